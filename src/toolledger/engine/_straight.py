"""The common call, written straight: one call of a known tool that writes its intent, with valid
input, nothing to ask, no branch to claim it for, and no record read — a fresh call.

It does what the general path (``toolledger.engine._runner._decide`` → ``_attempt.run``) does
for that call, in the same order, with the same records and the same writes: the intent
registered in flight and committed insert-if-absent, the tool called, its outcome buffered.
Only the decisions that cannot apply are skipped, and each step's common answer is handled
inline; every other answer — a refused or failed intent, a record already there — is handed
to the general path's own functions (``_attempt.after_intent``, ``_outcomes.flush``), so there
is one meaning of each, not two. ``plan`` says whether a call is the common one without any
I/O; ``call`` carries it out as part of the engine's generator (the agent's turn,
``arun_tool_uses``); ``run`` carries it out for ``run_tool_uses`` with no generator at all, its
uncommon answers handed to ``call``'s own continuation (``_answered``), driven.

``toolledger._switches.STRAIGHT`` off (``TOOLLEDGER_GENERAL_PATH=1``) sends every call down the
general path: the test suites run both (docs/architecture.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

from .._crash import hit as crash_point
from ..ops import InsertEffect, Op, Reading
from ..records import EffectRecord, ToolCall
from ..tools import InputError, Tool
from . import _decide as decide
from ._attempt import (
    CLOCK_TRIES,
    Again,
    after_intent,
    intent_of,
    invocation,
    ran,
    recorded_then_raised,
    set_at,
    unsent,
)
from ._claims import to_claim
from ._drivers import (
    CancelledAfterAnswer,
    Commit,
    Invoke,
    IOContext,
    Request,
    commit_now,
    drive,
    invoke_now,
)
from ._outcomes import (
    Buffer,
    CallOutcome,
    Env,
    Flushed,
    clock_moved,
    flush,
    hold_while_it_may_run,
)
from ._reconcile import commit

__all__ = ["Plan", "call", "plan", "run"]


@dataclass(frozen=True, slots=True)
class Plan:
    """A call that takes the straight path, with what deciding it found."""

    call: ToolCall
    tool: Tool[Any, Any]
    kwargs: dict[str, Any]
    action: decide.Run


def plan(call: ToolCall, env: Env) -> Plan | None:
    """``call`` as the common call, or ``None``: the general path decides it. No I/O, nothing
    written — exactly the facts ``_runner._decide`` looks at for a call whose record is unread,
    and the answers under which it would write the intent first and run."""
    tool = env.tools.get(call.name)
    # A safe call writes no intent; a high-impact one asks first (``first_step``): neither goes
    # straight, and neither has its input validated here only to be validated again.
    if tool is None or call.problem is not None or tool.rerun_safe or tool.high_impact:
        return None
    try:
        kwargs = tool.validate(call.input)
    except InputError:
        return None
    action = decide.first_step(
        None, tool, call, input_error=None, available=env.tools.names, can_ask=env.can_ask
    )
    if not isinstance(action, decide.Run) or to_claim(None, tool, action, env):
        return None
    return Plan(call, tool, kwargs, action)


# An attempt begun: its key in flight, its start (monotonic), its intent.
_Begun = tuple[tuple[str, str, str], float, EffectRecord]


def call(
    p: Plan, env: Env, buf: Buffer, head: Sequence[Op] = ()
) -> Generator[Request, Any, CallOutcome | Again]:
    """Run the planned call: its outcome (its write buffered), or ``Again`` with the record its
    intent met — the general path decides from there.

    ``head``: the agent's checkpoint A, not yet written. The intent rides in its commit — one
    durable write instead of two, and no instant at which one is durable without the other —
    and if that commit fails, the error is raised as checkpoint A's (``_outcomes.ahead``):
    nothing ran, and nothing of the turn is durable."""
    begun = _intend(p, env, buf)
    sent: list[Op] = [*head, InsertEffect(begun[2], _at(p, env, begun))]
    answer = yield Commit(sent)
    tries = CLOCK_TRIES - 1
    while type(answer) is not list and tries:
        answer = yield from commit(sent, answered=answer)  # an unknown outcome, reconciled
        if clock_moved(answer) is None:
            break
        begun = _anew(p, env, buf, begun)
        sent = [*head, InsertEffect(begun[2], _at(p, env, begun))]
        answer = yield Commit(sent)
        tries -= 1
    return (yield from _answered(p, env, buf, head=head, sent=sent, answer=answer, begun=begun))


def run(p: Plan, env: Env, buf: Buffer, io: IOContext) -> CallOutcome | Again:
    """``call`` for ``run_tool_uses`` (no checkpoint, no lease), carried out synchronously:
    the intent's commit and the tool called here, with no request or driver in between. An
    intent's answer other than the common one — refused, failed, unconfirmed — is handed to
    ``call``'s own continuation, driven: one meaning of each."""
    begun = key, began, intent = _intend(p, env, buf)
    checks = env.ledger.store.checks_clock  # the clock reading an intent carries, if it is
    sent: list[Op] = [InsertEffect(intent, set_at(intent, p.tool) if checks else None)]
    answer = commit_now(io, sent)
    tries = CLOCK_TRIES - 1
    while type(answer) is not list and tries:
        answer = drive(commit(sent, answered=answer), io)  # an unknown outcome, reconciled
        if clock_moved(answer) is None:
            break
        begun = key, began, intent = _anew(p, env, buf, begun)
        sent = [InsertEffect(intent, _at(p, env, begun))]
        answer = commit_now(io, sent)
        tries -= 1
    if type(answer) is not list or not answer[-1]:
        return drive(_answered(p, env, buf, head=(), sent=sent, answer=answer, begun=begun), io)
    crash_point("after_intent")
    invoke = _invocation(p, env, intent, began)
    buf.unrun.discard(key)  # from here on, the tool may have been called
    answered = invoke_now(invoke)
    return _ran(p, env, buf, answered, intent=intent, key=key)


