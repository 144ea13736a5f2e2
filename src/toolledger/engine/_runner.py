"""``run_tool_uses`` / ``arun_tool_uses``: the ledger gate, the approval gate, then the tool.

The sequence lives once, in ``_process``, a generator that *yields* every piece of I/O it needs
(read records, commit writes, ask the approver, call a function) and receives the answer. The
sync and async drivers only carry those requests out, so the two cannot drift apart. What to do
at each step is decided by the pure functions of ``toolledger.engine._decide``; this module only
sequences their I/O. Running one attempt is ``toolledger.engine._attempt``; when each write must be
durable, and what happens when it cannot be written as it stands, ``toolledger.engine._outcomes``.

The common call (fresh, its tool known, writing its intent, nothing to ask) takes
``toolledger.engine._straight``: the same writes in fewer steps, anything else handed back here.

A ``started`` record is settled only when its attempt is provably over (``toolledger._liveness``):
while it may still run — in another thread, process, worker or host — every path says
``EffectInProgressError`` and touches nothing. So one non-idempotent call costs two commits
(intent, outcome), a safe one costs one.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import replace
from typing import Any, assert_never

from .. import _switches as switches
from ..errors import EffectInProgressError
from ..ops import Op
from ..records import EffectRecord, Status, ToolCall
from ..stores.store import Ledger
from ..tools import InputError, ToolSet
from . import _answers as answers
from . import _decide as decide
from . import _straight as straight
from . import _telemetry as telemetry
from ._attempt import Again, context, run
from ._claims import (
    before_making,
    claims,
    lineage_root,
    look_up,
    looks_up,
    pinned,
    take_over,
    to_claim,
)
from ._copies import defer
from ._drivers import (
    Ask,
    Failure,
    Invoke,
    IOContext,
    ReadEffects,
    Request,
    drive,
)
from ._gate import Decision
from ._messages import held_back
from ._outcomes import (
    Batch,
    Buffer,
    Buffered,
    CallOutcome,
    Disposition,
    Env,
    ahead,
    flush,
    flush_now,
    given_up,
    write,
)
from ._started import settled_or_over

__all__ = ["Disposition", "process_batch", "run_batch"]

_Gen = Generator[Request, Any, "Batch"]


# -- the sequence, once --------------------------------------------------------------------------


def _common(calls: list[ToolCall], env: Env) -> straight.Plan | None:
    """The batch's one call as the common call (``toolledger.engine._straight``), or ``None``."""
    return straight.plan(calls[0], env) if len(calls) == 1 and switches.STRAIGHT else None


def _process(
    calls: list[ToolCall],
    env: Env,
    tail: Callable[[list[CallOutcome]], Sequence[Op]] | None,
    head: Sequence[Op],
    common: straight.Plan | None,
) -> _Gen:
    # One call alone may write first (``_decide``): its insert-if-absent intent is refused by a
    # record already there, which is read then. Several are read together before anything runs,
    # so that rule 7 holds for the whole message. Checkpoint A (``head``) rides in the common
    # call's intent (``common``: ``_common``, planned by the caller); any other batch commits it
    # first.
    unread = len(calls) == 1
    if head and common is None:
        yield from ahead(head)
    found: dict[str, EffectRecord] = (
        {} if unread else (yield ReadEffects([c.tool_use_id for c in calls]))
    )
    for call in calls:  # rule 7, checked for the whole message before anything runs
        record = found.get(call.tool_use_id)
        if record is not None:
            _same_call(record, call, env)
    buf = Buffer()
    try:
        outcomes: list[CallOutcome] = []
        for call in calls:
            try:
                record = found.get(call.tool_use_id)
                done = yield from _one(call, record, env, buf, unread, common=common, head=head)
                outcomes.append(done)
            except Exception:
                # A later call of the message raised (the store went away while it was being
                # decided, another attempt holds it): the outcomes of the calls that already
                # ran are written — or alerted — before the error goes up, never dropped.
                if any(i.urgent for i in buf.items):
                    yield from flush(buf, env, [])
                raise
        unwritten = [
            o.call.tool_use_id
            for o in outcomes
            if o.alert is not None and o.alert.cause is not None
        ]
        if tail is not None and unwritten:
            # An outcome whose write failed earlier in this batch (the store failed) is not in
            # the ledger yet: a checkpoint reporting it would be a transcript claiming a success
            # its ledger lacks, for good if this process dies first. The checkpoint waits; the
            # next run answers from the ledger once the write lands, or finds the call in doubt.
            if buf.items:
                yield from flush(buf, env, [])
            refused = held_back(env.session_id, env.url, unwritten, buf.kept)
            return Batch(outcomes, commit_error=refused)
        extra = list(tail(outcomes)) if tail is not None else []
        error = None
        if buf.items or extra:
            error = (yield from flush(buf, env, extra)).error
        return Batch(outcomes, commit_error=error if extra else None)
    finally:
        given_up(env, buf)  # an exception: attempts whose outcome never committed
        if buf.spans:
            telemetry.end_spans(buf.spans)  # after the outcomes' commit


