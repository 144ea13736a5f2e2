"""A branch's copies of its lineage's calls (DESIGN.md rule 19: one lineage, one call per id).

A fork copies every record of its source into the new session's ledger
(``branching.copy_of``), each with ``origin``, the session the call was made in. A copy is the
same call, not a new one: its idempotency key is the origin's, and a model on the branch that
issues its id again gets its outcome (or ``LedgerMismatchError`` for another input). A copy with
an outcome — succeeded, failed, declined — answers as the original does. One without — the call
was in progress, in doubt, or resolved as not having happened when the branch was made — is
still the origin's to settle:

* it takes the origin's outcome as soon as there is one (written into the copy, a
  compare-and-set, so the branch's ledger answers alone from then on);
* while it has none, its attempt is judged where it ran — the origin's record, lease and
  process: in progress there is in progress here;
* a tool safe to run again (read-only, idempotent, key-forwarding) may run again on the branch,
  under the lineage's key: the receiver takes the repeat as the first;
* any other is neither run nor settled on the branch: a person settles it in the origin, once
  for the whole lineage, and the branch takes that outcome at its next run. So a call in doubt
  runs again at most once, wherever its id is replayed.

A copy whose origin no longer holds the call (the origin was removed) is the branch's own, and
is settled there like any other.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import replace
from typing import Any

from . import decide
from ._batch import Buffer, Buffered, CallOutcome, Disposition, Env, write
from .drivers import ReadEffects, ReadLease, Request, Sleep
from .liveness import Over, Running, Verdict, judge
from .outcomes import flush
from .records import EffectRecord, Lease, Status, ToolCall
from .stores.copies import same_call
from .stores.store import in_progress_error
from .tools import Tool

__all__ = ["adopted", "defer", "settled_elsewhere"]

_POLL_FIRST_S = 0.005
_POLL_MAX_S = 0.25


def adopted(copy: EffectRecord, there: EffectRecord) -> EffectRecord:
    """The origin's outcome ``there``, as the branch's copy holds it."""
    return replace(there, session_id=copy.session_id, origin=copy.origin)


def settled_elsewhere(copy: EffectRecord, origin: str) -> str:
    """What the model is told of a copy whose call waits to be settled in ``origin``."""
    return decide.in_doubt_message(
        copy.tool,
        f"it was interrupted in session {origin!r}, where this conversation's lineage made "
        f"the call; it is settled there, once for every branch",
    )


def defer(
    call: ToolCall,
    copy: EffectRecord,
    tool: Tool[Any, Any] | None,
    env: Env,
    buf: Buffer,
) -> Generator[Request, Any, EffectRecord | CallOutcome]:
    """Decide a copy without an outcome of its own by its origin (the module docstring): the
    record to go on deciding from — the origin's outcome, adopted; or the copy itself when the
    branch may settle it (a tool safe to run again, whose attempt is over; an origin gone) —
    or the call's answer, in doubt, when only the origin may settle it. Raises
    ``EffectInProgressError`` while the attempt may still run (after ``env.wait`` seconds)."""
    assert copy.origin is not None
    origin = copy.origin
    waited, pause = 0.0, _POLL_FIRST_S
    while True:
        found: dict[str, EffectRecord] = yield ReadEffects([call.tool_use_id], session=origin)
        there = found.get(call.tool_use_id)
        if not same_call(copy, there):
            # The origin is gone (removed once every call of it was settled): the copy is the
            # branch's own, and its attempt is over.
            return copy
        assert there is not None
        if there.status.terminal:
            # Recorded so the branch answers alone from now on; losing it only reads again.
            mine = adopted(copy, there)
            buf.items.append(Buffered(write(mine, copy), urgent=False, outcome=None))
            return mine
        verdict: Verdict = Over(f"it is {there.status.value} in session {origin!r}")
        if there.status is Status.STARTED:
            lease: Lease | None = None
            if there.lease_token is not None:
                lease = yield ReadLease(session=origin)
            store = env.ledger.store
            verdict = judge(there, now=env.now(), lease=lease, runtime=store.runtime, url=env.url)
        if isinstance(verdict, Over):
            if tool is not None and tool.rerun_safe:
                return copy  # runs again here, under the lineage's key
            return CallOutcome(
                call,
                Disposition.IN_DOUBT,
                settled_elsewhere(copy, origin),
                is_error=True,
                settle_in=origin,
            )
        assert isinstance(verdict, Running)
        if waited >= env.wait:
            if buf.items:
                yield from flush(buf, env, [])
            raise in_progress_error(there, verdict)
        step = min(pause, env.wait - waited)
        yield Sleep(step)
        waited += step
        pause = min(pause * 2, _POLL_MAX_S)
