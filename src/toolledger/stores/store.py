"""``Store``, the one front of every backend: ledgers, sessions, transcripts, approvals, leases,
integrity. Nothing outside ``toolledger.stores`` and the drivers touches a backend; everything
toolledger writes goes through ``Store.apply`` (and so through the ``redact`` hook).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from .._liveness import Over, Running, Runtime, Verdict, judge, lease_state, this_process
from .._redact import redact_ops
from ..codec import encode_result
from ..errors import (
    EffectInProgressError,
    InvalidSessionIdError,
    NotInDoubtError,
    SessionConflictError,
)
from ..ops import Op, UpdateEffect
from ..records import (
    ApprovalRecord,
    EffectRecord,
    Lease,
    RunStatus,
    SessionState,
    Status,
    StoredMessage,
)
from . import copies
from .contract import AsyncBackend, Backend, InlineAsync, Inspectable

if TYPE_CHECKING:
    from ..branches._history import BranchHistory, Turn
    from ..tools import ToolSet
    from .retention import PruneReport

__all__ = ["Ledger", "Store", "check_session_id", "in_progress_error"]

MAX_SESSION_ID_CHARS = 256


def check_session_id(session_id: object) -> str:
    """Session ids are 1-256 characters with no control characters; anything else (``../``,
    ``/``, quotes, any script) is fine and stored safely by every backend."""
    if not isinstance(session_id, str):
        raise InvalidSessionIdError(f"a session id must be a str, not {type(session_id).__name__}")
    if not session_id or len(session_id) > MAX_SESSION_ID_CHARS:
        raise InvalidSessionIdError(
            f"a session id must be 1-{MAX_SESSION_ID_CHARS} characters, got {len(session_id)}"
        )
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in session_id):
        raise InvalidSessionIdError(
            f"session id {session_id[:40]!r} holds a control character (NUL, newline …)"
        )
    try:
        session_id.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidSessionIdError(
            f"session id {session_id[:40]!r} is not valid Unicode (lone surrogate)"
        ) from None
    return session_id


def _undecided(verdict: Verdict) -> bool:
    """Whether only more watching can decide ``verdict`` (``Running.watch``, no renewal seen)."""
    return isinstance(verdict, Running) and verdict.watch is not None and not verdict.renewed


def in_progress_error(
    record: EffectRecord, verdict: Running, *, action: str = "run again"
) -> EffectInProgressError:
    """``record``'s attempt may still take effect, so it cannot be ``action`` now."""
    holder = record.worker or "another worker"
    until = (
        f" until {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(verdict.until))} at least"
        if verdict.until is not None
        else " for as long as that process lives"
    )
    return EffectInProgressError(
        f"{record.tool!r} ({record.tool_use_id}) in session {record.session_id!r} is in "
        f"progress: attempt {record.attempt} by {holder} may still take effect ({verdict.why})"
        f"{until}. It cannot be {action} now; retry later to get its stored result"
        + ("" if action == "run again" else ", or use --force if you know better")
        + ".",
        session_id=record.session_id,
        tool_use_id=record.tool_use_id,
        holder=record.worker,
        until=verdict.until,
    )


