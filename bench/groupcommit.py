"""Group commit: what sharing commits saves.

* Within one turn, toolledger already shares commits (runner.py): an unsafe call's outcome rides
  with the next intent, a safe outcome with whatever commits next, the last outcome with
  checkpoint B. ``within_turn`` measures that against one commit per record.
* Across sessions of one process, the SQLite backend runs a leader/follower commit queue: the
  batches of concurrent sessions share one transaction — one fsync — while each batch stays
  atomic (a savepoint per batch: a failed guard rolls back that batch alone), every conditional
  write is evaluated in a serial order, and no batch is acknowledged before the shared COMMIT
  (and its fsync) has returned (``toolledger.stores.sqlite``). ``concurrent_sessions`` measures
  it against ``SerialSQLiteBackend``, one commit per batch as before.
* The same concurrent calls from asyncio tasks (``arun_tool_uses``) instead of threads:
  ``threads_and_tasks`` counts how many calls share a commit in each.
"""

from __future__ import annotations

import asyncio
import sqlite3
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import toolledger as tl
from toolledger.ops import InsertEffect, Op
from toolledger.stores.sqlite import SQLiteBackend, translate

from . import core, floor
from .measure import Contender, Sample, interleaved

# -- within one turn -----------------------------------------------------------------------------


def within_turn(directory: Path, stack: ExitStack, n: int) -> list[Sample]:
    contenders: list[Contender] = [floor.append_fsync(directory, stack)]
    for shared in (True, False):
        how = "shared commits (as shipped)" if shared else "one commit per record"
        for tool, key in (("noop_effect", "effect"), ("noop_read", "read")):
            store = core.open_bench_store("sqlite", directory, f"turn4-{key}-{shared}", stack)
            core.count_commits(store)
            if not shared:
                core.one_commit_per_record(store)
            c = core.agent_turn(store, f"sqlite, {how}", tool=tool, calls=4)
            c.key = f"turn4_{key}_{'shared' if shared else 'single'}"
            contenders.append(c)
        store = core.open_bench_store("sqlite", directory, f"call4-{shared}", stack)
        core.count_commits(store)
        if not shared:
            core.one_commit_per_record(store)
        contenders.append(
            core.per_call(
                store,
                f"sqlite, {how}",
                "noop_effect",
                calls=4,
                key=f"call4_{'shared' if shared else 'single'}",
            )
        )
    return interleaved(contenders, n)


# -- across sessions: group commit against one commit per batch ---------------------------------


class SerialSQLiteBackend(SQLiteBackend):
    """The SQLite backend as it was before group commit: one transaction, one fsync per batch,
    one batch at a time. Kept here as the baseline that group commit is measured against."""

    def apply(self, session_id: str, ops: Sequence[Op]) -> list[bool]:
        if not ops:
            return []
        try:
            with self._lock:
                c = self._conn
                c.execute("BEGIN IMMEDIATE")
                try:
                    out = self._apply_batch(session_id, ops, self._form(session_id, ops))
                    c.execute("COMMIT")
                    self.commits += 1
                except BaseException:
                    if c.in_transaction:
                        c.execute("ROLLBACK")
                    raise
        except sqlite3.Error as exc:
            raise translate(exc, self.url, "writing the ledger") from exc
        return out


def open_serial(path: Path, stack: ExitStack) -> tl.Store:
    url = f"sqlite:///{path}"
    return stack.enter_context(tl.Store(SerialSQLiteBackend(str(path), url=url)))


@dataclass
class Cell:
    workload: str
    backend: str
    threads: int
    ops: int = 0
    wall_s: float = 0.0
    latencies_ns: list[float] = field(default_factory=list)
    commits: int = 0

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.wall_s if self.wall_s else 0.0

    @property
    def median_us(self) -> float:
        return statistics.median(self.latencies_ns) / 1000

    @property
    def p99_us(self) -> float:
        xs = sorted(self.latencies_ns)
        return xs[min(len(xs) - 1, int(len(xs) * 0.99))] / 1000


Workload = Callable[[tl.Store, str], Callable[[int], Any]]


def _record_workload(store: tl.Store, session: str) -> Callable[[int], Any]:
    def op(i: int) -> Any:
        return store.apply(session, [InsertEffect(core.record(session, core.next_id()))])

    return op


def _call_workload(store: tl.Store, session: str) -> Callable[[int], Any]:
    ledger = store.ledger(session)

    def op(i: int) -> Any:
        block = {"type": "tool_use", "id": core.next_id(), "name": "noop_effect", "input": {"n": i}}
        return tl.run_tool_uses([block], core.TOOLS, ledger=ledger)

    return op


def _turn_workload(store: tl.Store, session: str) -> Callable[[int], Any]:
    agent = tl.Agent(
        client=core.FakeAnthropic(), model="bench", tools=core.TOOLS, store=store, max_turns=1
    )

    def op(i: int) -> Any:
        # A new session of one tool turn: create, A, intent, outcome + B, status (5 commits).
        return agent.run(session=f"{session}-{i}", prompt="go")

    return op


