"""The approval gate: who may say yes to a high-impact call, and how they are asked.

An approver is any callable ``approve(request) -> bool | Decision`` (or an ``async def``). It is
asked only after the ledger gate: a call already recorded never asks again (DESIGN.md rule 1).

Built in:

* ``terminal`` — asks on the terminal, showing the tool, its input and whether it is in doubt;
* ``queue`` — persists the request in the store and answers "pending": an agent run stops with
  ``awaiting_approval``; a person decides with ``toolledger approve|deny`` (or ``decide``), and the
  next run proceeds. A decision is bound to (tool_use_id, tool, input hash, whether the call is
  in doubt); an approval is used up by the attempt it allows, in the same commit as its intent,
  so it allows exactly one; a denial stands.
"""

from __future__ import annotations

import getpass
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .errors import (
    ConfigurationError,
    NotPendingError,
    SessionConflictError,
)
from .liveness import Running
from .ops import PutApproval
from .records import ApprovalRecord, ApprovalStatus, Status

if TYPE_CHECKING:
    from .stores.base import Ledger, Store

__all__ = [
    "PENDING",
    "ApprovalQueue",
    "ApprovalRequest",
    "Approver",
    "Decision",
    "decide",
    "pending",
    "queue",
    "terminal",
]


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


def terminal(request: ApprovalRequest) -> Decision:
    """Ask on this terminal: shows the tool, its input, and whether the call is in doubt. With no
    terminal to answer on (stdin closed) the call is declined, and says so."""
    from .cli.prompts import ask_approval  # rich is loaded only when a person is asked

    approved = ask_approval(request)
    if approved is None:  # no terminal: nobody said yes
        return Decision(approved=False, by="terminal: no terminal to ask on")
    return Decision(approved=approved, by=f"terminal:{getpass.getuser()}")


class ApprovalQueue:
    """Persist approval requests in the session's store; answer ``PENDING`` until a person
    decides. Use the ready-made ``toolledger.approvals.queue``."""

    def __call__(self, request: ApprovalRequest) -> Decision:
        if request.ledger is None:
            raise ConfigurationError(
                "the approval queue needs the request's ledger; it works through "
                "run_tool_uses and Agent",
                session_id=request.session_id,
                tool_use_id=request.tool_use_id,
            )
        store = request.ledger.store
        current = _find(store, request.session_id, request.tool_use_id)
        fresh = ApprovalRecord(
            session_id=request.session_id,
            tool_use_id=request.tool_use_id,
            tool=request.tool,
            input_hash=request.input_hash,
            input=request.input,
            in_doubt=request.in_doubt,
            reason=request.reason,
            status=ApprovalStatus.PENDING,
            requested_at=store.clock(),
            attempt=request.attempt,
        )
        if current is None:
            store.apply(request.session_id, [PutApproval(fresh, None)])
            return PENDING
        bound = (
            current.tool == request.tool
            and current.input_hash == request.input_hash
            and current.in_doubt == request.in_doubt
            and current.attempt == request.attempt
        )
        if bound and current.status is ApprovalStatus.USED and _progressed(request):
            # Used up by a racing worker whose intent is already in the ledger: this caller read
            # the ledger before that commit. Its intent will meet that record and give way to
            # it (the stored outcome, or EffectInProgressError) — nobody is asked again.
            return Decision(approved=True, by=current.decided_by, approval=current)
        if not bound or current.status is ApprovalStatus.USED:
            # A decision about another question (other input, or a first run when this is an
            # in-doubt re-run), or one spent on an attempt that has since been resolved as not
            # having happened: this is a new request.
            store.apply(request.session_id, [PutApproval(fresh, current.status)])
            return PENDING
        if current.status is ApprovalStatus.PENDING:
            return PENDING
        # Not used up here: the runner does it in the commit that records the intent.
        return Decision(
            approved=current.status is ApprovalStatus.APPROVED,
            by=current.decided_by,
            approval=current,
        )


def _progressed(request: ApprovalRequest) -> bool:
    """Whether a racing worker's attempt, allowed by this (used) approval, is in the ledger:
    running, or finished. An attempt that is over without an outcome (in doubt), or one a
    person resolved as not having happened, used it up: a new question needs a new answer."""
    assert request.ledger is not None
    record = request.ledger.get(request.tool_use_id)
    if record is None or record.status is Status.NOT_HAPPENED:
        return False
    if record.status is Status.STARTED:
        return isinstance(request.ledger.store.judge(record), Running)
    return True


queue = ApprovalQueue()


def _find(store: Store, session_id: str, tool_use_id: str) -> ApprovalRecord | None:
    found = [a for a in store.approvals(session_id) if a.tool_use_id == tool_use_id]
    return found[0] if found else None


def pending(store: Store, session_id: str | None = None) -> list[ApprovalRecord]:
    """Requests waiting for a person, oldest first."""
    waiting = [a for a in store.approvals(session_id) if a.status is ApprovalStatus.PENDING]
    return sorted(waiting, key=lambda a: (a.requested_at, a.session_id, a.tool_use_id))


def decide(
    store: Store, session_id: str, tool_use_id: str, *, approved: bool, by: str
) -> ApprovalRecord:
    """Approve or deny a pending request (one compare-and-set). Raises ``NotPendingError`` when
    there is no pending request for that call, ``SessionConflictError`` when it was decided by
    someone else meanwhile."""
    current = _find(store, session_id, tool_use_id)
    if current is None or current.status is not ApprovalStatus.PENDING:
        if current is None:
            state = f"there is no approval request for {tool_use_id!r} in session {session_id!r}"
        elif current.status is ApprovalStatus.USED:
            state = (
                f"the request for {tool_use_id!r} was approved by {current.decided_by} and that "
                "approval has been used by the call it allowed"
            )
        else:
            state = (
                f"the request for {tool_use_id!r} was already {current.status.value} by "
                f"{current.decided_by}"
            )
        raise NotPendingError(
            f"{state} (in {store.url}); only a pending request can be decided — "
            "`toolledger approvals` lists them",
            session_id=session_id,
            tool_use_id=tool_use_id,
        )
    decided = replace(
        current,
        status=ApprovalStatus.APPROVED if approved else ApprovalStatus.DENIED,
        decided_by=by,
        decided_at=store.clock(),
    )
    (won,) = store.apply(session_id, [PutApproval(decided, ApprovalStatus.PENDING)])
    if not won:
        raise SessionConflictError(
            f"the request for {tool_use_id!r} changed while it was being decided; look again",
            session_id=session_id,
            tool_use_id=tool_use_id,
        )
    return decided
