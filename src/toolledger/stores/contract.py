"""The store contract: what a storage engine implements, as Protocols.

A backend implements reads and one write primitive, ``apply``: a list of the conditional
operations of ``toolledger.ops`` committed durably in one transaction. Everything else —
judging liveness, redaction, ledgers, in-doubt listings — is written once above them, in
``Store`` (``stores/store.py``). ``Inspectable`` is optional: a backend with its own integrity
check (SQLite's ``PRAGMA integrity_check``, PostgreSQL's constraints) offers it there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ..ops import Op
from ..records import ApprovalRecord, EffectRecord, Lease, SessionState, StoredMessage

__all__ = ["AsyncBackend", "Backend", "InlineAsync", "Inspectable"]


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


@runtime_checkable
class Inspectable(Protocol):
    """Optional: a backend that can check its own storage (``toolledger verify`` runs it)."""

    def integrity_check(self) -> list[str]:
        """What is wrong with the storage itself (an empty list: sound)."""
        ...


class InlineAsync:
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
