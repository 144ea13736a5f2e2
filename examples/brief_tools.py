"""The brief's six tools, declared with what running them twice would do.

Each one works against a small local "world" (a directory), so the example runs anywhere:

    python examples/brief_tools.py [WORLD_DIR]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any

import toolledger as tl

WORLD = Path(os.environ.get("BRIEF_WORLD", tempfile.mkdtemp(prefix="toolledger-world-")))


# read_only: reading leaves nothing behind; a re-run returns what is on disk now.
@tl.tool(effect="read_only")
def read_file(path: Annotated[str, "path inside the world directory"]) -> str:
    """Read a text file."""
    return (WORLD / path).read_text()


# non_idempotent + high_impact: every run puts one more message in someone's inbox.
@tl.tool(effect="non_idempotent", high_impact=True)
def send_email(to: str, subject: str, body: str, ctx: tl.ToolContext) -> dict[str, str]:
    """Send an e-mail."""
    outbox = WORLD / "outbox"
    outbox.mkdir(exist_ok=True)
    n = len(list(outbox.iterdir())) + 1
    message = {"to": to, "subject": subject, "body": body, "message_id": ctx.idempotency_key}
    (outbox / f"{n:04d}.json").write_text(json.dumps(message))
    return {"status": "sent", "message_id": ctx.idempotency_key}


# idempotent: looks the title up first and only creates when absent — but only as safe as that
# lookup (two tickets whose titles differ by a space are two tickets).
@tl.tool(effect="idempotent")
def ensure_ticket(title: str, body: str) -> dict[str, Any]:
    """Return the open ticket with this title, creating it if there is none."""
    db = WORLD / "tickets.json"
    tickets: list[dict[str, Any]] = json.loads(db.read_text()) if db.exists() else []
    for ticket in tickets:
        if ticket["title"] == title:
            return {**ticket, "created": False}
    ticket = {"id": len(tickets) + 1, "title": title, "body": body}
    db.write_text(json.dumps([*tickets, ticket]))
    return {**ticket, "created": True}


# non_idempotent: every run adds a line; the log grows with the number of calls.
@tl.tool(effect="non_idempotent")
def append_log(line: str) -> str:
    """Append a line to the activity log."""
    with open(WORLD / "activity.log", "a") as log:
        log.write(line + "\n")
    return "appended"


# idempotent: an overwrite; ten runs leave the value one run leaves.
@tl.tool(effect="idempotent")
def set_config(key: str, value: str) -> str:
    """Set a configuration key (overwrites)."""
    db = WORLD / "config.json"
    config = json.loads(db.read_text()) if db.exists() else {}
    config[key] = value
    db.write_text(json.dumps(config))
    return f"{key}={value}"


# idempotent + high_impact: gone is gone, so "not found" counts as success — otherwise the
# second run of a delete that worked would report a failure.
@tl.tool(effect="idempotent", high_impact=True)
def delete_file(path: str) -> str:
    """Delete a file; deleting a file that is already gone succeeds."""
    try:
        (WORLD / path).unlink()
    except FileNotFoundError:
        return f"{path} was already absent"
    return f"deleted {path}"


TOOLS = tl.ToolSet([read_file, send_email, ensure_ticket, append_log, set_config, delete_file])


def main() -> None:
    (WORLD / "notes.txt").write_text("the outage started at 09:12")
    store = tl.open_store(f"sqlite:///{WORLD / 'ledger.db'}")
    ledger = store.ledger("brief-tools")
    message = [
        {"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": args}
        for i, (name, args) in enumerate(
            [
                ("read_file", {"path": "notes.txt"}),
                ("ensure_ticket", {"title": "Outage", "body": "customers report errors"}),
                ("append_log", {"line": "opened the outage ticket"}),
                ("set_config", {"key": "status_page", "value": "degraded"}),
                ("send_email", {"to": "oncall@example.com", "subject": "Outage", "body": "on it"}),
                ("delete_file", {"path": "notes.txt"}),
            ]
        )
    ]
    approve = lambda request: True  # noqa: E731 - every high-impact call approved, for the demo
    for attempt in ("first run", "replay after a 'crash'"):
        results = tl.run_tool_uses(message, TOOLS, ledger=ledger, approve=approve)
        print(f"{attempt}:")
        for block, result in zip(message, results, strict=True):
            effect = TOOLS[block["name"]].effect.value
            print(f"  {block['name']:<14} {effect:<15} {result['content']}")
    emails = len(list((WORLD / "outbox").iterdir()))
    log_lines = (WORLD / "activity.log").read_text().count("\n")
    print(f"e-mails sent: {emails}, log lines: {log_lines}")
    store.close()
    if emails != 1 or log_lines != 1:
        sys.exit("an effect happened twice")


if __name__ == "__main__":
    main()