def default_worker_id() -> str:
    """``host:pid:random`` — who wrote a record; unique per process."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Store:
    """A place where ledgers (and, for the agent, checkpoints) live. Open one with
    ``toolledger.open_store(url)``; use it as a context manager or call ``close()``.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        async_backend: AsyncBackend | None = None,
        clock: Callable[[], float] = time.time,
        worker_id: str | None = None,
        redact: Callable[[str], str] | None = None,
        runtime: Runtime | None = None,
    ) -> None:
        self.backend = backend
        self.async_backend: AsyncBackend = async_backend or InlineAsync(backend)
        self.clock = clock
        """This worker's clock: the timestamps people read (``created_at``, ``updated_at``).
        Nothing that decides liveness uses it: that is ``now()``, the store's clock."""
        self.worker_id = worker_id or default_worker_id()
        self.redact = redact
        self.runtime = runtime or this_process()
        """This process as liveness sees it (identity, attempts in flight, leases watched)."""
        self.shared_clock = bool(getattr(backend, "shared_clock", False))
        """Whether ``now()`` is one clock every worker reads (a database server's) rather than
        each machine's own (a file store's): on a shared clock a lease expires by its expiry;
        on machines' own clocks, only once it was watched unrenewed for its time to live."""
        self._before_close: list[Callable[[], None]] = []

    def before_close(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` when this store is closed, before its backend is (used to write what a
        failed commit left behind one last time)."""
        if fn not in self._before_close:
            self._before_close.append(fn)

    def _closing(self) -> None:
        hooks, self._before_close = self._before_close, []
        for fn in hooks:
            fn()

    def now(self) -> float:
        """The store's clock (``Backend.now``): lease expiries and deadlines are on it."""
        return self.backend.now()

    def judge(self, record: EffectRecord, lease: Lease | None = None) -> Verdict:
        """Whether a ``started`` record's attempt may still take effect (``Running``) or is
        over (``Over``): see ``toolledger._liveness``. Reads the session's lease unless given."""
        if record.status is not Status.STARTED:
            return Over(f"it is {record.status.value}")
        if record.copied:  # a branch's copy: its attempt is its origin's
            return copies.verdict_of(self, record)
        if lease is None and record.lease_token is not None:
            lease = self.backend.read_lease(record.session_id)
        return judge(
            record,
            now=self.now(),
            lease=lease,
            runtime=self.runtime,
            url=self.url,
            shared_clock=self.shared_clock,
        )

    def lease_state(self, lease: Lease | None) -> Verdict:
        """Whether a session's lease is held (``Running``) or may be taken (``Over``): see
        ``toolledger._liveness.lease_state``."""
        return lease_state(
            lease,
            now=self.now(),
            runtime=self.runtime,
            url=self.url,
            shared_clock=self.shared_clock,
        )

    def apply(self, session_id: str, ops: Sequence[Op]) -> list[bool]:
        """Commit ``ops`` through the backend, after the ``redact`` hook (see
        ``toolledger._redact``). Everything toolledger writes goes through here."""
        return self.backend.apply(session_id, self._prepare(ops))

    async def aapply(self, session_id: str, ops: Sequence[Op]) -> list[bool]:
        return await self.async_backend.apply(session_id, self._prepare(ops))

    def _prepare(self, ops: Sequence[Op]) -> list[Op]:
        if self.redact is None:
            return list(ops)
        return redact_ops(list(ops), self.redact)

    @property
    def url(self) -> str:
        return self.backend.url

    @property
    def durable(self) -> bool:
        """False for ``memory://``: nothing survives the process."""
        return self.backend.durable

    def ledger(self, session_id: str) -> Ledger:
        """The effects ledger of one session (created on first write)."""
        return Ledger(self, check_session_id(session_id))

    def sessions(self) -> list[str]:
        """Every session id with a ledger record or an agent state, sorted."""
        return sorted(self.backend.session_ids())

    def session(self, session_id: str) -> SessionState | None:
        """An agent session's state, or ``None``."""
        return self.backend.read_session(session_id)

    def session_states(self) -> list[SessionState]:
        """Every agent session's state."""
        return self.backend.list_sessions()

    def messages(self, session_id: str, since: int = 0) -> list[StoredMessage]:
        """A session's transcript, from ``seq`` ``since`` on."""
        return self.backend.read_messages(session_id, since)

    def abandoned(self, session_id: str) -> dict[int, list[StoredMessage]]:
        """A rewound session's abandoned branches, by number: the messages a rewind took out of
        its transcript, each with the seq it had (``toolledger.branches._branching``)."""
        return self.backend.read_abandoned(session_id)

    def approvals(self, session_id: str | None = None) -> list[ApprovalRecord]:
        """The approval requests of one session, or of all."""
        return self.backend.read_approvals(session_id)

    def lease(self, session_id: str) -> Lease | None:
        """A session's lease, as stored (``toolledger._liveness`` judges it)."""
        return self.backend.read_lease(session_id)

    def prune(
        self, *, older_than: float, status: RunStatus | str | None = None, dry_run: bool = False
    ) -> PruneReport:
        """Remove ended sessions idle for more than ``older_than`` seconds, one transaction
        each; never one with a call in progress or in doubt, a pending approval or a held lease.
        See ``toolledger.stores.retention``."""
        from .retention import prune

        return prune(self, older_than=older_than, status=status, dry_run=dry_run)

    def history(self, session_id: str, *, tools: ToolSet | None = None) -> list[Turn]:
        """Every turn of a session — when, what the model asked for, each call's tool, effect
        class (when ``tools`` knows it) and disposition in the ledger — oldest first. Reads
        only. See ``toolledger.branches._history``."""
        from ..branches._history import history

        return history(self, session_id, tools=tools)

    def branches(self, session_id: str, *, tools: ToolSet | None = None) -> list[BranchHistory]:
        """The forks and rewinds that made a session, oldest first: each one's point, the
        effects it listed, and a rewind's abandoned turns. Reads only. See
        ``toolledger.branches._history`` and ``toolledger.branches._branching``."""
        from ..branches._history import branches

        return branches(self, session_id, tools=tools)

    def integrity(self) -> list[str] | None:
        """What the backend's own check finds wrong (an empty list: sound), or ``None`` when it
        has no such check."""
        if not isinstance(self.backend, Inspectable):
            return None
        return list(self.backend.integrity_check())

    def started(
        self, *, watch: float = 0.0, sleep: Callable[[float], None] = time.sleep
    ) -> list[tuple[EffectRecord, Verdict]]:
        """Every ``started`` record of every session with its verdict, oldest first: ``Running``
        (in progress: leave it alone) or ``Over`` (in doubt: a person may settle it).

        A verdict that only watching can decide (a worker this process cannot judge by its
        process table, on a file store: ``Running.watch``) is watched for up to ``watch``
        seconds — its lease renewed meanwhile, or not for a whole time to live — before the
        list is returned."""
        found = self._started()
        left = watch  # counted by what it slept, so it ends whatever the clocks do
        while True:
            pending = [
                v.watch for _, v in found if isinstance(v, Running) and _undecided(v) and v.watch
            ]
            if not pending or left <= 0:
                return found
            pause = min(max(pending), left, 1.0)
            left -= pause
            sleep(pause)
            found = self._started()

    def _started(self) -> list[tuple[EffectRecord, Verdict]]:
        records = sorted(self.backend.in_doubt(), key=lambda r: (r.created_at, r.session_id))
        leases: dict[str, Lease | None] = {}
        out: list[tuple[EffectRecord, Verdict]] = []
        for r in records:
            if copies.listed_elsewhere(self, r):
                continue  # one call, listed once: where its lineage made it
            if r.session_id not in leases:
                leases[r.session_id] = self.backend.read_lease(r.session_id)
            out.append((r, self.judge(r, leases[r.session_id])))
        return out

    def in_doubt(self, *, watch: float = 0.0) -> list[EffectRecord]:
        """Every in-doubt call of every session — started, and its attempt provably over —
        oldest first. Calls still in progress are in ``started()`` (``watch``: as there)."""
        return [r for r, verdict in self.started(watch=watch) if isinstance(verdict, Over)]

    def close(self) -> None:
        self._closing()
        self.backend.close()

    async def aclose(self) -> None:
        self._closing()
        await self.async_backend.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<Store {self.url}{'' if self.durable else ' (not durable)'}>"


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
        started = [
            r for r in self.records() if r.in_doubt and not copies.listed_elsewhere(self.store, r)
        ]
        if not started:
            return []
        lease = self.store.backend.read_lease(self.session_id)
        return [r for r in started if isinstance(self.store.judge(r, lease), Over)]

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
        """
        record = self.get(tool_use_id)
        if record is None or not record.in_doubt:
            state = "has no record" if record is None else f"is {record.status.value}"
            raise NotInDoubtError(
                f"call {tool_use_id!r} {state}; only an in-doubt (started) call can be resolved",
                session_id=self.session_id,
                tool_use_id=tool_use_id,
            )
        copies.settle_here(self.store, record)
        who = by or "a person"
        verdict = self.store.judge(record)
        left = watch  # counted by what it slept, so it ends whatever the clocks do
        while _undecided(verdict) and not force and left > 0:
            assert isinstance(verdict, Running) and verdict.watch is not None
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
        )
        (applied,) = self.store.apply(self.session_id, [op])
        if not applied:
            raise SessionConflictError(
                f"call {tool_use_id!r} changed while it was being resolved; look again",
                session_id=self.session_id,
                tool_use_id=tool_use_id,
            )
        return new
