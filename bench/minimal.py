"""What correctness alone costs: the smallest ledger that keeps a non-idempotent call from
running twice across a crash, on the same SQLite settings as toolledger's default store (WAL,
``synchronous=FULL``). Every toolledger figure is published beside it.

Per call: read the record; if it is finished, answer from it; if it is started, the call is in
doubt and does not run; otherwise commit the intent, run the tool, commit the outcome. No
schema checks, approvals, leases, liveness, redaction or alerts: the two commits and the read
are what any correct ledger must pay.

``bare_loop`` is less than that: the two commits alone (intent, outcome), without the read —
what a worker process's calls per second cannot exceed on a store shared by many processes.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from .core import next_id
from .measure import Contender

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS {table} (session TEXT, id TEXT, status TEXT, result TEXT, "
    "PRIMARY KEY (session, id))"
)
READ = "SELECT status, result FROM {table} WHERE session = ? AND id = ?"
INTENT = "INSERT INTO {table} VALUES (?, ?, 'started', NULL)"
OUTCOME = "UPDATE {table} SET status = 'succeeded', result = ? WHERE session = ? AND id = ?"


def connect(path: Path, *, synchronous: str = "FULL") -> sqlite3.Connection:
    """A connection on toolledger's SQLite settings (WAL; ``synchronous`` FULL unless told; a
    10 s busy timeout), its table created."""
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute(f"PRAGMA synchronous = {synchronous}")
    db.execute(SCHEMA.format(table="effects"))
    return db


class MinimalLedger:
    def __init__(self, path: Path, *, synchronous: str = "FULL") -> None:
        self.db = connect(path, synchronous=synchronous)

    def call(self, session: str, call_id: str, tool: Callable[[], Any]) -> Any:
        row = self.db.execute(READ.format(table="effects"), (session, call_id)).fetchone()
        if row is not None:
            if row[0] == "succeeded":
                return json.loads(row[1])
            raise RuntimeError(f"{call_id} is in doubt: it may have run")
        # The intent, durable before the effect.
        self.db.execute(INTENT.format(table="effects"), (session, call_id))
        result = tool()
        # The outcome, durable the instant the tool returns.
        self.db.execute(OUTCOME.format(table="effects"), (json.dumps(result), session, call_id))
        return result

    def close(self) -> None:
        self.db.close()


def bare_loop(db: sqlite3.Connection, session: str) -> Callable[[int], Any]:
    """One call's two commits and nothing else: ``INSERT`` the intent, ``UPDATE`` the outcome,
    each in autocommit (its own transaction, its own fsync)."""
    intent, outcome = INTENT.format(table="effects"), OUTCOME.format(table="effects")

    def op(i: int) -> Any:
        call_id = next_id()
        db.execute(intent, (session, call_id))
        return db.execute(outcome, ('"ok"', session, call_id))

    return op


def per_call(
    directory: Path,
    stack: ExitStack,
    *,
    synchronous: str = "FULL",
    key: str = "minimal_call",
    label: str = "minimal correct ledger",
) -> Contender:
    """One non-idempotent no-op call through the minimal ledger (2 commits and a read)."""
    ledger = MinimalLedger(directory / f"minimal-{key}.db", synchronous=synchronous)
    stack.callback(ledger.close)

    def step(i: int) -> Any:
        return ledger.call("bench", next_id(), lambda: "ok")

    return Contender(f"{label}: one non-idempotent call", step, writes=2, key=key)
