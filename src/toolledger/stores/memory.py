"""``memory://`` — a store in this process's memory. NOT durable: for tests and examples only.

``memory://`` alone is a fresh private store; ``memory://NAME`` is shared by every
``open_store("memory://NAME")`` in the process, which lets a test "reopen" a store.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from ..ops import (
    AppendMessages,
    HoldLease,
    InsertEffect,
    Op,
    PutApproval,
    PutSession,
    TakeLease,
    UpdateEffect,
    approval_applies,
    busy,
    conflict,
    effect_applies,
    lost,
    moved,
)
from ..records import ApprovalRecord, EffectRecord, Lease, SessionState, Status, StoredMessage

__all__ = ["MemoryBackend"]

logger = logging.getLogger("toolledger")

_named: dict[str, MemoryBackend] = {}
_named_lock = threading.Lock()


@dataclass
class SessionData:
    effects: dict[str, EffectRecord] = field(default_factory=dict)
    state: SessionState | None = None
    messages: list[StoredMessage] = field(default_factory=list)
    approvals: dict[str, ApprovalRecord] = field(default_factory=dict)
    lease: Lease | None = None


def apply_ops(session_id: str, data: SessionData, ops: Sequence[Op]) -> list[bool]:
    """Apply ``ops`` to ``data`` in place, all or nothing for guards. Shared by file backends
    that hold a session in memory while they rewrite it."""
    out: list[bool] = []
    for op in ops:
        if isinstance(op, (InsertEffect, UpdateEffect)):
            applied = effect_applies(op, data.effects.get(op.record.tool_use_id))
            if applied:
                data.effects[op.record.tool_use_id] = op.record
            elif isinstance(op, UpdateEffect) and op.guard:
                raise moved(session_id, op.record.tool_use_id)
        elif isinstance(op, PutSession):
            current = data.state
            if op.expect_version is None and current is not None:
                raise conflict(session_id, "it already exists")
            if op.expect_version is not None and (
                current is None or current.version != op.expect_version
            ):
                found = "missing" if current is None else f"version {current.version}"
                raise conflict(session_id, f"expected version {op.expect_version}, {found}")
            data.state = op.state
            applied = True
        elif isinstance(op, AppendMessages):
            for message in op.messages:
                if message.seq != len(data.messages):
                    raise conflict(
                        session_id, f"message {message.seq} is not next ({len(data.messages)})"
                    )
                data.messages.append(message)
            applied = True
        elif isinstance(op, PutApproval):
            applied = approval_applies(op, data.approvals.get(op.record.tool_use_id))
            if applied:
                data.approvals[op.record.tool_use_id] = op.record
        elif isinstance(op, TakeLease):
            current_token = data.lease.token if data.lease is not None else 0
            renewed = (
                op.expect_expires_at is not None
                and data.lease is not None
                and data.lease.expires_at != op.expect_expires_at
            )
            if current_token != op.expect_token or renewed:
                raise busy(session_id, data.lease)
            data.lease = op.lease
            applied = True
        elif isinstance(op, HoldLease):
            lease = data.lease
            if lease is None or lease.token != op.token or lease.expires_at <= 0:
                raise lost(session_id, op.token)
            data.lease = replace(lease, expires_at=op.expires_at)
            applied = True
        else:
            applied = data.lease is not None and data.lease.token == op.token
            if applied and data.lease is not None:
                data.lease = replace(data.lease, expires_at=0.0)
        out.append(applied)
    return out


class MemoryBackend:
    durable = False

    def __init__(self, url: str = "memory://", *, clock: Callable[[], float] = time.time) -> None:
        self.url = url
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

    def read_effects(
        self, session_id: str, tool_use_ids: Sequence[str] | None = None
    ) -> dict[str, EffectRecord]:
        with self._lock:
            effects = self._sessions.get(session_id, SessionData()).effects
            if tool_use_ids is None:
                return dict(effects)
            return {i: effects[i] for i in tool_use_ids if i in effects}

    def apply(self, session_id: str, ops: Sequence[Op]) -> list[bool]:
        with self._lock:
            current = self._sessions.get(session_id, SessionData())
            # Work on a copy and swap it in: a failed guard leaves nothing half-applied.
            draft = SessionData(
                effects=dict(current.effects),
                state=current.state,
                messages=list(current.messages),
                approvals=dict(current.approvals),
                lease=current.lease,
            )
            out = apply_ops(session_id, draft, ops)
            self._sessions[session_id] = draft
            return out

    def read_session(self, session_id: str) -> SessionState | None:
        with self._lock:
            return self._sessions.get(session_id, SessionData()).state

    def read_messages(self, session_id: str, since: int = 0) -> list[StoredMessage]:
        with self._lock:
            messages = self._sessions.get(session_id, SessionData()).messages[since:]
            return copy.deepcopy(messages)  # content is mutable JSON: callers get their own

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
