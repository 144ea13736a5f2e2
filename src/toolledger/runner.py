"""``run_tool_uses`` / ``arun_tool_uses``: the ledger gate, the approval gate, then the tool.

The sequence lives once, in ``_process``, a generator that *yields* every piece of I/O it needs
(read records, commit writes, ask the approver, call a function) and receives the answer. The
sync and async drivers below only carry those requests out, so the two cannot drift apart.

Writes are grouped without giving up a guarantee. The rule for each write is when it must be
durable at the latest:

* the intent (``started``) of a call whose re-run is unsafe: before that tool runs;
* the outcome of such a call: before anything else can happen — the next tool, the approver's
  wait, the return to the caller. It rides in the same commit as the next intent, or as the
  turn's checkpoint when the agent passes one (``tail``);
* the outcome of a call whose re-run is safe (read-only, idempotent, key-forwarding): with the
  next commit, whenever that is. Losing it costs a harmless re-run.

So one non-idempotent call costs two commits (intent, outcome), a safe one costs one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from . import decide
from ._crash import hit as crash_point
from .adapters import ResultShape, read_calls
from .approvals import ApprovalRequest, Decision
from .codec import EncodedResult, content_of, encode_result, idempotency_key, valid_unicode
from .drivers import (
    Alert,
    AlertHook,
    Ask,
    Commit,
    Failure,
    Invoke,
    IOContext,
    ReadEffects,
    Request,
    adrive,
    drive,
    refuse_async_in_loop,
)
from .errors import (
    ConfigurationError,
    EffectInProgressError,
    LedgerMismatchError,
    LedgerWriteError,
    OutcomeUnknown,
    SessionConflictError,
    StoreError,
    ToolLedgerError,
)
from .leases import DEFAULT_CLAIM_TIMEOUT, claim_is_live, in_flight
from .records import EffectRecord, Status, ToolCall
from .stores.base import InsertEffect, Ledger, Op, UpdateEffect
from .tools import InputError, Tool, ToolContext, ToolSet

__all__ = ["Disposition", "arun_tool_uses", "run_tool_uses"]

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


_Gen = Generator[Request, Any, "Batch"]


@dataclass(slots=True)
class _Buffered:
    op: Op
    urgent: bool  # must be durable before anything else happens
    outcome: CallOutcome | None  # whose effect the op records (for alerts)


@dataclass(slots=True)
class _Buffer:
    items: list[_Buffered] = field(default_factory=list)

    @property
    def urgent(self) -> bool:
        return any(i.urgent for i in self.items)


@dataclass(frozen=True, slots=True)
class _Env:
    tools: ToolSet
    ledger: Ledger
    can_ask: bool
    exclusive: bool = False  # the caller holds the session's lease: a started record is in doubt
    claim_timeout: float = DEFAULT_CLAIM_TIMEOUT

    @property
    def session_id(self) -> str:
        return self.ledger.session_id

    @property
    def worker(self) -> str:
        return self.ledger.store.worker_id

    @property
    def url(self) -> str:
        return self.ledger.store.url

    def clock(self) -> float:
        return self.ledger.store.clock()


# -- the sequence, once --------------------------------------------------------------------------


def _process(
    calls: list[ToolCall],
    env: _Env,
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
    buf = _Buffer()
    outcomes: list[CallOutcome] = []
    for call in calls:
        outcomes.append((yield from _one(call, found.get(call.tool_use_id), env, buf)))
    extra = list(tail(outcomes)) if tail is not None else []
    error = None
    if buf.items or extra:
        error = (yield from _flush(buf, env, extra)).error
    return Batch(outcomes, commit_error=error if extra else None)


@dataclass(frozen=True, slots=True)
class _Flushed:
    error: ToolLedgerError | None  # the commit failed: nothing in it landed
    extra_applied: list[bool]  # per op of ``extra``: did its condition hold


def _flush(buf: _Buffer, env: _Env, extra: list[Op]) -> Generator[Request, Any, _Flushed]:
    """Commit the buffered writes plus ``extra`` in one transaction.

    A recorded effect whose write did not land raises an alert (rule 4): it happened, and only a
    person can now say so for sure.
    """
    items, buf.items = buf.items, []
    answer = yield Commit([i.op for i in items] + extra)
    error = answer.exc if isinstance(answer, Failure) else None
    if error is not None and not isinstance(error, (StoreError, SessionConflictError)):
        raise error
    everything: list[bool] = [False] * (len(items) + len(extra)) if error is not None else answer
    applied = everything[: len(items)]
    if error is not None:
        # Writes that may wait (safe calls' records, denials) go back in the queue: the next
        # commit — checkpoint B, say — carries them, so a transcript never reports a success
        # its ledger lacks. If that commit fails too, they are lost together.
        buf.items = [i for i in items if not i.urgent] + buf.items
    for item, ok in zip(items, applied, strict=True):
        if ok or item.outcome is None or item.outcome.disposition is not Disposition.EXECUTED:
            continue
        if not item.urgent:
            continue  # a safe call's record: requeued above, or someone else recorded it
        cause: BaseException | None = error
        why = (
            f"the ledger write failed ({error})"
            if error is not None
            else "its record was changed by someone else first (a stale worker, or a "
            "concurrent resolve)"
        )
        alert = LedgerWriteError(
            f"{item.outcome.call.name!r} ({item.outcome.call.tool_use_id}) in session "
            f"{env.session_id!r} took effect but {why}. The model got the real result; a resume "
            "could run it again. A person must check and resolve it.",
            session_id=env.session_id,
            tool_use_id=item.outcome.call.tool_use_id,
            tool=item.outcome.call.name,
            result=item.outcome.content,
            cause=cause,
            url=env.url,
        )
        item.outcome.alert = alert
        yield Alert(alert)
    if error is None and any(
        ok and i.outcome is not None for i, ok in zip(items, applied, strict=True)
    ):
        crash_point("after_record")
    return _Flushed(error, everything[len(items) :])


def _record(
    env: _Env,
    call: ToolCall,
    *,
    status: Status,
    attempt: int,
    created_at: float | None,
    result: str | None = None,
    error: str | None = None,
    approved_by: str | None = None,
) -> EffectRecord:
    now = env.clock()
    return EffectRecord(
        session_id=env.session_id,
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
        worker=env.worker,
    )


def _write(new: EffectRecord, old: EffectRecord | None) -> Op:
    """Insert-if-absent for a first record, compare-and-set against what we read otherwise."""
    if old is None:
        return InsertEffect(new)
    return UpdateEffect(new, expect_status=old.status, expect_attempt=old.attempt)


def _replayed(call: ToolCall, record: EffectRecord) -> CallOutcome:
    if record.status is Status.SUCCEEDED and record.result is not None:
        return CallOutcome(call, Disposition.REPLAYED, content_of(record.result), is_error=False)
    return CallOutcome(
        call, Disposition.REPLAYED, record.error or f"{record.status.value}", is_error=True
    )


def _one(
    call: ToolCall, record: EffectRecord | None, env: _Env, buf: _Buffer
) -> Generator[Request, Any, CallOutcome]:
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
    yield from _refuse_live_claim(call, record, env, buf)
    action = decide.first_step(
        record,
        tool,
        call,
        input_error=input_error,
        available=env.tools.names,
        can_ask=env.can_ask,
    )
    approved_by: str | None = record.approved_by if record is not None else None
    while True:
        if isinstance(action, decide.Replay):
            return _replayed(call, action.record)
        if isinstance(action, decide.Reject):
            return CallOutcome(call, Disposition.REJECTED, action.message, is_error=True)
        if isinstance(action, decide.Unresolved):
            return CallOutcome(call, Disposition.IN_DOUBT, action.message, is_error=True)
        assert tool is not None  # every other action concerns a known tool
        if isinstance(action, decide.Ask):
            if buf.urgent:
                yield from _flush(buf, env, [])  # a person may take minutes: nothing waits on them
            if not env.can_ask:
                message = decide.no_approver_message(call.name)
                denied = _record(
                    env,
                    call,
                    status=Status.DENIED,
                    attempt=_attempt(record),
                    created_at=_created(record),
                    error=message,
                )
                buf.items.append(_Buffered(_write(denied, record), urgent=False, outcome=None))
                return CallOutcome(call, Disposition.DECLINED, message, is_error=True)
            request = ApprovalRequest(
                session_id=env.session_id,
                tool_use_id=call.tool_use_id,
                tool=call.name,
                input=call.input,
                in_doubt=action.in_doubt,
                reason=action.reason,
                input_hash=call.input_hash,
                ledger=env.ledger,
            )
            decision: Decision = yield Ask(request)
            if decision.pending:
                return CallOutcome(
                    call,
                    Disposition.AWAITING_APPROVAL,
                    f"awaiting approval: {call.name!r} is queued for a person to decide; "
                    "not executed yet.",
                    is_error=True,
                )
            if decision.approved:
                approved_by = decision.by
                action = decide.Run(in_doubt=action.in_doubt)
                continue
            if action.in_doubt:
                # "Do not run it again" is not "it did not happen": the call stays in doubt.
                return CallOutcome(
                    call,
                    Disposition.IN_DOUBT,
                    decide.in_doubt_message(call.name, f"a re-run was declined by {decision.by}"),
                    is_error=True,
                )
            message = decide.denied_message(call.name, decision.by)
            denied = _record(
                env,
                call,
                status=Status.DENIED,
                attempt=_attempt(record),
                created_at=_created(record),
                error=message,
                approved_by=None,
            )
            # Recorded so it is not asked again; losing it would only mean asking again.
            buf.items.append(_Buffered(_write(denied, record), urgent=False, outcome=None))
            return CallOutcome(call, Disposition.DECLINED, message, is_error=True)
        if isinstance(action, decide.Check):
            if buf.urgent:
                yield from _flush(buf, env, [])
            assert record is not None
            ctx = _context(env, call, in_doubt=True, attempt=record.attempt)
            answer = yield Invoke(tool.check_invocation(kwargs, ctx), tool.check_is_async)
            if isinstance(answer, Failure):
                return CallOutcome(
                    call,
                    Disposition.IN_DOUBT,
                    decide.in_doubt_message(call.name, f"its check raised {answer.exc!r}"),
                    is_error=True,
                )
            if answer is not None:
                encoded = _encode(answer, env, call)
                done = _record(
                    env,
                    call,
                    status=Status.SUCCEEDED,
                    attempt=record.attempt,
                    created_at=record.created_at,
                    result=encoded.stored,
                    error="in doubt; its check found the effect",
                    approved_by=record.approved_by,
                )
                outcome = CallOutcome(call, Disposition.EXECUTED, encoded.content, is_error=False)
                buf.items.append(_Buffered(_write(done, record), urgent=False, outcome=outcome))
                return outcome
            action = decide.after_check_not_found(tool, call)
            continue
        assert isinstance(action, decide.Run)
        return (
            yield from _run(
                call,
                tool,
                kwargs,
                record=record,
                in_doubt=action.in_doubt,
                approved_by=approved_by,
                env=env,
                buf=buf,
            )
        )


def _refuse_live_claim(
    call: ToolCall, record: EffectRecord | None, env: _Env, buf: _Buffer
) -> Generator[Request, Any, None]:
    """A ``started`` record whose worker may still be running the call is not in doubt: it is in
    progress elsewhere. Say so (after making what this batch did so far durable)."""
    if (
        record is not None
        and record.status is Status.STARTED
        and not env.exclusive
        and claim_is_live(record, now=env.clock(), claim_timeout=env.claim_timeout)
    ):
        if buf.items:
            yield from _flush(buf, env, [])
        raise _in_progress(env, call, record)


def _in_progress(env: _Env, call: ToolCall, current: EffectRecord | None) -> EffectInProgressError:
    holder = current.worker if current is not None else None
    return EffectInProgressError(
        f"{call.name!r} ({call.tool_use_id}) in session {env.session_id!r} is being run by "
        f"{holder or 'another worker'} and has not finished; retry later to get its stored "
        "result",
        session_id=env.session_id,
        tool_use_id=call.tool_use_id,
        holder=holder,
    )


def _encode(value: Any, env: _Env, call: ToolCall) -> EncodedResult:
    return encode_result(value, max_bytes=env.tools.max_result_bytes, tool=call.name)


def _attempt(record: EffectRecord | None) -> int:
    return record.attempt if record is not None else 0


def _created(record: EffectRecord | None) -> float | None:
    return record.created_at if record is not None else None


def _context(env: _Env, call: ToolCall, *, in_doubt: bool, attempt: int) -> ToolContext:
    return ToolContext(
        session_id=env.session_id,
        tool_use_id=call.tool_use_id,
        idempotency_key=idempotency_key(env.session_id, call.tool_use_id),
        in_doubt=in_doubt,
        attempt=attempt,
    )


def _run(
    call: ToolCall,
    tool: Tool[Any, Any],
    kwargs: dict[str, Any],
    *,
    record: EffectRecord | None,
    in_doubt: bool,
    approved_by: str | None,
    env: _Env,
    buf: _Buffer,
) -> Generator[Request, Any, CallOutcome]:
    attempt = _attempt(record) + 1
    if tool.needs_intent:
        intent = _record(
            env,
            call,
            status=Status.STARTED,
            attempt=attempt,
            created_at=_created(record),
            approved_by=approved_by,
            error="in doubt: started, outcome not recorded",
        )
        flushed = yield from _flush(buf, env, [_write(intent, record)])
        if flushed.error is not None:
            return CallOutcome(
                call,
                Disposition.NOT_EXECUTED,
                decide.intent_failed_message(call.name, flushed.error),
                is_error=True,
            )
        if not flushed.extra_applied[0]:
            # Someone else wrote this call's record since we read it: another worker.
            now_found: dict[str, EffectRecord] = yield ReadEffects([call.tool_use_id])
            current = now_found.get(call.tool_use_id)
            if current is not None and current.status.terminal:
                return _replayed(call, current)
            raise _in_progress(env, call, current)
        record = intent
        crash_point("after_intent")
    elif buf.urgent:
        yield from _flush(buf, env, [])
    ctx = _context(env, call, in_doubt=in_doubt, attempt=attempt)
    key = (env.session_id, call.tool_use_id)
    in_flight.add(key)  # so another ledger of this process sees the call as running, not in doubt
    try:
        answer = yield Invoke(tool.invocation(kwargs, ctx), tool.is_async)
    finally:
        in_flight.discard(key)
    crash_point("before_record")
    if isinstance(answer, Failure):
        exc = answer.exc
        if isinstance(exc, OutcomeUnknown) and tool.needs_intent:
            # The intent stays: the call is in doubt until someone (or a later check) decides.
            return CallOutcome(
                call,
                Disposition.IN_DOUBT,
                decide.in_doubt_message(call.name, f"the tool could not tell: {exc}"),
                is_error=True,
            )
        message = decide.failed_message(call.name, exc)
        if tool.needs_intent:
            assert record is not None
            failed = _record(
                env,
                call,
                status=Status.FAILED,
                attempt=attempt,
                created_at=record.created_at,
                error=message,
                approved_by=record.approved_by,
            )
            buf.items.append(_Buffered(_write(failed, record), urgent=True, outcome=None))
        return CallOutcome(call, Disposition.FAILED, message, is_error=True)
    encoded = _encode(answer, env, call)
    done = _record(
        env,
        call,
        status=Status.SUCCEEDED,
        attempt=attempt,
        created_at=_created(record),
        result=encoded.stored,
        approved_by=approved_by if record is None else record.approved_by,
    )
    outcome = CallOutcome(call, Disposition.EXECUTED, encoded.content, is_error=False)
    buf.items.append(_Buffered(_write(done, record), urgent=tool.needs_intent, outcome=outcome))
    return outcome


# -- public entry points -----------------------------------------------------------------------


def process_batch(
    calls: list[ToolCall],
    tools: ToolSet,
    ledger: Ledger,
    *,
    can_ask: bool,
    tail: Callable[[list[CallOutcome]], Sequence[Op]] | None = None,
    exclusive: bool = False,
    claim_timeout: float = DEFAULT_CLAIM_TIMEOUT,
) -> _Gen:
    """The generator behind ``run_tool_uses``. The agent drives it with a ``tail`` (the
    checkpoint that commits together with the batch's last outcome) and ``exclusive`` (it holds
    the session's lease, so a ``started`` record can only be a previous holder's: in doubt)."""
    env = _Env(
        tools=tools,
        ledger=ledger,
        can_ask=can_ask,
        exclusive=exclusive,
        claim_timeout=claim_timeout,
    )
    return _process(calls, env, tail)


def _prepare(
    content: Any, tools: ToolSet | Sequence[Any], ledger: Ledger
) -> tuple[list[ToolCall], ResultShape, ToolSet]:
    if not isinstance(ledger, Ledger):
        raise ConfigurationError(
            f"ledger= must be a toolledger Ledger (store.ledger(session_id)), not "
            f"{type(ledger).__name__}"
        )
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
    claim_timeout: float = DEFAULT_CLAIM_TIMEOUT,
) -> list[dict[str, Any]]:
    """Run the ``tool_use`` blocks of ``content`` through the ledger; return their
    ``tool_result`` blocks, in order, ready to send as the next user message.

    For each call (DESIGN.md rules 1-7): a finished record answers it without running anything or
    asking anyone; a high-impact call asks ``approve``; the intent is durable before a call whose
    re-run is unsafe runs, and the outcome the instant it returns. A call found in doubt is
    re-run only when that is safe, settled by the tool's ``check``, or put to the approver;
    otherwise it answers ``is_error`` and stays in doubt for a person.

    Raises ``LedgerMismatchError`` (before running anything) when an id is recorded with another
    tool or input, ``MalformedContentError`` for content it cannot read, and
    ``EffectInProgressError`` when another worker is running a call right now (a live process of
    this host, or another host's claim younger than ``claim_timeout`` seconds; older ones are in
    doubt). A failed ledger write after a
    tool succeeded is *not* raised: the real result is returned and the alert goes to the
    ``toolledger`` logger and ``on_alert``.
    """
    calls, shape, toolset = _prepare(content, tools, ledger)
    named = {c.name for c in calls}
    refuse_async_in_loop([t for t in toolset if t.name in named], "run_tool_uses")
    gen = process_batch(
        calls, toolset, ledger, can_ask=approve is not None, claim_timeout=claim_timeout
    )
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
    claim_timeout: float = DEFAULT_CLAIM_TIMEOUT,
) -> list[dict[str, Any]]:
    """The async twin of ``run_tool_uses``: same rules, same results. ``async def`` tools,
    checks and approvers are awaited; plain ones run in a worker thread."""
    calls, shape, toolset = _prepare(content, tools, ledger)
    gen = process_batch(
        calls, toolset, ledger, can_ask=approve is not None, claim_timeout=claim_timeout
    )
    io = IOContext(
        store=ledger.store, session_id=ledger.session_id, approve=approve, on_alert=on_alert
    )
    return (await adrive(gen, io)).results(shape)
