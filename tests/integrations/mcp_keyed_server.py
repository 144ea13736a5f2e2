"""An MCP server for the tests, run over stdio: ``python mcp_keyed_server.py WORLD MODE [STORE]``.

``create_ticket`` appends its title to ``WORLD/world.txt`` (one line per real effect) and answers
a fresh ticket id; every ``tools/call`` of it that arrives is logged (its key) to
``WORLD/received.log``, whether it runs or not. ``MODE`` is ``plain`` (the SDK alone: every call
runs) or ``ledgered`` (under a ``ServerLedger`` on the store at ``STORE``, all calls from the
one local client); ``unnamed`` is ``ledgered`` with the default principal, which a stdio server
never has. ``slow_ticket`` is ``create_ticket`` after a second's pause (a first attempt still
running); ``unsure_ticket`` is ``create_ticket`` that then cannot tell whether it took effect
(it raises ``OutcomeUnknown``); ``full_ticket`` answers the SDK's ``CallToolResult`` itself, an
error result once the world holds a line, and ``bare_ticket`` does the same with no return
annotation; ``badge_ticket`` answers the SDK's ``Image`` (a PNG of the title's bytes);
``echo_meta`` answers the ``_meta`` it received.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mcp.server import MCPServer
from mcp.server.mcpserver import Context, Image
from mcp.types import CallToolResult, TextContent

import toolledger as tl
from toolledger.integrations.mcp_server import ServerLedger

WORLD = Path(sys.argv[1]) / "world.txt"
MODE = sys.argv[2]
server = MCPServer("keyed-tickets")


def effect(title: str) -> dict[str, str]:
    with WORLD.open("a") as f:
        f.write(title + "\n")
    return {"ticket": uuid.uuid4().hex[:8], "title": title}


def create_ticket(title: str, ctx: Context) -> dict[str, str]:
    """Open a support ticket."""
    return effect(title)


async def slow_ticket(title: str, ctx: Context) -> dict[str, str]:
    """Open a support ticket, slowly."""
    await asyncio.sleep(1.0)
    return effect(title)


def received(tool: Callable[..., Any]) -> Callable[..., Any]:
    """``tool``, logging each call that arrives, before the ledger (if any) sees it."""

    @functools.wraps(tool)
    async def logged(**kwargs: Any) -> Any:
        with (WORLD.parent / "received.log").open("a") as f:
            f.write(json.dumps(kwargs["ctx"].request_context.meta or {}) + "\n")
        answer = tool(**kwargs)
        return (await answer) if asyncio.iscoroutine(answer) else answer

    return logged


def unsure_ticket(title: str, ctx: Context) -> dict[str, str]:
    """Open a support ticket; the answer is lost on the way back."""
    effect(title)
    raise tl.OutcomeUnknown("the ticket service timed out after it was sent")


def full_ticket(title: str, ctx: Context) -> CallToolResult:
    """Open a support ticket unless one is open already (an error result)."""
    if WORLD.exists():
        return CallToolResult(content=[TextContent(text="a ticket is open already")], is_error=True)
    return CallToolResult(content=[TextContent(text=json.dumps(effect(title)))])


def bare_ticket(title: str, ctx: Context):  # type: ignore[no-untyped-def]
    """``full_ticket`` without a return annotation."""
    return full_ticket(title, ctx)


def badge_ticket(title: str, ctx: Context) -> Image:
    """Open a support ticket and answer a badge for it (an image)."""
    effect(title)
    return Image(data=title.encode(), format="png")


@server.tool()
def echo_meta(ctx: Context) -> dict[str, Any]:
    """The _meta of this request."""
    return dict(ctx.request_context.meta or {})


if __name__ == "__main__":
    store = None
    if MODE == "plain":
        server.tool()(received(create_ticket))
        server.tool()(slow_ticket)
    else:
        store = tl.open_store(sys.argv[3])
        if MODE == "ledgered":
            keyed = ServerLedger(store, principal=lambda ctx: "local")
        else:
            keyed = ServerLedger(store)
        server.tool()(received(keyed.tool(effect="non_idempotent")(create_ticket)))
        server.tool()(keyed.tool(slow_ticket))
        server.tool()(keyed.tool(effect="non_idempotent")(unsure_ticket))
        server.tool()(keyed.tool(effect="non_idempotent")(full_ticket))
        server.tool()(keyed.tool(effect="non_idempotent")(bare_ticket))
        server.tool()(keyed.tool(effect="non_idempotent")(badge_ticket))
    try:
        server.run()
    finally:
        if store is not None:
            store.close()
