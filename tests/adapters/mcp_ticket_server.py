"""An MCP server for the tests, run over stdio: ``python mcp_ticket_server.py WORLD_DIR``.

Its tools leave their effects in a ``toolledger.testing.World`` directory (one file per ticket,
one line per real execution in ``executions.log``), so a test counts what really happened on the
server, whatever the agent process believed. One tool per recovery strategy, declared through
MCP annotations:

* ``create_ticket`` — no hints: non-idempotent;
* ``create_ticket_checked`` — no hints; tags the ticket with the idempotency key toolledger sends
  in ``_meta``, so ``find_ticket`` can tell whether a call happened;
* ``create_ticket_keyed`` — no hints; drops repeats of a key (the test declares it
  ``forwards_idempotency_key``);
* ``ensure_ticket`` — ``idempotentHint``;
* ``find_ticket``, ``list_tickets`` — ``readOnlyHint``;
* ``close_ticket`` — ``destructiveHint`` + ``idempotentHint``;
* ``flaky_export`` — answers ``isError``.
"""

from __future__ import annotations

import hashlib
import json
import sys
import uuid
from pathlib import Path
from typing import Any

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from toolledger.adapters.mcp import key_from_meta

WORLD = Path(sys.argv[1])
TICKETS = WORLD / "tickets"
server = MCPServer("tickets")


def log(tool: str, key: str | None) -> None:
    with open(WORLD / "executions.log", "a") as fh:
        fh.write(json.dumps({"tool": tool, "key": key}) + "\n")


def write(name: str, ticket: dict[str, Any]) -> dict[str, Any]:
    path = TICKETS / f"{name}.json"
    if path.exists():
        found: dict[str, Any] = json.loads(path.read_text())
        return found
    path.write_text(json.dumps(ticket))
    return ticket


def key(ctx: Context) -> str | None:
    return key_from_meta(ctx.request_context.meta)


@server.tool()
def create_ticket(title: str, ctx: Context) -> dict[str, Any]:
    """Open a support ticket (every call opens a new one)."""
    log("create_ticket", key(ctx))
    ticket = {"id": uuid.uuid4().hex[:8], "title": title}
    return write(ticket["id"], ticket)


@server.tool()
def create_ticket_checked(title: str, ctx: Context) -> dict[str, Any]:
    """Open a support ticket tagged with the caller's key."""
    log("create_ticket_checked", key(ctx))
    ticket = {"id": uuid.uuid4().hex[:8], "title": title, "external_id": key(ctx)}
    return write(ticket["id"], ticket)


@server.tool()
def create_ticket_keyed(title: str, ctx: Context) -> dict[str, Any]:
    """Open a support ticket; a repeated idempotency key returns the first one."""
    log("create_ticket_keyed", key(ctx))
    name = key(ctx) or uuid.uuid4().hex[:8]
    return write(name, {"id": name, "title": title})


@server.tool(annotations=ToolAnnotations(idempotent_hint=True))
def ensure_ticket(title: str, ctx: Context) -> dict[str, Any]:
    """Return the ticket with this title, opening it if there is none."""
    log("ensure_ticket", key(ctx))
    name = hashlib.sha256(title.encode()).hexdigest()[:16]
    return write(name, {"id": name, "title": title})


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def find_ticket(external_id: str) -> dict[str, Any]:
    """The ticket with this external id, or an empty object."""
    for path in TICKETS.glob("*.json"):
        ticket: dict[str, Any] = json.loads(path.read_text())
        if ticket.get("external_id") == external_id:
            return ticket
    return {}


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def list_tickets() -> list[dict[str, Any]]:
    """Every ticket."""
    return [json.loads(p.read_text()) for p in sorted(TICKETS.glob("*.json"))]


@server.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=True))
def close_ticket(ticket_id: str) -> str:
    """Close (delete) a ticket; closing a closed ticket succeeds."""
    (TICKETS / f"{ticket_id}.json").unlink(missing_ok=True)
    return f"closed {ticket_id}"


@server.tool()
def flaky_export(fmt: str) -> str:
    """Export the tickets (always fails)."""
    raise ToolError(f"export to {fmt} is down")


if __name__ == "__main__":
    TICKETS.mkdir(parents=True, exist_ok=True)
    server.run()
