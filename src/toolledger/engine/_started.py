"""A call whose record is ``started`` when a run comes to it: its attempt is over (in doubt,
and the run goes on to settle it), or it may still run — in another thread, process, worker or
host — and the run waits for it a while, then says ``EffectInProgressError`` and touches
nothing (``toolledger._liveness`` judges which)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from .._liveness import Over, Running
from ..records import EffectRecord, Lease, Status, ToolCall
from ..stores.store import in_progress_error
from ._drivers import ReadEffects, ReadLease, Request, Sleep
from ._outcomes import Buffer, Env, flush

__all__ = ["settled_or_over"]

_POLL_FIRST_S = 0.005
_POLL_MAX_S = 0.25


def settled_or_over(
    call: ToolCall, record: EffectRecord, env: Env, buf: Buffer
) -> Generator[Request, Any, EffectRecord]:
    """``record`` is ``started``: return it once its attempt is over (in doubt), or whatever
    the record became meanwhile; while it may still run, wait up to ``env.wait`` seconds, then
    raise ``EffectInProgressError`` (after making what this batch did so far durable)."""
    waited = 0.0
    pause = _POLL_FIRST_S
    while True:
        lease: Lease | None = None
        if record.lease_token is not None:
            lease = yield ReadLease()
        verdict = env.judge(record, lease)
        if isinstance(verdict, Over):
            # Read it once more: an attempt leaves flight (or its process exits) only after its
            # outcome committed, so a record still the same now is truly one whose attempt is
            # over; one that moved on was finished meanwhile.
            again: dict[str, EffectRecord] = yield ReadEffects([call.tool_use_id])
            current = again.get(call.tool_use_id)
            assert current is not None, "a record is never deleted"
            if current == record:
                return record
            if current.status is not Status.STARTED:
                return current
            record = current
            continue
        assert isinstance(verdict, Running)
        if waited >= env.wait:
            if buf.items:
                yield from flush(buf, env, [])
            raise in_progress_error(record, verdict)
        if buf.urgent:
            yield from flush(buf, env, [])  # nothing of ours waits while we do
        step = min(pause, env.wait - waited)
        yield Sleep(step)
        waited += step
        pause = min(pause * 2, _POLL_MAX_S)
        found: dict[str, EffectRecord] = yield ReadEffects([call.tool_use_id])
        current = found.get(call.tool_use_id)
        if current is None or current.status is not Status.STARTED:
            assert current is not None, "a record is never deleted"
            return current
        record = current
