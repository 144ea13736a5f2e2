"""MCP, both halves: a client that sends the idempotency key, a server that honours it.

The server (this file, run with `--serve DIR`) is an `MCPServer` whose `create_ticket` runs under
`toolledger.integrations.mcp_server.ServerLedger`: a repeat of a key answers the first result. The
client starts it over stdio and calls `create_ticket` twice under one key, each time on an empty
ledger of its own — what a client that died before it recorded the answer does when it resumes.
One ticket. See docs/integrations/mcp.md. Runs offline; exits 0 with a note when the mcp SDK is
not installed:

    pip install 'toolledger[mcp]' && python examples/recipe_mcp_server.py
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

import toolledger as tl

try:
    from mcp import ClientSession, StdioServerParameters, stdio_client
    from mcp.server import MCPServer
    from mcp.server.mcpserver import Context

    from toolledger.adapters.mcp import tools_from_session
    from toolledger.integrations.mcp_server import ServerLedger
except ImportError:
    print("the mcp SDK is not installed: pip install mcp (skipping this recipe)")
    sys.exit(0)


def serve(directory: Path) -> None:
    """The server: tickets are lines in DIR/tickets.txt; its ledger is DIR/server.db."""
    server = MCPServer("tickets")
    with tl.open_store(f"sqlite:///{directory / 'server.db'}") as store:
        keyed = ServerLedger(store, principal=lambda ctx: "local")  # stdio: one client

        @server.tool()
        @keyed.tool(effect="non_idempotent")
        def create_ticket(title: str, ctx: Context) -> dict[str, str]:
            """Open a support ticket."""
            with (directory / "tickets.txt").open("a") as f:
                f.write(title + "\n")
            return {"ticket": f"T-{len((directory / 'tickets.txt').read_text().splitlines())}"}

        server.run()


async def client(directory: Path) -> None:
    params = StdioServerParameters(
        command=sys.executable, args=[__file__, "--serve", str(directory)]
    )
    call = {"type": "tool_use", "id": "call_1", "name": "create_ticket"}
    answers = []
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = await tools_from_session(
            session, overrides={"create_ticket": {"forwards_idempotency_key": True}}
        )
        for _ in range(2):  # the call, then the same call after a "crash" lost its record
            with tl.open_store("memory://") as store:
                (result,) = await tl.arun_tool_uses(
                    [{**call, "input": {"title": "Checkout down"}}],
                    tools,
                    ledger=store.ledger("conversation-1"),
                )
            answers.append(result["content"])
    tickets = (directory / "tickets.txt").read_text().splitlines()
    print(f"answers: {answers}")
    print(f"tickets opened: {len(tickets)}")
    if len(tickets) != 1 or answers[0] != answers[1]:
        sys.exit("a ticket was opened twice")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(Path(sys.argv[2]))
    else:
        with tempfile.TemporaryDirectory() as where:
            asyncio.run(client(Path(where)))
