"""A store handle that acts as if it ran on another host: for tests of what one worker sees of
another's attempts and leases without a second machine.

``elsewhere(store, "host-b")`` shares ``store``'s backend (the same rows, the same server) but
has its own identity — another host, so it judges this process's attempts and leases by lease and
deadline on the store's clock, never by this process table — its own attempts in flight and its
own worker id. Its ``clock`` (the timestamps people read) may be skewed with ``skew=`` seconds:
liveness never reads it.
"""

from __future__ import annotations

import itertools
import time

from ..liveness import Runtime
from ..records import Holder
from ..stores.store import Store

__all__ = ["Elsewhere", "elsewhere"]

_pids = itertools.count(1000)


class Elsewhere(Runtime):
    """A process on another host: its own identity; it can see no process table but its own."""

    def __init__(self, host: str) -> None:
        super().__init__()
        self._holder = Holder(host=host, pidns="4026531836", pid=next(_pids), start=1)

    @property
    def holder(self) -> Holder | None:
        return self._holder

    def process_alive(self, holder: Holder) -> bool | None:
        return None  # not a process this test can look at


def elsewhere(store: Store, host: str = "host-b", *, skew: float = 0.0) -> Store:
    """``store``'s rows, seen by a worker on ``host`` (whose clock is off by ``skew`` seconds)."""
    runtime = Elsewhere(host)
    assert runtime.holder is not None
    return Store(
        store.backend,
        async_backend=store.async_backend,
        clock=lambda: time.time() + skew,
        worker_id=f"{host}:{runtime.holder.pid}:test",
        redact=store.redact,
        runtime=runtime,
    )
