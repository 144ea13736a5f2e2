"""The approval gate's question and answer: what an approver is asked about a high-impact call,
and what it may say. The runner asks through these; ready-made approvers are in
``toolledger.approvals``.

An approver is any callable ``approve(request) -> bool | Decision`` (or an ``async def``). It is
asked only after the ledger gate: a call already recorded never asks again (docs/design.md, rule 1).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from .records import ApprovalRecord
from .stores import Ledger

__all__ = ["PENDING", "ApprovalRequest", "Approver", "Decision", "normalise"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalRequest:
    """What the approver is asked about.

    ``in_doubt`` is true when this very call may already have happened (the process died while it
    ran) and the question is whether to run it *again*; ``reason`` says why the approver is asked.
    ``ledger`` is the session's ledger, for approvers that persist requests.
    """

    session_id: str
    tool_use_id: str
    tool: str
    input: dict[str, Any]
    in_doubt: bool
    reason: str
    input_hash: str = ""
    attempt: int = 0
    """The attempt the question is about (0: the call never started; else the attempt in doubt,
    or the one a person resolved as not having happened)."""
    ledger: Ledger | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """An approver's answer with its author; a plain ``bool`` is accepted too. ``pending``: no
    answer yet (the request is queued for a person). ``approval``: the persisted request this
    answers (the queue's), which the runner uses up in the same commit as what it allows — so a
    decision is used once, and never without the call's intent."""

    approved: bool
    by: str | None = None
    pending: bool = False
    approval: ApprovalRecord | None = field(default=None, repr=False, compare=False)


PENDING = Decision(approved=False, pending=True)

Approver = Callable[[ApprovalRequest], "bool | Decision | Awaitable[bool | Decision]"]


def normalise(answer: object, approver: object) -> Decision:
    """``True``/``False``/``Decision`` → ``Decision``; anything else is a programming error."""
    if isinstance(answer, Decision):
        if answer.by is None and not answer.pending:
            return replace(answer, by=_name_of(approver))
        return answer
    if isinstance(answer, bool):
        return Decision(approved=answer, by=_name_of(approver))
    raise TypeError(
        f"approver {_name_of(approver)} returned {answer!r}; it must return a bool or a Decision"
    )


def _name_of(approver: object) -> str:
    return str(getattr(approver, "__qualname__", None) or type(approver).__name__)
