"""What one batch of calls has done so far, and how its writes reach the store.

``runner`` decides what happens to each call; this module keeps the writes it produced and
commits them by the rule of when each must be durable at the latest:

* the intent (``started``) of a call whose re-run is unsafe: before that tool runs;
* the outcome of such a call: before anything else can happen — the next tool, the approver's
  wait, the return to the caller. It rides in the same commit as the next intent, or as the
  turn's checkpoint when the agent passes one (``tail``);
* the outcome of a call whose re-run is safe (read-only, idempotent, key-forwarding): with the
  next commit, whenever that is. Losing it costs a harmless re-run.

An attempt is registered in flight in this process (``liveness``) from before its intent commits
until the commit holding its outcome has returned, so that no other thread or task of this
process can take it for an attempt that is over.

When an outcome cannot be written as it stands — the record moved on while the tool ran,
because another attempt replaced it or a person settled it — the attempt's outcome is written
into the record's history and raised as an alert (``LateOutcomeError``). When the commit failed
because this worker's lease was taken over, the outcomes are written again without the fence:
each is a compare-and-set on the record, which is all the protection a record needs.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from ._crash import hit as crash_point
from .adapters import ResultShape
from .codec import valid_unicode
from .drivers import Alert, Failure, ReadEffects, Remember, Request
from .errors import (
    LateOutcomeError,
    LeaseLostError,
    LedgerWriteError,
    SessionConflictError,
    StoreError,
    ToolLedgerError,
)
from .liveness import flight_key
from .ops import AppendMessages, InsertEffect, Op, PutSession, UpdateEffect
from .reconcile import commit
from .records import EffectRecord, Holder, PastAttempt, Status, ToolCall
from .stores.base import Ledger
from .tools import ToolSet

__all__ = ["Batch", "Buffer", "CallOutcome", "Disposition", "Env", "flush"]

logger = logging.getLogger("toolledger")


class Disposition(StrEnum):
    """What happened to one call in a batch."""

    EXECUTED = "executed"  # the tool ran and returned
    REPLAYED = "replayed"  # answered from the ledger; nothing ran
    FAILED = "failed"  # the tool raised
    DECLINED = "declined"  # the approver said no, or there is no approver
    REJECTED = "rejected"  # unknown tool or bad input; nothing ran
    IN_DOUBT = "in_doubt"  # may have happened; a person must resolve it
    NOT_EXECUTED = "not_executed"  # the ledger could not record the intent; nothing ran
    AWAITING_APPROVAL = "awaiting_approval"  # queued for a person; nothing ran yet


@dataclass(slots=True)
class CallOutcome:
    """The result of one call, plus what the agent needs to know about it."""

    call: ToolCall
    disposition: Disposition
    content: str
    is_error: bool
    alert: LedgerWriteError | None = None

    def __post_init__(self) -> None:
        # An error message can carry text UTF-8 cannot hold (an exception's repr); the model
        # APIs would refuse the whole request for it. A result's content needs no check (and a
        # 1 MiB one should not pay a scan): ``codec.content_of`` never yields a lone surrogate.
        if self.is_error:
            self.content = valid_unicode(self.content)


@dataclass(slots=True)
class Batch:
    outcomes: list[CallOutcome]
    commit_error: ToolLedgerError | None = None  # the final commit (with ``tail``) failed

    def results(self, shape: ResultShape) -> list[dict[str, Any]]:
        return [shape(o.call.tool_use_id, o.content, is_error=o.is_error) for o in self.outcomes]

    @property
    def alerts(self) -> list[LedgerWriteError]:
        return [o.alert for o in self.outcomes if o.alert is not None]


@dataclass(frozen=True, slots=True)
class Env:
    """What a batch runs against."""

    tools: ToolSet
    ledger: Ledger
    can_ask: bool
    wait: float = 0.0  # how long to wait for a call another attempt is running
    lease_token: int | None = None  # the agent's session lease, recorded in intents

    @property
    def session_id(self) -> str:
        return self.ledger.session_id

    @property
    def worker(self) -> str:
        return self.ledger.store.worker_id

    @property
    def url(self) -> str:
        return self.ledger.store.url

    @property
    def holder(self) -> Holder | None:
        return self.ledger.store.runtime.holder

    def clock(self) -> float:
        return self.ledger.store.clock()

    def now(self) -> float:
        """The store's clock."""
        return self.ledger.store.now()

    def flight(self, call: ToolCall) -> tuple[str, str, str]:
        return flight_key(self.url, self.session_id, call.tool_use_id)

    def record(
        self,
        call: ToolCall,
        *,
        status: Status,
        attempt: int,
        created_at: float | None,
        result: str | None = None,
        error: str | None = None,
        approved_by: str | None = None,
        deadline: float | None = None,
        history: tuple[PastAttempt, ...] = (),
        holder: Holder | None = None,
    ) -> EffectRecord:
        """A record of ``call`` written by this worker."""
        now = self.clock()
        return EffectRecord(
            session_id=self.session_id,
            tool_use_id=call.tool_use_id,
            tool=call.name,
            input_hash=call.input_hash,
            status=status,
            attempt=attempt,
            result=result,
            error=valid_unicode(error),  # an exception's text may hold what no store can encode
            created_at=created_at if created_at is not None else now,
            updated_at=now,
            approved_by=approved_by,
            worker=self.worker,
            holder=holder if holder is not None else self.holder,
            lease_token=self.lease_token,
            deadline=deadline,
            history=history,
        )


