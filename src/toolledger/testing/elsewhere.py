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

from .._liveness import Runtime
from ..stores.store import Store

__all__ = ["Elsewhere", "elsewhere"]

_pids = itertools.count(1000)


class _AnotherHost:
    """The operating system of a process on another host, as that process sees it: a process
    table holding itself and nothing this test could look at."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.pid = next(_pids)

    def getpid(self) -> int:
        return self.pid

    def read(self, path: str) -> str | None:
        if path in (f"/proc/{self.pid}/stat", "/proc/self/stat"):
            return f"{self.pid} (worker) S" + " 0" * 18 + " 1"  # started at tick 1
        if path == "/proc/sys/kernel/random/boot_id":
            return self.host
        return None  # another host's processes: nothing here to read

    def readlink(self, path: str) -> str | None:
        if path == "/proc/self":
            return str(self.pid)
        if path == "/proc/self/ns/pid":
            return "pid:[4026531836]"
        return None

    def signal0(self, pid: int) -> bool | None:
        return True if pid == self.pid else None  # nothing to tell of the others

    def host_id(self) -> str | None:
        return None

    def boottime(self) -> float | None:
        return None  # another machine's boot clock: nothing this one can compare


class Elsewhere(Runtime):
    """A process on another host: its own identity; it can see no process table but its own."""

    def __init__(self, host: str) -> None:
        super().__init__(_AnotherHost(host))


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
