"""Pure decisions: given what the ledger holds, what the tool declares and what was answered so
far, what happens next.

No I/O here — no store, no clock (a time is passed in). ``step`` is the one function the runner
asks, once per step: from a call's ``Facts`` — its record, its tool, the call, and the answers
gathered so far (its check's, the approver's) — to the next ``Action``. Its parts are the
transitions: ``first_step`` (from the record), ``after_check`` (the check answered),
``after_approval`` (the approver answered); ``after_failure`` says how a call whose tool raised
ends. ``toolledger.engine._runner`` only carries the actions out, so the rules
(docs/design.md, rules 1-7) live in one place and cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..codec import describe
from ..errors import LedgerMismatchError, OutcomeUnknown
from ..records import SAFE_RERUN, EffectRecord, PastAttempt, Status, ToolCall
from ..tools import Tool
from ._gate import Decision
from ._messages import (
    denied_message,
    failed_message,
    in_doubt_message,
    no_approver_message,
    unknown_tool_message,
)

__all__ = [
    "Action",
    "Ask",
    "Await",
    "Check",
    "Checked",
    "Decline",
    "Facts",
    "Failed",
    "Found",
    "Reject",
    "Replay",
    "Run",
    "Unresolved",
    "after_approval",
    "after_check",
    "after_check_not_found",
    "after_failure",
    "first_step",
    "history",
    "mismatch",
    "refuse_mismatch",
    "settled_by",
    "step",
    "writes_first",
]


@dataclass(frozen=True, slots=True)
class Replay:
    """The ledger already answers this call: return the stored outcome, run nothing, ask no one."""

    record: EffectRecord


@dataclass(frozen=True, slots=True)
class Reject:
    """The call cannot run as asked (unknown tool, input not matching the schema). Nothing ran
    and nothing is recorded: the same call always gets the same answer."""

    message: str


@dataclass(frozen=True, slots=True)
class Ask:
    """Ask the approver. ``in_doubt``: the question is whether to run an in-doubt call again.
    ``settled``: how the attempt a run would replace counts as over, when this step learnt it."""

    in_doubt: bool
    reason: str
    settled: str | None = None


@dataclass(frozen=True, slots=True)
class Check:
    """In doubt, and the tool can tell: call its ``check`` and trust the answer."""


@dataclass(frozen=True, slots=True)
class Run:
    """Execute. ``in_doubt`` tells the tool an earlier attempt may have taken effect.
    ``approved_by``: the approver who allowed this run (``None``: nobody was asked now; the
    record's approval stands). ``settled``: how the attempt it replaces counts as over, when a
    step before learnt it (``None``: as ``settled_by`` says)."""

    in_doubt: bool
    approved_by: str | None = None
    settled: str | None = None


_RUN = Run(in_doubt=False)
_RERUN = Run(in_doubt=True)
"""A fresh call's run and an in-doubt one's re-run, made once: every call decides one (a
frozen value, so one object serves them all)."""


@dataclass(frozen=True, slots=True)
class Unresolved:
    """In doubt and nothing may decide it automatically: answer ``is_error`` and leave the record
    ``started`` for a person (``toolledger resolve``)."""

    message: str


@dataclass(frozen=True, slots=True)
class Decline:
    """Not approved, or there is no approver: answer ``is_error`` and record the denial, so the
    same call is not asked again."""

    message: str


@dataclass(frozen=True, slots=True)
class Await:
    """The approver queued the question for a person: nothing runs and nothing is recorded yet;
    the same call asks again (and finds the person's answer) later."""

    message: str
    in_doubt: bool = False  # the question is whether to run a call in doubt again


@dataclass(frozen=True, slots=True)
class Found:
    """In doubt, and its check found the effect: the call succeeded, with what the check returned
    as its result."""


Action = Replay | Reject | Ask | Check | Run | Unresolved | Decline | Await | Found


@dataclass(frozen=True, slots=True)
class Failed:
    """How a call whose tool raised ends. ``in_doubt``: the tool could not tell whether its effect
    happened (``OutcomeUnknown``) and its intent is recorded — the attempt is over, the call stays
    in doubt; else it failed. ``message`` is the model's answer, ``error`` the record's."""

    in_doubt: bool
    message: str
    error: str


@dataclass(frozen=True, slots=True)
class Checked:
    """What an in-doubt call's ``check`` answered: ``raised`` what it raised, else ``found``
    whether it returned something (the effect exists)."""

    raised: BaseException | None
    found: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Facts:
    """All that decides a call's next step: its ``record`` (``None``: none), its ``tool``
    (``None``: not in the toolset), the ``call``, why its input does not validate
    (``input_error``), the toolset's names, whether an approver can be asked, and the answers
    gathered so far — its check's (``checked``) and the approver's (``approval``)."""

    record: EffectRecord | None
    tool: Tool[Any, Any] | None
    call: ToolCall
    input_error: str | None
    available: list[str]
    can_ask: bool
    checked: Checked | None = None
    approval: Decision | None = None


def step(facts: Facts) -> Action:
    """The next step of a call, from everything known of it (a pure function: the same facts
    always give the same step). The runner asks once per step and adds each answer it gets
    (``Facts.checked``, ``Facts.approval``) to the facts before it asks again; a ``Run`` or an
    answer to the model ends the call's steps."""
    call, tool = facts.call, facts.tool
    action = first_step(
        facts.record,
        tool,
        call,
        input_error=facts.input_error,
        available=facts.available,
        can_ask=facts.can_ask,
    )
    if isinstance(action, Check) and facts.checked is not None:
        assert tool is not None  # only a known tool's check is called
        checked = facts.checked
        action = after_check(tool, call, raised=checked.raised, found=checked.found)
    if isinstance(action, Ask) and (facts.approval is not None or not facts.can_ask):
        action = after_approval(call, action, facts.approval)
    return action


def refuse_mismatch(record: EffectRecord, call: ToolCall, session_id: str, where: str) -> None:
    """Raise ``LedgerMismatchError`` when ``record`` is not this call's (rule 7): ``where``
    says in which session it is and how that came to be (what follows ``mismatch``'s why)."""
    why = mismatch(record, call)
    if why is not None:
        raise LedgerMismatchError(
            f"{why} {where}",
            session_id=session_id,
            tool_use_id=call.tool_use_id,
            recorded_tool=record.tool,
            recorded_input_hash=record.input_hash,
            tool=call.name,
            input_hash=call.input_hash,
        )


def mismatch(record: EffectRecord, call: ToolCall) -> str | None:
    """Why ``record`` cannot be this call's record (docs/design.md, rule 7), or ``None``."""
    if record.tool != call.name:
        return (
            f"tool_use id {call.tool_use_id!r} is recorded for tool {record.tool!r}, "
            f"not {call.name!r}"
        )
    if record.input_hash != call.input_hash:
        return (
            f"tool_use id {call.tool_use_id!r} is recorded for {record.tool!r} with another "
            f"input ({record.input_hash[:19]}…, now {call.input_hash[:19]}…)"
        )
    return None


def first_step(
    record: EffectRecord | None,
    tool: Tool[Any, Any] | None,
    call: ToolCall,
    *,
    input_error: str | None,
    available: list[str],
    can_ask: bool,
) -> Action:
    """The first thing to do with ``call``.

    Rule 1: the ledger gate comes first — a finished record is replayed before the tool or the
    approver is even looked at. Then an in-doubt record is settled by rule 6, in order: a re-run
    that is safe; the tool's own ``check``; the approver (``in_doubt=True``); else a person.
    A fresh call (or one a person resolved as not having happened) goes through the approval
    gate if it is high-impact, then runs.
    """
    if record is not None and record.status.terminal:
        return Replay(record)
    in_doubt = record is not None and record.status is Status.STARTED
    if tool is None:
        if in_doubt:
            return Unresolved(
                in_doubt_message(
                    call.name, "it was interrupted, and the tool is not in this toolset any more"
                )
            )
        return Reject(unknown_tool_message(call.name, available))
    if input_error is not None:
        # A recorded intent implies the input validated once; if the schema changed since, a
        # person decides rather than a guess.
        if in_doubt:
            return Unresolved(in_doubt_message(call.name, f"interrupted; now {input_error}"))
        return Reject(f"{input_error}. Not executed.")
    if in_doubt:
        if tool.rerun_safe:
            # read_only / idempotent / key-forwarding: a second run leaves the world as one run.
            # A high-impact one was approved when its intent was written; re-running it does
            # not add an effect, so it is not a new question for the approver.
            return _RERUN
        if tool.has_check:
            return Check()
        if can_ask:
            return Ask(
                in_doubt=True,
                reason=(
                    f"{call.name!r} was interrupted while it ran and may already have happened; "
                    "approve only if running it again is acceptable"
                ),
            )
        return Unresolved(in_doubt_message(call.name, _why_in_doubt(record)))
    if tool.high_impact:
        return Ask(in_doubt=False, reason=f"{call.name!r} is high-impact")
    return _RUN


def _why_in_doubt(record: EffectRecord | None) -> str:
    """Why a ``started`` record is in doubt: what its worker said when it gave the attempt up
    (the tool could not tell, its run was cancelled), else its process stopped while it ran."""
    if record is not None and record.released and record.error:
        return record.error.removeprefix("in doubt: ")
    return "the process stopped while it ran"


def writes_first(action: Action, tool: Tool[Any, Any] | None) -> bool:
    """Whether ``action`` — the first step of a call whose record was not read — can be taken
    without reading it: a run whose intent is written first. The intent is insert-if-absent, so
    a record already there refuses it and nothing runs. Anything else (a replay, a rejection, a
    safe tool's run that writes only its outcome, a question to the approver) depends on the
    record and must read it first."""
    return isinstance(action, Run) and tool is not None and tool.needs_intent


_NO_TRACE = "its check found no trace of it"


def after_check_not_found(tool: Tool[Any, Any], call: ToolCall) -> Action:
    """The tool's ``check`` says the effect did not happen: the call is as good as fresh."""
    if tool.high_impact:
        return Ask(
            in_doubt=False,
            reason=(
                f"{call.name!r} was interrupted; its check found no trace of it, so it would run "
                "now for the first time"
            ),
            settled=_NO_TRACE,
        )
    return Run(in_doubt=False, settled=_NO_TRACE)


def after_check(
    tool: Tool[Any, Any], call: ToolCall, *, raised: BaseException | None, found: bool
) -> Action:
    """The check's answer for an in-doubt call: ``raised`` what it raised, else ``found`` whether
    it returned something (the effect exists). A check that fails decides nothing."""
    if raised is not None:
        return Unresolved(in_doubt_message(call.name, f"its check raised {describe(raised)}"))
    if found:
        return Found()
    return after_check_not_found(tool, call)


def after_approval(call: ToolCall, ask: Ask, decision: Decision | None) -> Action:
    """The approver's answer to ``ask`` (``None``: there is no approver to ask)."""
    if decision is None:
        return Decline(no_approver_message(call.name))
    if decision.pending:
        if ask.in_doubt:
            return Await(
                f"in doubt, awaiting a person: {call.name!r} may already have happened; a "
                "person decides whether it did or whether to run it again. Not run again yet.",
                in_doubt=True,
            )
        return Await(
            f"awaiting approval: {call.name!r} is queued for a person to decide; not executed yet."
        )
    if decision.approved:
        if ask.in_doubt:
            if not decision.rerun:
                # A plain yes approves a first run; a re-run of a call in doubt needs a yes
                # that says so (docs/design.md, rule 21). The call stays in doubt for a person.
                return Unresolved(
                    in_doubt_message(
                        call.name,
                        f"{decision.by} answered a plain yes, which approves a first run, not "
                        "a re-run of a call in doubt",
                    )
                )
            settled = f"an approver ({decision.by}) allowed running it again"
            return Run(in_doubt=True, approved_by=decision.by, settled=settled)
        return Run(in_doubt=False, approved_by=decision.by, settled=ask.settled)
    if ask.in_doubt:
        # "Do not run it again" is not "it did not happen": the call stays in doubt.
        return Unresolved(in_doubt_message(call.name, f"a re-run was declined by {decision.by}"))
    return Decline(denied_message(call.name, decision.by))


def after_failure(tool: str, exc: BaseException, *, intended: bool) -> Failed:
    """The tool raised ``exc``. ``intended``: the attempt's intent is recorded, so a tool that
    could not tell (``OutcomeUnknown``) leaves its call in doubt rather than failed."""
    if isinstance(exc, OutcomeUnknown) and intended:
        return Failed(
            in_doubt=True,
            message=in_doubt_message(tool, f"the tool could not tell: {describe(exc)}"),
            error=f"in doubt: {describe(exc)}",
        )
    message = failed_message(tool, exc)
    return Failed(in_doubt=False, message=message, error=message)


def settled_by(record: EffectRecord | None, tool: Tool[Any, Any]) -> str:
    """How the attempt of ``record`` counts as over, should a new attempt replace it."""
    if record is None:
        return ""
    if record.status is Status.NOT_HAPPENED:
        return record.error or "a person resolved it as not happened"
    if tool.rerun_safe:
        return f"{SAFE_RERUN} ({tool.effect.value}" + (
            ", forwards its idempotency key)" if tool.forwards_idempotency_key else ")"
        )
    return "in doubt"


def history(record: EffectRecord | None, settled: str) -> tuple[PastAttempt, ...]:
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
