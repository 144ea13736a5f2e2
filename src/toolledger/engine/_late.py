"""An outcome its record no longer waits for: the record moved on while the attempt ran (a
later attempt replaced it, a person settled it, the store forgot it). The outcome is kept in the
record — as the truth, or in its history beside what replaced it — and, when it took effect,
raised as an alert (``LateOutcomeError``, or ``LedgerWriteError`` when it could not be kept).
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from dataclasses import replace
from typing import Any

from ..errors import LateOutcomeError, LedgerWriteError, StoreError
from ..ops import InsertEffect, UpdateEffect
from ..records import EffectRecord, PastAttempt, Status
from ._batch import Buffered, Env
from ._drivers import Alert, Failure, ReadEffects, Request, drive
from ._io import IOContext
from ._reconcile import commit

__all__ = ["kept_late", "late", "write_failed"]

logger = logging.getLogger("toolledger")

_LATE_TRIES = 5


def late(item: Buffered, env: Env, *, finding: bool = False) -> Generator[Request, Any, None]:
    """Our attempt's outcome found the record moved on. Keep the outcome in the record — as the
    truth when a person had only said "it did not happen" and nobody ran it since, else in the
    history beside the attempt that replaced ours — and raise the alert when it took effect.
    ``finding``: not an attempt's outcome but what its check found, kept only while the record
    still waits for that attempt."""
    assert isinstance(item.op, UpdateEffect)
    ours = item.op.record
    tid = ours.tool_use_id
    late = "succeeded" if ours.status is Status.SUCCEEDED else f"{ours.status.value}: {ours.error}"
    why = "it kept changing while this worker tried to add the outcome to it"
    cause: StoreError | None = None
    for _ in range(_LATE_TRIES):
        try:
            found: dict[str, EffectRecord] = yield ReadEffects([tid])
        except StoreError as exc:
            # What the record says now cannot be learnt: the outcome cannot be added to it,
            # and the effect must not go untold with the read's error.
            why = f"the store could not be read to add the outcome to it ({exc})"
            cause = exc
            break
        current = found.get(tid)
        if current is None:
            back = yield from _written_back(item, env, ours)
            if back is None:
                continue  # it is there again: read it
            if back:
                return
            why = "it is gone from the ledger (deleted, or the store replaced)"
            break
        if current.attempt == ours.attempt and current.status is Status.SUCCEEDED:
            # Settled as having happened (a person's word, or its check found it) while it ran:
            # this very attempt's effect, vouched for already. Nothing happened twice.
            logger.warning(
                "toolledger: attempt %s of %r (%s) in session %r reported %s after it was "
                "settled as %s (%s)",
                ours.attempt,
                ours.tool,
                tid,
                env.session_id,
                late,
                current.status.value,
                current.error,
            )
            return
        if finding and not (current.status is Status.STARTED and current.attempt == ours.attempt):
            # A check's finding says the call's effect exists — not which attempt made it: a
            # record that moved on (settled, or run again) has nothing to learn from it.
            return
        if current.status is Status.STARTED and current.attempt == ours.attempt:
            # Still our attempt: someone wrote a note into it (a replaced attempt's late
            # outcome). Write ours again over that version, keeping the note.
            mine = replace(ours, history=current.history)
            retry = UpdateEffect(
                mine, Status.STARTED, current.attempt, expect_at=current.updated_at
            )
            again = yield from commit([retry], fenced=False)
            if again == [True]:
                return
            continue
        if (
            current.status is Status.NOT_HAPPENED
            and current.attempt == ours.attempt
            and ours.status is Status.SUCCEEDED
        ):
            new = replace(
                ours,
                history=current.history,
                error=f"{current.error}; but attempt {ours.attempt} then reported "
                f"{ours.status.value}" + (f": {ours.error}" if ours.error else ""),
            )
            what = f"a person resolved it as not happened ({current.error})"
            kept = "The record now holds that outcome instead; nothing ran again since."
        else:
            past = _past(current, ours, late)
            # A new version (a later ``updated_at``): the attempt still running, if any, then
            # finds its compare-and-set refused and keeps this note when it writes again.
            new = replace(
                current, history=past, updated_at=max(env.clock(), current.updated_at + 1e-6)
            )
            what = (
                f"attempt {current.attempt} replaced it"
                if current.attempt != ours.attempt
                else f"it was settled meanwhile ({current.error or current.status.value})"
            )
            kept = (
                "Its outcome is kept in the record's history; the world may hold this effect "
                "twice. A person must check it (`toolledger verify` lists such calls)."
            )
        op = UpdateEffect(
            new,
            expect_status=current.status,
            expect_attempt=current.attempt,
            expect_at=current.updated_at,
        )
        answer = yield from commit([op], fenced=False)
        if isinstance(answer, Failure):
            break
        if answer == [True]:
            if ours.status is Status.SUCCEEDED and not item.safe:
                yield from _alert_late(item, env, ours, current, f"{what}. {kept}")
            else:
                logger.warning(
                    "toolledger: attempt %s of %r (%s) in session %r reported %s after %s",
                    ours.attempt,
                    ours.tool,
                    tid,
                    env.session_id,
                    late,
                    what,
                )
            return
    if ours.status is Status.SUCCEEDED and item.outcome is not None:
        yield from write_failed(
            item,
            env,
            f"{ours.tool!r} ({tid}) in session {env.session_id!r} took effect (attempt "
            f"{ours.attempt}) but its record was changed by someone else first: {why}. The "
            "model got the real result; a resume could run it again. A person must check the "
            "world and resolve it.",
            cause,
        )


def kept_late(items: list[Buffered], env: Env, n: int) -> None:
    """The background writer's commit of ``items[n]``'s outcome — kept when the store failed —
    was refused: its record moved on meanwhile (a person settled it, another attempt ran).
    ``late`` does now what it does for an outcome refused at once: the record keeps it, and a
    person is alerted (in the writer's thread, through the ``toolledger`` logger: the run that
    made it has returned)."""
    drive(late(items[n], env), IOContext(store=env.ledger.store, session_id=env.session_id))


def _written_back(
    item: Buffered, env: Env, ours: EffectRecord
) -> Generator[Request, Any, bool | None]:
    """The ledger forgot the call (its file deleted, the store replaced): what this worker
    knows is all there is. Write it back, so no resume runs it again. Whether it was written
    (``None``: a record is there again after all)."""
    answer = yield from commit([InsertEffect(ours)], fenced=False)
    if isinstance(answer, Failure):
        return False
    if answer != [True]:
        return None
    if item.outcome is not None:
        yield from write_failed(
            item,
            env,
            f"{ours.tool!r} ({ours.tool_use_id}) in session {env.session_id!r} took effect, but "
            "its record was changed by someone else first: it was gone from the ledger "
            "(deleted, or the store replaced), and has been written again from this worker's "
            "outcome. Whatever else the ledger held may be lost: a person must check the store.",
        )
    return True


def write_failed(
    item: Buffered, env: Env, message: str, cause: BaseException | None = None
) -> Generator[Request, Any, None]:
    """Alert that ``item``'s effect happened but its record could not be written as it stands
    (``cause``: the store's error; ``None``: someone else changed the record first)."""
    assert item.outcome is not None
    call = item.outcome.call
    alert = LedgerWriteError(
        message,
        session_id=env.session_id,
        tool_use_id=call.tool_use_id,
        tool=call.name,
        result=item.outcome.content,
        cause=cause,
        url=env.url,
    )
    item.outcome.alert = alert
    yield Alert(alert)


def _past(current: EffectRecord, ours: EffectRecord, late: str) -> tuple[PastAttempt, ...]:
    """``current``'s history with our attempt's late outcome in it."""
    entries = list(current.history)
    for n, entry in enumerate(entries):
        if entry.attempt == ours.attempt:
            entries[n] = replace(entry, late=late, late_result=ours.result)
            return tuple(entries)
    entries.append(
        PastAttempt(
            attempt=ours.attempt,
            worker=ours.worker,
            holder=ours.holder,
            at=ours.updated_at,
            deadline=ours.deadline,
            settled=f"settled while it ran: {current.error or current.status.value}",
            late=late,
            late_result=ours.result,
        )
    )
    return tuple(entries)


def _alert_late(
    item: Buffered, env: Env, ours: EffectRecord, current: EffectRecord, what: str
) -> Generator[Request, Any, None]:
    assert item.outcome is not None
    alert = LateOutcomeError(
        f"{ours.tool!r} ({ours.tool_use_id}) in session {env.session_id!r}: attempt "
        f"{ours.attempt} took effect after {what} This happens only when a call is settled "
        "while its attempt still runs — a person forcing it, or a worker paused or cut off "
        "past its deadline; a tool that forwards ctx.idempotency_key lets the receiver refuse "
        "a repeat.",
        session_id=env.session_id,
        tool_use_id=ours.tool_use_id,
        tool=ours.tool,
        result=item.outcome.content,
        attempt=ours.attempt,
        current=f"{current.status.value} (attempt {current.attempt})",
        url=env.url,
    )
    item.outcome.alert = alert
    yield Alert(alert)
