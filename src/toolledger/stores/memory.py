"""``memory://`` — a store in this process's memory. NOT durable: for tests and examples only.

``memory://`` alone is a fresh private store; ``memory://NAME`` is shared by every
``open_store("memory://NAME")`` in the process, which lets a test "reopen" a store.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from ..records import EffectRecord
from .base import InsertEffect, Op

__all__ = ["MemoryBackend"]

logger = logging.getLogger("toolledger")

_named: dict[str, MemoryBackend] = {}
_named_lock = threading.Lock()


class MemoryBackend:
    durable = False

    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        self._lock = threading.Lock()
        self._effects: dict[str, dict[str, EffectRecord]] = {}

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
            session = self._effects.get(session_id, {})
            if tool_use_ids is None:
                return dict(session)
            return {i: session[i] for i in tool_use_ids if i in session}

    def apply(self, session_id: str, ops: Sequence[Op]) -> list[bool]:
        with self._lock:
            session = self._effects.setdefault(session_id, {})
            out: list[bool] = []
            for op in ops:
                current = session.get(op.record.tool_use_id)
                if isinstance(op, InsertEffect):
                    applied = current is None
                else:
                    applied = (
                        current is not None
                        and current.status is op.expect_status
                        and current.attempt == op.expect_attempt
                    )
                if applied:
                    session[op.record.tool_use_id] = op.record
                out.append(applied)
            return out

    def session_ids(self) -> list[str]:
        with self._lock:
            return [s for s, records in self._effects.items() if records]

    def close(self) -> None:
        """Nothing to release; a named store keeps its contents until the process ends."""
