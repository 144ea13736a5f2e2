"""One attempt at a call: its intent made durable, the tool called, its outcome buffered.

``toolledger.engine._runner`` decides that a call runs (``decide.Run``); this carries it out, as
part of
the same generator (every piece of I/O is yielded). What the tool's exception means is
``decide.after_failure``; when each write must be durable, ``toolledger.engine._outcomes``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from typing import Any, NoReturn

from .._crash import hit as crash_point
from ..codec import EncodedResult, describe, encode_result, idempotency_key
from ..errors import (
    ClockMovedError,
    CorruptLedgerError,
    LeaseLostError,
    StoreError,
    StoreUnavailableError,
    ToolLedgerError,
)
from ..ops import Op, Reading
from ..records import EffectRecord, PastAttempt, Status, ToolCall, same_write
from ..tools import Tool, ToolContext
from . import _decide as decide
from ._drivers import CancelledAfterAnswer, Failure, Invoke, ReadEffects, Remember, Request
from ._messages import intent_failed_message
from ._outcomes import (
    Buffer,
    Buffered,
    CallOutcome,
    Disposition,
    Env,
    Flushed,
    flush,
    hold_while_it_may_run,
    not_run,
    on_intent,
    release,
    write,
)
from ._reconcile import commit

__all__ = [
    "CLOCK_TRIES",
    "Again",
    "after_intent",
    "attempt_of",
    "context",
    "created_of",
    "encode",
    "intent_of",
    "invocation",
    "ran",
    "recorded_then_raised",
    "run",
    "set_at",
    "unsent",
]

logger = logging.getLogger("toolledger")


@dataclass(frozen=True, slots=True)
class Again:
    """The record changed under us: start the call over from ``record``."""

    record: EffectRecord


def attempt_of(record: EffectRecord | None) -> int:
    return record.attempt if record is not None else 0


def created_of(record: EffectRecord | None) -> float | None:
    return record.created_at if record is not None else None


def encode(value: Any, env: Env, call: ToolCall) -> EncodedResult:
    return encode_result(value, max_bytes=env.tools.max_result_bytes, tool=call.name)


def context(
    env: Env,
    call: ToolCall,
    *,
    in_doubt: bool,
    attempt: int,
    tool: Tool[Any, Any],
    intent: EffectRecord | None = None,
    began: float | None = None,
    record: EffectRecord | None = None,
) -> ToolContext:
    """The call's context. Its deadline is the intent's (the one every other worker judges by,
    on the store's clock) told on this worker's clock — never later than it — and on this
    process's monotonic clock (``expires``): the tool's timeout after the attempt ``began``
    (that clock, read before its intent was written), never later, whatever a wall clock did or
    however long the process was paused since. Its key is made from the session the call was
    made in (``record.key_session``: a branch's copy of its lineage's call forwards the
    lineage's key), else from this one."""
    window = _window(env, tool, intent, began)
    return _context(env, call, window, in_doubt=in_doubt, attempt=attempt, record=record)


def _window(
    env: Env, tool: Tool[Any, Any], intent: EffectRecord | None, began: float | None
) -> tuple[float, float]:
    """The monotonic clock now, and the seconds the attempt has left (``context``)."""
    monotonic = env.ledger.store.runtime.monotonic()
    left = tool.timeout if began is None else tool.timeout - (monotonic - began)
    if intent is not None and intent.deadline is not None:
        left = min(left, intent.deadline - env.now())
    return monotonic, left


def _context(
    env: Env,
    call: ToolCall,
    window: tuple[float, float],
    *,
    in_doubt: bool,
    attempt: int,
    record: EffectRecord | None,
) -> ToolContext:
    monotonic, left = window
    return ToolContext(
        session_id=env.session_id,
        tool_use_id=call.tool_use_id,
        idempotency_key=idempotency_key(env.key_session(call, record), call.tool_use_id),
        in_doubt=in_doubt,
        attempt=attempt,
        deadline=env.clock() + left,
        expires=monotonic + left,
    )


def invocation(
    env: Env,
    call: ToolCall,
    tool: Tool[Any, Any],
    kwargs: dict[str, Any],
    *,
    in_doubt: bool,
    attempt: int,
    intent: EffectRecord | None,
    record: EffectRecord | None,
    began: float,
) -> Invoke:
    """The tool's call, under its context (``context``) if it takes one — only then is the
    context built, its key a SHA-256 — and an async one cancelled when its deadline comes (what
    the others judge by), not later."""
    window = monotonic, left = _window(env, tool, intent, began)
    ctx = (
        _context(env, call, window, in_doubt=in_doubt, attempt=attempt, record=record)
        if tool.takes_context
        else None
    )
    timeout = max(0.0, monotonic + left - env.ledger.store.runtime.monotonic())
    if intent is not None and left <= 0:
        # Its time ran out before the tool was called (the process paused, or the intent's
        # commit took that long): past its deadline another worker may judge the attempt over
        # and run the call again. It is not started: the attempt fails, having done nothing.
        return Invoke(_not_started(tool, left), tool.is_async, timeout=0.0, ctx=ctx)
    return Invoke(tool.invocation(kwargs, ctx), tool.is_async, timeout=timeout, ctx=ctx)


def _not_started(tool: Tool[Any, Any], left: float) -> Callable[[], Any]:
    def refuse() -> Any:
        raise TimeoutError(
            f"not started: its deadline had passed {-left:.1f}s before the tool could be called "
            f"(timeout={tool.timeout:g}s); nothing was done, it is safe to retry"
        )

    return refuse


def run(
    call: ToolCall,
    tool: Tool[Any, Any],
    kwargs: dict[str, Any],
    *,
    record: EffectRecord | None,
    action: decide.Run,
    consume: Op | None,
    env: Env,
    buf: Buffer,
) -> Generator[Request, Any, CallOutcome | Again]:
    """Run ``call`` as ``action`` says, replacing the attempt of ``record`` (if any); ``consume``
    is the approval it uses up, written with its intent."""
    attempt = attempt_of(record) + 1
    settled = action.settled if action.settled is not None else decide.settled_by(record, tool)
    history = decide.history(record, settled)
    approved_by = action.approved_by
    if approved_by is None and record is not None:
        approved_by = record.approved_by
    key = env.flight(call)
    intent: EffectRecord | None = None
    # The attempt's time starts now, on this process's monotonic clock: a pause between its
    # intent and its tool (or a wall clock stepped meanwhile) never gives the tool more.
    began = env.ledger.store.runtime.monotonic()
    if tool.needs_intent:
        buf.ends[key] = began + tool.timeout
        intended = yield from _intend(
            call,
            tool,
            record,
            attempt=attempt,
            history=history,
            approved_by=approved_by,
            consume=consume,
            env=env,
            buf=buf,
        )
        if isinstance(intended, CallOutcome | Again):
            return intended
        intent = intended
    elif buf.urgent:
        yield from flush(buf, env, [])
    elif consume is not None:
        buf.items.append(Buffered(consume, urgent=False, outcome=None))
    invoke = invocation(
        env,
        call,
        tool,
        kwargs,
        in_doubt=action.in_doubt,
        attempt=attempt,
        intent=intent,
        record=intent or record,
        began=began,
    )
    buf.unrun.discard(key)  # from here on, the tool may have been called
    try:
        answer = yield invoke
    except CancelledAfterAnswer as late:
        answer = late.answer
        cancelled: CancelledAfterAnswer | None = late
    except asyncio.CancelledError:
        if intent is not None:
            hold_while_it_may_run(env, key, began + tool.timeout, intent)
        raise
    else:
        cancelled = None
    crash_point("before_record")
    outcome = ran(
        call,
        tool,
        answer,
        intent=intent,
        record=record,
        attempt=attempt,
        history=history,
        approved_by=approved_by,
        key=key,
        env=env,
        buf=buf,
    )
    if cancelled is not None:
        yield from recorded_then_raised(cancelled, env, buf)
    return outcome


def recorded_then_raised(
    cancelled: CancelledAfterAnswer, env: Env, buf: Buffer
) -> Generator[Request, Any, NoReturn]:
    """The run was cancelled while its tool ran, and the tool then answered: its outcome,
    just buffered, is written now — it is known, and the next run answers from it instead of
    finding the call in doubt — and the cancellation goes on up."""
    yield from flush(buf, env, [])
    raise cancelled


def ran(
    call: ToolCall,
    tool: Tool[Any, Any],
    answer: Any,
    *,
    intent: EffectRecord | None,
    record: EffectRecord | None,
    attempt: int,
    history: tuple[PastAttempt, ...],
    approved_by: str | None,
    key: tuple[str, str, str],
    env: Env,
    buf: Buffer,
) -> CallOutcome:
    """The attempt's tool ``answer``ed (its value, or a ``Failure``): its outcome, with the write
    that records it buffered (``intent``: the attempt's durable intent, if it wrote one)."""
    if intent is not None and intent.deadline is not None and env.now() > intent.deadline:
        # A plain function cannot be stopped at its deadline. Its outcome is still written —
        # a compare-and-set: if nobody settled the call meanwhile nothing happened twice, and
        # if someone did, the outcome is kept beside theirs and alerted — but never silently.
        logger.warning(
            "toolledger: %r (%s) in session %r returned %.1fs after its deadline (timeout=%gs): "
            "past it, a worker elsewhere may judge the attempt over. Raise the tool's timeout.",
            call.name,
            call.tool_use_id,
            env.session_id,
            env.now() - intent.deadline,
            tool.timeout,
        )
    closes = key if intent is not None else None
    if isinstance(answer, Failure):
        failed = decide.after_failure(call.name, answer.exc, intended=intent is not None)
        if intent is not None:
            # In doubt, the attempt is over and nobody knows how it went: the record says so
            # (released: in doubt at once for everyone, not only once this process has ended).
            ended = env.record(
                call,
                status=Status.STARTED if failed.in_doubt else Status.FAILED,
                attempt=attempt,
                created_at=intent.created_at,
                error=failed.error,
                approved_by=intent.approved_by,
                deadline=intent.deadline,
                history=history,
                replaces=intent,
            )
            if failed.in_doubt:
                ended = _released(ended)
            buf.items.append(
                Buffered(write(ended, intent), urgent=True, outcome=None, closes=closes)
            )
        if failed.in_doubt:
            return CallOutcome(
                call, Disposition.IN_DOUBT, failed.message, is_error=True, attempt=attempt
            )
        return CallOutcome(call, Disposition.FAILED, failed.message, is_error=True)
    encoded = encode(answer, env, call)
    base = intent if intent is not None else record
    done = env.record(
        call,
        status=Status.SUCCEEDED,
        attempt=attempt,
        # The call was created when its first record was: its intent's, else the record it had.
        created_at=intent.created_at if intent is not None else created_of(record),
        result=encoded.stored,
        approved_by=approved_by if intent is None else intent.approved_by,
        deadline=intent.deadline if intent is not None else None,
        history=history,
        replaces=intent or record,
    )
    outcome = CallOutcome(call, Disposition.EXECUTED, encoded.content, is_error=False)
    buf.items.append(
        Buffered(
            write(done, base),
            urgent=tool.needs_intent,
            outcome=outcome,
            closes=closes,
            safe=tool.rerun_safe,
        )
    )
    return outcome


def _intend(
    call: ToolCall,
    tool: Tool[Any, Any],
    record: EffectRecord | None,
    *,
    attempt: int,
    history: tuple[PastAttempt, ...],
    approved_by: str | None,
    consume: Op | None,
    env: Env,
    buf: Buffer,
) -> Generator[Request, Any, EffectRecord | CallOutcome | Again]:
    """Make the intent of ``attempt`` durable (with the approval it uses up): the intent, or
    the call's answer when it must not run (the commit failed, another attempt got there).

    A store that cannot be written now answers "not executed, safe to retry"; a damaged one is
    raised (``CorruptLedgerError``): no retry mends it, and a call written first (its record
    unread) meets the damage here, where a read would have raised it."""
    key = env.flight(call)
    # In flight from before the intent is durable: no other thread or task of this process
    # may ever see our ``started`` record without knowing that we are running it.
    env.ledger.store.runtime.in_flight.add(key)
    buf.flights.append(key)
    if record is None or record.status is not Status.STARTED:
        buf.unrun.add(key)  # no attempt before it may have taken effect
    else:
        buf.unrun.discard(key)  # a re-run of a call in doubt stays in doubt
    for _ in range(CLOCK_TRIES):
        intent = intent_of(
            call, tool, record, attempt=attempt, history=history, approved_by=approved_by, env=env
        )
        buf.intents[key] = intent
        at = set_at(intent, tool) if env.ledger.store.checks_clock else None
        extra = [write(intent, record, at)]
        flushed = yield from flush(buf, env, extra + ([consume] if consume is not None else []))
        if not isinstance(flushed.error, ClockMovedError):
            break  # else its deadline was set on a reading of the clock that it has moved from
    return (
        yield from after_intent(flushed, call, intent, record=record, key=key, env=env, buf=buf)
    )


def intent_of(
    call: ToolCall,
    tool: Tool[Any, Any],
    record: EffectRecord | None,
    *,
    attempt: int,
    history: tuple[PastAttempt, ...],
    approved_by: str | None,
    env: Env,
) -> EffectRecord:
    """The intent (``started``) of ``attempt``, replacing ``record``."""
    return env.record(
        call,
        status=Status.STARTED,
        attempt=attempt,
        created_at=created_of(record),
        approved_by=approved_by,
        error="in doubt: started, outcome not recorded",
        deadline=env.now() + tool.timeout,
        history=history,
        boot_deadline=env.boot_deadline(tool.timeout),
        replaces=record,
    )


CLOCK_TRIES = 3
"""How many times an intent is built and sent while a shared clock refuses it
(``ClockMovedError``): each refusal has the clock read again, so a second try lands unless the
clock keeps stepping."""


def set_at(intent: EffectRecord, tool: Tool[Any, Any]) -> Reading | None:
    """The reading of the store's clock the deadline of ``intent`` was set on
    (``UpdateEffect.at``), taken when it was: called as the intent is built, so the monotonic
    clock is read within microseconds of the store's. For a store that checks it only
    (``StoreCore.checks_clock``)."""
    if intent.deadline is None:
        return None
    return intent.deadline - tool.timeout, time.monotonic()


def unsent(
    error: BaseException,
    intent: EffectRecord,
    *,
    key: tuple[str, str, str],
    env: Env,
    buf: Buffer,
    in_doubt: bool = False,
) -> Generator[Request, Any, None]:
    """The commit of ``intent`` failed with ``error``, and the tool will not run: the attempt
    is over here (a corrupt ledger raises at once). ``in_doubt``: the intent was a re-run of a
    call in doubt, which stays in doubt."""
    if isinstance(error, CorruptLedgerError):
        release(env, key, buf)
        raise error
    if isinstance(error, StoreError) and error.outcome_unknown:
        # The intent may be in the store, and the tool will not run: have it say so once the
        # store answers again — exactly this intent, no other. Not happened; or, replacing an
        # attempt that may have taken effect, still in doubt (released: in doubt at once).
        buf.flights.remove(key)
        buf.unrun.discard(key)  # its clean-up is this one
        if in_doubt:
            never = _released(
                replace(
                    intent,
                    error="in doubt: its re-run did not run (the commit of its intent went "
                    "unconfirmed), and the attempt before it may have taken effect",
                    updated_at=env.clock(),
                )
            )
            op = on_intent(never, intent)
        else:
            op = not_run(intent, "the commit of its intent went unconfirmed", env)
        # A clean-up, not an outcome: refused because the record moved on, nothing is lost
        # (a "not happened" one is never taken for an outcome: ``_background.moved_on``).
        yield Remember([op], [key], moved=_nothing_lost if in_doubt else None)
    else:
        release(env, key, buf)


def after_intent(
    flushed: Flushed,
    call: ToolCall,
    intent: EffectRecord,
    *,
    record: EffectRecord | None,
    key: tuple[str, str, str],
    env: Env,
    buf: Buffer,
) -> Generator[Request, Any, EffectRecord | CallOutcome | Again]:
    """The commit of ``intent`` (registered in flight as ``key``) answered ``flushed``: the
    intent, durable, or the call's answer when it must not run."""
    if flushed.error is not None:
        in_doubt = record is not None and record.status is Status.STARTED
        yield from unsent(flushed.error, intent, key=key, env=env, buf=buf, in_doubt=in_doubt)
        if isinstance(flushed.error, LeaseLostError):
            raise flushed.error  # taken over: this worker goes no further
        return (yield from not_executed(flushed.error, call, intent, record=record, env=env))
    if not flushed.extra_applied[0]:
        # Someone else wrote this call's record since we read it — another attempt, a person:
        # decide again from what it says now.
        release(env, key, buf)
        now_found: dict[str, EffectRecord] = yield ReadEffects([call.tool_use_id])
        current = now_found.get(call.tool_use_id)
        assert current is not None, "a record is never deleted"
        return Again(current)
    crash_point("after_intent")
    return intent


def not_executed(
    error: ToolLedgerError,
    call: ToolCall,
    intent: EffectRecord,
    *,
    record: EffectRecord | None,
    env: Env,
) -> Generator[Request, Any, CallOutcome | Again]:
    """The commit of ``intent`` (replacing ``record``) failed with ``error``, and the tool did
    not run: the call's answer, "not executed, safe to retry" — once the ledger holds it.

    Answered and not recorded, it would hold for this delivery only: a second delivery of the
    message (a queue that delivers twice, a resume whose transcript lost the answer) finds the
    call free and runs it, while the model, told it did not happen, retries it under a new id.
    So the answer is recorded first, as a denial that stands for ever (the same call always
    gets the same answer), over what the call had: no record, a "did not happen", or this very
    intent if it landed after all (its commit unconfirmed). What else is found there now is
    decided from — another attempt, a person, a branch's copy, written since this worker read
    it (or, written first, never read). A call in doubt is not "nothing happened": its earlier
    attempt may have taken effect. It, and an answer the store will not take, raise the store's
    error: nothing is answered, nothing ran, and the next delivery decides afresh. A read that
    fails raises too."""
    found: dict[str, EffectRecord] = yield ReadEffects([call.tool_use_id])
    there = found.get(call.tool_use_id)
    ours = same_write(there, intent) or (record is not None and same_write(there, record))
    if there is not None and not ours:
        return Again(there)
    if record is not None and record.status is not Status.NOT_HAPPENED:
        raise unanswered(
            error, call, env, "could not record the intent of its re-run; it stays in doubt"
        )
    message = intent_failed_message(call.name, error)
    # This attempt, recorded as not run, over what is there: its intent, or what it replaced.
    denied = env.record(
        call,
        status=Status.DENIED,
        attempt=intent.attempt,
        created_at=intent.created_at,
        error=message,
        history=intent.history,
        replaces=record,
    )
    answer = yield from commit([write(denied, there)])
    if isinstance(answer, Failure):
        raise unanswered(
            answer.exc, call, env, "could record neither its intent nor that it did not run"
        )
    if not answer[0]:  # moved meanwhile: decide from what it says now
        now_found: dict[str, EffectRecord] = yield ReadEffects([call.tool_use_id])
        current = now_found.get(call.tool_use_id)
        assert current is not None, "a record is never deleted"
        return Again(current)
    return CallOutcome(call, Disposition.NOT_EXECUTED, message, is_error=True)


_PLAIN_FAILURES = (StoreError, StoreUnavailableError, ClockMovedError)


def unanswered(error: BaseException, call: ToolCall, env: Env, why: str) -> BaseException:
    """What a batch raises when ``call`` did not run and no answer to it could be recorded
    (``why``, the store's ``error``): nothing of the message is answered — an answer would
    contradict what a later delivery does — and nothing is lost; a store's plain failure is said
    so, a damaged or newer store's error goes up as it is."""
    if not isinstance(error, StoreError) or type(error) not in _PLAIN_FAILURES:
        return error
    raised = StoreUnavailableError(
        f"{call.name!r} ({call.tool_use_id}) in session {env.session_id!r} did not run: the "
        f"ledger {why} ({describe(error)}). So nothing of this message is answered: an answer "
        "could contradict what a later delivery of it does. Nothing is lost: a call of it that "
        "took effect is alerted and its outcome kept by this process until the store takes "
        "it. Run it again once the store takes writes: what ran answers from the ledger, and "
        "what did not runs.",
        url=error.url,
        session_id=env.session_id,
        tool_use_id=call.tool_use_id,
    )
    raised.__cause__ = error
    return raised


def _released(record: EffectRecord) -> EffectRecord:
    """A ``started`` record whose worker gave its attempt up: no holder, its deadline kept."""
    return replace(record, holder=None, deadline=record.deadline or record.updated_at)


def _nothing_lost(index: int) -> None:
    """A kept clean-up refused because its record moved on: the record says more now."""
