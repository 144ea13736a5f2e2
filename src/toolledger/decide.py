"""Pure decisions: given what the ledger holds and what the tool declares, what happens next.

No I/O here. The sync and async runners are thin shells that carry these decisions out, so the
rules (DESIGN.md 1-7) live in one place and cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .codec import describe
from .records import EffectRecord, Status, ToolCall
from .tools import Tool

__all__ = [
    "Action",
    "Ask",
    "Check",
    "Reject",
    "Replay",
    "Run",
    "Unresolved",
    "after_check_not_found",
    "first_step",
    "mismatch",
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
    """Ask the approver. ``in_doubt``: the question is whether to run an in-doubt call again."""

    in_doubt: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Check:
    """In doubt, and the tool can tell: call its ``check`` and trust the answer."""


@dataclass(frozen=True, slots=True)
class Run:
    """Execute. ``in_doubt`` tells the tool an earlier attempt may have taken effect."""

    in_doubt: bool


@dataclass(frozen=True, slots=True)
class Unresolved:
    """In doubt and nothing may decide it automatically: answer ``is_error`` and leave the record
    ``started`` for a person (``toolledger resolve``)."""

    message: str


Action = Replay | Reject | Ask | Check | Run | Unresolved


def mismatch(record: EffectRecord, call: ToolCall) -> str | None:
    """Why ``record`` cannot be this call's record (DESIGN.md rule 7), or ``None``."""
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


def unknown_tool_message(name: str, available: list[str]) -> str:
    names = ", ".join(available) if available else "none"
    return f"unknown tool {name!r}; available tools: {names}. Not executed."


def in_doubt_message(tool: str, why: str) -> str:
    return (
        f"{tool!r} may already have happened ({why}); it was not run again. A person must "
        "resolve it (toolledger resolve) before it is retried. Do not retry it under a new call."
    )


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
            return Run(in_doubt=True)
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
        return Unresolved(in_doubt_message(call.name, "the process stopped while it ran"))
    if tool.high_impact:
        return Ask(in_doubt=False, reason=f"{call.name!r} is high-impact")
    return Run(in_doubt=False)


def after_check_not_found(tool: Tool[Any, Any], call: ToolCall) -> Action:
    """The tool's ``check`` says the effect did not happen: the call is as good as fresh."""
    if tool.high_impact:
        return Ask(
            in_doubt=False,
            reason=(
                f"{call.name!r} was interrupted; its check found no trace of it, so it would run "
                "now for the first time"
            ),
        )
    return Run(in_doubt=False)


def denied_message(tool: str, by: str | None) -> str:
    who = f" by {by}" if by else ""
    return f"declined{who}: {tool!r} needs approval and was not approved; not executed."


def no_approver_message(tool: str) -> str:
    return (
        f"not executed: {tool!r} is high-impact and needs approval, but no approver is "
        "configured (pass approve=...)."
    )


def failed_message(tool: str, exc: BaseException) -> str:
    return f"{tool!r} failed: {describe(exc)}"


def intent_failed_message(tool: str, exc: BaseException) -> str:
    return (
        f"not executed: the ledger could not record the intent to run {tool!r} "
        f"({describe(exc)}). "
        "Nothing happened; it is safe to retry once the store is back."
    )