def _same_call(record: EffectRecord, call: ToolCall, env: Env) -> None:
    """Rule 7: ``record`` must be this call's (same tool, same input)."""
    decide.refuse_mismatch(
        record,
        call,
        env.session_id,
        f"in session {env.session_id!r}. Nothing was run. The transcript was edited or two runs "
        "share a session name.",
    )


def _one(
    call: ToolCall,
    record: EffectRecord | None,
    env: Env,
    buf: Buffer,
    unread: bool,
    *,
    common: straight.Plan | None,
    head: Sequence[Op],
) -> Generator[Request, Any, CallOutcome]:
    """``unread``: the call's record was not read (it may exist). ``common``: it takes the
    straight path, with checkpoint A (``head``). The call's span (when tracing) is current
    while it is decided and run."""
    if not telemetry.watching():
        return (yield from _decided(call, record, env, buf, unread, common=common, head=head))
    tool = env.tools.get(call.name)
    effect = None if tool is None else tool.effect._value_  # (``.value`` is a Python property)
    span = telemetry.tool_span(env.session_id, call, effect)
    token = telemetry.enter(span)
    try:
        outcome = yield from _decided(call, record, env, buf, unread, common=common, head=head)
    except BaseException as exc:
        telemetry.tool_failed(span, exc)
        raise
    finally:
        telemetry.leave(token)
    if buf.spans is None:
        buf.spans = []
    telemetry.tool_done(span, outcome, effect, call.name, buf.spans)
    return outcome


def _decided(
    call: ToolCall,
    record: EffectRecord | None,
    env: Env,
    buf: Buffer,
    unread: bool,
    *,
    common: straight.Plan | None,
    head: Sequence[Op],
) -> Generator[Request, Any, CallOutcome]:
    """The call decided and carried out (``_one``, inside its span)."""
    if common is None:
        return (yield from _settle(call, record, env, buf, unread))
    done = yield from straight.call(common, env, buf, head)  # the common call (``_straight``)
    if isinstance(done, Again):  # its intent met a record: decided from it
        _same_call(done.record, call, env)
        done = yield from _settle(call, done.record, env, buf, False, tried=1)
    return done


