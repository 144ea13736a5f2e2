"""CPU only: toolledger and the minimal correct ledger on stores with ``synchronous=OFF``, in a
tmpfs directory when the machine has one (``/dev/shm``), interleaved. No fsync is left to wait
for, so what remains is the CPU each spends per call and per turn — what caps throughput when
many workers share a store, and where a gain of a few microseconds shows.

Each operation is timed on the process's CPU clock (all its threads: a lease renewer's work
counts), its wall-clock median kept beside it: on a shared machine the wall clock also holds the
time a thread waited for a core, or for another thread.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import toolledger as tl

from . import core, minimal
from .measure import Contender, Sample, interleaved

TMPFS = Path("/dev/shm")


def scratch_dir(fallback: Path, stack: ExitStack) -> tuple[Path, str]:
    """A directory in tmpfs (removed at the end) if there is one, else ``fallback``; and where
    it is, for the report."""
    if TMPFS.is_dir() and os.access(TMPFS, os.W_OK):
        path = Path(tempfile.mkdtemp(prefix="toolledger-bench-", dir=TMPFS))
        stack.callback(shutil.rmtree, path, ignore_errors=True)
        return path, f"tmpfs ({TMPFS})"
    return fallback, "the bench directory's disk (no tmpfs at /dev/shm)"


def synchronous_off(store: tl.Store) -> tl.Store:
    """The store's SQLite connection stops waiting for fsyncs: the same statements, the same
    commits, no durability."""
    conn = store.backend._conn  # type: ignore[attr-defined]
    conn.execute("PRAGMA synchronous = OFF")
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 0
    return store


def cpu_rows(directory: Path, stack: ExitStack, n: int) -> list[Sample]:
    """The minimal correct ledger first (the rows' reference), then toolledger's call, turn and
    record, every one on its own ``synchronous=OFF`` file in ``directory``."""

    def store(name: str) -> tl.Store:
        return synchronous_off(core.open_bench_store("sqlite", directory, name, stack))

    contenders: list[Contender] = [
        minimal.per_call(
            directory, stack, synchronous="OFF", key="cpu_minimal_call", label="CPU only: minimal"
        ),
        sql_alone(store("cpu-sql")),
    ]
    for tool in ("noop_effect", "noop_read"):
        c = core.per_call(store(f"cpu-call-{tool}"), "CPU only", tool)
        c.key = f"cpu_call_{tool}"
        contenders.append(c)
    c = core.agent_turn(store("cpu-turn"), "CPU only")
    c.key = "cpu_turn"
    contenders.append(c)
    contenders.append(core.per_record(store("cpu-record"), "CPU only", key="cpu_record"))
    for c in contenders:
        c.cpu_time = True
    return interleaved(contenders, n)


class _Recording:
    """A SQLite connection that keeps every statement run through it, with its parameters."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.statements: list[tuple[str, tuple[Any, ...]]] = []

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        self.statements.append((sql, tuple(params)))
        return self.conn.execute(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


def sql_alone(store: tl.Store) -> Contender:
    """toolledger's own SQL for one non-idempotent call, with nothing around it: the statements
    a real ``run_tool_uses`` call runs on ``store`` (recorded, with their parameters), run again
    for a fresh call id each time. Beside the minimal ledger's whole call, it is how much of
    toolledger's CPU is SQLite's; the rest is everything else it does."""
    backend = store.backend
    recorded = _Recording(backend._conn)  # type: ignore[attr-defined]
    ledger = store.ledger("bench")

    def call(call_id: str) -> None:
        block = {"type": "tool_use", "id": call_id, "name": "noop_effect", "input": {"n": 0}}
        tl.run_tool_uses([block], core.TOOLS, ledger=ledger)

    call(core.next_id())  # the first call of a store reads what later ones know
    first = core.next_id()
    backend._conn = recorded  # type: ignore[attr-defined]
    try:
        call(first)
    finally:
        backend._conn = recorded.conn  # type: ignore[attr-defined]
    # Its writes (the intent, the outcome), each a statement of its own on the straight path.
    template = [(sql, p) for sql, p in recorded.statements if sql.startswith(("INSERT", "UPDATE"))]
    if not template:
        raise RuntimeError(f"a call ran no write: {recorded.statements}")
    conn = recorded.conn

    def step(i: int) -> Any:
        call_id = core.next_id()
        for sql, params in template:
            fresh = tuple(call_id if p == first else p for p in params)
            if conn.execute(sql, fresh).rowcount != 1:  # each really writes its row
                raise RuntimeError(f"replaying {sql[:60]!r} changed no row")

    return Contender(
        f"CPU only: toolledger's SQL alone (a call's {len(template)} writes, replayed)",
        step,
        writes=2,
        key="cpu_sql_alone",
    )
