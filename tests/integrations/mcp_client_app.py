"""A toolledger MCP client for the kill tests: ``python mcp_client_app.py WORLD MODE STORE``.

It starts ``mcp_keyed_server.py WORLD MODE STORE`` over stdio, builds its tools with
``tools_from_session`` (``create_ticket`` declared to forward its idempotency key) and runs one
call — ``create_ticket("checkout is down")``, call ``toolu_1`` of session ``outage-42`` — through
the ledger on ``STORE``, then prints the result and the client's record as JSON. Run again after a
kill, it is the resume: the same call, the same key. ``TOOLLEDGER_CRASH_AT`` makes this process
(not the server, which is not given the variable) ``SIGKILL`` itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters, stdio_client

import toolledger as tl
from toolledger.adapters.mcp import tools_from_session

SERVER = str(Path(__file__).with_name("mcp_keyed_server.py"))
SESSION, CALL_ID = "outage-42", "toolu_1"
CALL = {"type": "tool_use", "id": CALL_ID, "name": "create_ticket", "input": {"title": ""}}


async def main(world: str, mode: str, store_url: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "TOOLLEDGER_CRASH_AT"}
    params = StdioServerParameters(
        command=sys.executable, args=[SERVER, world, mode, store_url], env=env
    )
    call = {**CALL, "input": {"title": "checkout is down"}}
    with open(Path(world) / "server.log", "a") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            tools = await tools_from_session(
                session, overrides={"create_ticket": {"forwards_idempotency_key": True}}
            )
            with tl.open_store(store_url) as store:
                ledger = store.ledger(SESSION)
                (result,) = await tl.arun_tool_uses([call], tools, ledger=ledger)
                record = ledger.get(CALL_ID)
                assert record is not None
                return {
                    "content": result["content"],
                    "is_error": bool(result.get("is_error")),
                    "status": record.status.value,
                    "attempt": record.attempt,
                }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(*sys.argv[1:]))))
