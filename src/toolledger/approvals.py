"""The approval gate: who may say yes to a high-impact call, and how they are asked.

An approver is any callable ``approve(request) -> bool | Decision`` (or an ``async def``). It is
asked only after the ledger gate: a call already recorded never asks again (DESIGN.md rule 1).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ApprovalRequest", "Approver", "Decision"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalRequest:
    """What the approver is asked about.

    ``in_doubt`` is true when this very call may already have happened (the process died while it
    ran) and the question is whether to run it *again*; ``reason`` says why the approver is asked.
    """

    session_id: str
    tool_use_id: str
    tool: str
    input: dict[str, Any]
    in_doubt: bool
    reason: str
    input_hash: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """An approver's answer with its author; a plain ``bool`` is accepted too."""

    approved: bool
    by: str | None = None


Approver = Callable[[ApprovalRequest], "bool | Decision | Awaitable[bool | Decision]"]


def normalise(answer: object, approver: object) -> Decision:
    """``True``/``False``/``Decision`` → ``Decision``; anything else is a programming error."""
    if isinstance(answer, Decision):
        if answer.by is None:
            return Decision(approved=answer.approved, by=_name_of(approver))
        return answer
    if isinstance(answer, bool):
        return Decision(approved=answer, by=_name_of(approver))
    raise TypeError(
        f"approver {_name_of(approver)} returned {answer!r}; it must return a bool or a Decision"
    )


def _name_of(approver: object) -> str:
    return str(getattr(approver, "__qualname__", None) or type(approver).__name__)
