"""Every approach to "a durable record of a tool call", behind one small interface, so the same
run can grow each ledger to N records and time one more record at that size.

toolledger (SQLite and JSON stores), the brief's whole-file JSON ledger, and — installed with the
``bench`` extra, skipped with a message when missing — LangGraph's ``SqliteSaver.put_writes``, a
DBOS step on a SQLite system database and effect-ledger's ``EffectExecutor``. Each rival is run
as it ships (its own journal mode and ``synchronous`` setting, which ``describe`` reports).
"""

from __future__ import annotations

import logging
import sqlite3
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import toolledger as tl
from toolledger.ops import InsertEffect

from . import core
from .measure import Contender
from .wholefile import WholeFileLedger


class Approach:
    """One way of keeping the ledger. ``grow_to`` is setup (not timed); ``contender`` times one
    more record at the current size."""

    key = ""
    name = ""
    writes: float = 1.0  # commits per timed operation, where it cannot be counted
    cheap = False  # ~a fsync per record: worth more samples than the group's N
    setup_ms_per_record = 0.0  # an estimate, to skip sizes that take too long to build

    def size(self) -> int:
        raise NotImplementedError

    def grow_to(self, n: int) -> None:
        raise NotImplementedError

    def contender(self) -> Contender:
        raise NotImplementedError

    def describe(self) -> str:
        return ""


def _pragmas(path: Path) -> str:
    with sqlite3.connect(path) as c:
        mode = c.execute("PRAGMA journal_mode").fetchone()[0]
    return f"journal_mode={mode}"


def grow_session(store: tl.Store, n: int) -> None:
    """Setup: bring session ``bench`` to ``n`` records, 10,000 per commit."""
    missing = n - len(store.backend.read_effects("bench"))
    for start in range(0, max(0, missing), 10_000):
        ops = [
            InsertEffect(core.record("bench", core.next_id()))
            for _ in range(min(10_000, missing - start))
        ]
        store.apply("bench", ops)


class ToolledgerRecord(Approach):
    """One ledger record through ``Store.apply`` (SQLite: one transaction; JSON store: a rewrite
    of the session's file)."""

    def __init__(self, kind: str, directory: Path, stack: ExitStack) -> None:
        self.kind = kind
        self.cheap = kind == "sqlite"
        self.key = f"tl_{kind}_record"
        self.name = f"toolledger {kind}: one durable record"
        self.store = core.open_bench_store(kind, directory, f"scale-{kind}", stack)

    def size(self) -> int:
        return len(self.store.backend.read_effects("bench"))

    def grow_to(self, n: int) -> None:
        grow_session(self.store, n)

    def contender(self) -> Contender:
        return core.per_record(self.store, f"toolledger {self.kind}", key=self.key)

    def describe(self) -> str:
        if self.kind == "sqlite":
            return "WAL, synchronous=FULL, one connection per store"
        return "whole file per session: tmp + fsync + rename + fsync(dir), digest per record"


class ToolledgerCall(Approach):
    """A ``run_tool_uses`` call on a session of N records: non-idempotent (intent, then
    outcome) or idempotent (the outcome alone)."""

    cheap = True

    def __init__(self, directory: Path, stack: ExitStack, tool: str) -> None:
        self.tool = tool
        self.key = f"tl_sqlite_call_{tool}"
        self.name = f"toolledger sqlite: run_tool_uses, one {core.LABEL[tool]} call"
        self.store = core.open_bench_store("sqlite", directory, f"scale-{tool}", stack)

    def size(self) -> int:
        return len(self.store.backend.read_effects("bench"))

    def grow_to(self, n: int) -> None:
        grow_session(self.store, n)

    def contender(self) -> Contender:
        return core.per_call(self.store, "toolledger sqlite", self.tool, key=self.key)


class BriefWholeFile(Approach):
    key = "brief_json"
    name = "brief's whole-file JSON (load, add, .tmp + fsync, rename, fsync dir)"

    def __init__(self, directory: Path) -> None:
        self.ledger = WholeFileLedger(directory / "brief" / "effects.json")
        self.ledger.path.parent.mkdir(exist_ok=True)
        self.count = 0

    def size(self) -> int:
        return self.count

    def grow_to(self, n: int) -> None:
        if n > self.count:
            self.ledger.prefill([core.next_id() for _ in range(n - self.count)])
            self.count = n

    def contender(self) -> Contender:
        def step(i: int) -> None:
            self.ledger.record(core.next_id(), "noop_effect", "ok")
            self.count += 1

        return Contender(self.name, step, writes=1, key=self.key)

    def describe(self) -> str:
        return "the brief's algorithm plus the two fsyncs durability needs (see wholefile.py)"


class LangGraphPutWrites(Approach):
    key = "langgraph"
    name = "LangGraph SqliteSaver.put_writes (one write)"
    cheap = True

    def __init__(self, directory: Path, stack: ExitStack) -> None:
        from langgraph.checkpoint.sqlite import SqliteSaver

        self.path = directory / "langgraph.sqlite"
        conn = sqlite3.connect(self.path, check_same_thread=False)
        stack.callback(conn.close)
        self.saver = SqliteSaver(conn)
        self.saver.setup()
        self.config: Any = {
            "configurable": {"thread_id": "bench", "checkpoint_ns": "", "checkpoint_id": "cp-1"}
        }
        self.count = 0

    def size(self) -> int:
        return self.count

    def grow_to(self, n: int) -> None:
        for _ in range(self.count, n, 10_000):
            k = min(10_000, n - self.count)
            self.saver.put_writes(self.config, [("noop", "ok")] * k, task_id=core.next_id())
            self.count += k

    def contender(self) -> Contender:
        def step(i: int) -> None:
            self.saver.put_writes(self.config, [("noop", "ok")], task_id=core.next_id())
            self.count += 1

        return Contender(self.name, step, writes=1, key=self.key)

    def describe(self) -> str:
        sync = self.saver.conn.execute("PRAGMA synchronous").fetchone()[0]
        return f"{_pragmas(self.path)}, synchronous={sync} (as shipped)"


