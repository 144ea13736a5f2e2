"""``run_tool_uses`` / ``arun_tool_uses``: the ledger gate, the approval gate, then the tool.

The sequence lives once, in ``_process``, a generator that *yields* every piece of I/O it needs
(read records, commit writes, ask the approver, call a function) and receives the answer. The
sync and async drivers only carry those requests out, so the two cannot drift apart. When each
write must be durable, and what happens when it cannot be written as it stands, is
``toolledger.outcomes``.

A ``started`` record is settled only when its attempt is provably over (``toolledger.liveness``):
while it may still run — in another thread, process, worker or host — every path says
``EffectInProgressError`` and touches nothing. So one non-idempotent call costs two commits
(intent, outcome), a safe one costs one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from . import decide
from ._crash import hit as crash_point
from .adapters import ResultShape, read_calls
from .approvals import ApprovalRequest, Decision
from .codec import EncodedResult, content_of, describe, encode_result, idempotency_key
from .drivers import (
    AlertHook,
    Ask,
    Failure,
    Invoke,
    IOContext,
    ReadEffects,
    ReadLease,
    Remember,
    Request,
    Sleep,
    adrive,
    drive,
    refuse_async_in_loop,
)
from .errors import (
    ConfigurationError,
    EffectInProgressError,
    LeaseLostError,
    LedgerMismatchError,
    OutcomeUnknown,
    StoreError,
)
from .liveness import Over, Running, judge
from .ops import Op, PutApproval, UpdateEffect
from .outcomes import (
    Batch,
    Buffer,
    Buffered,
    CallOutcome,
    Disposition,
    Env,
    flush,
    release,
    write,
)
from .records import SAFE_RERUN, ApprovalStatus, EffectRecord, Lease, PastAttempt, Status, ToolCall
from .stores.base import Ledger, in_progress_error
from .tools import InputError, Tool, ToolContext, ToolSet

__all__ = ["Disposition", "arun_tool_uses", "run_tool_uses"]

logger = logging.getLogger("toolledger")

_Gen = Generator[Request, Any, "Batch"]

_POLL_FIRST_S = 0.005
_POLL_MAX_S = 0.25


# -- the sequence, once --------------------------------------------------------------------------


def _process(
    calls: list[ToolCall],
    env: Env,
    tail: Callable[[list[CallOutcome]], Sequence[Op]] | None,
) -> _Gen:
    found: dict[str, EffectRecord] = yield ReadEffects([c.tool_use_id for c in calls])
    for call in calls:  # rule 7, checked for the whole message before anything runs
        record = found.get(call.tool_use_id)
        why = decide.mismatch(record, call) if record is not None else None
        if record is not None and why is not None:
            raise LedgerMismatchError(
                f"{why} in session {env.session_id!r}. Nothing was run. The transcript was "
                "edited or two runs share a session name.",
                session_id=env.session_id,
                tool_use_id=call.tool_use_id,
                recorded_tool=record.tool,
                recorded_input_hash=record.input_hash,
                tool=call.name,
                input_hash=call.input_hash,
            )
    buf = Buffer()
    try:
        outcomes: list[CallOutcome] = []
        for call in calls:
            outcomes.append((yield from _one(call, found.get(call.tool_use_id), env, buf)))
        extra = list(tail(outcomes)) if tail is not None else []
        error = None
        if buf.items or extra:
            error = (yield from flush(buf, env, extra)).error
        return Batch(outcomes, commit_error=error if extra else None)
    finally:
        for key in list(buf.flights):  # an exception, or an outcome that never committed
            release(env, key, buf)


def _one(
    call: ToolCall, record: EffectRecord | None, env: Env, buf: Buffer
) -> Generator[Request, Any, CallOutcome]:
    for _ in range(_RESTARTS):
        done = yield from _decide(call, record, env, buf)
        if not isinstance(done, _Again):
            return done
        record = done.record
    assert record is not None
    raise EffectInProgressError(
        f"{call.name!r} ({call.tool_use_id}) in session {env.session_id!r}: its record kept "
        "changing while this worker tried to run it (other attempts are at it); retry later "
        "to get its stored result",
        session_id=env.session_id,
        tool_use_id=call.tool_use_id,
        holder=record.worker,
    )


def _decide(
    call: ToolCall, record: EffectRecord | None, env: Env, buf: Buffer
) -> Generator[Request, Any, CallOutcome | _Again]:
    if record is not None and record.status is Status.STARTED:
        record = yield from _settled_or_over(call, record, env, buf)
    tool = env.tools.get(call.name)
    kwargs: dict[str, Any] = {}
    input_error = call.problem
    if (
        input_error is None
        and tool is not None
        and not (record is not None and record.status.terminal)
    ):
        try:
            kwargs = tool.validate(call.input)
        except InputError as exc:
            input_error = str(exc)
    action = decide.first_step(
        record,
        tool,
        call,
        input_error=input_error,
        available=env.tools.names,
        can_ask=env.can_ask,
    )
    plan = _Plan(
        approved_by=record.approved_by if record is not None else None,
        settled=_settled_by(record, tool),
    )
    while True:
        if isinstance(action, decide.Replay):
            return _replayed(call, action.record)
        if isinstance(action, decide.Reject):
            return CallOutcome(call, Disposition.REJECTED, action.message, is_error=True)
        if isinstance(action, decide.Unresolved):
            return CallOutcome(call, Disposition.IN_DOUBT, action.message, is_error=True)
        assert tool is not None  # every other action concerns a known tool
        if isinstance(action, decide.Ask):
            asked = yield from _ask(call, record, action, plan=plan, env=env, buf=buf)
            if isinstance(asked, CallOutcome):
                return asked
            action = asked
            continue
        if isinstance(action, decide.Check):
            assert record is not None
            checked = yield from _check(call, tool, kwargs, record, env=env, buf=buf)
            if isinstance(checked, CallOutcome):
                return checked
            plan.settled = "its check found no trace of it"
            action = checked
            continue
        assert isinstance(action, decide.Run)
        return (
            yield from _run(
                call,
                tool,
                kwargs,
                record=record,
                in_doubt=action.in_doubt,
                plan=plan,
                env=env,
                buf=buf,
            )
        )


@dataclass(frozen=True, slots=True)
class _Again:
    """The record changed under us: start the call over from ``record``."""

    record: EffectRecord


_RESTARTS = 5


@dataclass(slots=True)
class _Plan:
    """What the steps before running a call decided about its attempt."""

    approved_by: str | None
    settled: str  # how the attempt it replaces counts as over (for its history)
    consume: Op | None = None  # the approval it uses up, with its intent


def _ask(
    call: ToolCall,
    record: EffectRecord | None,
    action: decide.Ask,
    *,
    plan: _Plan,
    env: Env,
    buf: Buffer,
) -> Generator[Request, Any, CallOutcome | decide.Action]:
    """Put the call to the approver: the answer for the model, or ``Run`` when approved."""
    if buf.urgent:
        yield from flush(buf, env, [])  # a person may take minutes: nothing waits on them
    if not env.can_ask:
        message = decide.no_approver_message(call.name)
        denied = _denied(env, call, record, message)
        buf.items.append(Buffered(write(denied, record), urgent=False, outcome=None))
        return CallOutcome(call, Disposition.DECLINED, message, is_error=True)
    request = ApprovalRequest(
        session_id=env.session_id,
        tool_use_id=call.tool_use_id,
        tool=call.name,
        input=call.input,
        in_doubt=action.in_doubt,
        reason=action.reason,
        input_hash=call.input_hash,
        attempt=_attempt(record),
        ledger=env.ledger,
    )
    decision: Decision = yield Ask(request)
    if decision.pending:
        return CallOutcome(
            call,
            Disposition.AWAITING_APPROVAL,
            f"awaiting approval: {call.name!r} is queued for a person to decide; not executed yet.",
            is_error=True,
        )
    plan.consume = _consume(env, decision)
    if decision.approved:
        plan.approved_by = decision.by
        if action.in_doubt:
            plan.settled = f"an approver ({decision.by}) allowed running it again"
        return decide.Run(in_doubt=action.in_doubt)
    if action.in_doubt:
        # "Do not run it again" is not "it did not happen": the call stays in doubt.
        return CallOutcome(
            call,
            Disposition.IN_DOUBT,
            decide.in_doubt_message(call.name, f"a re-run was declined by {decision.by}"),
            is_error=True,
        )
    message = decide.denied_message(call.name, decision.by)
    denied = _denied(env, call, record, message)
    # Recorded so it is not asked again; losing it would only mean asking again.
    buf.items.append(Buffered(write(denied, record), urgent=False, outcome=None))
    return CallOutcome(call, Disposition.DECLINED, message, is_error=True)


def _check(
    call: ToolCall,
    tool: Tool[Any, Any],
    kwargs: dict[str, Any],
    record: EffectRecord,
    *,
    env: Env,
    buf: Buffer,
) -> Generator[Request, Any, CallOutcome | decide.Action]:
    """Ask the tool's ``check`` whether the in-doubt call happened: its answer for the model,
    or what to do next when it did not."""
    if buf.urgent:
        yield from flush(buf, env, [])
    ctx = _context(env, call, in_doubt=True, attempt=record.attempt, tool=tool)
    answer = yield Invoke(
        tool.check_invocation(kwargs, ctx), tool.check_is_async, ctx=ctx, check=True
    )
    if isinstance(answer, Failure):
        return CallOutcome(
            call,
            Disposition.IN_DOUBT,
            decide.in_doubt_message(call.name, f"its check raised {describe(answer.exc)}"),
            is_error=True,
        )
    if answer is None:
        return decide.after_check_not_found(tool, call)
    encoded = _encode(answer, env, call)
    done = replace(
        record,
        status=Status.SUCCEEDED,
        result=encoded.stored,
        error="in doubt; its check found the effect",
        updated_at=env.clock(),
    )
    outcome = CallOutcome(call, Disposition.EXECUTED, encoded.content, is_error=False)
    buf.items.append(Buffered(write(done, record), urgent=False, outcome=outcome, must_land=True))
    return outcome


def _settled_or_over(
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
        verdict = judge(
            record, now=env.now(), lease=lease, runtime=env.ledger.store.runtime, url=env.url
        )
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


def _settled_by(record: EffectRecord | None, tool: Tool[Any, Any] | None) -> str:
    """How the attempt of ``record`` counts as over, should a new attempt replace it."""
    if record is None:
        return ""
    if record.status is Status.NOT_HAPPENED:
        return record.error or "a person resolved it as not happened"
    if tool is not None and tool.rerun_safe:
        return f"{SAFE_RERUN} ({tool.effect.value}" + (
            ", forwards its idempotency key)" if tool.forwards_idempotency_key else ")"
        )
    return "in doubt"


def _consume(env: Env, decision: Decision) -> Op | None:
    """The write that uses up a persisted approval: it rides in the commit that records what the
    decision allowed (the intent), so an approval is never used without it, nor twice."""
    approval = decision.approval
    if approval is None or approval.status is not ApprovalStatus.APPROVED:
        return None  # a denial is not used up: it stands (and is recorded with the call)
    used = approval.consumed(at=env.clock())
    return PutApproval(used, expect_status=approval.status)


def _denied(env: Env, call: ToolCall, record: EffectRecord | None, message: str) -> EffectRecord:
    return env.record(
        call,
        status=Status.DENIED,
        attempt=_attempt(record),
        created_at=_created(record),
        error=message,
        history=record.history if record is not None else (),
    )


def _replayed(call: ToolCall, record: EffectRecord) -> CallOutcome:
    if record.status is Status.SUCCEEDED and record.result is not None:
        return CallOutcome(call, Disposition.REPLAYED, content_of(record.result), is_error=False)
    return CallOutcome(
        call, Disposition.REPLAYED, record.error or f"{record.status.value}", is_error=True
    )


def _encode(value: Any, env: Env, call: ToolCall) -> EncodedResult:
    return encode_result(value, max_bytes=env.tools.max_result_bytes, tool=call.name)


def _attempt(record: EffectRecord | None) -> int:
    return record.attempt if record is not None else 0


def _created(record: EffectRecord | None) -> float | None:
    return record.created_at if record is not None else None


def _context(
    env: Env,
    call: ToolCall,
    *,
    in_doubt: bool,
    attempt: int,
    tool: Tool[Any, Any],
    intent: EffectRecord | None = None,
) -> ToolContext:
    """The call's context. Its deadline is the intent's (the one every other worker judges by,
    on the store's clock) told on this worker's clock — never later than it."""
    if intent is not None and intent.deadline is not None:
        deadline = env.clock() + (intent.deadline - env.now())
    else:
        deadline = env.clock() + tool.timeout
    return ToolContext(
        session_id=env.session_id,
        tool_use_id=call.tool_use_id,
        idempotency_key=idempotency_key(env.session_id, call.tool_use_id),
        in_doubt=in_doubt,
        attempt=attempt,
        deadline=deadline,
    )


def _history(record: EffectRecord | None, settled: str) -> tuple[PastAttempt, ...]:
    """The history of a new attempt: the record's, plus the attempt it replaces (if any)."""
    if record is None:
        return ()
    if record.attempt == 0 or record.status not in (Status.STARTED, Status.NOT_HAPPENED):
        return record.history
    replaced = PastAttempt(
        attempt=record.attempt,
        worker=record.worker,
        holder=record.holder,
        at=record.updated_at,
        deadline=record.deadline,
        settled=settled,
    )
    return (*record.history, replaced)


def _run(
    call: ToolCall,
    tool: Tool[Any, Any],
    kwargs: dict[str, Any],
    *,
    record: EffectRecord | None,
    in_doubt: bool,
    plan: _Plan,
    env: Env,
    buf: Buffer,
) -> Generator[Request, Any, CallOutcome | _Again]:
    attempt = _attempt(record) + 1
    history = _history(record, plan.settled)
    approved_by, consume = plan.approved_by, plan.consume
    key = env.flight(call)
    intent: EffectRecord | None = None
    if tool.needs_intent:
        intended = yield from _intend(
            call, tool, record, attempt=attempt, history=history, plan=plan, env=env, buf=buf
        )
        if isinstance(intended, CallOutcome | _Again):
            return intended
        intent = intended
    elif buf.urgent:
        yield from flush(buf, env, [])
    elif consume is not None:
        buf.items.append(Buffered(consume, urgent=False, outcome=None))
    ctx = _context(env, call, in_doubt=in_doubt, attempt=attempt, tool=tool, intent=intent)
    # An async tool is cancelled when its deadline comes (what the others judge by), not later.
    timeout = max(0.0, ctx.deadline - env.clock()) if ctx.deadline is not None else tool.timeout
    answer = yield Invoke(tool.invocation(kwargs, ctx), tool.is_async, timeout=timeout, ctx=ctx)
    crash_point("before_record")
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
        exc = answer.exc
        if isinstance(exc, OutcomeUnknown) and intent is not None:
            # The attempt is over and nobody knows how it went: say so in the record (released:
            # in doubt at once for everyone, not only once this process has ended).
            given_up = env.record(
                call,
                status=Status.STARTED,
                attempt=attempt,
                created_at=intent.created_at,
                approved_by=intent.approved_by,
                error=f"in doubt: {describe(exc)}",
                deadline=intent.deadline,
                history=history,
            )
            given_up = _released(given_up)
            buf.items.append(
                Buffered(write(given_up, intent), urgent=True, outcome=None, closes=closes)
            )
            return CallOutcome(
                call,
                Disposition.IN_DOUBT,
                decide.in_doubt_message(call.name, f"the tool could not tell: {describe(exc)}"),
                is_error=True,
            )
        message = decide.failed_message(call.name, exc)
        if intent is not None:
            failed = env.record(
                call,
                status=Status.FAILED,
                attempt=attempt,
                created_at=intent.created_at,
                error=message,
                approved_by=intent.approved_by,
                deadline=intent.deadline,
                history=history,
            )
            buf.items.append(
                Buffered(write(failed, intent), urgent=True, outcome=None, closes=closes)
            )
        return CallOutcome(call, Disposition.FAILED, message, is_error=True)
    encoded = _encode(answer, env, call)
    base = intent if intent is not None else record
    done = env.record(
        call,
        status=Status.SUCCEEDED,
        attempt=attempt,
        created_at=_created(record),
        result=encoded.stored,
        approved_by=approved_by if intent is None else intent.approved_by,
        deadline=intent.deadline if intent is not None else None,
        history=history,
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
    plan: _Plan,
    env: Env,
    buf: Buffer,
) -> Generator[Request, Any, EffectRecord | CallOutcome | _Again]:
    """Make the intent of ``attempt`` durable (with the approval it uses up): the intent, or
    the call's answer when it must not run (the commit failed, another attempt got there)."""
    key = env.flight(call)
    intent = env.record(
        call,
        status=Status.STARTED,
        attempt=attempt,
        created_at=_created(record),
        approved_by=plan.approved_by,
        error="in doubt: started, outcome not recorded",
        deadline=env.now() + tool.timeout,
        history=history,
    )
    # In flight from before the intent is durable: no other thread or task of this process
    # may ever see our ``started`` record without knowing that we are running it.
    env.ledger.store.runtime.in_flight.add(key)
    buf.flights.append(key)
    extra = [write(intent, record)] + ([plan.consume] if plan.consume is not None else [])
    flushed = yield from flush(buf, env, extra)
    if flushed.error is not None:
        if isinstance(flushed.error, StoreError) and flushed.error.outcome_unknown:
            # The intent may be in the store, and the tool will not run: have it say so
            # (not happened) once the store answers again — exactly this intent, no other.
            buf.flights.remove(key)
            never = replace(
                intent,
                status=Status.NOT_HAPPENED,
                error="its worker did not run it: the commit of its intent went unconfirmed",
                updated_at=env.clock(),
            )
            op = UpdateEffect(never, Status.STARTED, intent.attempt, expect_at=intent.updated_at)
            yield Remember([op], [key])
        else:
            release(env, key, buf)
        if isinstance(flushed.error, LeaseLostError):
            raise flushed.error  # taken over: this worker goes no further
        return CallOutcome(
            call,
            Disposition.NOT_EXECUTED,
            decide.intent_failed_message(call.name, flushed.error),
            is_error=True,
        )
    if not flushed.extra_applied[0]:
        # Someone else wrote this call's record since we read it — another attempt, a person:
        # decide again from what it says now.
        release(env, key, buf)
        now_found: dict[str, EffectRecord] = yield ReadEffects([call.tool_use_id])
        current = now_found.get(call.tool_use_id)
        assert current is not None, "a record is never deleted"
        return _Again(current)
    crash_point("after_intent")
    return intent


def _released(record: EffectRecord) -> EffectRecord:
    """A ``started`` record whose worker gave its attempt up: no holder, its deadline kept."""
    return replace(record, holder=None, deadline=record.deadline or record.updated_at)


# -- public entry points -----------------------------------------------------------------------


def process_batch(
    calls: list[ToolCall],
    tools: ToolSet,
    ledger: Ledger,
    *,
    can_ask: bool,
    tail: Callable[[list[CallOutcome]], Sequence[Op]] | None = None,
    wait: float = 0.0,
    lease_token: int | None = None,
) -> _Gen:
    """The generator behind ``run_tool_uses``. The agent drives it with a ``tail`` (the
    checkpoint that commits together with the batch's last outcome) and its ``lease_token`` (so
    its intents say which lease they ran under)."""
    env = Env(tools=tools, ledger=ledger, can_ask=can_ask, wait=wait, lease_token=lease_token)
    return _process(calls, env, tail)


def _prepare(
    content: Any, tools: ToolSet | Sequence[Any], ledger: Ledger, wait: float
) -> tuple[list[ToolCall], ResultShape, ToolSet]:
    if not isinstance(ledger, Ledger):
        raise ConfigurationError(
            f"ledger= must be a toolledger Ledger (store.ledger(session_id)), not "
            f"{type(ledger).__name__}"
        )
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait < 1e9:
        raise ConfigurationError(f"wait= must be a number of seconds >= 0, not {wait!r}")
    toolset = tools if isinstance(tools, ToolSet) else ToolSet(tools)
    calls, shape = read_calls(content)
    return calls, shape, toolset


def run_tool_uses(
    content: Any,
    tools: ToolSet | Sequence[Any],
    *,
    ledger: Ledger,
    approve: Any = None,
    on_alert: AlertHook | None = None,
    wait: float = 0.0,
) -> list[dict[str, Any]]:
    """Run the ``tool_use`` blocks of ``content`` through the ledger; return their
    ``tool_result`` blocks, in order, ready to send as the next user message.

    For each call (DESIGN.md rules 1-7, 12-13): a finished record answers it without running
    anything or asking anyone; a high-impact call asks ``approve``; the intent is durable before
    a call whose re-run is unsafe runs, and the outcome the instant it returns. A call found in
    doubt is re-run only when that is safe, settled by the tool's ``check``, or put to the
    approver; otherwise it answers ``is_error`` and stays in doubt for a person.

    Raises ``LedgerMismatchError`` (before running anything) when an id is recorded with another
    tool or input, ``MalformedContentError`` for content it cannot read, and
    ``EffectInProgressError`` when another attempt at a call may still be running — another
    thread or task of this process, a live process of this host, or a worker elsewhere whose
    lease is held or whose deadline has not passed. ``wait`` is how many seconds to wait for
    such an attempt to finish (its stored result is then returned) before raising. A failed
    ledger write after a tool succeeded is *not* raised: the real result is returned and the
    alert goes to the ``toolledger`` logger and ``on_alert``.
    """
    calls, shape, toolset = _prepare(content, tools, ledger, wait)
    named = {c.name for c in calls}
    refuse_async_in_loop([t for t in toolset if t.name in named], "run_tool_uses")
    gen = process_batch(calls, toolset, ledger, can_ask=approve is not None, wait=wait)
    io = IOContext(
        store=ledger.store, session_id=ledger.session_id, approve=approve, on_alert=on_alert
    )
    return drive(gen, io).results(shape)


async def arun_tool_uses(
    content: Any,
    tools: ToolSet | Sequence[Any],
    *,
    ledger: Ledger,
    approve: Any = None,
    on_alert: AlertHook | None = None,
    wait: float = 0.0,
) -> list[dict[str, Any]]:
    """The async twin of ``run_tool_uses``: same rules, same results. ``async def`` tools,
    checks and approvers are awaited (an ``async def`` tool is cancelled at its deadline and left
    in doubt); plain ones run in a worker thread."""
    calls, shape, toolset = _prepare(content, tools, ledger, wait)
    gen = process_batch(calls, toolset, ledger, can_ask=approve is not None, wait=wait)
    io = IOContext(
        store=ledger.store, session_id=ledger.session_id, approve=approve, on_alert=on_alert
    )
    return (await adrive(gen, io)).results(shape)
