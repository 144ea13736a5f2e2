"""The simulation: one thread, simulated time, a seeded scheduler stepping every worker one
request at a time, and the faults.

``runner._process`` and ``Agent._loop`` are generators that yield every piece of I/O; here each
yielded request is carried out against the shared in-memory store (the real conformance
semantics) at the current simulated instant, and its answer delivered after a simulated latency.
So the code under test is the real code, and only time, the network and the processes are
simulated. Everything random comes from one ``random.Random(seed)``: the same seed replays the
same run, step for step.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import random
from collections import Counter, deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ... import approval_queue as approvals
from ...adapters.anthropic import pairing_errors
from ...agent import Agent
from ...drivers import (
    Alert,
    Ask,
    CallModel,
    Commit,
    Failure,
    Fence,
    Invoke,
    IOContext,
    ReadEffects,
    ReadLease,
    ReadMessages,
    ReadSession,
    Remember,
    Sleep,
)
from ...errors import SessionConflictError, StoreError, StoreUnavailableError, ToolLedgerError
from ...gate import normalise
from ...liveness import Over
from ...ops import DropLease, HoldLease, InsertEffect, Op, UpdateEffect
from ...records import RunStatus, Status
from ...runner import process_batch
from ...stores.memory import MemoryBackend
from ._cluster import SimProcess, Table
from ._world import KIND_OF, SimWorld, script_for

__all__ = ["SimConfig", "Simulation"]

T0 = 1_800_000_000.0


@dataclass(frozen=True)
class SimConfig:
    """What one simulated run holds and how hard it is shaken."""

    hosts: int = 2  # distinct hosts
    containers: int = 1  # process tables (PID namespaces) per host
    processes: int = 3  # worker processes at any time
    threads: int = 2  # workers per process
    sessions: int = 4
    kinds: tuple[str, ...] = ("plain", "checked", "keyed", "idempotent", "read_only", "high_impact")
    chaos_steps: int = 3_000  # steps with faults, then a quiet phase until every session ends
    max_steps: int = 30_000
    lease_ttl: float = 1.0
    tool_timeout: float = 2.0
    max_offset: float = 120.0  # a host's clock is off by up to this many seconds
    crash: float = 0.002  # per step: the chance of each fault
    pause: float = 0.003
    partition: float = 0.002
    lost_reply: float = 0.0  # a commit lands but its answer is lost
    op_timeout: float = 0.3  # a store operation cut off by the network hangs this long, then fails
    operator: float = 0.01
    force: float = 0.0  # an operator forcing a resolution of a running call
    sloppy: float = 0.0  # a process whose tools send past their deadline
    duplicate_delivery: float = 0.2  # a worker runs a session's pending calls by run_tool_uses


@dataclass(order=True)
class _Event:
    at: float
    tie: float
    seq: int
    act: Callable[[], None] = field(compare=False)


class _Client:
    """A duck-typed Messages API client: the simulation answers the model calls itself."""

    class messages:
        @staticmethod
        def create(**kwargs: Any) -> Any:
            raise AssertionError("the simulation answers model calls itself")


@dataclass
class _Worker:
    process: SimProcess
    name: str
    gen: Generator[Any, Any, Any] | None = None
    io: IOContext | None = None
    session: str = ""
    invoking: tuple[str, str, int] | None = None  # (session, tool_use_id, attempt) running
    busy_since: float | None = None  # when its store operation under way began


@dataclass
class _Attempt:
    """The truth about one attempt, as the simulation sees it."""

    worker: _Worker
    gen: Any  # the run that made it: the attempt lives while that run does
    process: SimProcess
    deadline: float | None  # on its host's clock, as its ToolContext says
    effect_done: bool = False
    over: bool = False  # returned, or its worker is gone


class Simulation:
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
        self.attempts: dict[tuple[str, str, int], _Attempt] = {}
        self._attempt_numbers: dict[tuple[str, str], list[int]] = {}
        self.forced: set[tuple[str, str]] = set()
        self.approved: Counter[tuple[str, str]] = Counter()
        self.limit_cases: set[tuple[str, str]] = set()
        self.steps = 0
        self._events: list[_Event] = []
        self._seq = itertools.count()
        self._graveyard: list[Any] = []  # crashed generators: never finalised mid-run
        self._current: _Worker | None = None
        self._acting_forced = False
        self.tables = self._tables()
        self.tools = self.world.toolset(self.config.tool_timeout)
        self._agents: dict[str, Agent] = {}
        self.processes: list[SimProcess] = []
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
        tables = []
        for h in range(self.config.hosts):
            offset = self.rng.uniform(-self.config.max_offset, self.config.max_offset)
            drift = self.rng.uniform(-1e-4, 1e-4)
            for c in range(self.config.containers):
                tables.append(
                    Table(
                        name=f"h{h}c{c}",
                        host=f"boot-{h}",
                        pidns=str(4026531836 + 10 * h + c),
                        offset=offset,
                        drift=drift,
                    )
                )
        return tables

    def _spawn(
        self, table: Table, *, name: str | None = None, workers: int | None = None
    ) -> SimProcess:
        table.next_pid += self.rng.randint(1, 7)
        process = SimProcess(
            name=name or f"p{len(self.processes)}",
            table=table,
            pid=1 if table.next_pid > 60_000 else table.next_pid,
            start=int((self.t - T0) * 100),
            sim=self,
            sloppy=self.rng.random() < self.config.sloppy,
        )
        self.processes.append(process)
        for i in range(self.config.threads if workers is None else workers):
            worker = _Worker(process, f"{process.name}.{i}")
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
            approve=approvals.queue,
            lease_ttl=self.config.lease_ttl,
            on_alert=lambda alert: self.alerts.append(
                (type(alert).__name__, alert.session_id or "", alert.tool_use_id or "")
            ),
        )

    # -- the clock and the scheduler --------------------------------------------------------------

    def _at(self, delay: float, act: Callable[[], None]) -> None:
        heapq.heappush(
            self._events, _Event(self.t + max(delay, 0.0), self.rng.random(), next(self._seq), act)
        )

    def note(self, text: str) -> None:
        self.trace.append(f"{self.t - T0:10.4f} {text}")

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

    def _start_job(self, w: _Worker) -> None:
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
        from ...adapters.anthropic import read_tool_uses

        return read_tool_uses(messages[-1].content)

    def _deliver(
        self, w: _Worker, gen: Any, answer: Any, *, throw: BaseException | None = None
    ) -> None:
        """Hand ``answer`` to the worker once its process runs (a paused thread waits)."""
        p = w.process
        if w.gen is not gen or not p.alive:
            return  # crashed meanwhile: the answer goes nowhere
        if not p.runnable:
            self._at(
                p.paused_until - self.t + 0.0001, lambda: self._deliver(w, gen, answer, throw=throw)
            )
            return
        self._step(w, answer, throw=throw)

    def _step(self, w: _Worker, answer: Any, *, throw: BaseException | None = None) -> None:
        assert w.gen is not None
        self.steps += 1
        w.busy_since = None
        self._current = w  # whose writes these are, for the checks
        try:
            try:
                request = w.gen.throw(throw) if throw is not None else w.gen.send(answer)
            except StopIteration as stop:
                self._finish(w, stop.value, None)
                return
            except (ToolLedgerError, OSError) as exc:
                self._finish(w, None, exc)
                return
            self._handle(w, request)
        finally:
            self._current = None

    def _finish(self, w: _Worker, value: Any, exc: BaseException | None) -> None:
        what = (
            type(exc).__name__
            if exc is not None
            else getattr(getattr(value, "status", None), "value", "done")
        )
        self.stats[f"run_{what}"] += 1
        self.note(f"{w.name} ends: {what}")
        io = w.io
        w.gen, w.io = None, None
        if io is not None and io.fence is not None:  # the driver's give-back
            lease = io.fence.lease
            io.fence = None
            w.process.runtime.live_runs.discard(lease.owner)
            with contextlib.suppress(ToolLedgerError):
                w.process.store.apply(lease.session_id, [DropLease(lease.session_id, lease.token)])
        self._at(self.rng.uniform(0.01, 0.3), lambda: self._start_job(w))

    def _latency(self) -> float:
        return self.rng.expovariate(1 / 0.002)

    def _handle(self, w: _Worker, request: Any) -> None:
        gen, io, p = w.gen, w.io, w.process
        assert io is not None
        sid = w.session
        if isinstance(request, (ReadEffects, ReadSession, ReadMessages, ReadLease)):
            self._read(w, request)
            return
        if isinstance(request, Commit):
            w.busy_since = self.t
            answer: Any = self._commit(w, request)
            cut = isinstance(answer, Failure) and isinstance(answer.exc, StoreUnavailableError)
            # A commit cut off, or whose answer was lost, hangs until its deadline cuts it.
            delay = self.config.op_timeout if cut else self._latency()
            self._at(delay, lambda: self._deliver(w, gen, answer))
            return
        if isinstance(request, Invoke):
            self._invoke(w, request)
            return
        if isinstance(request, CallModel):
            answer = self._model(w, request.kwargs)
            self._at(self.rng.uniform(0.02, 0.4), lambda: self._deliver(w, gen, answer))
            return
        if isinstance(request, Ask):
            try:
                decision = normalise(approvals.queue(request.request), approvals.queue)
            except StoreError as exc:
                self._finish(w, None, exc)
                return
            self.note(
                f"{w.name} asks about {request.request.tool_use_id}"
                f"{' (in doubt)' if request.request.in_doubt else ''}: "
                f"{'pending' if decision.pending else decision.approved}"
            )
            self._at(self._latency(), lambda: self._deliver(w, gen, decision))
            return
        if isinstance(request, Alert):
            a = request.alert
            self.alerts.append((type(a).__name__, a.session_id or "", a.tool_use_id or ""))
            self.note(f"{w.name} ALERT {type(a).__name__} {a.session_id}/{a.tool_use_id}")
            self._at(0, lambda: self._deliver(w, gen, None))
            return
        if isinstance(request, Fence):
            io.fence = request
            p.runtime.live_runs.add(request.lease.owner)
            self._heartbeat(w, io, request)
            self._at(0, lambda: self._deliver(w, gen, None))
            return
        if isinstance(request, Sleep):
            self._at(request.seconds, lambda: self._deliver(w, gen, None))
            return
        if isinstance(request, Remember):
            p.kept += 1
            self._keep(w, sid, request, 1.0)
            self._at(0, lambda: self._deliver(w, gen, None))
            return
        raise AssertionError(f"unknown request {request!r}")

    def _read(
        self, w: _Worker, request: ReadEffects | ReadSession | ReadMessages | ReadLease
    ) -> None:
        gen, backend, sid = w.gen, w.process.store.backend, w.session
        w.busy_since = self.t
        try:
            if isinstance(request, ReadEffects):
                answer: Any = backend.read_effects(sid, request.tool_use_ids)
            elif isinstance(request, ReadSession):
                answer = backend.read_session(sid)
            elif isinstance(request, ReadMessages):
                answer = backend.read_messages(sid, request.since)
            else:
                answer = backend.read_lease(sid)
        except StoreError as exc:
            failed: StoreError = exc  # cut off: it hangs until its deadline cuts it
            self._at(self.config.op_timeout, lambda: self._deliver(w, gen, None, throw=failed))
            return
        self._at(self._latency(), lambda: self._deliver(w, gen, answer))

    def _commit(self, w: _Worker, request: Commit) -> Any:
        io = w.io
        assert io is not None
        p = w.process
        ops = io.fenced(request.ops, request.fenced)
        try:
            flags = p.store.apply(w.session, ops)
        except (StoreError, SessionConflictError) as exc:
            return Failure(exc)
        if self.t < p.lose_replies_until:
            self.stats["lost_replies"] += 1
            self.note(f"{w.name} commit landed, answer lost")
            return Failure(
                StoreUnavailableError(
                    f"{p.store.url}: the connection was lost during COMMIT (simulated): the write "
                    "may or may not have been committed",
                    url=p.store.url,
                    outcome_unknown=True,
                )
            )
        return io.unfenced(flags, request.fenced)

    def _keep(self, w: _Worker, sid: str, request: Remember, delay: float) -> None:
        """The process's background writer (``background.Keeper``): retry until the store takes
        it; a crash loses it. Its writes are the worker's own, deferred (for the checks)."""
        p = w.process

        def again() -> None:
            if not p.alive:
                return
            if not p.runnable:
                self._at(p.paused_until - self.t + 0.001, again)
                return
            self._current = w
            try:
                p.store.apply(sid, request.ops)
            except StoreError:
                self._keep(w, sid, request, min(delay * 2, 30.0))
                return
            except SessionConflictError:
                pass
            finally:
                self._current = None
            p.kept -= 1
            self.stats["kept_writes"] += 1
            for key in request.keys:
                p.runtime.in_flight.discard(key)

        self._at(delay, again)

    def _heartbeat(self, w: _Worker, io: IOContext, fence: Fence) -> None:
        def beat() -> None:
            if io.fence is not fence or not w.process.alive:
                return
            if not w.process.runnable:
                self._at(w.process.paused_until - self.t + 0.001, beat)
                return
            stuck = w.busy_since
            if stuck is not None and self.t - stuck > fence.ttl / 3:
                # As background.Heartbeats: a run stuck on the store stops being renewed.
                self.stats["renewals_withheld"] += 1
                self._at(fence.ttl / 3, beat)
                return
            try:
                w.process.store.apply(io.session_id, io.fenced([]))
            except SessionConflictError:
                return
            except StoreError:  # cut off: the renewal hung until its deadline
                self._at(max(fence.ttl / 3, self.config.op_timeout), beat)
                return
            self._at(fence.ttl / 3, beat)

        self._at(fence.ttl / 3, beat)

    # -- tools ------------------------------------------------------------------------------------

    def _invoke(self, w: _Worker, request: Invoke) -> None:
        gen, p = w.gen, w.process
        ctx = request.ctx
        key = (ctx.session_id, ctx.tool_use_id, ctx.attempt) if ctx is not None else None
        if key is not None and not request.check:
            w.invoking = key
        self.stats["checks" if request.check else "tool_runs"] += 1

        def send() -> None:
            if w.gen is not gen or not p.alive:
                return  # crashed before sending: no effect
            if not p.runnable:
                self._at(p.paused_until - self.t + 0.0001, send)
                return
            self.world.who = p.name
            self.world.local_time = p.local_time()
            self.world.honours_deadline = not p.sloppy
            before = len(self.world.effects)
            try:
                answer: Any = request.fn()
            except Exception as exc:
                answer = Failure(exc)
            if len(self.world.effects) > before:
                self._effect_made(self.world.effects[-1])
            if key is not None and not request.check and key in self.attempts:
                self.attempts[key].effect_done = True
            self._at(self.rng.uniform(0.001, 0.3), lambda: returned(answer))

        def returned(answer: Any) -> None:
            if w.gen is not gen or not p.alive:
                return
            if key is not None and not request.check:
                w.invoking = None
                attempt = self.attempts.get(key)
                if attempt is not None:
                    attempt.over = True
            self._deliver(w, gen, answer)

        self._at(self.rng.uniform(0.001, 0.6), send)

    def _effect_made(self, effect: Any) -> None:
        self.note(
            f"EFFECT {effect.kind} {effect.title} by {effect.process} attempt {effect.attempt}"
        )
        same = self.world.effects_of(effect.title)
        if len(same) < 2:
            return
        sid, tid = effect.title.split("/")[0], effect.tool_use_id
        if effect.kind in ("keyed", "idempotent"):
            self.violation(f"{effect.title}: {len(same)} effects of a {effect.kind} call")
        elif any(e.past_deadline for e in same):
            self.limit_cases.add((sid, tid))
            self.stats["limit_cases"] += 1
        elif not any(k[0] == sid and k[1] in {e.tool_use_id for e in same} for k in self.forced):
            self.violation(
                f"{effect.title}: took effect {len(same)} times "
                f"({', '.join(f'attempt {e.attempt} by {e.process}' for e in same)})"
            )

    # -- the model --------------------------------------------------------------------------------

    def _model(self, w: _Worker, kwargs: dict[str, Any]) -> Any:
        messages = kwargs["messages"]
        problems = pairing_errors(messages)
        if problems:
            self.violation(f"{w.session}: the model was sent a broken transcript: {problems}")
        turn = sum(1 for m in messages if m["role"] == "assistant")
        script = self.scripts[w.session]
        self.stats["model_calls"] += 1
        if turn >= len(script):
            return {
                "content": [{"type": "text", "text": "All done."}],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": 1, "output_tokens": 1},
            }
        blocks: list[dict[str, Any]] = [{"type": "text", "text": f"turn {turn}"}]
        for name, title in script[turn]:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_{w.session}_{turn}_{next(self._minted)}",
                    "name": name,
                    "input": {"title": title},
                }
            )
        return {
            "content": blocks,
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }

    # -- what every write is checked against ------------------------------------------------------

    def observe_commit(
        self,
        process: SimProcess,
        session_id: str,
        ops: Sequence[Op],
        apply: Callable[[str, Sequence[Op]], list[bool]],
    ) -> list[bool]:
        """Apply ``ops`` for ``process``; check, against the truth, every change it makes to a
        ``started`` record (nothing is settled while its attempt can still take effect) and that
        every checkpoint carries its writer's fence."""
        before = {
            op.record.tool_use_id: self.backend.read_effects(
                session_id, [op.record.tool_use_id]
            ).get(op.record.tool_use_id)
            for op in ops
            if isinstance(op, (InsertEffect, UpdateEffect))
        }
        flags = apply(session_id, ops)
        writes_transcript = any(type(op).__name__ in ("AppendMessages", "PutSession") for op in ops)
        unfenced = not any(isinstance(op, HoldLease) for op in ops)
        if (
            writes_transcript
            and unfenced
            and any(type(op).__name__ == "AppendMessages" for op in ops)
        ):
            self.violation(f"{session_id}: a transcript written without its lease's fence")
        worker = self._current
        for op, ok in zip(ops, flags, strict=True):
            if not ok or not isinstance(op, (InsertEffect, UpdateEffect)):
                continue
            new, old = op.record, before.get(op.record.tool_use_id)
            fresh = new.status is Status.STARTED and (old is None or old.attempt != new.attempt)
            if fresh and worker is not None:
                deadline = new.deadline
                local = None if deadline is None else deadline - self.t + process.local_time()
                self._attempt_numbers.setdefault((session_id, new.tool_use_id), []).append(
                    new.attempt
                )
                self.attempts[(session_id, new.tool_use_id, new.attempt)] = _Attempt(
                    worker, worker.gen, process, local
                )
            if old is not None and old.status is Status.STARTED:
                self._settled(process, worker, old, new)
        return flags

    def let_go(self, process: SimProcess, session_id: str, tool_use_id: str) -> None:
        """``process`` no longer holds the call in flight. An attempt of it that none of its
        workers is invoking will never be invoked now: its outcome is written, or its worker
        gave it up (an intent whose commit went unconfirmed, one read back as not landed) —
        it is over. (A worker that invoked it all the same would make a second effect, which
        the effect count catches.)"""
        for n in self._attempt_numbers.get((session_id, tool_use_id), ()):
            key = (session_id, tool_use_id, n)
            attempt = self.attempts[key]
            if attempt.process is process and not any(w.invoking == key for w in process.workers):
                attempt.over = True

    def _settled(self, process: SimProcess, worker: _Worker | None, old: Any, new: Any) -> None:
        if (new.status, new.attempt, new.holder is None) == (
            old.status,
            old.attempt,
            old.holder is None,
        ):
            return
        truth = self.attempts.get((old.session_id, old.tool_use_id, old.attempt))
        if truth is None or (worker is not None and truth.worker is worker):
            return  # its own worker's outcome, or an attempt this run never saw start
        may = (
            truth.process.alive
            and not truth.over
            and not truth.effect_done
            and truth.worker.gen is truth.gen
        )
        if may and not truth.process.sloppy and truth.deadline is not None:
            may = truth.process.local_time() < truth.deadline
        if not may:
            return
        key = (old.session_id, old.tool_use_id)
        if self._acting_forced:
            return
        if truth.process.sloppy:
            self.limit_cases.add(key)
            return
        self.violation(
            f"{old.session_id}/{old.tool_use_id}: attempt {old.attempt} (by {truth.process.name}, "
            f"{truth.process.state}) was settled by {process.name} as {new.status.value} "
            f"(attempt {new.attempt}) while it could still take effect"
        )

    def violation(self, text: str) -> None:
        self.note(f"VIOLATION {text}")
        if text not in self.violations:
            self.violations.append(text)

    # -- faults and people ------------------------------------------------------------------------

    def _chaos(self) -> None:
        c, rng = self.config, self.rng
        workers = [p for p in self.processes if p is not self.operator and p.alive]
        if workers and rng.random() < c.crash:
            victim = rng.choice(workers)
            self._crash(victim)
        if workers and rng.random() < c.pause:
            victim = rng.choice(workers)
            if victim.runnable:
                span = rng.choice([0.2, c.lease_ttl * 1.5, c.tool_timeout * 2, c.lease_ttl * 5])
                victim.state, victim.paused_until = "paused", self.t + span
                self.stats["pauses"] += 1
                self.stats["pauses_past_lease"] += span > c.lease_ttl
                self.stats["pauses_past_deadline"] += span > c.tool_timeout
                self.note(f"pause {victim.name} for {span:.2f}s")
                self._at(span, self._waker(victim))
        if workers and rng.random() < c.partition:
            victim = rng.choice(workers)
            span = rng.uniform(0.1, 3.0)
            victim.partitioned_until = self.t + span
            self.stats["partitions"] += 1
            self.note(f"partition {victim.name} for {span:.2f}s")
        if workers and c.lost_reply and rng.random() < c.lost_reply:
            victim = rng.choice(workers)
            victim.lose_replies_until = self.t + rng.uniform(0.001, 0.05)
        if rng.random() < c.operator:
            self._operate()

    def _waker(self, p: SimProcess) -> Callable[[], None]:
        return lambda: self._wake(p)

    def _wake(self, p: SimProcess) -> None:
        if p.state == "paused" and self.t >= p.paused_until - 1e-9:
            p.state = "running"
            self.note(f"wake {p.name}")

    def _crash(self, p: SimProcess) -> None:
        p.state = "crashed"
        self.stats["crashes"] += 1
        self.note(f"CRASH {p.name}")
        for w in p.workers:
            if w.gen is not None:
                self._graveyard.append(w.gen)
            w.gen, w.io = None, None
        self._at(self.rng.uniform(0.05, 2.0), lambda: self._respawn(p.table))

    def _respawn(self, table: Table) -> None:
        self._spawn(table)

    def _operate(self) -> None:
        """A person at the console: decides pending approvals, settles calls in doubt from the
        world's evidence, and (if configured) forces a running call."""
        store = self.operator.store
        self.stats["operator_looks"] += 1
        try:
            waiting = approvals.pending(store)
            started = store.started()
        except StoreError:
            return
        for request in waiting:
            # A first run is approved; running an in-doubt call again only when the world shows
            # it did not happen (approving it otherwise would be a person choosing a duplicate).
            approve = not (request.in_doubt and self._happened(request.tool_use_id))
            try:
                approvals.decide(
                    store, request.session_id, request.tool_use_id, approved=approve, by="ana"
                )
            except ToolLedgerError:
                continue
            if approve:
                self.approved[(request.session_id, request.tool_use_id)] += 1
            self.stats["approvals" if approve else "denials"] += 1
            self.note(
                f"operator {'approves' if approve else 'denies'} "
                f"{request.session_id}/{request.tool_use_id}"
            )
        for record, verdict in started:
            forced = not isinstance(verdict, Over)
            if forced and not (self.config.force and self.rng.random() < self.config.force):
                continue
            happened = self._happened(record.tool_use_id)
            self._acting_forced = forced
            try:
                store.ledger(record.session_id).resolve(
                    record.tool_use_id, happened=happened, by="ana", force=forced
                )
            except ToolLedgerError:
                continue
            finally:
                self._acting_forced = False
            if forced:
                self.forced.add((record.session_id, record.tool_use_id))
            self.stats["forced" if forced else "resolutions"] += 1
            self.note(
                f"operator resolves {record.session_id}/{record.tool_use_id} "
                f"{'happened' if happened else 'not happened'}{' (forced)' if forced else ''}"
            )
        self._wake_all_idle()

    def crashed(self, name: str) -> bool:
        return any(p.name == name and not p.alive for p in self.processes)

    def _happened(self, tool_use_id: str) -> bool:
        return any(e.tool_use_id == tool_use_id for e in self.world.effects)

    def _wake_all_idle(self) -> None:
        """After the chaos, keep sessions moving: an operator's word makes a stopped session
        worth running again."""
        if self.steps < self.config.chaos_steps:
            return
        for p in self.processes:
            for w in p.workers:
                if w.gen is None and p.alive:
                    self._at(0.001, self._starter(w))

    def _starter(self, w: _Worker) -> Callable[[], None]:
        return lambda: self._start_job(w)

    def quiet_operator(self) -> None:
        self._operate()


def kind_of(tool_name: str) -> str:
    return KIND_OF.get(tool_name, "?")
