"""The store contract: a few primitives per backend, everything else written once above them.

A backend implements reads and one write primitive, ``apply``: a list of conditional operations
committed durably in one transaction. Each operation is a single conditional write —
insert-if-absent or compare-and-set on ``(status, attempt)`` — so a crash or a racing worker can
never leave half a state change, and a re-sent write is harmless (STYLE.md rule 3).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from ..codec import encode_result
from ..errors import (
    EffectInProgressError,
    InvalidSessionIdError,
    LeaseLostError,
    SessionBusyError,
    SessionConflictError,
    ToolLedgerError,
)
from ..liveness import Over, Running, Runtime, Verdict, judge, this_process
from ..records import (
    ApprovalRecord,
    ApprovalStatus,
    EffectRecord,
    Lease,
    SessionState,
    Status,
    StoredMessage,
)

__all__ = [
    "AppendMessages",
    "AsyncBackend",
    "Backend",
    "DropLease",
    "HoldLease",
    "InsertEffect",
    "Ledger",
    "Op",
    "PutApproval",
    "PutSession",
    "Store",
    "TakeLease",
    "UpdateEffect",
    "approval_applies",
    "busy",
    "check_session_id",
    "conflict",
    "effect_applies",
    "in_progress_error",
    "lost",
    "moved",
]

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


@dataclass(frozen=True, slots=True)
class InsertEffect:
    """Insert ``record`` unless its ``(session, tool_use_id)`` exists. Applied → ``True``."""

    record: EffectRecord


@dataclass(frozen=True, slots=True)
class UpdateEffect:
    """Replace the record if it is still ``(expect_status, expect_attempt)`` — and, with
    ``expect_at``, the very version written at that ``updated_at``: compare-and-set. Applied →
    ``True``; someone else moved it first → ``False``."""

    record: EffectRecord
    expect_status: Status
    expect_attempt: int
    expect_at: float | None = None
    guard: bool = False
    """A guard, like ``PutSession``: if the record moved on, the whole batch rolls back and
    ``SessionConflictError`` (with ``tool_use_id``) is raised — a checkpoint that reports an
    outcome never lands without it."""


@dataclass(frozen=True, slots=True)
class PutSession:
    """Write a session's state: create it (``expect_version=None``) or compare-and-set on its
    version. A *guard*: if the condition fails the whole batch is rolled back and
    ``SessionConflictError`` raised — a checkpoint is all or nothing."""

    state: SessionState
    expect_version: int | None


@dataclass(frozen=True, slots=True)
class AppendMessages:
    """Append messages at the end of a transcript (their ``seq`` continues it). A guard, like
    ``PutSession``: a seq already taken means another writer got there first."""

    messages: tuple[StoredMessage, ...]


@dataclass(frozen=True, slots=True)
class PutApproval:
    """Create an approval request (``expect_status=None``) or move one on (compare-and-set on
    its status). Applied → ``True``."""

    record: ApprovalRecord
    expect_status: ApprovalStatus | None


@dataclass(frozen=True, slots=True)
class TakeLease:
    """Take the session's lease: insert it (``expect_token=0``: there is none) or replace the
    one with ``expect_token`` and ``expect_expires_at`` (expired, given back, or held by a dead
    worker — the caller judged it, ``toolledger.liveness.lease_state``). Comparing the expiry too
    means a renewal that lands between the judgement and the take-over makes it fail. A guard: if
    the lease moved on, the batch rolls back and ``SessionBusyError`` is raised."""

    lease: Lease
    expect_token: int
    expect_expires_at: float | None = None


@dataclass(frozen=True, slots=True)
class HoldLease:
    """The fence: the session's lease must still carry ``token`` (and not have been given
    back); it is renewed to ``expires_at``. A guard: a taken-over lease rolls the batch back
    (``LeaseLostError``)."""

    session_id: str
    token: int
    expires_at: float


@dataclass(frozen=True, slots=True)
class DropLease:
    """Give the lease up (it expires now) if it still carries ``token``. Applied → ``True``."""

    session_id: str
    token: int


Op = (
    InsertEffect
    | UpdateEffect
    | PutSession
    | AppendMessages
    | PutApproval
    | TakeLease
    | HoldLease
    | DropLease
)


def busy(session_id: str, current: Lease | None, why: str | None = None) -> SessionBusyError:
    owner = current.owner if current is not None else "another worker"
    expires = current.expires_at if current is not None else 0.0
    held = why or (f"its lease runs until {time.strftime('%H:%M:%S', time.localtime(expires))}")
    return SessionBusyError(
        f"session {session_id!r} is being run by {owner} ({held}): two workers never run one "
        "session at once. Try again later, or let `toolledger resume-all` pick it up.",
        session_id=session_id,
        owner=owner,
        expires_at=expires,
    )


def lost(session_id: str, token: int) -> LeaseLostError:
    return LeaseLostError(
        f"this worker's lease on session {session_id!r} (token {token}) was taken over by "
        "another worker: the write was refused and nothing of it landed. This run stops here.",
        session_id=session_id,
    )


def effect_applies(op: InsertEffect | UpdateEffect, current: EffectRecord | None) -> bool:
    """The condition of an effect operation, for backends that evaluate it in Python."""
    if isinstance(op, InsertEffect):
        return current is None
    return (
        current is not None
        and current.status is op.expect_status
        and current.attempt == op.expect_attempt
        and (op.expect_at is None or current.updated_at == op.expect_at)
    )


def approval_applies(op: PutApproval, current: ApprovalRecord | None) -> bool:
    if op.expect_status is None:
        return current is None
    return current is not None and current.status is op.expect_status


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


def moved(session_id: str, tool_use_id: str) -> SessionConflictError:
    """A guarded outcome found its record moved on (another attempt, a person)."""
    return SessionConflictError(
        f"the record of {tool_use_id!r} in session {session_id!r} moved on while this worker "
        "ran the call (another attempt replaced it, or a person settled it): nothing of this "
        "checkpoint was written. Run the session again: it answers from the ledger.",
        session_id=session_id,
        tool_use_id=tool_use_id,
    )


def conflict(session_id: str, why: str) -> SessionConflictError:
    return SessionConflictError(
        f"session {session_id!r} changed since it was read ({why}): another worker is running "
        "it or ran it meanwhile. Nothing of this checkpoint was written; reload and go on.",
        session_id=session_id,
    )


@runtime_checkable
class Backend(Protocol):
    """What a storage engine implements. Everything else is built on these."""

    url: str
    durable: bool

    def read_effects(
        self, session_id: str, tool_use_ids: Sequence[str] | None = None
    ) -> dict[str, EffectRecord]:
        """Records of one session; all of them when ``tool_use_ids`` is None."""
        ...

    def apply(self, session_id: str, ops: Sequence[Op]) -> list[bool]:
        """Commit ``ops`` (all of one session) durably in one transaction; per op, whether its
        condition held. A failed guard (``PutSession``, ``AppendMessages``) rolls everything
        back and raises ``SessionConflictError``. Raises ``StoreError`` (nothing committed) when
        the store cannot be written."""
        ...

    def read_session(self, session_id: str) -> SessionState | None: ...

    def read_messages(self, session_id: str, since: int = 0) -> list[StoredMessage]:
        """The transcript from ``seq >= since``, in order."""
        ...

    def read_approvals(self, session_id: str | None = None) -> list[ApprovalRecord]:
        """Approval records of one session, or of every session."""
        ...

    def read_lease(self, session_id: str) -> Lease | None: ...

    def now(self) -> float:
        """The store's clock, in epoch seconds: what lease expiries and attempt deadlines are
        written and judged on. The machine's clock for embedded stores (every process using the
        file shares it); the server's for PostgreSQL."""
        ...

    def list_sessions(self) -> list[SessionState]:
        """Every agent session's state (sessions used only through ``run_tool_uses`` have
        effects but no state: see ``session_ids``)."""
        ...

    def session_ids(self) -> list[str]:
        """Every session with an effect record or a state."""
        ...

    def in_doubt(self) -> list[EffectRecord]:
        """Every ``started`` record of every session."""
        ...

    def close(self) -> None: ...


