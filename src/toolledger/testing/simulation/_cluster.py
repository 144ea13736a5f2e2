"""Simulated machines: process tables with their own clocks, processes that run, pause, crash and
restart, and the store handle each process sees.

A *process table* is one host's (or one container's) view of processes: a host identity, a PID
namespace, a clock offset and drift. Two tables may share a host identity (containers of one
kernel); they never share a PID namespace. A process's ``Runtime`` answers "is that process
alive?" only for its own table, as the real one does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...drivers import IOContext
from ...errors import StoreUnavailableError
from ...liveness import InFlight, Runtime
from ...ops import Op
from ...records import ApprovalRecord, EffectRecord, Holder, Lease, SessionState, StoredMessage
from ...stores.memory import MemoryBackend
from ...stores.store import Store

__all__ = ["ActorBackend", "SimProcess", "SimRuntime", "Table", "Worker"]


class Simulation(Protocol):
    """What a simulated process needs of the simulation running it (``_engine.Simulation``)."""

    t: float
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


@dataclass
class Table:
    """One process table: a host (or a container of one)."""

    name: str
    host: str  # host identity (what TOOLLEDGER_HOST_ID or the boot id would be)
    pidns: str
    offset: float  # this host's clock minus the true time, in seconds
    drift: float  # parts of a second gained per second
    next_pid: int = 100

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
    runtime: SimRuntime = field(init=False)
    store: Store = field(init=False)
    workers: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.runtime = SimRuntime(self)
        self.store = Store(
            ActorBackend(self.sim.backend, self),
            clock=lambda: self.table.clock(self.sim.t),
            worker_id=f"{self.table.name}:{self.pid}:{self.name}",
            runtime=self.runtime,
        )

    @property
    def holder(self) -> Holder:
        return Holder(host=self.table.host, pidns=self.table.pidns, pid=self.pid, start=self.start)

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
        super().__init__()
        self.process = process

    def discard(self, key: tuple[str, str, str]) -> None:
        super().discard(key)
        if key not in self:
            self.process.sim.let_go(self.process, key[1], key[2])


class SimRuntime(Runtime):
    """A simulated process as toolledger's liveness sees it."""

    def __init__(self, process: SimProcess) -> None:
        super().__init__()
        self.process = process
        self.in_flight = _WatchedInFlight(process)

    @property
    def holder(self) -> Holder | None:
        return self.process.holder

    def process_alive(self, holder: Holder) -> bool | None:
        for p in self.process.sim.processes:
            if (p.table.host, p.table.pidns, p.pid) == (holder.host, holder.pidns, holder.pid):
                return p.alive and p.start == holder.start
        return False  # no such pid in this table: gone (and reaped)

    def pid_gone(self, pid: int) -> bool:
        mine = self.process.table
        return not any(
            p.table is mine and p.pid == pid and p.alive for p in self.process.sim.processes
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

    def now(self) -> float:
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
