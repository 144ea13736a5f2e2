"""``memory://`` — a store in this process's memory. NOT durable: for tests and examples only.

``memory://`` alone is a fresh private store; ``memory://NAME`` is shared by every
``open_store("memory://NAME")`` in the process, which lets a test "reopen" a store.
"""

from __future__ import annotations

import copy
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence

from ..ops import DropSession, Op
from ..records import ApprovalRecord, EffectRecord, Lease, SessionState, Status, StoredMessage
from ._document import SessionData, apply_ops

__all__ = ["MemoryBackend"]

logger = logging.getLogger("toolledger")

_named: dict[str, MemoryBackend] = {}
_named_lock = threading.Lock()


_PLACES = itertools.count(1)
"""Numbers for ``place``: an object's ``id`` is reused once it is gone, and what this process
holds in flight for one store must never be taken for another's."""


class MemoryBackend:
    durable = False
    shared_clock = True  # one process, one clock (or the one given: the simulator's)

    def __init__(self, url: str = "memory://", *, clock: Callable[[], float] = time.time) -> None:
        self.url = url
        self.place = f"memory:{next(_PLACES)}"  # each one its own, never one reused
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[str, SessionData] = {}

    @classmethod
    def open(cls, name: str) -> MemoryBackend:
        logger.info("memory:// store: nothing is durable; use sqlite:/// or json:/// for real runs")
        if not name:
            return cls()
        with _named_lock:
            if name not in _named:
                _named[name] = cls(f"memory://{name}")
            return _named[name]

    @classmethod
    def opened(cls, name: str) -> MemoryBackend | None:
        """The store ``memory://NAME`` this process opened, or ``None``: what a reader that
        must not create one (``open_store(create=False)``) finds."""
        with _named_lock:
            return _named.get(name) if name else None

    def read_effects(
        self, session_id: str, tool_use_ids: Sequence[str] | None = None
    ) -> dict[str, EffectRecord]:
        with self._lock:
            effects = self._sessions.get(session_id, SessionData()).effects
            if tool_use_ids is None:
                return dict(effects)
            return {i: effects[i] for i in tool_use_ids if i in effects}

    def read_effect_ids(self, session_id: str) -> list[str]:
        with self._lock:
            return list(self._sessions.get(session_id, SessionData()).effects)

    def apply(self, session_id: str, ops: Sequence[Op]) -> list[bool]:
        with self._lock:
            current = self._sessions.get(session_id, SessionData())
            # Work on a copy and swap it in: a failed guard leaves nothing half-applied.
            draft = current.draft()
            out = apply_ops(session_id, draft, ops)
            if any(isinstance(op, DropSession) for op in ops):
                self._sessions.pop(session_id, None)
            else:
                self._sessions[session_id] = draft
            return out

    def read_session(self, session_id: str) -> SessionState | None:
        with self._lock:
            return self._sessions.get(session_id, SessionData()).state

    def read_messages(self, session_id: str, since: int = 0) -> list[StoredMessage]:
        with self._lock:
            messages = self._sessions.get(session_id, SessionData()).messages[since:]
            return copy.deepcopy(messages)  # content is mutable JSON: callers get their own

    def read_abandoned(self, session_id: str) -> dict[int, list[StoredMessage]]:
        with self._lock:
            branches = self._sessions.get(session_id, SessionData()).abandoned
            return copy.deepcopy({n: list(ms) for n, ms in sorted(branches.items())})

    def read_approvals(self, session_id: str | None = None) -> list[ApprovalRecord]:
        with self._lock:
            chosen = (
                [self._sessions.get(session_id, SessionData())]
                if session_id is not None
                else list(self._sessions.values())
            )
            return [a for s in chosen for a in s.approvals.values()]

    def read_lease(self, session_id: str) -> Lease | None:
        with self._lock:
            return self._sessions.get(session_id, SessionData()).lease

    def now(self) -> float:
        """This machine's clock (or the one given: the simulator's)."""
        return self._clock()

    def list_sessions(self) -> list[SessionState]:
        with self._lock:
            return [s.state for s in self._sessions.values() if s.state is not None]

    def session_ids(self) -> list[str]:
        with self._lock:
            return [k for k, s in self._sessions.items() if s.effects or s.state is not None]

    def in_doubt(self) -> list[EffectRecord]:
        with self._lock:
            return [
                r
                for s in self._sessions.values()
                for r in s.effects.values()
                if r.status is Status.STARTED
            ]

    def close(self) -> None:
        """Nothing to release; a named store keeps its contents until the process ends."""
