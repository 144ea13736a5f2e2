"""The approval queue: a request persisted in the session's store for a person to decide.

``queue`` answers "pending" until someone decides with ``toolledger approve|deny`` (or
``decide``). A decision is bound to (tool_use_id, tool, input hash, whether the call is in
doubt); an approval is used up by the attempt it allows, in the same commit as its intent, so it
allows exactly one; a denial stands.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, overload

from .._liveness import Running
from .._shell import command, shown_id
from ..engine._gate import PENDING, ApprovalRequest, Decision
from ..errors import ConfigurationError, NotPendingError, SessionConflictError
from ..ops import PutApproval
from ..records import ApprovalRecord, ApprovalStatus, Status
from ..stores import Store
from ._notify import Notifier, Target, notifier

__all__ = ["ApprovalQueue", "decide", "pending", "queue"]


class ApprovalQueue:
    """Persist approval requests in the session's store; answer ``PENDING`` until a person
    decides. Use the ready-made ``toolledger.approvals.queue``, or ``queue(notify=...)`` for one
    that tells someone each time it queues a request (a callable, a webhook URL or a
    ``toolledger.notify.Notifier``; see ``toolledger.notify``)."""

    def __init__(self, notify: Notifier | Target | None = None) -> None:
        self.notify = notifier(notify)

    def __repr__(self) -> str:
        return (
            "ApprovalQueue()" if self.notify is None else f"ApprovalQueue(notify={self.notify!r})"
        )

    @overload
    def __call__(self, request: ApprovalRequest) -> Decision: ...
    @overload
    def __call__(self, *, notify: Notifier | Target) -> ApprovalQueue: ...
    def __call__(
        self, request: ApprovalRequest | None = None, *, notify: Any = None
    ) -> Decision | ApprovalQueue:
        if request is None:
            if notify is None:
                raise ConfigurationError(
                    "approvals.queue is the approver itself (approve=toolledger.approvals.queue); "
                    "call it only with notify=... to get one that notifies"
                )
            return ApprovalQueue(notify)
        return self._ask(request)

    def _ask(self, request: ApprovalRequest) -> Decision:
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
            self._queued(request, store.apply(request.session_id, [PutApproval(fresh, None)]))
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
            return Decision(
                approved=True, by=current.decided_by, approval=current, rerun=current.in_doubt
            )
        if not bound or current.status is ApprovalStatus.USED:
            # A decision about another question (other input, or a first run when this is an
            # in-doubt re-run), or one spent on an attempt that has since been resolved as not
            # having happened: this is a new request.
            queued = store.apply(request.session_id, [PutApproval(fresh, current.status)])
            self._queued(request, queued)
            return PENDING
        if current.status is ApprovalStatus.PENDING:
            return PENDING
        # Not used up here: the runner does it in the commit that records the intent. A
        # person's approval of an in-doubt request is a yes to its re-run: it was the question.
        approved = current.status is ApprovalStatus.APPROVED
        return Decision(
            approved=approved,
            by=current.decided_by,
            approval=current,
            rerun=approved and current.in_doubt,
        )

    def _queued(self, request: ApprovalRequest, applied: list[bool]) -> None:
        """Tell the notifier of a request this call put in the store (not one a racing worker
        put there first: it tells its own)."""
        if self.notify is not None and applied == [True]:
            self.notify.approval_requested(
                session_id=request.session_id,
                tool_use_id=request.tool_use_id,
                tool=request.tool,
                input=request.input,
                reason=request.reason,
                in_doubt=request.in_doubt,
            )


def _progressed(request: ApprovalRequest) -> bool:
    """Whether a racing worker's attempt, allowed by this (used) approval, is in the ledger:
    running, or finished. An attempt that is over without an outcome (in doubt), or one a
    person resolved as not having happened, used it up: a new question needs a new answer.

    A record read as ``started`` whose process is then found ended is read again: that process
    may have written its outcome and exited between the read and the look at it — an attempt
    that finished, not one in doubt."""
    assert request.ledger is not None
    ledger = request.ledger
    record = ledger.get(request.tool_use_id)
    if record is not None and record.status is Status.STARTED:
        if isinstance(ledger.store.judge(record), Running):
            return True
        again = ledger.get(request.tool_use_id)
        if again == record:
            return False  # still as it was, and over: in doubt
        record = again
        if record is not None and record.status is Status.STARTED:
            return isinstance(ledger.store.judge(record), Running)
    return record is not None and record.status is not Status.NOT_HAPPENED


queue = ApprovalQueue()


def _find(store: Store, session_id: str, tool_use_id: str) -> ApprovalRecord | None:
    found = [a for a in store.approvals(session_id) if a.tool_use_id == tool_use_id]
    return found[0] if found else None


def _still_in_doubt(store: Store, request: ApprovalRecord) -> None:
    """A yes to running a call in doubt again answers a question only while the call is in
    doubt: one a person settled meanwhile (``toolledger resolve``), or another attempt ran, is
    answered already — a yes would answer nothing, or be taken for a later question's. (A no
    is always taken: it closes the request, and runs nothing.)"""
    record = store.ledger(request.session_id).get(request.tool_use_id)
    if record is None:
        now = "gone from the ledger"
    elif record.status is not Status.STARTED:
        now = record.status.value
    elif request.attempt and record.attempt != request.attempt:  # (0: asked by toolledger 0.1)
        now = f"attempt {record.attempt}, not the attempt {request.attempt} the request is about"
    else:
        return
    sid, tid = request.session_id, request.tool_use_id
    raise NotPendingError(
        f"the call {tid!r} in session {sid!r} is no longer the call in doubt this request asks "
        f"about (it is {now}): there is nothing left to approve. `deny` closes the request; "
        "`show` says what happened to the call:\n"  # each command on a line of its own
        f"{command('deny', sid, tid, url=store.url)}\n{command('show', sid, url=store.url)}",
        session_id=sid,
        tool_use_id=tid,
    )


def _changed(
    current: ApprovalRecord, *, input_hash: str | None, in_doubt: bool | None, attempt: int | None
) -> str:
    """How ``current`` differs from the request as shown (each part given), or ``""``."""
    if input_hash is not None and current.input_hash != input_hash:
        return f"its input changed (hash {current.input_hash}, not {input_hash})"
    if in_doubt is not None and current.in_doubt != in_doubt:
        return (
            "it now asks to run again a call that may already have happened (an attempt "
            "started and its outcome is unknown)"
            if current.in_doubt
            else "it no longer asks about a call in doubt"
        )
    if attempt is not None and current.attempt != attempt:
        return f"it now asks about attempt {current.attempt}, not {attempt}"
    return ""


def pending(store: Store, session_id: str | None = None) -> list[ApprovalRecord]:
    """Requests waiting for a person, oldest first."""
    waiting = [a for a in store.approvals(session_id) if a.status is ApprovalStatus.PENDING]
    return sorted(waiting, key=lambda a: (a.requested_at, a.session_id, a.tool_use_id))


def decide(
    store: Store,
    session_id: str,
    tool_use_id: str,
    *,
    approved: bool,
    by: str,
    input_hash: str | None = None,
    in_doubt: bool | None = None,
    attempt: int | None = None,
) -> ApprovalRecord:
    """Approve or deny a pending request (one compare-and-set). Raises ``NotPendingError`` when
    there is no pending request for that call, ``SessionConflictError`` when it was decided by
    someone else meanwhile.

    ``input_hash``, ``in_doubt``, ``attempt``: the request as the person was shown it — its
    input's hash, whether it asked to run again a call in doubt, the attempt it asked about. A
    request that is another question by now (another input; a first run's question become an
    in-doubt re-run's, which runs a call that may already have happened) is refused
    (``SessionConflictError``), not decided. The decision written is the request as read, so a
    request replaced between that read and the write is not decided either: it is another
    question, and the queue asks again."""
    current = _find(store, session_id, tool_use_id)
    if current is None or current.status is not ApprovalStatus.PENDING:
        # Who decided, as a name read from the store is shown: a line break in it would start
        # a line of the error's own, one that could pass for a command to paste.
        who = None if current is None else shown_id(str(current.decided_by))
        if current is None:
            state = f"there is no approval request for {tool_use_id!r} in session {session_id!r}"
        elif current.status is ApprovalStatus.USED:
            state = (
                f"the request for {tool_use_id!r} was approved by {who} and that "
                "approval has been used by the call it allowed"
            )
        else:
            state = f"the request for {tool_use_id!r} was already {current.status.value} by {who}"
        raise NotPendingError(
            f"{state} (in {store.url}); only a pending request can be decided — "
            "`toolledger approvals` lists them",
            session_id=session_id,
            tool_use_id=tool_use_id,
        )
    changed = _changed(current, input_hash=input_hash, in_doubt=in_doubt, attempt=attempt)
    if changed:
        raise SessionConflictError(
            f"the request for {tool_use_id!r} is not the one you were shown: {changed}; "
            "look at it again",
            session_id=session_id,
            tool_use_id=tool_use_id,
        )
    if current.in_doubt and approved:
        _still_in_doubt(store, current)
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
