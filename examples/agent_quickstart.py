"""A durable agent in under 20 lines — run offline against the scripted model.

With a real model, replace ``model.client()`` by ``anthropic.Anthropic()`` and ``claude-test`` by
a model name. Kill this script at any point and run it again: it resumes, and nothing happens
twice. Its store is ``TOOLLEDGER_STORE``, else one file in the temporary directory that every run
shares (delete it to start over).

    python examples/agent_quickstart.py
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import toolledger as tl
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

tickets: list[str] = []


@tl.tool(effect="non_idempotent")
def create_ticket(title: str, ctx: tl.ToolContext) -> dict[str, str]:
    """Open a support ticket."""
    tickets.append(title)
    return {"ticket": f"T-{len(tickets)}", "key": ctx.idempotency_key}


@tl.tool(effect="read_only")
def status_page() -> str:
    """Read the public status page."""
    return "checkout: degraded"


def main() -> None:
    script = [
        Reply(text="Let me check.", tool_uses=[ToolUse("status_page")]),
        Reply(tool_uses=[ToolUse("create_ticket", {"title": "Checkout degraded"})]),
        Reply(text="Ticket T-1 is open."),
    ]
    shared = Path(tempfile.gettempdir()) / "toolledger-agent-quickstart.db"
    db = os.environ.get("TOOLLEDGER_STORE") or f"sqlite:///{shared}"
    with ScriptedModel(script) as model, tl.open_store(db) as store:
        # --- the part you write -------------------------------------------------------------
        agent = tl.Agent(
            client=model.client(),  # anthropic.Anthropic() for real
            model="claude-test",
            tools=[create_ticket, status_page],
            store=store,
            approve=tl.approvals.terminal,  # asked before high-impact tools only
        )
        run = agent.run(session="outage-42", prompt="Checkout is failing for customers.")
        print(run.status, "-", run.final_text)
        # ------------------------------------------------------------------------------------
        again = agent.run(session="outage-42", prompt="Checkout is failing for customers.")
        # What happened in the world is in the ledger: this process, or one before it that
        # this run resumed, opened the ticket — once.
        made = [r for r in store.ledger("outage-42").records() if r.tool == "create_ticket"]
    print(
        f"ran twice, tickets opened by this process: {len(tickets)}, in the ledger: "
        f"{len(made)}; second run: {again.status}"
    )
    if len(made) != 1 or len(tickets) > 1 or run.status is not tl.RunStatus.COMPLETED:
        raise SystemExit("something happened twice")


if __name__ == "__main__":
    main()