WORKLOADS: dict[str, Workload] = {
    "one durable record": _record_workload,
    "run_tool_uses, one non-idempotent call": _call_workload,
    "Agent.run, a new session of one turn (one non-idempotent call)": _turn_workload,
}


def _run_cell(cell: Cell, store: tl.Store, workload: Workload, per_thread: int) -> None:
    assert isinstance(store.backend, SQLiteBackend)
    before = store.backend.commits
    barrier = threading.Barrier(cell.threads + 1)
    latencies: list[list[float]] = [[] for _ in range(cell.threads)]
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            op = workload(store, f"{cell.workload[:12]}-{cell.threads}-{k}-{core.next_id()}")
            barrier.wait()
            for i in range(per_thread):
                t0 = time.perf_counter_ns()
                op(i)
                latencies[k].append(float(time.perf_counter_ns() - t0))
        except BaseException as exc:
            errors.append(exc)
            raise

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(cell.threads)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    cell.wall_s += time.perf_counter() - t0
    if errors:
        raise errors[0]
    cell.ops += cell.threads * per_thread
    for xs in latencies:
        cell.latencies_ns.extend(xs)
    backend = store.backend
    assert isinstance(backend, SQLiteBackend)
    cell.commits += backend.commits - before


def concurrent_sessions(
    directory: Path,
    stack: ExitStack,
    *,
    threads: tuple[int, ...],
    per_thread: int,
    rounds: int,
) -> list[Cell]:
    """N threads, each running its own sessions on one store: the shipped backend (group commit)
    against one commit per batch, interleaved round by round."""
    cells: list[Cell] = []
    for name, workload in WORKLOADS.items():
        slug = name.split(",")[0].replace(" ", "-").replace(".", "")
        stores = {
            "one commit per batch (before)": open_serial(directory / f"conc-{slug}-1.db", stack),
            "group commit (shipped)": core.open_bench_store(
                "sqlite", directory, f"conc-{slug}", stack
            ),
        }
        grid = {(label, t): Cell(name, label, t) for label in stores for t in threads}
        for _ in range(rounds):
            for t in threads:
                for label, store in stores.items():
                    _run_cell(grid[(label, t)], store, workload, per_thread)
        cells.extend(grid.values())
    return cells


# -- the same calls from asyncio tasks -----------------------------------------------------------

CALLS = "one non-idempotent call, own session per caller"


def _run_tasks(cell: Cell, store: tl.Store, loop: asyncio.AbstractEventLoop, per_task: int) -> None:
    """``cell.threads`` asyncio tasks on one event loop, each awaiting ``arun_tool_uses`` on its
    own session, ``per_task`` times."""
    backend = store.backend
    assert isinstance(backend, SQLiteBackend)
    ledgers = [
        store.ledger(f"async-{cell.threads}-{k}-{core.next_id()}") for k in range(cell.threads)
    ]
    latencies: list[float] = []

    async def task(ledger: tl.Ledger) -> None:
        for i in range(per_task):
            block = {
                "type": "tool_use",
                "id": core.next_id(),
                "name": "noop_effect",
                "input": {"n": i},
            }
            t0 = time.perf_counter_ns()
            await tl.arun_tool_uses([block], core.TOOLS, ledger=ledger)
            latencies.append(float(time.perf_counter_ns() - t0))

    async def everyone() -> None:
        await asyncio.gather(*(task(ledger) for ledger in ledgers))

    before = backend.commits
    t0 = time.perf_counter()
    loop.run_until_complete(everyone())
    cell.wall_s += time.perf_counter() - t0
    cell.ops += cell.threads * per_task
    cell.latencies_ns.extend(latencies)
    cell.commits += backend.commits - before


def threads_and_tasks(
    directory: Path, stack: ExitStack, *, callers: int, per_caller: int, rounds: int
) -> list[Cell]:
    """``callers`` threads calling ``run_tool_uses`` against ``callers`` asyncio tasks awaiting
    ``arun_tool_uses``, on one SQLite store (group commit as shipped), interleaved round by
    round. Commits are the backend's physical transactions, so calls per commit is how many
    calls shared each one."""
    store = core.open_bench_store("sqlite", directory, "callers", stack)
    loop = asyncio.new_event_loop()
    stack.callback(loop.close)
    threads = Cell(f"run_tool_uses, {CALLS}", "threads", callers)
    tasks = Cell(f"arun_tool_uses, {CALLS}", "asyncio tasks, one event loop", callers)
    _run_tasks(Cell("warm-up", "", 1), store, loop, 2)
    for _ in range(rounds):
        _run_cell(threads, store, _call_workload, per_caller)
        _run_tasks(tasks, store, loop, per_caller)
    return [threads, tasks]
