"""Simulated machines: process tables with their own clocks, processes that run, pause, crash and
restart, and the store handle each process sees.

A *process table* is one host's (or one container's) view of processes: a host identity, a PID
namespace, a clock offset and drift. Two tables may share a host identity (containers of one
kernel); they never share a PID namespace. Each process reads its machine through ``SimProc``, a
simulated ``/proc`` (``toolledger._liveness._procview``), so the code that interprets what it reads
is
toolledger's own. A table's ``/proc`` may be its own (``own``), missing (``none``: macOS,
Windows, a masked ``/proc``), hidden across uids (``hidden``: ``hidepid=2``) or the host's
(``host``: a PID namespace without a ``/proc`` of its own, whose pids name other processes
there); a process may run in a time namespace whose boot-time offset shifts the start times it
reads.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..._liveness import InFlight, Runtime
from ...engine._drivers import IOContext
from ...errors import StoreUnavailableError
from ...ops import Op
from ...records import ApprovalRecord, EffectRecord, Lease, SessionState, StoredMessage
from ...stores.memory import MemoryBackend
from ...stores.store import Store
from ._config import SimConfig

__all__ = ["SYSTEM_PIDS", "ActorBackend", "SimProc", "SimProcess", "Table", "Worker"]


class Simulation(Protocol):
    """What a simulated process needs of the simulation running it (``_engine.Simulation``)."""

    t: float
    config: SimConfig
    local_clock: bool
    backend: MemoryBackend
    processes: list[SimProcess]
    stats: Counter[str]

    def observe_commit(
        self,
        process: SimProcess,
        session_id: str,
        ops: Sequence[Op],
        apply: Callable[[str, Sequence[Op]], list[bool]],
    ) -> list[bool]: ...

    def let_go(self, process: SimProcess, session_id: str, tool_use_id: str) -> None: ...


SYSTEM_PIDS = 100
"""Pids below this are a table's own long-lived processes (init, kernel threads): alive for
ever, started at boot."""


@dataclass
class Table:
    """One process table: a host (or a container of one)."""

    name: str
    host: str  # host identity (what TOOLLEDGER_HOST_ID or the boot id would be)
    pidns: str
    offset: float  # this host's clock minus the true time, in seconds
    drift: float  # parts of a second gained per second
    next_pid: int = SYSTEM_PIDS
    proc: str = "own"  # own | none | hidden | host: what its processes' /proc shows
    parent: Table | None = None  # for proc="host": the table whose /proc they see

    def clock(self, true_time: float) -> float:
        return true_time + self.offset + self.drift * (true_time - 1_800_000_000.0)


@dataclass
class SimProcess:
    name: str
    table: Table
    pid: int
    start: int
    sim: Simulation
    state: str = "running"  # running | paused | crashed
    paused_until: float = 0.0
    partitioned_until: float = 0.0
    lose_replies_until: float = 0.0
    sloppy: bool = False  # its tools may send after their deadline (rule 14)
    kept: int = 0  # writes its background writer still holds (lost if it crashes)
    uid: int = 0
    timens: int = 0  # its time namespace (0: the initial one)
    boottime_offset: int = 0  # that namespace's boot-time offset, in clock ticks
    host_pid: int = 0  # for a table with proc="host": its pid in the parent's table
    reaped: bool = True  # once crashed: gone from its table, or left as a zombie
    runtime: Runtime = field(init=False)
    store: Store = field(init=False)
    workers: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.runtime = Runtime(
            SimProc(self), in_flight=_WatchedInFlight(self), monotonic=lambda: self.sim.t
        )
        self.store = Store(
            ActorBackend(self.sim.backend, self),
            clock=lambda: self.table.clock(self.sim.t),
            worker_id=f"{self.table.name}:{self.pid}:{self.name}",
            runtime=self.runtime,
        )

    @property
    def alive(self) -> bool:
        return self.state != "crashed"

    @property
    def runnable(self) -> bool:
        return self.state == "running"

    def local_time(self) -> float:
        return self.table.clock(self.sim.t)


@dataclass
class Worker:
    """One worker thread of a simulated process: the run it is stepping, if any."""

    process: SimProcess
    name: str
    gen: Generator[Any, Any, Any] | None = None
    io: IOContext | None = None
    session: str = ""
    invoking: tuple[str, str, int] | None = None  # (session, tool_use_id, attempt) running
    busy_since: float | None = None  # when its store operation under way began


class _WatchedInFlight(InFlight):
    """The process's calls in flight, telling the simulation when it lets go of one entirely."""

    def __init__(self, process: SimProcess) -> None:
        super().__init__(lambda: process.sim.t)
        self.process = process

    def discard(self, key: tuple[str, str, str]) -> None:
        super().discard(key)
        if key not in self:
            self.process.sim.let_go(self.process, key[1], key[2])