@dataclass(slots=True)
class Buffered:
    op: Op
    urgent: bool  # must be durable before anything else happens
    outcome: CallOutcome | None  # whose effect the op records (for alerts)
    closes: tuple[str, str, str] | None = None  # the attempt in flight this op ends
    safe: bool = False  # the tool is safe to run again: a late success duplicates nothing
    must_land: bool = False  # an outcome others cannot recompute (a check's finding): kept


@dataclass(slots=True)
class Buffer:
    items: list[Buffered] = field(default_factory=list)
    flights: list[tuple[str, str, str]] = field(default_factory=list)  # registered by us

    @property
    def urgent(self) -> bool:
        return any(i.urgent for i in self.items)


@dataclass(frozen=True, slots=True)
class Flushed:
    error: ToolLedgerError | None  # the commit failed: nothing in it landed
    extra_applied: list[bool]  # per op of ``extra``: did its condition hold


def _guarded(item: Buffered) -> Op:
    if item.closes is not None and isinstance(item.op, UpdateEffect):
        return replace(item.op, guard=True)
    return item.op


def _moved(error: BaseException | None) -> bool:
    """The commit was refused because a guarded outcome's record moved on."""
    return (
        isinstance(error, SessionConflictError)
        and not isinstance(error, LeaseLostError)
        and error.tool_use_id is not None
    )


def write(new: EffectRecord, old: EffectRecord | None) -> Op:
    """Insert-if-absent for a first record; otherwise compare-and-set against the very version
    we read (status, attempt *and* ``updated_at``), so a note written into it meanwhile — a late
    attempt's outcome in its history — is never overwritten unseen."""
    if old is None:
        return InsertEffect(new)
    return UpdateEffect(
        new, expect_status=old.status, expect_attempt=old.attempt, expect_at=old.updated_at
    )


def release(env: Env, key: tuple[str, str, str], buf: Buffer) -> None:
    if key in buf.flights:
        buf.flights.remove(key)
        env.ledger.store.runtime.in_flight.discard(key)


