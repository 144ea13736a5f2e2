"""The transitions of a call, as the pure functions of ``toolledger.engine._decide``: given what the
ledger holds, what the tool declares and what the last step answered, what happens next. No
store, no clock: each test is the function and its answer."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

import toolledger as tl
from toolledger.codec import input_hash
from toolledger.engine import _decide as decide
from toolledger.engine import _messages as messages
from toolledger.records import SAFE_RERUN, EffectRecord, Status, ToolCall

CALL = ToolCall(
    tool_use_id="toolu_1", name="send", input={"to": "x"}, input_hash=input_hash({"to": "x"})
)


def _tool(**declared: Any) -> tl.Tool[Any, Any]:
    @tl.tool(**declared)
    def send(to: str) -> str:
        return to

    return send


def _record(status: Status, *, attempt: int = 1, error: str | None = None) -> EffectRecord:
    return EffectRecord(
        session_id="s",
        tool_use_id=CALL.tool_use_id,
        tool=CALL.name,
        input_hash=CALL.input_hash,
        status=status,
        attempt=attempt,
        error=error,
        created_at=100.0,
        updated_at=101.0,
        worker="host:1",
        deadline=130.0,
    )


def _first(record: EffectRecord | None, tool: Any, **kw: Any) -> decide.Action:
    kw.setdefault("input_error", None)
    kw.setdefault("can_ask", True)
    return decide.first_step(record, tool, CALL, available=["send"], **kw)


# -- first step ----------------------------------------------------------------------------------


def test_first_step_replays_a_finished_record_before_anything_else() -> None:
    done = _record(Status.SUCCEEDED)
    assert _first(done, None) == decide.Replay(done)
    assert _first(done, _tool(high_impact=True), input_error="bad") == decide.Replay(done)


def test_first_step_of_a_fresh_call() -> None:
    assert _first(None, _tool()) == decide.Run(in_doubt=False)
    ask = _first(None, _tool(high_impact=True))
    assert isinstance(ask, decide.Ask) and not ask.in_doubt and ask.settled is None
    assert isinstance(_first(None, None), decide.Reject)
    assert _first(None, _tool(), input_error="bad input") == decide.Reject(
        "bad input. Not executed."
    )


def test_first_step_of_an_in_doubt_call_follows_rule_6_in_order() -> None:
    started = _record(Status.STARTED)
    assert _first(started, _tool(effect="idempotent")) == decide.Run(in_doubt=True)
    checked = _tool()
    checked.check(lambda to: None)
    assert _first(started, checked) == decide.Check()
    ask = _first(started, _tool())
    assert isinstance(ask, decide.Ask) and ask.in_doubt
    assert isinstance(_first(started, _tool(), can_ask=False), decide.Unresolved)
    assert isinstance(_first(started, None), decide.Unresolved)


# -- the approver's answer -----------------------------------------------------------------------


def test_after_approval_of_a_fresh_call() -> None:
    ask = decide.Ask(in_doubt=False, reason="high-impact")
    assert decide.after_approval(CALL, ask, tl.Decision(approved=True, by="ana")) == decide.Run(
        in_doubt=False, approved_by="ana"
    )
    denied = decide.after_approval(CALL, ask, tl.Decision(approved=False, by="ana"))
    assert denied == decide.Decline(messages.denied_message("send", "ana"))
    pending = decide.after_approval(CALL, ask, tl.Decision(approved=False, pending=True))
    assert isinstance(pending, decide.Await) and "awaiting approval" in pending.message
    assert decide.after_approval(CALL, ask, None) == decide.Decline(
        messages.no_approver_message("send")
    )


def test_after_approval_of_an_in_doubt_call() -> None:
    ask = decide.Ask(in_doubt=True, reason="interrupted")
    run = decide.after_approval(CALL, ask, tl.Decision(approved=True, by="ana", rerun=True))
    assert run == decide.Run(
        in_doubt=True, approved_by="ana", settled="an approver (ana) allowed running it again"
    )
    # A plain yes approves a first run: a call in doubt stays in doubt (docs/design.md, rule 21).
    plain = decide.after_approval(CALL, ask, tl.Decision(approved=True, by="ana"))
    assert isinstance(plain, decide.Unresolved) and "plain yes" in plain.message
    # A yes that names a re-run is a plain yes to a call that is not in doubt.
    first = decide.Ask(in_doubt=False, reason="high impact")
    assert decide.after_approval(CALL, first, tl.Decision(approved=True, rerun=True)) == (
        decide.Run(in_doubt=False, approved_by=None)
    )
    # "Do not run it again" is not "it did not happen": it stays in doubt, nothing is recorded.
    no = decide.after_approval(CALL, ask, tl.Decision(approved=False, by="ana"))
    assert isinstance(no, decide.Unresolved) and "declined by ana" in no.message


def test_what_a_check_learnt_survives_the_approval() -> None:
    ask = decide.after_check_not_found(_tool(high_impact=True), CALL)
    assert isinstance(ask, decide.Ask) and ask.settled == "its check found no trace of it"
    run = decide.after_approval(CALL, ask, tl.Decision(approved=True, by="ana"))
    assert run == decide.Run(
        in_doubt=False, approved_by="ana", settled="its check found no trace of it"
    )


# -- the check's answer --------------------------------------------------------------------------


def test_after_check() -> None:
    tool = _tool()
    assert decide.after_check(tool, CALL, raised=None, found=True) == decide.Found()
    assert decide.after_check(tool, CALL, raised=None, found=False) == decide.Run(
        in_doubt=False, settled="its check found no trace of it"
    )
    failed = decide.after_check(tool, CALL, raised=TimeoutError("slow"), found=False)
    assert isinstance(failed, decide.Unresolved) and "its check raised" in failed.message


# -- one step at a time: the function the runner asks ---------------------------------------------


def _facts(record: EffectRecord | None, tool: Any, **kw: Any) -> decide.Facts:
    kw.setdefault("input_error", None)
    kw.setdefault("can_ask", True)
    return decide.Facts(record=record, tool=tool, call=CALL, available=["send"], **kw)


def _checked_tool(**declared: Any) -> tl.Tool[Any, Any]:
    tool = _tool(**declared)

    @tool.check
    def _(to: str) -> str | None:
        return None

    return tool


def test_step_walks_a_high_impact_call_in_doubt_through_its_check_and_its_approver() -> None:
    """The whole conversation of a call, as one function of what is known: each answer added to
    the facts gives the next step, and the same facts always give the same step."""
    tool = _checked_tool(high_impact=True)
    facts = _facts(_record(Status.STARTED), tool)
    assert decide.step(facts) == decide.Check() == decide.step(facts)
    not_there = decide.Checked(raised=None, found=False)
    asked = decide.step(replace(facts, checked=not_there))
    assert isinstance(asked, decide.Ask) and not asked.in_doubt
    assert asked.settled == "its check found no trace of it"
    yes = tl.Decision(approved=True, by="ana")
    assert decide.step(replace(facts, checked=not_there, approval=yes)) == decide.Run(
        in_doubt=False, approved_by="ana", settled="its check found no trace of it"
    )
    there = decide.Checked(raised=None, found=True)
    assert decide.step(replace(facts, checked=there)) == decide.Found()
    # An approval given before the check answered does not skip the check.
    assert decide.step(replace(facts, approval=yes)) == decide.Check()


def test_step_of_a_fresh_high_impact_call() -> None:
    facts = _facts(None, _tool(high_impact=True))
    assert isinstance(decide.step(facts), decide.Ask)
    no = tl.Decision(approved=False, by="ana")
    assert decide.step(replace(facts, approval=no)) == decide.Decline(
        messages.denied_message("send", "ana")
    )
    # With nobody to ask, the question is never put: the call is declined at once.
    assert decide.step(replace(facts, can_ask=False)) == decide.Decline(
        messages.no_approver_message("send")
    )


def test_step_of_an_in_doubt_call_needs_a_yes_that_says_rerun() -> None:
    facts = _facts(_record(Status.STARTED), _tool())
    ask = decide.step(facts)
    assert isinstance(ask, decide.Ask) and ask.in_doubt
    plain = decide.step(replace(facts, approval=tl.Decision(approved=True, by="ana")))
    assert isinstance(plain, decide.Unresolved) and "plain yes" in plain.message
    rerun = tl.Decision(approved=True, by="ana", rerun=True)
    assert decide.step(replace(facts, approval=rerun)) == decide.Run(
        in_doubt=True, approved_by="ana", settled="an approver (ana) allowed running it again"
    )
    # A finished record is replayed whatever was answered.
    done = _record(Status.SUCCEEDED)
    assert decide.step(replace(facts, record=done, approval=rerun)) == decide.Replay(done)


# -- a tool's exception --------------------------------------------------------------------------


@pytest.mark.parametrize("intended", [True, False])
def test_after_failure(intended: bool) -> None:
    failed = decide.after_failure("send", ValueError("no such address"), intended=intended)
    assert not failed.in_doubt and failed.message == failed.error
    assert failed.message == messages.failed_message("send", ValueError("no such address"))


def test_a_tool_that_cannot_tell_leaves_a_recorded_attempt_in_doubt() -> None:
    unknown = tl.OutcomeUnknown("the connection dropped")
    failed = decide.after_failure("send", unknown, intended=True)
    assert failed.in_doubt and failed.error.startswith("in doubt: ")
    assert "may already have happened" in failed.message
    # Without an intent nothing says it started: it failed.
    assert not decide.after_failure("send", unknown, intended=False).in_doubt


# -- the history a new attempt carries -----------------------------------------------------------


def test_settled_by_and_history() -> None:
    started = _record(Status.STARTED)
    assert decide.settled_by(None, _tool()) == ""
    assert decide.settled_by(started, _tool()) == "in doubt"
    assert decide.settled_by(started, _tool(effect="idempotent")).startswith(SAFE_RERUN)
    resolved = _record(Status.NOT_HAPPENED, error="a person said so")
    assert decide.settled_by(resolved, _tool()) == "a person said so"
    assert decide.history(None, "x") == ()
    (past,) = decide.history(started, "in doubt")
    assert (past.attempt, past.worker, past.at, past.deadline, past.settled) == (
        1,
        "host:1",
        101.0,
        130.0,
        "in doubt",
    )
    assert decide.history(_record(Status.FAILED), "x") == ()
