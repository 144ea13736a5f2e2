"""What the model is told when a call does not run as asked: unknown, in doubt, declined, no
approver, failed, its intent not recorded. Each says what happened and what to do."""

from __future__ import annotations

from ..codec import describe
from ..errors import StoreUnavailableError

__all__ = [
    "denied_message",
    "failed_message",
    "held_back",
    "in_doubt_message",
    "intent_failed_message",
    "no_approver_message",
    "unknown_tool_message",
]


def unknown_tool_message(name: str, available: list[str]) -> str:
    names = ", ".join(available) if available else "none"
    return f"unknown tool {name!r}; available tools: {names}. Not executed."


def in_doubt_message(tool: str, why: str) -> str:
    return (
        f"{tool!r} may already have happened ({why}); it was not run again. A person must "
        "resolve it (toolledger resolve) before it is retried. Do not retry it under a new call."
    )


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


def held_back(
    session_id: str, url: str, unwritten: list[str], kept: set[str]
) -> StoreUnavailableError:
    """Why a batch's checkpoint was not written: outcomes of it that could not be (``kept``: the
    calls whose outcomes this process keeps trying to write)."""
    trying = [tid for tid in unwritten if tid in kept]
    told = [tid for tid in unwritten if tid not in kept]
    why = []
    if trying:
        why.append(f"this process keeps trying to write that of {', '.join(trying)}")
    if told:
        why.append(
            f"that of {', '.join(told)} is not retried: its record had moved on and could not "
            "be read, and a person must look"
        )
    return StoreUnavailableError(
        f"the outcome of {', '.join(unwritten)} in session {session_id!r} could not be "
        f"written (the store failed; {'; '.join(why)}; an alert was raised), so the checkpoint "
        "that would report it to the model was not written either. Run the session again: it "
        "answers from the ledger once the write lands, or finds the call in doubt.",
        url=url,
        session_id=session_id,
    )
