"""The brief's proof: the same tool_use_id twice executes create_ticket once.

A counting fake ``create_ticket`` is run through ``run_tool_uses`` with one tool_use_id, the
store is closed and reopened (as after a crash and a resume), and the call is made again. On a
SQLite store and on a JSON store the second call returns the stored result and the counter stays
at 1.

    python examples/create_ticket_twice.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import toolledger as tl

executions: list[str] = []  # one entry per real execution: the counting fake


@tl.tool(effect="non_idempotent")
def create_ticket(title: str, body: str, ctx: tl.ToolContext) -> dict[str, Any]:
    """Open a support ticket."""
    executions.append(ctx.tool_use_id)
    return {"ticket_id": f"T-{len(executions)}", "title": title}


# What the model sent: one tool_use block, id minted by the API.
MESSAGE = [
    {"type": "text", "text": "A customer reports an outage; I'll open a ticket."},
    {
        "type": "tool_use",
        "id": "toolu_01A",
        "name": "create_ticket",
        "input": {"title": "Outage", "body": "Customer reports 502s on checkout"},
    },
]


def prove(url: str) -> bool:
    executions.clear()
    tools = tl.ToolSet([create_ticket])
    with tl.open_store(url) as store:
        first = tl.run_tool_uses(MESSAGE, tools, ledger=store.ledger("outage-42"))
    # ... the process dies here, before the result reached any checkpoint, and is restarted ...
    with tl.open_store(url) as store:
        second = tl.run_tool_uses(MESSAGE, tools, ledger=store.ledger("outage-42"))
        record = store.ledger("outage-42").get("toolu_01A")
    ok = len(executions) == 1 and first == second
    scheme = url.split(":", maxsplit=1)[0]
    print(
        f"{scheme:>6}: create_ticket executed {len(executions)} time(s); "
        f"second call returned the stored result: {second[0]['content']}"
    )
    print(
        f"        ledger: {record.status.value if record else 'missing'}, "
        f"attempt {record.attempt if record else '-'}"
    )
    return ok


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="toolledger-") as tmp:
        results = [
            prove(f"sqlite:///{Path(tmp) / 'ledger.db'}"),
            prove(f"json:///{Path(tmp) / 'json'}"),
        ]
    if not all(results):
        sys.exit("create_ticket ran more than once")
    print("executed once on both stores")


if __name__ == "__main__":
    main()
