"""An async agent whose tools are an MCP server's, run in a forked process a test can kill.

The child starts ``mcp_ticket_server.py`` over stdio with the ``mcp`` SDK's client, turns its
tools into a toolset with ``tools_from_session`` and runs ``await Agent.arun`` against the scripted
Messages API with ``anthropic.AsyncAnthropic``. ``TOOLLEDGER_CRASH_AT``-style crash points make it
``SIGKILL`` itself; the server, left without its client, exits at the end of its stdin.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolledger.testing.world import run_forked

SERVER = str(Path(__file__).with_name("mcp_ticket_server.py"))


@dataclass(frozen=True)
class MCPSpec:
    store_url: str
    base_url: str
    world: str
    session: str = "outage-42"
    prompt: str = "A customer reports an outage; open a ticket."


def _result(value: Any) -> Any:
    structured = getattr(value, "structured_content", None)
    return structured if structured is not None else None


async def _run(spec: MCPSpec, result_path: str) -> None:
    """Run the agent, write what it returned, and leave at once (``os._exit``): the server exits
    by itself at the end of its stdin, and a graceful stdio shutdown costs half a second a run."""
    import anthropic
    from mcp import ClientSession, StdioServerParameters, stdio_client

    import toolledger as tl
    from toolledger.adapters.mcp import tools_from_session

    params = StdioServerParameters(command=sys.executable, args=[SERVER, spec.world])
    with open(Path(spec.world) / "server.log", "a") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()

            async def find(arguments: dict[str, Any], ctx: tl.ToolContext) -> Any:
                found = await session.call_tool("find_ticket", {"external_id": ctx.idempotency_key})
                return _result(found) or None

            tools = await tools_from_session(
                session,
                overrides={
                    "create_ticket_checked": {"check": find},
                    "create_ticket_keyed": {"forwards_idempotency_key": True},
                },
            )
            client = anthropic.AsyncAnthropic(
                base_url=spec.base_url, api_key="scripted", max_retries=0
            )
            with tl.open_store(spec.store_url) as store:
                agent = tl.Agent(client=client, model="claude-scripted", tools=tools, store=store)
                out: dict[str, Any]
                try:
                    run = await agent.arun(session=spec.session, prompt=spec.prompt)
                    out = {"status": run.status.value, "reason": run.reason, "turns": run.turns}
                except tl.ToolLedgerError as exc:
                    out = {"error": type(exc).__name__, "message": str(exc)}
            Path(result_path).write_text(json.dumps(out))
            os._exit(0)


def _child(spec: MCPSpec, crash_at: str | None, result_path: str) -> None:
    from toolledger import _crash

    _crash.arm(crash_at)
    asyncio.run(_run(spec, result_path))


def run_mcp_agent(
    spec: MCPSpec, *, crash_at: str | None = None, timeout: float = 60
) -> tuple[int, dict[str, Any] | None]:
    """Run the agent in a forked process; its exit code (-9 when killed) and what it returned."""
    import anthropic  # noqa: F401 - imported once here, inherited by every forked child
    import mcp  # noqa: F401

    return run_forked(_child, (spec, crash_at), Path(spec.world), timeout=timeout)
