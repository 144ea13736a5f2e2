"""The simulation: one thread, simulated time, a seeded scheduler stepping every worker one
request at a time — its cast (process tables, processes, workers) and its loop. The other parts:
``_requests`` (carrying out a worker's requests), ``_truth`` (what every write is checked
against), ``_faults`` (faults and people), ``_state`` (what they share).

``runner._process`` and ``Agent._loop`` are generators that yield every piece of I/O; here each
yielded request is carried out against the shared in-memory store (the real conformance
semantics) at the current simulated instant, and its answer delivered after a simulated latency.
So the code under test is the real code, and only time, the network and the processes are
simulated. Everything random comes from one ``random.Random(seed)``: the same seed replays the
same run, step for step.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from ...adapters.anthropic import read_tool_uses
from ...agent._agent import Agent
from ...approvals import _queue as approvals
from ...engine._drivers import IOContext
from ...engine._runner import process_batch
from ...errors import StoreError
from ...records import RunStatus
from ...stores.memory import MemoryBackend
from ._branches import Branches
from ._cluster import SimProcess, Table, Worker
from ._config import SimConfig
from ._faults import Faults
from ._requests import Requests
from ._state import T0
from ._world import KIND_OF, SimWorld, script_for

__all__ = ["SimConfig", "Simulation"]


class _Client:
    """A duck-typed Messages API client: the simulation answers the model calls itself."""

    class messages:
        @staticmethod
        def create(**kwargs: Any) -> Any:
            raise AssertionError("the simulation answers model calls itself")


class Simulation(Requests, Faults, Branches):
    """One seeded run. ``run()`` returns the report; ``violations`` lists what broke."""

    def __init__(self, seed: int, config: SimConfig | None = None) -> None:
        self.seed = seed
        self.config = config or SimConfig()
        self.rng = random.Random(seed)  # noqa: S311 - a reproducible schedule, not a secret
        self.t = T0
        self.backend = MemoryBackend(f"memory://sim-{seed}", clock=lambda: self.t)
        self.world = SimWorld(now=lambda: self.t)
        self.stats: Counter[str] = Counter()
        self.violations: list[str] = []
        self.trace: deque[str] = deque(maxlen=400)
        self.alerts: list[tuple[str, str, str]] = []  # (kind, session, tool_use_id)
        self.attempts = {}
        self._attempt_numbers: dict[tuple[str, str], list[int]] = {}
        self.forced: set[tuple[str, str]] = set()
        self.approved: Counter[tuple[str, str]] = Counter()
        self.limit_cases: set[tuple[str, str]] = set()
        self.steps = 0
        self._events = []
        self._seq = itertools.count()
        self._graveyard: list[Any] = []  # crashed generators: never finalised mid-run
        self._current = None
        self._acting_forced = False
        c = self.config
        self.fooling = (
            c.proc_modes != ("own",)
            or c.uids > 1
            or c.time_namespaces > 0
            or c.store_clock != "server"
            or c.clock_step > 0
        )
        """Whether liveness may be fooled here (process tables, namespaces, clocks): the draws
        for it are made only then, so the worlds without them replay as they always did."""
        self.local_clock = c.store_clock == "local" or (
            c.store_clock == "either" and self.rng.random() < 0.5
        )
        """A file store's clock (each host's own, which may step) rather than a server's."""
        self.tables = self._tables()
        self.tools = self.world.toolset(self.config.tool_timeout)
        self._agents: dict[str, Agent] = {}
        self.processes: list[SimProcess] = []
        self._setup_branches()
        self.operator = self._spawn(self.tables[0], name="operator", workers=0)
        self.scripts = {
            f"s{i}": script_for(self.rng, f"s{i}", self.config.kinds)
            for i in range(self.config.sessions)
        }
        self._minted = itertools.count(1)
        for _ in range(self.config.processes):
            self._spawn(self.rng.choice(self.tables))

    # -- the cast ---------------------------------------------------------------------------------

    def _tables(self) -> list[Table]:
        tables: list[Table] = []
        for h in range(self.config.hosts):
            offset = self.rng.uniform(-self.config.max_offset, self.config.max_offset)
            drift = self.rng.uniform(-1e-4, 1e-4)
            if self.local_clock and tables:
                # A file store lives on one machine: its "hosts" are containers of that kernel
                # (one boot id, one clock), each with PID namespaces of its own.
                offset, drift = tables[0].offset, tables[0].drift
            first: Table | None = None
            for c in range(self.config.containers):
                mode = self.rng.choice(self.config.proc_modes) if self.fooling else "own"
                table = Table(
                    name=f"h{h}c{c}",
                    host="boot-0" if self.local_clock else f"boot-{h}",
                    pidns=str(4026531836 + 10 * h + c),
                    offset=offset,
                    drift=drift,
                    proc=mode,
                )
                if mode == "host":
                    # A PID namespace without its own /proc sees the host's: that of the host's
                    # first table (itself, when it is the first: then it is the host's own).
                    table.parent = first or Table(
                        name=f"h{h}",
                        host="boot-0" if self.local_clock else f"boot-{h}",
                        pidns=str(4026531835 + 10 * h),
                        offset=offset,
                        drift=drift,
                    )
                    table.next_pid = 1  # pids there start small, naming host processes
                first = first or table
                tables.append(table)
        return tables

    def _spawn(
        self, table: Table, *, name: str | None = None, workers: int | None = None
    ) -> SimProcess:
        table.next_pid += self.rng.randint(1, 7)
        c = self.config
        process = SimProcess(
            name=name or f"p{len(self.processes)}",
            table=table,
            pid=1 if table.next_pid > 60_000 else table.next_pid,
            start=int((self.t - T0) * 100),
            sim=self,
            sloppy=self.rng.random() < c.sloppy,
        )
        if self.fooling:  # drawn only here, so the worlds without these faults replay as before
            process.uid = self.rng.randrange(c.uids)
            if self.rng.random() < c.time_namespaces:
                process.timens = len(self.processes) + 1
                process.boottime_offset = self.rng.choice([500_000, 12_300, -4_000])
            if table.proc == "host":
                assert table.parent is not None
                table.parent.next_pid += self.rng.randint(1, 7)
                process.host_pid = table.parent.next_pid
        self.processes.append(process)
        self._hire(process)
        for i in range(self.config.threads if workers is None else workers):
            worker = Worker(process, f"{process.name}.{i}")
            process.workers.append(worker)
            self._at(self.rng.uniform(0, 0.05), self._starter(worker))
        self.note(f"spawn {process.name} on {table.name} pid {process.pid}")
        return process

    def _agent(self, process: SimProcess) -> Agent:
        made = self._agents.get(process.name)
        if made is None:
            made = self._agents[process.name] = self._make_agent(process)
        return made

    def _make_agent(self, process: SimProcess) -> Agent:
        return Agent(
            client=_Client(),
            model="sim",
            tools=self.tools,
            store=process.store,
            approve=self.approver_of(process),
            lease_ttl=self.config.lease_ttl,
            on_alert=lambda alert: self.alerts.append(
                (type(alert).__name__, alert.session_id or "", alert.tool_use_id or "")
            ),
        )

    # -- the scheduler --------------------------------------------------------------------------

    def bury(self) -> None:
        """Finalise every generator left — crashed processes', and runs still under way when
        the simulation stopped — while the simulated world is still in place: none is finalised
        later, by the collector, on a real thread."""
        for gen in [*self._graveyard, *(w.gen for p in self.processes for w in p.workers)]:
            if gen is not None:
                gen.close()
        self._graveyard.clear()

    def run(self) -> None:
        events = 0
        drained_at: float | None = None
        while self._events and self.steps < self.config.max_steps:
            event = heapq.heappop(self._events)
            self.t = max(self.t, event.at)
            event.act()
            events += 1
            if drained_at is None and events % 64 == 0 and self._all_done():
                # Every session ended: let what is still under way finish (a paused process's
                # tool, an outcome still being written) before the final count.
                drained_at = self.t
                self._quiet_down()
            if drained_at is not None:
                # A live process's background writer still holding an outcome counts too.
                busy = any(
                    p.kept or any(w.gen is not None for w in p.workers)
                    for p in self.processes
                    if p.alive
                )
                if not busy or self.t > drained_at + 60:
                    break
            elif self.steps < self.config.chaos_steps:
                self._chaos()
            elif self.rng.random() < self.config.operator:
                self._operate()  # the quiet phase: people still settle and approve
            if events > 50 * self.config.max_steps:
                self.violation("the run made no progress (a livelock)")
                break
        self._quiet_down()
        self._settle_the_rest()

    def _settle_the_rest(self) -> None:
        """The work is done; a person settles what is still in doubt, from the world's evidence,
        as each call's attempt is judged over (a call whose worker died without a lease stays in
        progress until its deadline: the person waits for it, up to two minutes)."""
        for _ in range(120):
            try:
                left = self.operator.store.started()
            except StoreError:
                return
            if not left:
                return
            self._operate()
            self.t += 1.0

    def _all_done(self) -> bool:
        done = 0
        for sid in self.scripts:
            state = self.backend.read_session(sid)
            done += state is not None and state.status is RunStatus.COMPLETED
        return done == len(self.scripts)

    def _quiet_down(self) -> None:
        for p in self.processes:
            if p.state == "paused":
                p.state = "running"
            p.partitioned_until = p.lose_replies_until = 0.0

    # -- workers ----------------------------------------------------------------------------------

    def _start_job(self, w: Worker) -> None:
        p = w.process
        if not p.alive or w.gen is not None:
            return
        if not p.runnable:
            self._at(p.paused_until - self.t + 0.001, lambda: self._start_job(w))
            return
        open_ = [s for s in self.scripts if not self._completed(s)]
        if not open_:
            return  # nothing left to run: this worker rests
        sid = self.rng.choice(open_)
        w.session = sid
        w.io = IOContext(store=p.store, session_id=sid, approve=approvals.queue)
        batch = (
            self._pending_calls(sid) if self.rng.random() < self.config.duplicate_delivery else None
        )
        if batch:
            agent = self._agent(p)
            w.gen = process_batch(
                batch,
                agent.tools,
                p.store.ledger(sid),
                can_ask=True,
                wait=self.rng.choice([0.0, 0.0, 0.5]),
            )
            self.note(f"{w.name} delivers {sid}'s pending calls again")
        else:
            w.gen = self._agent(p)._loop(sid, f"session {sid}")
            self.note(f"{w.name} runs {sid}")
        self._step(w, None)

    def _completed(self, sid: str) -> bool:
        state = self.backend.read_session(sid)
        return state is not None and state.status is RunStatus.COMPLETED

    def _pending_calls(self, sid: str) -> list[Any]:
        messages = self.backend.read_messages(sid)
        if not messages or messages[-1].role != "assistant":
            return []
        return read_tool_uses(messages[-1].content)

    def _starter(self, w: Worker) -> Callable[[], None]:
        return lambda: self._start_job(w)


def kind_of(tool_name: str) -> str:
    return KIND_OF.get(tool_name, "?")