class DBOSStep(Approach):
    """A DBOS step (no-op) inside a workflow, on a SQLite system database. A timed operation is
    one step; the workflow around a batch of steps is started outside the timing."""

    key = "dbos"
    name = "DBOS step (SQLite system database)"
    setup_ms_per_record = 2.0
    BATCH = 25

    def __init__(self, directory: Path, stack: ExitStack) -> None:
        from dbos import DBOS

        logging.getLogger("dbos").setLevel(logging.WARNING)
        self.path = directory / "dbos.sqlite"
        # Typed loosely: the keys DBOS's config TypedDict knows change between its releases.
        config: Any = {
            "name": "toolledger-bench",
            "system_database_url": f"sqlite:///{self.path}",
            "log_level": "WARNING",
            "run_admin_server": False,
        }
        DBOS(config=config)

        @DBOS.step()
        def noop(i: int) -> str:
            return "ok"

        @DBOS.workflow()
        def timed_steps(k: int) -> list[int]:
            out = []
            for j in range(k):
                t0 = time.perf_counter_ns()
                noop(j)
                out.append(time.perf_counter_ns() - t0)
            return out

        self.workflow = timed_steps
        DBOS.launch()
        stack.callback(DBOS.destroy)
        self.count = 0

    def size(self) -> int:
        return self.count

    def grow_to(self, n: int) -> None:
        while self.count < n:
            k = min(1000, n - self.count)
            self.workflow(k)
            self.count += k

    def contender(self) -> Contender:
        def step(i: int) -> list[int]:
            self.count += self.BATCH
            durations: list[int] = self.workflow(self.BATCH)
            return durations

        return Contender(
            self.name, step, writes=1, key=self.key, ops_per_step=self.BATCH, self_timed=True
        )

    def describe(self) -> str:
        with sqlite3.connect(self.path) as c:
            sync = c.execute("PRAGMA synchronous").fetchone()[0]
        return f"{_pragmas(self.path)}, synchronous={sync} (as shipped)"


class EffectLedgerExecute(Approach):
    """effect-ledger's ``EffectExecutor.execute`` with a no-op handler: a claim, then the
    outcome — the same two writes as a toolledger non-idempotent call."""

    key = "effect_ledger"
    name = "effect-ledger EffectExecutor.execute (claim + finish)"
    writes = 2.0

    def __init__(self, directory: Path) -> None:
        from effect_ledger import EffectExecutor

        self.path = directory / "effect-ledger.sqlite"
        self.executor = EffectExecutor(self.path, scope="bench")
        self.count = 0

    def size(self) -> int:
        return self.count

    def grow_to(self, n: int) -> None:
        """Bulk insert completed operations in one transaction (setup, not measured)."""
        if n <= self.count:
            return
        rows = [
            ("bench", core.next_id(), "noop.v1", '{"n":0}', str(uuid.uuid4()), '"ok"')
            for _ in range(n - self.count)
        ]
        with sqlite3.connect(self.path) as c:
            c.executemany(
                "INSERT INTO operations (scope, operation_id, effect, request, provider_key, "
                "state, attempt, version, result, error, created_at) "
                "VALUES (?, ?, ?, ?, ?, 'completed', 1, 2, ?, NULL, '2026-01-01T00:00:00')",
                rows,
            )
        self.count = n

    def contender(self) -> Contender:
        def handler(op: Any) -> str:
            return "ok"

        def step(i: int) -> None:
            self.executor.execute(core.next_id(), "noop.v1", {"n": i}, handler)
            self.count += 1

        return Contender(self.name, step, writes=2, key=self.key)

    def describe(self) -> str:
        return f"{_pragmas(self.path)}, synchronous=FULL, a new connection per transaction"


def load_rivals(directory: Path, stack: ExitStack) -> tuple[list[Approach], list[str]]:
    """The installed rivals, and a message for each one that is missing."""
    found: list[Approach] = []
    missing: list[str] = []
    for make, package in (
        (lambda: LangGraphPutWrites(directory, stack), "langgraph-checkpoint-sqlite"),
        (lambda: DBOSStep(directory, stack), "dbos"),
        (lambda: EffectLedgerExecute(directory), "effect-ledger"),
    ):
        try:
            found.append(make())
        except ImportError as exc:
            missing.append(
                f"{package} is not installed ({exc.name}): skipped. "
                "pip install -e '.[bench]' to include it."
            )
    return found, missing


def all_approaches(directory: Path, stack: ExitStack) -> tuple[list[Approach], list[str]]:
    ours: list[Approach] = [
        ToolledgerRecord("sqlite", directory, stack),
        ToolledgerCall(directory, stack, "noop_effect"),
        ToolledgerCall(directory, stack, "noop_idem"),
        ToolledgerRecord("json", directory, stack),
        BriefWholeFile(directory),
    ]
    theirs, missing = load_rivals(directory, stack)
    return ours + theirs, missing