def _settle(
    call: ToolCall,
    record: EffectRecord | None,
    env: Env,
    buf: Buffer,
    unread: bool,
    *,
    tried: int = 0,
) -> Generator[Request, Any, CallOutcome]:
    for _ in range(_RESTARTS - tried):  # ``tried``: started over already (the straight path)
        done = yield from _decide(call, record, env, buf, unread)
        if not isinstance(done, Again):
            return done
        if unread:
            _same_call(done.record, call, env)  # seen for the first time: nothing ran yet
        record, unread = done.record, False
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
    call: ToolCall, record: EffectRecord | None, env: Env, buf: Buffer, unread: bool = False
) -> Generator[Request, Any, CallOutcome | Again]:
    """Carry out what ``decide`` says of ``call``, one transition after another, until it is
    answered or runs.

    ``unread``: the record was not read. A call that would run at once with an intent writes
    first — its intent is insert-if-absent, so a record already there refuses it and is read
    then (``Again``): one statement less for the common case, and on a server one round trip.
    Any other call reads its record first (rule 1: the ledger before the tool or the approver).
    """
    if (
        record is not None
        and record.copied
        and not record.status.terminal
        and not (yield from pinned(record, env.tools.get(call.name), env))
    ):
        # A branch's copy of its lineage's call: its origin settles it
        # (``toolledger.engine._copies``).
        # Returned as it is, its origin no longer holds the call: its attempt as copied is over.
        deferred = yield from defer(call, record, env, buf)
        if isinstance(deferred, CallOutcome):
            return deferred
        tool = env.tools.get(call.name)
        if not deferred.status.terminal and claims(tool):
            # The session it stood for gave it up: it runs here once the lineage's claim is
            # this session's, else it is decided again from where the call is now.
            deferred, here = yield from take_over(call, deferred, env, buf)
            if not here:
                return Again(deferred)
        elif not deferred.status.terminal and looks_up(tool) and deferred.origin is not None:
            # Handed back, a key-forwarding call is looked up in the lineage's first session,
            # as a fresh one is: that record answers, else it runs here under that one's key.
            root = yield from lineage_root(env)
            if root is not None and root != deferred.origin:
                held = yield from look_up(call, deferred, root, env)
                if held is not None:
                    return Again(held)
        record = deferred
    elif record is not None and record.status is Status.STARTED:
        record = yield from settled_or_over(call, record, env, buf)
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
    # ``decide.step`` of facts with no answers yet: the call's first step.
    action = decide.first_step(
        record, tool, call, input_error=input_error, available=env.tools.names, can_ask=env.can_ask
    )
    if to_claim(record, tool, action, env):  # a branch's call, made here first
        held, unread = yield from before_making(call, record, env, unread)
        if held is not None:
            return Again(held)
    if unread and not decide.writes_first(action, tool):
        looked: dict[str, EffectRecord] = yield ReadEffects([call.tool_use_id])
        record = looked.get(call.tool_use_id)
        if record is not None:
            return Again(record)
    if isinstance(action, decide.Run):  # the common call: nothing to ask, straight to its attempt
        assert tool is not None
        return (
            yield from run(
                call, tool, kwargs, record=record, action=action, consume=None, env=env, buf=buf
            )
        )
    facts = decide.Facts(
        record=record,
        tool=tool,
        call=call,
        input_error=input_error,
        available=env.tools.names,
        can_ask=env.can_ask,
    )
    return (yield from _steps(facts, kwargs, env, buf))


def _steps(
    facts: decide.Facts, kwargs: dict[str, Any], env: Env, buf: Buffer
) -> Generator[Request, Any, CallOutcome | Again]:
    """Ask ``decide.step`` for the call's next step, carry it out, add what it was answered to
    ``facts``, and ask again: until the call runs or is answered."""
    call, record, tool = facts.call, facts.record, facts.tool
    consume: Op | None = None  # the approval the run uses up, with its intent
    answer: Any = None  # what the check returned
    while True:
        match action := decide.step(facts):
            case decide.Run():
                assert tool is not None
                return (
                    yield from run(
                        call,
                        tool,
                        kwargs,
                        record=record,
                        action=action,
                        consume=consume,
                        env=env,
                        buf=buf,
                    )
                )
            case decide.Replay():
                return answers.replayed(call, action.record)
            case decide.Reject():
                return CallOutcome(call, Disposition.REJECTED, action.message, is_error=True)
            case decide.Unresolved():
                attempt = None if record is None else record.attempt
                return CallOutcome(
                    call, Disposition.IN_DOUBT, action.message, is_error=True, attempt=attempt
                )
            case decide.Await():
                return CallOutcome(
                    call,
                    Disposition.AWAITING_APPROVAL,
                    action.message,
                    is_error=True,
                    in_doubt=action.in_doubt,
                )
            case decide.Decline():
                denied = answers.denied(env, call, record, action.message)
                # Recorded so it is not asked again; losing it would only mean asking again.
                buf.items.append(Buffered(write(denied, record), urgent=False, outcome=None))
                return CallOutcome(call, Disposition.DECLINED, action.message, is_error=True)
            case decide.Found():
                assert record is not None
                return answers.found(call, answer, record, env, buf)
            case decide.Ask():
                if buf.urgent:
                    yield from flush(buf, env, [])  # a person may take minutes: nothing waits
                decision: Decision = yield Ask(answers.request(call, record, action, env))
                if not decision.pending:
                    consume = answers.consume(env, decision)
                facts = replace(facts, approval=decision)
            case decide.Check():
                assert tool is not None and record is not None
                if buf.urgent:
                    yield from flush(buf, env, [])  # a check may take minutes: nothing waits
                ctx = context(
                    env, call, in_doubt=True, attempt=record.attempt, tool=tool, record=record
                )
                answer = yield Invoke(
                    tool.check_invocation(kwargs, ctx), tool.check_is_async, ctx=ctx, check=True
                )
                raised = answer.exc if isinstance(answer, Failure) else None
                facts = replace(facts, checked=decide.Checked(raised, found=answer is not None))
            case _:
                assert_never(action)


