"""What correctness alone costs: the smallest ledger that keeps a non-idempotent call from
running twice across a crash, on the same SQLite settings as toolledger's default store (WAL,
``synchronous=FULL``). Every toolledger figure is published beside it.

Per call: read the record; if it is finished, answer from it; if it is started, the call is in
doubt and does not run; otherwise commit the intent, run the tool, commit the outcome. No
schema checks, approvals, leases, liveness, redaction or alerts: the two commits and the read
are what any correct ledger must pay.
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


class MinimalLedger:
    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode = WAL")
        self.db.execute("PRAGMA synchronous = FULL")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS effects (session TEXT, id TEXT, status TEXT, "
            "result TEXT, PRIMARY KEY (session, id))"
        )

    def call(self, session: str, call_id: str, tool: Callable[[], Any]) -> Any:
        row = self.db.execute(
            "SELECT status, result FROM effects WHERE session = ? AND id = ?", (session, call_id)
        ).fetchone()
        if row is not None:
            if row[0] == "succeeded":
                return json.loads(row[1])
            raise RuntimeError(f"{call_id} is in doubt: it may have run")
        self.db.execute(
            "INSERT INTO effects VALUES (?, ?, 'started', NULL)", (session, call_id)
        )  # the intent, durable before the effect
        result = tool()
        self.db.execute(
            "UPDATE effects SET status = 'succeeded', result = ? WHERE session = ? AND id = ?",
            (json.dumps(result), session, call_id),
        )  # the outcome, durable the instant the tool returns
        return result

    def close(self) -> None:
        self.db.close()


def per_call(directory: Path, stack: ExitStack) -> Contender:
    """One non-idempotent no-op call through the minimal ledger (2 commits and a read)."""
    ledger = MinimalLedger(directory / "minimal.db")
    stack.callback(ledger.close)

    def step(i: int) -> Any:
        return ledger.call("bench", next_id(), lambda: "ok")

    return Contender(
        "minimal correct ledger: one non-idempotent call", step, writes=2, key="minimal_call"
    )