class AsyncBackend(Protocol):
    """The async twin of ``Backend`` (PostgreSQL implements it natively)."""

    async def read_effects(
        self, session_id: str, tool_use_ids: Sequence[str] | None = None
    ) -> dict[str, EffectRecord]: ...

    async def apply(self, session_id: str, ops: Sequence[Op]) -> list[bool]: ...

    async def read_session(self, session_id: str) -> SessionState | None: ...

    async def read_messages(self, session_id: str, since: int = 0) -> list[StoredMessage]: ...

    async def read_approvals(self, session_id: str | None = None) -> list[ApprovalRecord]: ...

    async def read_lease(self, session_id: str) -> Lease | None: ...

    async def close(self) -> None: ...


class _InlineAsync:
    """An embedded backend seen through the async contract.

    Embedded stores do their I/O on the calling thread: one fsync, well under a millisecond, is
    cheaper than a hop to a worker thread and back.
    """

    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    async def read_effects(
        self, session_id: str, tool_use_ids: Sequence[str] | None = None
    ) -> dict[str, EffectRecord]:
        return self._backend.read_effects(session_id, tool_use_ids)

    async def apply(self, session_id: str, ops: Sequence[Op]) -> list[bool]:
        return self._backend.apply(session_id, ops)

    async def read_session(self, session_id: str) -> SessionState | None:
        return self._backend.read_session(session_id)

    async def read_messages(self, session_id: str, since: int = 0) -> list[StoredMessage]:
        return self._backend.read_messages(session_id, since)

    async def read_approvals(self, session_id: str | None = None) -> list[ApprovalRecord]:
        return self._backend.read_approvals(session_id)

    async def read_lease(self, session_id: str) -> Lease | None:
        return self._backend.read_lease(session_id)

    async def close(self) -> None:
        self._backend.close()


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
        self.async_backend: AsyncBackend = async_backend or _InlineAsync(backend)
        self.clock = clock
        """This worker's clock: the timestamps people read (``created_at``, ``updated_at``).
        Nothing that decides liveness uses it: that is ``now()``, the store's clock."""
        self.worker_id = worker_id or default_worker_id()
        self.redact = redact
        self.runtime = runtime or this_process()
        """This process as liveness sees it (identity, attempts in flight)."""
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
        over (``Over``): see ``toolledger.liveness``. Reads the session's lease unless given."""
        if record.status is not Status.STARTED:
            return Over(f"it is {record.status.value}")
        if lease is None and record.lease_token is not None:
            lease = self.backend.read_lease(record.session_id)
        return judge(record, now=self.now(), lease=lease, runtime=self.runtime, url=self.url)

    def apply(self, session_id: str, ops: Sequence[Op]) -> list[bool]:
        """Commit ``ops`` through the backend, after the ``redact`` hook (see
        ``toolledger.redact``). Everything toolledger writes goes through here."""
        return self.backend.apply(session_id, self._prepare(ops))

    async def aapply(self, session_id: str, ops: Sequence[Op]) -> list[bool]:
        return await self.async_backend.apply(session_id, self._prepare(ops))

    def _prepare(self, ops: Sequence[Op]) -> list[Op]:
        if self.redact is None:
            return list(ops)
        from ..redact import redact_ops

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

    def started(self) -> list[tuple[EffectRecord, Verdict]]:
        """Every ``started`` record of every session with its verdict, oldest first: ``Running``
        (in progress: leave it alone) or ``Over`` (in doubt: a person may settle it)."""
        records = sorted(self.backend.in_doubt(), key=lambda r: (r.created_at, r.session_id))
        leases: dict[str, Lease | None] = {}
        out: list[tuple[EffectRecord, Verdict]] = []
        for r in records:
            if r.session_id not in leases:
                leases[r.session_id] = self.backend.read_lease(r.session_id)
            out.append((r, self.judge(r, leases[r.session_id])))
        return out

    def in_doubt(self) -> list[EffectRecord]:
        """Every in-doubt call of every session — started, and its attempt provably over —
        oldest first. Calls still in progress are in ``started()``."""
        return [r for r, verdict in self.started() if isinstance(verdict, Over)]

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
        started = [r for r in self.records() if r.in_doubt]
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
    ) -> EffectRecord:
        """Settle an in-doubt call by a person's word.

        ``happened=True`` records it ``succeeded`` with ``result`` (what the model will be told;
        default: a note saying a person confirmed it). ``happened=False`` records
        ``not_happened``: the next run executes it (through the approval gate if high-impact).
        One compare-and-set: raises ``ToolLedgerError`` if the call is not in doubt any more.

        A call whose attempt may still be running is not in doubt: it raises
        ``EffectInProgressError`` (naming the holder and until when) unless ``force=True`` — for
        a person who knows better (the worker's machine is gone for good). The record then says
        what was overridden; if that attempt does report later, its outcome is kept beside the
        person's word and raised as an alert.
        """
        record = self.get(tool_use_id)
        if record is None or not record.in_doubt:
            state = "has no record" if record is None else f"is {record.status.value}"
            raise ToolLedgerError(
                f"call {tool_use_id!r} {state}; only an in-doubt (started) call can be resolved",
                session_id=self.session_id,
                tool_use_id=tool_use_id,
            )
        who = by or "a person"
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
            raise ToolLedgerError(
                f"call {tool_use_id!r} changed while it was being resolved; look again",
                session_id=self.session_id,
                tool_use_id=tool_use_id,
            )
        return new
