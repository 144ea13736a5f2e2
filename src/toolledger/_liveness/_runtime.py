"""What this process knows of itself, for liveness: its identity, the attempts it runs
(``InFlight``), the leases it watches (``Watch``) and its boot clock — ``Runtime``, one per
process (``this_process()``), a stand-in in tests and the simulation. ``toolledger._liveness``
judges with it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Hashable

from ..records import Holder
from ._identity import BootClock, Identity, boot_clock, evidence, identify
from ._procview import ProcView, RealProc

__all__ = ["InFlight", "Runtime", "Watch", "flight_key", "this_process"]


class InFlight:
    """The attempts this process is running, by ``(store place, session_id, tool_use_id)``
    (``flight_key``):
    registered before the intent commits, dropped after the outcome commits. Counted, so two
    threads racing on one call (only one of which will win its intent) can both register."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        # A plain dict: a ``Counter`` runs Python code for a missing key and for a removal.
        self._calls: dict[tuple[str, str, str], int] = {}
        self._held: dict[tuple[str, str, str], float] = {}  # kept in flight until (``hold``)
        self._monotonic = monotonic

    def add(self, key: tuple[str, str, str]) -> None:
        with self._lock:
            self._calls[key] = self._calls.get(key, 0) + 1

    def discard(self, key: tuple[str, str, str]) -> None:
        with self._lock:
            left = self._calls.get(key, 0) - 1
            if left > 0:
                self._calls[key] = left
            else:
                self._calls.pop(key, None)

    def hold(self, key: tuple[str, str, str], until: float) -> None:
        """Keep ``key`` in flight until ``until`` (this process's monotonic clock), whatever
        is discarded meanwhile: an attempt this process stopped awaiting whose work may still
        take effect — an ``async def`` tool cancelled by its caller may have handed its effect to
        a thread, which nothing stops — until its deadline."""
        with self._lock:
            self._held[key] = max(until, self._held.get(key, until))

    def held(self, key: tuple[str, str, str]) -> bool:
        """Whether ``key`` is kept in flight by a ``hold`` that has not run out — not by an
        attempt registered (another thread's, racing on the same call)."""
        with self._lock:
            until = self._held.get(key)
            return until is not None and self._monotonic() < until

    def __contains__(self, key: object) -> bool:
        with self._lock:
            if key in self._calls:
                return True
            if not self._held:
                return False
            until = self._held.get(key)  # type: ignore[call-overload]
            if until is None:
                return False
            if self._monotonic() < until:
                return True
            del self._held[key]  # type: ignore[arg-type]
            return False

    def clear(self) -> None:
        with self._lock:
            self._calls.clear()
            self._held.clear()


class Watch:
    """What this process has seen of leases it can judge only by their renewals: for each, the
    renewal it last saw and since when (this process's monotonic clock)."""

    MAX = 100_000

    def __init__(self, monotonic: Callable[[], float]) -> None:
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._seen: dict[Hashable, tuple[Hashable, float, bool]] = {}

    def look(self, key: Hashable, marker: Hashable) -> tuple[float, bool]:
        """Seen ``marker`` under ``key`` now: how long it has been unchanged, and whether this
        process saw it change (a renewal) since it first looked."""
        now = self._monotonic()
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and seen[0] == marker:
                return now - seen[1], seen[2]
            if len(self._seen) >= self.MAX:
                for old in list(self._seen)[: self.MAX // 10]:
                    del self._seen[old]
            changed = seen is not None
            self._seen[key] = (marker, now, changed)
            return 0.0, changed

    def forget(self, key: Hashable) -> None:
        with self._lock:
            self._seen.pop(key, None)


class Runtime:
    """Where toolledger runs: this process's identity, the attempts and runs it has in flight,
    the leases it has watched, and how it looks at other processes — through ``proc``, its view
    of the operating system, and ``monotonic``, its clock for how long it watched.
    ``this_process()`` is the real one; the deterministic simulator gives each simulated process
    its own view of a simulated machine."""

    def __init__(
        self,
        proc: ProcView | None = None,
        *,
        in_flight: InFlight | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.proc: ProcView = proc if proc is not None else RealProc()
        self.in_flight = in_flight if in_flight is not None else InFlight(monotonic)
        self.live_runs: set[str] = set()
        """Lease owners of this process's agent runs that are still going."""
        self.monotonic = monotonic
        self.watch = Watch(monotonic)
        self._pid = -1
        self._identity: Identity | None = None
        self._boot: BootClock | None = None
        self._boot_read = False

    @property
    def boot(self) -> BootClock | None:
        """This kernel's boot clock, if this process can read it
        (``toolledger._liveness._identity``):
        deadlines are also written on it, so that workers of one machine judge them whatever
        its wall clock does."""
        if not self._boot_read:
            self._boot = boot_clock(self.proc)
            self._boot_read = True
        return self._boot

    @property
    def identity(self) -> Identity:
        found = self._identity
        if found is None or self._pid == -1:
            found = self._identity = identify(self.proc)
            self._pid = found.holder.pid
        return found

    @property
    def holder(self) -> Holder:
        """This process, as it names itself on every intent and lease (an unknown identity
        where its process table is not provably its own)."""
        return self.identity.holder

    def is_me(self, holder: Holder) -> bool:
        me = self.holder
        return me.known and holder == me

    def evidence(self, holder: Holder) -> bool | None:
        """What this process's table proves about ``holder``: alive, ended, or ``None``."""
        if self.is_me(holder):
            return True
        return evidence(self.proc, self.identity, holder)


class _ThisProcess(Runtime):
    def __init__(self) -> None:
        super().__init__()
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        # A forked child runs none of its parent's attempts or runs, and is another holder.
        self.in_flight = InFlight(self.monotonic)
        self.live_runs = set()
        self.watch = Watch(self.monotonic)
        self._pid = -1
        self._boot_read = False


_THIS_PROCESS = _ThisProcess()


def this_process() -> Runtime:
    return _THIS_PROCESS


# -- the judgements -------------------------------------------------------------------------------


def flight_key(place: str, session_id: str, tool_use_id: str) -> tuple[str, str, str]:
    """An attempt's key in ``InFlight``: its call, in the database it is recorded in
    (``StoreCore.place``: the file, the directory, the server's schema — whatever store object
    or spelling of the URL it runs through). One database opened twice in a process (an absolute
    and a relative path, a URL with another option) is one ledger: a call running through one is
    running through the other."""
    return (place, session_id, tool_use_id)
