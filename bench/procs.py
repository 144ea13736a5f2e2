"""Throughput with many worker processes, each on its own session of one shared store:
toolledger's non-idempotent ``run_tool_uses`` against a bare loop of the same two commits
(``INSERT`` the intent, ``UPDATE`` the outcome, each its own transaction — the minimal correct
ledger's commits, without its read), on SQLite (one file for all the processes, WAL,
``synchronous=FULL``) and on PostgreSQL (autocommit).

Every round starts all the workers of one contender, waits until each has opened its store and
made a first call, releases them together (a barrier) and lets each call for a fixed time; the
contenders take turns, round by round. Workers come from a fork server started once with
toolledger imported (``forkserver``): no thread of the bench process is forked, and a worker
starts in milliseconds.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import toolledger as tl

from . import core, minimal

TOOLLEDGER, BARE = "toolledger run_tool_uses", "bare INSERT + UPDATE loop"


@dataclass(frozen=True)
class Job:
    kind: str  # a key of OPENERS
    target: str  # a SQLite path or a PostgreSQL URL
    seconds: float
    schema: str = ""  # PostgreSQL: the bare loop's search path


@dataclass
class Rate:
    backend: str
    contender: str
    procs: int
    rates: list[float] = field(default_factory=list)  # calls/s of all the workers, per round
    calls: int = 0

    @property
    def per_s(self) -> float:
        return statistics.median(self.rates) if self.rates else 0.0


Op = Callable[[int], Any]


def _toolledger(job: Job, session: str) -> tuple[Op, Callable[[], None]]:
    store = tl.open_store(job.target)
    ledger = store.ledger(session)

    def op(i: int) -> Any:
        block = {"type": "tool_use", "id": core.next_id(), "name": "noop_effect", "input": {"n": i}}
        return tl.run_tool_uses([block], core.TOOLS, ledger=ledger)

    return op, store.close


def _bare_sqlite(job: Job, session: str) -> tuple[Op, Callable[[], None]]:
    db = minimal.connect(Path(job.target))
    return minimal.bare_loop(db, session), db.close


def _bare_postgres(job: Job, session: str) -> tuple[Op, Callable[[], None]]:
    import psycopg

    conn = psycopg.connect(job.target, autocommit=True)
    conn.execute("SELECT set_config('search_path', %s, false)", (job.schema,))
    intent = minimal.INTENT.format(table="bare_calls").replace("?", "%s")
    outcome = minimal.OUTCOME.format(table="bare_calls").replace("?", "%s")

    def op(i: int) -> Any:
        call_id = core.next_id()
        conn.execute(intent, (session, call_id))
        return conn.execute(outcome, ('"ok"', session, call_id))

    return op, conn.close


OPENERS: dict[str, Callable[[Job, str], tuple[Op, Callable[[], None]]]] = {
    "toolledger": _toolledger,
    "bare_sqlite": _bare_sqlite,
    "bare_postgres": _bare_postgres,
}


def _worker(job: Job, barrier: Any, out: Any) -> None:
    try:
        op, close = OPENERS[job.kind](job, f"{job.kind}-{os.getpid()}-{uuid.uuid4().hex[:12]}")
        try:
            op(-1)  # connections made, statements prepared: not counted
            barrier.wait(timeout=120)
            t0 = time.perf_counter()
            end, calls = t0 + job.seconds, 0
            while True:
                op(calls)
                calls += 1
                now = time.perf_counter()
                if now >= end:
                    break
            out.put((calls, now - t0))
        finally:
            close()
    except BaseException as exc:
        out.put(("error", f"{type(exc).__name__}: {exc}"))
        barrier.abort()
        raise


def _context() -> Any:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["toolledger", "bench.procs", "psycopg"])
    return ctx


def one_round(job: Job, procs: int) -> tuple[int, float]:
    """``procs`` workers running ``job`` together: (calls made, calls per second of them all —
    the sum of each worker's calls over its own time)."""
    ctx = _context()
    barrier = ctx.Barrier(procs + 1)
    out = ctx.Queue()
    workers = [ctx.Process(target=_worker, args=(job, barrier, out)) for _ in range(procs)]
    for w in workers:
        w.start()
    answers: list[tuple[Any, Any]] = []
    try:
        # A worker that failed to start broke the barrier: its error is in the queue.
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout=120)
        for _ in workers:
            try:
                answers.append(out.get(timeout=job.seconds + 120))
            except queue.Empty:
                break
    finally:
        for w in workers:
            w.join(timeout=job.seconds + 60)
            if w.is_alive():
                w.kill()
                w.join()
    errors = [str(a[1]) for a in answers if a[0] == "error"]
    if errors or len(answers) < procs or any(w.exitcode != 0 for w in workers):
        raise RuntimeError(f"a {job.kind} bench worker failed: {errors[:1]}")
    return sum(a[0] for a in answers), sum(a[0] / a[1] for a in answers)


def compare(backend: str, jobs: dict[str, Job], procs: int, rounds: int) -> list[Rate]:
    """The contenders of ``jobs`` ({contender: job}) with ``procs`` workers each, taking turns
    for ``rounds`` rounds."""
    rates = {name: Rate(backend, name, procs) for name in jobs}
    for _ in range(rounds):
        for name, job in jobs.items():
            calls, per_s = one_round(job, procs)
            rates[name].calls += calls
            rates[name].rates.append(per_s)
    return list(rates.values())


def sqlite(directory: Path, *, procs: int, seconds: float, rounds: int) -> list[Rate]:
    """toolledger and the bare loop, each on one SQLite file shared by its ``procs`` workers."""
    ours = directory / "procs-toolledger.db"
    tl.open_store(f"sqlite:///{ours}").close()  # migrated once, before the clock starts
    bare = directory / "procs-bare.db"
    minimal.connect(bare).close()
    jobs = {
        TOOLLEDGER: Job("toolledger", f"sqlite:///{ours}", seconds),
        BARE: Job("bare_sqlite", str(bare), seconds),
    }
    return compare("sqlite", jobs, procs, rounds)


def postgres(url: str, schema: str, *, procs: int, seconds: float, rounds: int) -> list[Rate]:
    """toolledger and the bare loop on one PostgreSQL server, in the schema ``schema``."""
    import psycopg
    from psycopg import sql

    target = f"{url}{'&' if '?' in url else '?'}schema={schema}"
    tl.open_store(target).close()  # the schema and toolledger's tables
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        conn.execute(minimal.SCHEMA.format(table="bare_calls"))
    jobs = {
        TOOLLEDGER: Job("toolledger", target, seconds),
        BARE: Job("bare_postgres", url, seconds, schema=schema),
    }
    return compare("postgres", jobs, procs, rounds)
