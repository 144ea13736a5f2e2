"""Write the upgrade fixtures of the code about to become 0.2.0, as it was before 0.2.0's format
changes (commit bc31cd9, where the package still said 0.1.0): stores that code itself wrote.

0.2.0 adds the JSON store's format file and opens stores read-only for the commands that only
look; the fixtures of 0.1.0 (``make_v0_1_0_fixtures.py``) do not hold what came between —
branches (forks and rewinds, abandoned turns), attempts' owners and their history, approvals
of in-doubt calls. These do, so a later release is tested against them too.

**Run it with that commit's source, never with a later tree.** From a clone:

    mkdir /tmp/tl-pre && git archive bc31cd9 src | tar -x -C /tmp/tl-pre
    PYTHONPATH=/tmp/tl-pre/src .venv/bin/python tests/upgrade/make_pre_0_2_0_fixtures.py

It refuses to run when the ``toolledger`` it imports is not under a directory named by
``PYTHONPATH``, or when the source lacks ``toolledger.branches._branching`` (too old) or has the
format file
(too new). It writes, in ``fixtures/pre_0_2_0/``: ``store.db`` (``sqlite:///``, checkpointed),
``json/`` (``json:///``) and ``manifest.json`` (each session's status, and what the tests check).

Sessions, made by really running the agent against ``ScriptedModel`` through the ``anthropic``
SDK: ``completed`` (a ticket opened), ``forked`` (``completed`` forked at turn 0: the ticket is an
effect after the fork, told to the model), ``rewound`` (two tickets, rewound to turn 1: the second
turn kept as abandoned branch 1), ``in-doubt`` (the tool said it may have done it:
``OutcomeUnknown``), ``awaiting-approval`` (a refund queued for a person).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any

import toolledger as tl

HERE = Path(__file__).parent
OUT = HERE / "fixtures" / "pre_0_2_0"
COMMIT = "bc31cd9"


def _check_source() -> None:
    where = Path(tl.__file__).resolve()
    roots = [Path(p).resolve() for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if not any(root in where.parents for root in roots):
        sys.exit(f"toolledger from {where}: run with PYTHONPATH naming commit {COMMIT}'s src")
    try:
        import toolledger.branches._branching  # noqa: F401
    except ImportError:
        sys.exit("this toolledger has no branches: older than the fixtures need")
    if (where.parent / "stores" / "jsonfile" / "_format.py").exists():
        sys.exit("this toolledger writes the JSON format file: newer than the fixtures need")


def _sessions(url: str) -> dict[str, str]:
    from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

    tickets: list[str] = []

    @tl.tool(effect="non_idempotent")
    def create_ticket(title: str, ctx: tl.ToolContext) -> dict[str, str]:
        """Open a ticket."""
        tickets.append(title)
        return {"ticket": f"T-{len(tickets)}"}

    @tl.tool(effect="non_idempotent")
    def send_email(to: str) -> str:
        """E-mail someone; the server hung up after the data."""
        raise tl.OutcomeUnknown("the SMTP server hung up after DATA")

    @tl.tool(effect="non_idempotent", high_impact=True)
    def refund(order: str, cents: int) -> str:
        """Refund an order."""
        return "refunded"

    tools = [create_ticket, send_email, refund]
    scripts: dict[str, list[Any]] = {
        "completed": [
            Reply(tool_uses=[ToolUse("create_ticket", {"title": "outage"})]),
            Reply(text="Opened."),
        ],
        "rewound": [
            Reply(tool_uses=[ToolUse("create_ticket", {"title": "first"})]),
            Reply(tool_uses=[ToolUse("create_ticket", {"title": "second"})]),
            Reply(text="Two."),
        ],
        "in-doubt": [Reply(tool_uses=[ToolUse("send_email", {"to": "ops@acme.example"})])],
        "awaiting-approval": [Reply(tool_uses=[ToolUse("refund", {"order": "o-1", "cents": 500})])],
    }
    statuses: dict[str, str] = {}
    with tl.open_store(url) as store:
        for session, script in scripts.items():
            with ScriptedModel(script) as model:
                agent = tl.Agent(
                    client=model.client(),
                    model="fixture",
                    tools=tools,
                    store=store,
                    approve=tl.approvals.queue,
                )
                statuses[session] = agent.run(session=session, prompt=f"go: {session}").status.value
        tl.fork(store, "completed", at_turn=0, new_session="forked", by="fixture")
        tl.rewind(store, "rewound", to_turn=1, by="fixture")
        for state in store.session_states():
            statuses[state.session_id] = state.status.value
    return statuses


def main() -> int:
    _check_source()
    with tempfile.TemporaryDirectory() as tmp:
        db, directory = Path(tmp) / "store.db", Path(tmp) / "json"
        made = {
            "sqlite": _sessions(f"sqlite:///{db}"),
            "json": _sessions(f"json:///{directory}"),
        }
        with sqlite3.connect(db) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            schema_version = conn.execute("PRAGMA user_version").fetchone()[0]
        if made["sqlite"] != made["json"]:
            sys.exit(f"the backends disagree: {made}")
        shutil.rmtree(OUT, ignore_errors=True)
        OUT.mkdir(parents=True)
        shutil.copy(db, OUT / "store.db")
        shutil.copytree(directory, OUT / "json")
    manifest = {
        "written_by": f"toolledger at commit {COMMIT} (it said {tl.__version__})",
        "generator": "tests/upgrade/make_pre_0_2_0_fixtures.py",
        "sqlite_schema_version": schema_version,
        "statuses": made["sqlite"],
        "forked": {"source": "completed", "turn": 0, "effects": ["create_ticket"]},
        "rewound": {"turn": 1, "abandoned_branches": [1]},
        "in_doubt": {"session": "in-doubt", "tool": "send_email"},
        "awaiting_approval": {"session": "awaiting-approval", "tool": "refund"},
    }
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    (OUT / ".gitignore").write_text(
        "# The repository ignores *.db; this one, written by the pre-0.2.0 code, is a fixture.\n"
        "!store.db\n"
    )
    print(json.dumps(manifest, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