def _intend(p: Plan, env: Env, buf: Buffer) -> _Begun:
    """The attempt's key in flight, its start on this process's monotonic clock, and its
    intent — registered in flight before it is durable (``_attempt._intend``)."""
    call = p.call
    runtime = env.ledger.store.runtime
    key = env.flight(call)
    began = runtime.monotonic()
    intent = intent_of(
        call, p.tool, None, attempt=1, history=(), approved_by=p.action.approved_by, env=env
    )
    runtime.in_flight.add(key)
    buf.flights.append(key)
    buf.intents[key] = intent
    buf.unrun.add(key)  # a fresh call: nothing before it may have taken effect
    buf.ends[key] = began + p.tool.timeout
    return key, began, intent


def _at(p: Plan, env: Env, begun: _Begun) -> Reading | None:
    """The clock reading the intent of ``begun`` carries, to a store that checks it."""
    return set_at(begun[2], p.tool) if env.ledger.store.checks_clock else None


def _anew(p: Plan, env: Env, buf: Buffer, begun: _Begun) -> _Begun:
    """The attempt ``begun``, its intent built anew: a shared clock refused the one sent
    (``ClockMovedError``: nothing landed) and has been read again."""
    key, began, _ = begun
    intent = intent_of(
        p.call, p.tool, None, attempt=1, history=(), approved_by=p.action.approved_by, env=env
    )
    buf.intents[key] = intent
    return key, began, intent


def _answered(
    p: Plan,
    env: Env,
    buf: Buffer,
    *,
    head: Sequence[Op],
    sent: list[Op],
    answer: Any,
    begun: _Begun,
) -> Generator[Request, Any, CallOutcome | Again]:
    """The commit of the intent (after ``head``) was answered ``answer``: the tool called
    once it is durable, or the general path's answer when it is not."""
    key, began, intent = begun
    if type(answer) is list and answer[-1]:  # a guard (checkpoint A) that fails raises
        if head:
            crash_point("after_checkpoint_a")
        crash_point("after_intent")
    else:
        flushed = yield from flush(buf, env, sent, answered=answer)
        if head:
            if flushed.error is not None:
                yield from unsent(flushed.error, intent, key=key, env=env, buf=buf)
                raise flushed.error
            crash_point("after_checkpoint_a")
            flushed = Flushed(None, flushed.extra_applied[len(head) :])
        done = yield from after_intent(
            flushed, p.call, intent, record=None, key=key, env=env, buf=buf
        )
        if isinstance(done, CallOutcome | Again):
            return done
    invoke = _invocation(p, env, intent, began)
    buf.unrun.discard(key)  # from here on, the tool may have been called
    try:
        answered = yield invoke
    except CancelledAfterAnswer as late:  # recorded, then the cancellation goes on
        _ran(p, env, buf, late.answer, intent=intent, key=key)
        yield from recorded_then_raised(late, env, buf)
    except asyncio.CancelledError:
        hold_while_it_may_run(env, key, began + p.tool.timeout, intent)
        raise
    return _ran(p, env, buf, answered, intent=intent, key=key)


def _invocation(p: Plan, env: Env, intent: EffectRecord, began: float) -> Invoke:
    """The tool's call (``_attempt.invocation``)."""
    return invocation(
        env,
        p.call,
        p.tool,
        p.kwargs,
        in_doubt=p.action.in_doubt,
        attempt=1,
        intent=intent,
        record=intent,
        began=began,
    )


def _ran(
    p: Plan,
    env: Env,
    buf: Buffer,
    answered: Any,
    *,
    intent: EffectRecord,
    key: tuple[str, str, str],
) -> CallOutcome:
    """The tool answered: its outcome, its write buffered (``_attempt.ran``)."""
    crash_point("before_record")
    return ran(
        p.call,
        p.tool,
        answered,
        intent=intent,
        record=None,
        attempt=1,
        history=(),
        approved_by=p.action.approved_by,
        key=key,
        env=env,
        buf=buf,
    )
