"""Counting fakes: evidence that a tool really ran, independent of toolledger's own records."""

from __future__ import annotations

import threading
from collections import Counter as _Counts

__all__ = ["Counter"]


class Counter:
    """Counts real executions by name. ``counter.hit("create_ticket")`` inside a fake tool,
    ``counter["create_ticket"]`` in the assertion."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: _Counts[str] = _Counts()

    def hit(self, name: str) -> int:
        with self._lock:
            self._counts[name] += 1
            return self._counts[name]

    def __getitem__(self, name: str) -> int:
        with self._lock:
            return self._counts[name]

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())

    def __repr__(self) -> str:
        return f"Counter({dict(self._counts)})"
