"""``Store``, the one front of every backend: ledgers, sessions, transcripts, approvals, leases,
integrity, history and retention. Nothing outside ``toolledger.stores`` and the drivers touches a
backend; everything toolledger writes goes through ``Store.apply`` (``._core``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from .._liveness import Over, Running
from ..codec import encode_result
from ..errors import NotInDoubtError, SessionConflictError
from ..ops import PutApproval, UpdateEffect
from ..records import ApprovalStatus, EffectRecord, RunStatus, Status
from . import _again as again
from . import _copies as copies
from . import _history, retention
from ._core import StoreCore, check_session_id, in_progress_error, undecided
from ._history import BranchHistory, Turn
from .retention import PruneReport

if TYPE_CHECKING:
    from ..tools import ToolSet

__all__ = ["Ledger", "Store", "check_session_id", "in_progress_error"]


class Store(StoreCore):
    """A place where ledgers (and, for the agent, checkpoints) live. Open one with
    ``toolledger.open_store(url)``; use it as a context manager or call ``close()``.
    """

    def ledger(self, session_id: str) -> Ledger:
        """The effects ledger of one session (created on first write)."""
        return Ledger(self, check_session_id(session_id))

    def prune(
        self, *, older_than: float, status: RunStatus | str | None = None, dry_run: bool = False
    ) -> PruneReport:
        """Remove ended sessions idle for more than ``older_than`` seconds, one transaction
        each; never one with a call in progress or in doubt, a pending approval or a held lease.
        See ``toolledger.stores.retention``."""
        return retention.prune(self, older_than=older_than, status=status, dry_run=dry_run)

    def history(self, session_id: str, *, tools: ToolSet | None = None) -> list[Turn]:
        """Every turn of a session — when, what the model asked for, each call's tool, effect
        class (when ``tools`` knows it) and disposition in the ledger — oldest first. Reads
        only. See ``toolledger.stores._history``."""
        return _history.history(self, session_id, tools=tools)

    def branches(self, session_id: str, *, tools: ToolSet | None = None) -> list[BranchHistory]:
        """The forks and rewinds that made a session, oldest first: each one's point, the
        effects it listed, and a rewind's abandoned turns. Reads only. See
        ``toolledger.stores._history`` and ``toolledger.branches``."""
        return _history.branches(self, session_id, tools=tools)


class Ledger:
    """One session's effects: what ran, what it returned, what is in doubt."""

    def __init__(self, store: Store, session_id: str) -> None:
        self.store = store
        self.session_id = session_id

    def __repr__(self) -> str:
        return f"<Ledger {self.session_id!r} in {self.store.url}>"

    def get(self, tool_use_id: str) -> EffectRecord | None:
        return self.store.backend.read_effects(self.session_id, [tool_use_id]).get(tool_use_id)

    async def aget(self, tool_use_id: str) -> EffectRecord | None:
        found = await self.store.async_backend.read_effects(self.session_id, [tool_use_id])
        return found.get(tool_use_id)

    def records(self) -> list[EffectRecord]:
        """Every record of the session, oldest first."""
        found = self.store.backend.read_effects(self.session_id)
        return sorted(found.values(), key=lambda r: (r.created_at, r.tool_use_id))

    def in_doubt(self) -> list[EffectRecord]:
        """Calls that started and whose attempt is provably over: someone must decide whether
        they happened. (Calls still running are not listed: see ``Store.started``.)"""
        backend = self.store.backend
        started = [
            r for r in self.records() if r.in_doubt and not copies.listed_elsewhere(backend, r)
        ]
        if not started:
            return []
        lease = self.store.backend.read_lease(self.session_id)
        judged = again.confirmed(self.store, [(r, self.store.judge(r, lease)) for r in started])
        return [r for r, verdict in judged if isinstance(verdict, Over)]

    def resolve(
        self,
        tool_use_id: str,
        *,
        happened: bool,
        result: object = None,
        by: str | None = None,
        force: bool = False,
        watch: float = 0.0,
        sleep: Callable[[float], None] = time.sleep,
        attempt: int | None = None,
    ) -> EffectRecord:
        """Settle an in-doubt call by a person's word.

        ``happened=True`` records it ``succeeded`` with ``result`` (what the model will be told;
        default: a note saying a person confirmed it). ``happened=False`` records
        ``not_happened``: the next run executes it (through the approval gate if high-impact).
        One compare-and-set: raises ``NotInDoubtError`` if the call is not in doubt, and
        ``SessionConflictError`` if it changed while being resolved.

        A call whose attempt may still be running is not in doubt: it raises
        ``EffectInProgressError`` (naming the holder and until when) unless ``force=True`` — for
        a person who knows better (the worker's machine is gone for good). Where only watching
        can tell (a worker this process cannot judge by its process table, on a file store),
        it watches for up to ``watch`` seconds first. The record then says
        what was overridden; if that attempt does report later, its outcome is kept beside the
        person's word and raised as an alert.

        ``attempt``: the attempt the person was shown in doubt. A call in doubt by now for
        another attempt (settled, run again and lost again meanwhile) is refused
        (``SessionConflictError``): a word about one attempt is not a word about the next.
        """
        record = self.get(tool_use_id)
        if record is None or not record.in_doubt:
            state = (
                f"has no record in session {self.session_id!r}"
                if record is None
                else f"is {record.status.value}"
            )
            raise NotInDoubtError(
                f"call {tool_use_id!r} {state}; only an in-doubt (started) call can be resolved "
                "(`toolledger in-doubt` lists them, with the commands that settle each)",
                session_id=self.session_id,
                tool_use_id=tool_use_id,
            )
        if attempt is not None and record.attempt != attempt:
            raise SessionConflictError(
                f"call {tool_use_id!r} is in doubt for attempt {record.attempt} now, not the "
                f"attempt {attempt} you were shown; look again",
                session_id=self.session_id,
                tool_use_id=tool_use_id,
            )
        copies.settle_here(self.store.backend, record)
        who = by or "a person"
        verdict = self.store.judge(record)
        left = watch  # counted by what it slept, so it ends whatever the clocks do
        while undecided(verdict) and not force and left > 0:
            assert isinstance(verdict, Running) and verdict.watch is not None
            # When it is judged again (``Running.until``, on the store's clock) may come before
            # its watch is over: an attempt whose deadline passes meanwhile.
            soonest = verdict.watch
            if verdict.until is not None:
                soonest = min(soonest, verdict.until - self.store.now())
            if soonest > left:
                # More than ``watch`` seconds of watching are needed (a renewal only adds to
                # them): waiting would end in the same refusal, later and silently.
                break
            pause = min(verdict.watch, left, 1.0)
            left -= pause
            sleep(pause)
            again = self.get(tool_use_id)
            if again is None or again != record:
                raise SessionConflictError(
                    f"call {tool_use_id!r} changed while its worker was being watched; look again",
                    session_id=self.session_id,
                    tool_use_id=tool_use_id,
                )
            verdict = self.store.judge(record)
        overrode = ""
        if isinstance(verdict, Running):
            if not force:
                raise in_progress_error(record, verdict, action="resolved")
            overrode = f"; forced while attempt {record.attempt} may still run ({verdict.why})"
        now = self.store.clock()
        if happened:
            value = result if result is not None else {"resolved": f"{who} confirmed it happened"}
            new = replace(
                record,
                status=Status.SUCCEEDED,
                result=encode_result(value, tool=record.tool).stored,
                error=f"resolved by {who}: happened{overrode}",
                updated_at=now,
            )
        else:
            new = replace(
                record,
                status=Status.NOT_HAPPENED,
                error=f"resolved by {who}: did not happen{overrode}",
                updated_at=now,
            )
        op = UpdateEffect(
            new,
            expect_status=record.status,
            expect_attempt=record.attempt,
            expect_at=record.updated_at,
            guard=True,  # the request below is closed only with it
        )
        settled = "happened" if happened else "did not happen"
        closed = self._close_requests(
            tool_use_id, happened=happened, by=f"{who} (resolved: {settled})"
        )
        try:
            self.store.apply(self.session_id, [op, *closed])
        except SessionConflictError as exc:
            raise SessionConflictError(
                f"call {tool_use_id!r} changed while it was being resolved; look again",
                session_id=self.session_id,
                tool_use_id=tool_use_id,
            ) from exc
        return new

    def _close_requests(self, tool_use_id: str, *, happened: bool, by: str) -> list[PutApproval]:
        """The call's request still pending that its settling answers: a question about
        running it again while it was in doubt (it is not in doubt any more), and — when it
        happened — any question about running it (it will not run again). Each is closed
        (declined, ``by`` saying by whom and how) in the same commit: no one is left asked, nor
        the session kept, for nothing. One about a first run when the call did not happen is
        kept: the next run asks it still. It applies only if the request is still pending then:
        a decision that beat it stands."""
        return [
            PutApproval(
                replace(
                    a, status=ApprovalStatus.DENIED, decided_at=self.store.clock(), decided_by=by
                ),
                expect_status=ApprovalStatus.PENDING,
            )
            for a in self.store.approvals(self.session_id)
            if a.tool_use_id == tool_use_id
            and a.status is ApprovalStatus.PENDING
            and (a.in_doubt or happened)
        ]
