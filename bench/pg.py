"""PostgreSQL: toolledger's durable record next to a bare ``INSERT … ON CONFLICT DO NOTHING``
autocommit round trip on the same server, throughput with 1, 4 and 16 worker processes (and
against a bare loop of the same commits: ``procs``), and the round trips of one call, counted on
the wire (``wire``), and the client's CPU per call beside a minimal PostgreSQL ledger's
(``cpu_rows``).

The bare insert is the floor here: one statement, one round trip, one commit (the server's WAL
flush) — what a durable record cannot be cheaper than on PostgreSQL. The server comes from
``TOOLLEDGER_BENCH_POSTGRES_URL`` (else ``TOOLLEDGER_TEST_POSTGRES_URL``, else the local
default); everything runs in a schema of its own, dropped at the end.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import toolledger as tl
from toolledger.ops import InsertEffect
from toolledger.stores._sql.rows import insert_params
from toolledger.stores._sql.statements import INSERT_EFFECT, format_style

from . import core
from .measure import Contender, Sample, interleaved
from .wire import WireCounter

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"


def server_url() -> tuple[str | None, str]:
    """The server to use, or ``None`` and why not."""
    url = (
        os.environ.get("TOOLLEDGER_BENCH_POSTGRES_URL")
        or os.environ.get("TOOLLEDGER_TEST_POSTGRES_URL")
        or DEFAULT_URL
    )
    try:
        import psycopg

        with psycopg.connect(url, connect_timeout=3):
            pass
    except Exception as exc:
        return None, f"PostgreSQL rows skipped: no server at {url} ({type(exc).__name__})"
    return url, ""


def _with_schema(url: str, schema: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}schema={schema}"


def _drop(url: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def bare_insert(url: str, schema: str, stack: ExitStack) -> Contender:
    """``INSERT INTO effects … ON CONFLICT DO NOTHING``, autocommit, same row as a record."""
    import psycopg
    from psycopg import sql

    conn = stack.enter_context(psycopg.connect(url, autocommit=True))
    conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
    conn.execute("CREATE TABLE bare (LIKE effects INCLUDING ALL)")
    statement = format_style(INSERT_EFFECT.replace("INTO effects", "INTO bare", 1))

    def step(i: int) -> Any:
        op = InsertEffect(core.record("bench", core.next_id()))
        return conn.execute(statement, insert_params(op))

    return Contender(
        "bare INSERT … ON CONFLICT DO NOTHING, autocommit", step, key="floor", writes=1
    )


def rows(url: str, stack: ExitStack, n: int) -> list[Sample]:
    schema = f"tl_bench_{uuid.uuid4().hex[:10]}"
    stack.callback(_drop, url, schema)

    def store() -> tl.Store:  # one per contender, so each counts its own commits
        return stack.enter_context(tl.open_store(_with_schema(url, schema)))

    contenders = [
        core.per_record(store(), "postgres", key="pg_record"),
        core.per_call(store(), "postgres", "noop_effect", key="pg_call_effect"),
        core.per_call(store(), "postgres", "noop_read", key="pg_call_read"),
    ]
    contenders.insert(0, bare_insert(url, schema, stack))
    return interleaved(contenders, n)


class MinimalPgLedger:
    """The smallest correct ledger on PostgreSQL, for the client's CPU: per call, insert the
    intent if absent (autocommit: durable before the effect); if it was there, read it and
    answer from it (or refuse: in doubt); else run the tool and update the outcome (autocommit).
    Two round trips for a fresh call, as toolledger's; no schema checks, leases, liveness,
    approvals or alerts."""

    def __init__(self, url: str, schema: str, stack: ExitStack) -> None:
        import psycopg
        from psycopg import sql

        self.conn = stack.enter_context(psycopg.connect(url, autocommit=True))
        self.conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        self.conn.execute(
            "CREATE TABLE minimal (session TEXT, id TEXT, status TEXT, result TEXT, "
            "PRIMARY KEY (session, id))"
        )

    def call(self, session: str, call_id: str, tool: Callable[[], Any]) -> Any:
        intent = self.conn.execute(
            "INSERT INTO minimal VALUES (%s, %s, 'started', NULL) ON CONFLICT DO NOTHING",
            (session, call_id),
        )
        if intent.rowcount != 1:
            row = self.conn.execute(
                "SELECT status, result FROM minimal WHERE session = %s AND id = %s",
                (session, call_id),
            ).fetchone()
            if row is not None and row[0] == "succeeded":
                return json.loads(row[1])
            raise RuntimeError(f"{call_id} is in doubt: it may have run")
        result = tool()
        self.conn.execute(
            "UPDATE minimal SET status = 'succeeded', result = %s WHERE session = %s AND id = %s",
            (json.dumps(result), session, call_id),
        )
        return result


def cpu_rows(url: str, stack: ExitStack, n: int) -> list[Sample]:
    """The client's CPU per non-idempotent call, interleaved: the minimal PostgreSQL ledger
    (the reference, first) and toolledger's ``run_tool_uses``, each on its own connection to
    the same server (the server's CPU is another process's, not counted)."""
    schema = new_schema(url, stack)
    store = stack.enter_context(tl.open_store(_with_schema(url, schema)))  # makes the schema
    ledger = MinimalPgLedger(url, schema, stack)

    def minimal_step(i: int) -> Any:
        return ledger.call("bench", core.next_id(), lambda: "ok")

    ours = core.per_call(store, "PostgreSQL, client CPU", "noop_effect", key="pg_cpu_call")
    contenders = [
        Contender(
            "PostgreSQL, client CPU: minimal correct ledger: one non-idempotent call",
            minimal_step,
            writes=2,
            key="pg_cpu_minimal_call",
        ),
        ours,
    ]
    for c in contenders:
        c.cpu_time = True
    return interleaved(contenders, n)


@dataclass(frozen=True)
class Throughput:
    workers: int
    calls: int
    seconds: float

    @property
    def per_s(self) -> float:
        return self.calls / self.seconds


def _worker(url: str, per_worker: int, barrier: Any) -> None:
    with tl.open_store(url) as store:
        ledger = store.ledger(f"w-{os.getpid()}")
        barrier.wait()
        for i in range(per_worker):
            block = {
                "type": "tool_use",
                "id": core.next_id(),
                "name": "noop_effect",
                "input": {"n": i},
            }
            tl.run_tool_uses([block], core.TOOLS, ledger=ledger)


def throughput(
    url: str, stack: ExitStack, workers: tuple[int, ...], per_worker: int
) -> list[Throughput]:
    """Non-idempotent calls per second with N worker processes, each on its own sessions."""
    schema = f"tl_bench_{uuid.uuid4().hex[:10]}"
    stack.callback(_drop, url, schema)
    target = _with_schema(url, schema)
    tl.open_store(target).close()  # migrated once, before the clock starts
    ctx = multiprocessing.get_context("fork")
    out = []
    for n in workers:
        barrier = ctx.Barrier(n + 1)
        procs = [ctx.Process(target=_worker, args=(target, per_worker, barrier)) for _ in range(n)]
        for p in procs:
            p.start()
        barrier.wait()
        t0 = time.perf_counter()
        for p in procs:
            p.join()
        out.append(Throughput(n, n * per_worker, time.perf_counter() - t0))
        if any(p.exitcode != 0 for p in procs):
            raise RuntimeError(f"a postgres bench worker failed (workers={n})")
    return out


@dataclass(frozen=True)
class RoundTrips:
    """Per non-idempotent ``run_tool_uses`` call, counted on the wire (``wire.WireCounter``)."""

    calls: int
    round_trips: float
    ready: float
    statements: float


# Calls before counting: the pool's connections are made, and psycopg has prepared every
# statement (it prepares one on its fifth execution on a connection: a round trip, once).
WARM_CALLS = 20


def round_trips(url: str, stack: ExitStack, n: int) -> RoundTrips | None:
    """``n`` calls through a store whose connections go through a ``WireCounter``, after
    ``WARM_CALLS`` calls; ``None`` if the wire could not be read."""
    counter, through = WireCounter.for_url(url)
    stack.callback(counter.close)
    schema = new_schema(url, stack)
    store = stack.enter_context(tl.open_store(_with_schema(through, schema)))
    ledger = store.ledger("round-trips")

    def call(i: int) -> None:
        block = {"type": "tool_use", "id": core.next_id(), "name": "noop_effect", "input": {"n": i}}
        tl.run_tool_uses([block], core.TOOLS, ledger=ledger)

    for i in range(WARM_CALLS):
        call(-1 - i)
    before = counter.counts()
    for i in range(n):
        call(i)
    d = counter.counts() - before
    if counter.unreadable:
        return None
    return RoundTrips(n, d.round_trips / n, d.ready / n, d.statements / n)


def new_schema(url: str, stack: ExitStack) -> str:
    """A schema name of our own, dropped at the end."""
    schema = f"tl_bench_{uuid.uuid4().hex[:10]}"
    stack.callback(_drop, url, schema)
    return schema