class SimProc:
    """A simulated process's view of its machine (``toolledger._liveness._procview.ProcView``)."""

    def __init__(self, process: SimProcess) -> None:
        self.process = process

    def getpid(self) -> int:
        return self.process.pid

    def host_id(self) -> str | None:
        return None

    def boottime(self) -> float | None:
        """Every simulated host booted 1000 s before the run began; a time namespace's offset
        shows on the boot clock read there."""
        me = self.process
        return me.sim.t - (1_800_000_000.0 - 1000.0) + me.boottime_offset / 100

    def read(self, path: str) -> str | None:
        me = self.process
        table = me.table
        if table.proc == "none":
            return None
        if path == "/proc/sys/kernel/random/boot_id":
            return table.host
        if path == "/proc/self/timens_offsets":
            return f"monotonic 0 0\nboottime {me.boottime_offset // 100} 0"
        parts = path.split("/")
        if len(parts) != 4 or parts[1] != "proc" or parts[3] != "stat":
            return None
        if parts[2] == "self":
            pid = me.host_pid if table.proc == "host" else me.pid
        elif parts[2].isdigit():
            pid = int(parts[2])
        else:
            return None
        entry = self._entry(pid)
        if entry is None:
            return None
        state, start = entry
        # A start time reads shifted by the reader's time-namespace boot-time offset.
        return f"{pid} (python) {state}" + " 0" * 18 + f" {start + me.boottime_offset}"

    def _entry(self, pid: int) -> tuple[str, int] | None:
        """``(state, start)`` of what the /proc this process sees shows under ``pid``."""
        me = self.process
        visible = me.table.parent if me.table.proc == "host" else me.table
        assert visible is not None
        if pid < SYSTEM_PIDS:
            found = self._in(visible, pid)
            if found is None:
                return ("S", 0)  # a system process, there since boot
        else:
            found = self._in(visible, pid)
            if found is None:
                return None
        if found.state == "crashed":
            if found.reaped:
                return None
            return ("Z", found.start)
        if me.table.proc == "hidden" and found.uid != me.uid:
            return None  # hidepid=2: another uid's entry is not there for us
        return ("S", found.start)

    def _in(self, visible: Table, pid: int) -> SimProcess | None:
        """The simulated process ``visible``'s /proc lists under ``pid``, if any (the last one
        given that pid: a reused pid names its newest process)."""
        found = None
        for p in self.process.sim.processes:
            if (p.table is visible and p.pid == pid) or (
                p.table.parent is visible and p.table.proc == "host" and p.host_pid == pid
            ):
                found = p
        return found

    def readlink(self, path: str) -> str | None:
        me = self.process
        table = me.table
        if table.proc == "none":
            return None
        if path == "/proc/self":
            return str(me.host_pid if table.proc == "host" else me.pid)
        if path == "/proc/self/ns/pid":
            return f"pid:[{table.pidns}]"
        if path in ("/proc/self/ns/time", "/proc/self/ns/time_for_children"):
            return f"time:[{4026531834 + me.timens}]"
        return None

    def signal0(self, pid: int) -> bool | None:
        """``kill(pid, 0)`` works without ``/proc``, in the process's own PID namespace."""
        if pid < SYSTEM_PIDS and self.process.table.proc != "host":
            return True
        return any(
            p.table is self.process.table
            and p.pid == pid
            and (p.state != "crashed" or not p.reaped)
            for p in self.process.sim.processes
        )


class ActorBackend:
    """The store as one simulated process reaches it: through its network (which may be cut or
    lose replies), with every write shown to the simulation's checks first."""

    durable = False

    def __init__(self, inner: MemoryBackend, process: SimProcess) -> None:
        self.inner = inner
        self.process = process
        self.url = inner.url

    def _reach(self, action: str) -> None:
        if self.process.sim.t < self.process.partitioned_until:
            self.process.sim.stats["store_refused"] += 1
            raise StoreUnavailableError(
                f"{self.url}: cannot reach the store while {action} (simulated partition)",
                url=self.url,
            )

    def apply(self, session_id: str, ops: Sequence[Op]) -> list[bool]:
        self._reach("writing the ledger")
        return self.process.sim.observe_commit(self.process, session_id, ops, self.inner.apply)

    def read_effects(
        self, session_id: str, tool_use_ids: Sequence[str] | None = None
    ) -> dict[str, EffectRecord]:
        self._reach("reading the ledger")
        return self.inner.read_effects(session_id, tool_use_ids)

    def read_effect_ids(self, session_id: str) -> list[str]:
        self._reach("reading the ledger")
        return self.inner.read_effect_ids(session_id)

    def read_session(self, session_id: str) -> SessionState | None:
        self._reach("reading a session")
        return self.inner.read_session(session_id)

    def read_messages(self, session_id: str, since: int = 0) -> list[StoredMessage]:
        self._reach("reading a transcript")
        return self.inner.read_messages(session_id, since)

    def read_abandoned(self, session_id: str) -> dict[int, list[StoredMessage]]:
        self._reach("reading abandoned branches")
        return self.inner.read_abandoned(session_id)

    def read_approvals(self, session_id: str | None = None) -> list[ApprovalRecord]:
        self._reach("reading approvals")
        return self.inner.read_approvals(session_id)

    def read_lease(self, session_id: str) -> Lease | None:
        self._reach("reading a lease")
        return self.inner.read_lease(session_id)

    @property
    def shared_clock(self) -> bool:
        return not self.process.sim.local_clock

    def now(self) -> float:
        if self.process.sim.local_clock:
            return self.process.local_time()  # a file store: each host reads its own clock
        return self.inner.now()

    def list_sessions(self) -> list[SessionState]:
        return self.inner.list_sessions()

    def session_ids(self) -> list[str]:
        return self.inner.session_ids()

    def in_doubt(self) -> list[EffectRecord]:
        self._reach("listing in-doubt calls")
        return self.inner.in_doubt()

    def close(self) -> None:
        """The simulated store outlives every handle."""


Clock = Callable[[], float]
