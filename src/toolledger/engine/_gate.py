"""The approval gate's question and answer: what an approver is asked about a high-impact call,
and what it may say. The runner asks through these; ready-made approvers are in
``toolledger.approvals``.

An approver is any callable ``approve(request) -> bool | Decision`` (or an ``async def``). It is
asked only after the ledger gate: a call already recorded never asks again (docs/design.md, rule 1).

A plain yes (``True``, or ``Decision(approved=True)``) approves a call's first run. Running a
call *in doubt* again (``request.in_doubt``: it may already have taken effect) needs an answer
that names the re-run — ``Decision(approved=True, rerun=True)``, as the persisted queue gives
for a person's "approve" of an in-doubt request and the terminal prompt for a person's yes to
its "IN DOUBT" question (docs/design.md, rule 21). A plain yes to that question leaves the call in
doubt for a person, and warns (``FutureWarning``): before toolledger 0.2 it re-ran the call, so
an approver that said yes to everything ran a duplicate.
"""

from __future__ import annotations

import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..records import ApprovalRecord
from ..stores import Ledger

__all__ = ["PENDING", "ApprovalRequest", "Approver", "Decision", "normalise", "plain_yes_message"]


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
    decision is used once, and never without the call's intent. ``rerun``: the yes names the
    re-run of a call in doubt — the only yes that runs one again (the module docstring)."""

    approved: bool
    by: str | None = None
    pending: bool = False
    approval: ApprovalRecord | None = field(default=None, repr=False, compare=False)
    rerun: bool = False


PENDING = Decision(approved=False, pending=True)

Approver = Callable[[ApprovalRequest], "bool | Decision | Awaitable[bool | Decision]"]


def normalise(answer: object, approver: object, *, in_doubt: bool = False) -> Decision:
    """``True``/``False``/``Decision`` → ``Decision``; anything else is a programming error.
    ``in_doubt``: the question was whether to run a call in doubt again — a yes that does not
    name the re-run warns that it does not re-run it (``FutureWarning``)."""
    if isinstance(answer, Decision):
        decision = answer
        if answer.by is None and not answer.pending:
            decision = replace(answer, by=_name_of(approver))
    elif isinstance(answer, bool):
        decision = Decision(approved=answer, by=_name_of(approver))
    else:
        raise TypeError(
            f"approver {_name_of(approver)} returned {answer!r}; it must return a bool or a "
            "Decision"
        )
    if in_doubt and decision.approved and not decision.rerun and not decision.pending:
        warnings.warn(plain_yes_message(decision.by), FutureWarning, stacklevel=3)
    return decision


def plain_yes_message(by: str | None) -> str:
    """What a plain yes to an in-doubt question is warned of (since toolledger 0.2)."""
    return (
        f"approver {by or 'an approver'} answered a plain yes to running a call in doubt "
        "again: a plain yes approves a first run and does not re-run a call in doubt (it may "
        "already have taken effect). The call stays in doubt for a person (toolledger "
        "resolve, or approve it in the queue); an approver that means to re-run it returns "
        "Decision(approved=True, rerun=True)"
    )


def _name_of(approver: object) -> str:
    return str(getattr(approver, "__qualname__", None) or type(approver).__name__)