_RESTARTS = 5


# -- public entry points -----------------------------------------------------------------------


def run_batch(
    calls: list[ToolCall],
    tools: ToolSet,
    ledger: Ledger,
    io: IOContext,
    *,
    can_ask: bool,
    wait: float,
) -> Batch:
    """The batch of ``run_tool_uses``, carried out synchronously. The common call alone
    (``toolledger.engine._straight``) runs with no generator or driver around it — what
    ``_process`` and ``_one`` do for it, done here: its intent's commit, its tool and its
    outcome's commit called in turn (``straight.run``, ``flush_now``), any answer but the common
    one handed to the general path's own functions, driven. Any other batch is ``_process``,
    driven."""
    env = Env(tools=tools, ledger=ledger, can_ask=can_ask, wait=wait)
    common = _common(calls, env)
    if common is None:
        return drive(_process(calls, env, None, (), None), io)
    buf = Buffer()
    try:
        try:
            done = _one_now(common, env, buf, io)
        except Exception:
            if buf.urgent:  # its outcome is written — or alerted — before the error goes up
                drive(flush(buf, env, []), io)
            raise
        if buf.items:
            flush_now(buf, env, io)
        return Batch([done])
    finally:
        given_up(env, buf)  # an exception: attempts whose outcome never committed
        if buf.spans:
            telemetry.end_spans(buf.spans)  # after the outcome's commit


def _one_now(common: straight.Plan, env: Env, buf: Buffer, io: IOContext) -> CallOutcome:
    """``_one`` of the common call, carried out synchronously (``straight.run``)."""
    if not telemetry.watching():
        return _decided_now(common, env, buf, io)
    call = common.call
    effect = common.tool.effect._value_
    span = telemetry.tool_span(env.session_id, call, effect)
    token = telemetry.enter(span)
    try:
        done = _decided_now(common, env, buf, io)
    except BaseException as exc:
        telemetry.tool_failed(span, exc)
        raise
    finally:
        telemetry.leave(token)
    if buf.spans is None:
        buf.spans = []
    telemetry.tool_done(span, done, effect, call.name, buf.spans)
    return done


def _decided_now(common: straight.Plan, env: Env, buf: Buffer, io: IOContext) -> CallOutcome:
    """``_decided`` of the common call, carried out synchronously."""
    done = straight.run(common, env, buf, io)
    if isinstance(done, Again):  # its intent met a record: decided from it
        _same_call(done.record, common.call, env)
        done = drive(_settle(common.call, done.record, env, buf, False, tried=1), io)
    return done


def process_batch(
    calls: list[ToolCall],
    tools: ToolSet,
    ledger: Ledger,
    *,
    can_ask: bool,
    tail: Callable[[list[CallOutcome]], Sequence[Op]] | None = None,
    wait: float = 0.0,
    lease_token: int | None = None,
    head: Sequence[Op] = (),
) -> _Gen:
    """The generator behind ``run_tool_uses``. The agent drives it with a ``head`` and a
    ``tail`` (its checkpoints A and B, committed with the batch's first intent — or before
    anything runs — and with its last outcome) and its ``lease_token`` (so its intents say
    which lease they ran under)."""
    env = Env(tools=tools, ledger=ledger, can_ask=can_ask, wait=wait, lease_token=lease_token)
    return _process(calls, env, tail, head, _common(calls, env))