def flush(buf: Buffer, env: Env, extra: list[Op]) -> Generator[Request, Any, Flushed]:
    """Commit the buffered writes plus ``extra`` in one transaction.

    A recorded effect whose write did not land raises an alert (rule 4): it happened, and only a
    person can now say so for sure.
    """
    items, buf.items = buf.items, []
    # A checkpoint that reports an outcome never lands without it: with one in ``extra``, our
    # attempts' outcomes are guards — if a record moved on, nothing of the commit lands.
    checkpoint = any(isinstance(op, PutSession | AppendMessages) for op in extra)
    answer = yield from commit([_guarded(i) if checkpoint else i.op for i in items] + extra)
    error = answer.exc if isinstance(answer, Failure) else None
    if error is not None and not isinstance(error, StoreError | SessionConflictError):
        raise error
    everything: list[bool] = [False] * (len(items) + len(extra)) if error is not None else answer
    applied = everything[: len(items)]
    if _moved(error) and items:
        # A record moved on while we ran the call: the checkpoint did not land. Our writes
        # alone learn which records moved; those outcomes are kept beside them (below).
        again = yield from commit([i.op for i in items])
        if not isinstance(again, Failure):
            applied = list(again)
    if isinstance(error, LeaseLostError):
        # Taken over: nothing of this commit landed, and this worker may not go on. But the
        # outcomes of its own attempts are facts; each is a compare-and-set on its record,
        # which needs no fence. Written alone, they land unless the record moved on.
        closing = [n for n, i in enumerate(items) if i.closes is not None]
        if closing:
            again = yield from commit([items[n].op for n in closing], fenced=False)
            if not isinstance(again, Failure):
                for n, ok in zip(closing, again, strict=True):
                    applied[n] = ok
    if error is not None:
        # Writes that may wait (safe calls' records, denials) go back in the queue: the next
        # commit — checkpoint B, say — carries them, so a transcript never reports a success
        # its ledger lacks. If that commit fails too, they are lost together.
        buf.items = [i for n, i in enumerate(items) if not i.urgent and not applied[n]]
    held: list[Buffered] = []
    if error is not None and not isinstance(error, SessionConflictError):
        # The store failed: our attempts' outcomes are known here and nowhere else. Keep trying
        # to write them, holding the calls in flight meanwhile — others in this process wait,
        # and on this host a live process's attempt is not called over — rather than leave a
        # record ``started`` that nobody runs any more.
        held = [i for n, i in enumerate(items) if i.closes is not None and not applied[n]]
        if held:
            keys = [i.closes for i in held if i.closes is not None]
            for key in keys:
                buf.flights.remove(key)  # ours no more: the background writer releases them
            yield Remember([i.op for i in held], keys)
    for item, ok in zip(items, applied, strict=True):
        if item.closes is not None and item not in held:
            release(env, item.closes, buf)  # its outcome is written, or cannot be by us
        if ok:
            continue
        if not item.urgent:
            if item.must_land and error is None:
                yield from _late(item, env, finding=True)  # a note was added: write it again
            continue
        if item.outcome is None or item.outcome.disposition is not Disposition.EXECUTED:
            late_failure = (
                isinstance(item.op, UpdateEffect) and item.op.record.status is Status.FAILED
            )
            if late_failure and (error is None or isinstance(error, SessionConflictError)):
                yield from _late(item, env)  # kept in the history; nothing happened twice
            continue
        if error is not None and not isinstance(error, SessionConflictError):
            alert = LedgerWriteError(
                f"{item.outcome.call.name!r} ({item.outcome.call.tool_use_id}) in session "
                f"{env.session_id!r} took effect but the ledger write failed ({error}). The "
                "model got the real result. This process keeps trying to write it and holds the "
                "call meanwhile; if it ends first, a resume finds the call in doubt. A person "
                "should check.",
                session_id=env.session_id,
                tool_use_id=item.outcome.call.tool_use_id,
                tool=item.outcome.call.name,
                result=item.outcome.content,
                cause=error,
                url=env.url,
            )
            item.outcome.alert = alert
            yield Alert(alert)
            continue
        yield from _late(item, env)
    if error is None and any(
        ok and i.outcome is not None for i, ok in zip(items, applied, strict=True)
    ):
        crash_point("after_record")
    return Flushed(error, everything[len(items) :])


# -- an outcome the record no longer waits for ----------------------------------------------------

_LATE_TRIES = 5


def _late(item: Buffered, env: Env, *, finding: bool = False) -> Generator[Request, Any, None]:
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
    for _ in range(_LATE_TRIES):
        found: dict[str, EffectRecord] = yield ReadEffects([tid])
        current = found.get(tid)
        if current is None:
            # The ledger forgot the call (its file deleted, the store replaced): what this
            # worker knows is all there is. Write it back, so no resume runs it again.
            answer = yield from commit([InsertEffect(ours)], fenced=False)
            if answer == [True] and item.outcome is not None:
                yield from _record_changed(
                    item,
                    env,
                    f"{ours.tool!r} ({tid}) in session {env.session_id!r} took effect, but its "
                    "record was changed by someone else first: it was gone from the ledger "
                    "(deleted, or the store replaced), and has been written again from this "
                    "worker's outcome. Whatever else the ledger held may be lost: a person "
                    "must check the store.",
                )
                return
            if answer == [True]:
                return
            if isinstance(answer, Failure):
                why = "it is gone from the ledger (deleted, or the store replaced)"
                break
            continue
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
        yield from _record_changed(
            item,
            env,
            f"{ours.tool!r} ({tid}) in session {env.session_id!r} took effect (attempt "
            f"{ours.attempt}) but its record was changed by someone else first: {why}. The "
            "model got the real result; a resume could run it again. A person must check the "
            "world and resolve it.",
        )


def _record_changed(item: Buffered, env: Env, message: str) -> Generator[Request, Any, None]:
    """Alert that ``item``'s effect happened but its record was changed by someone else."""
    assert item.outcome is not None and isinstance(item.op, UpdateEffect)
    alert = LedgerWriteError(
        message,
        session_id=env.session_id,
        tool_use_id=item.op.record.tool_use_id,
        tool=item.op.record.tool,
        result=item.outcome.content,
        cause=None,
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
