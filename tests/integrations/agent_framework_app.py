"""A Microsoft Agent Framework agent for the kill test: ``refund`` (``approval_mode=
"always_require"``) adds a line to ``DIR/refunds.txt``; the model is ``ScriptedOpenAI`` (Chat
Completions) at ``MODEL_URL``, asking for ``refund`` under call id ``call_R1``, then answering.

``python agent_framework_app.py MODEL_URL DIR STORE_URL MODE PHASE``; ``MODE`` is ``plain`` or
``ledgered`` (``LedgerMiddleware``); ``PHASE``:

* ``ask`` — run until the approval request; save the session and the request to ``DIR``;
* ``approve`` — send the approval with the saved session (``approve-kill``: the refund ``SIGKILL``s
  its process right after its effect; ``TOOLLEDGER_CRASH_AT`` kills at toolledger's points); run
  again after a crash, it is the app re-sending the approval it saved.

Prints what the run answered as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from agent_framework import Agent, AgentSession, Content, Message, tool
from agent_framework_openai import OpenAIChatCompletionClient

import toolledger as tl
from toolledger.integrations.agent_framework import LedgerMiddleware

SESSION, CALL_ID = "ticket-9", "call_R1"


async def main(url: str, where: str, store_url: str, mode: str, phase: str) -> dict[str, Any]:
    world = Path(where)

    @tool(approval_mode="always_require")
    def refund(order: str, cents: int) -> str:
        """Refund an order."""
        with (world / "refunds.txt").open("a") as f:
            f.write(f"{order} {cents}\n")
        if phase.endswith("kill"):
            os.kill(os.getpid(), signal.SIGKILL)
        return f"refunded {cents} cents on {order}"

    client = OpenAIChatCompletionClient(model="gpt-scripted", base_url=url, api_key="scripted")
    with tl.open_store(store_url) as store:
        effects = {"refund": {"effect": "non_idempotent", "high_impact": True}}
        middleware = [LedgerMiddleware(store, effects=effects)] if mode == "ledgered" else []
        agent = Agent(client=client, tools=[refund], middleware=middleware)
        if phase == "ask":
            session = AgentSession(session_id=SESSION)
            response = await agent.run("Refund order A-7, 500 cents.", session=session)
            (request,) = response.user_input_requests
            (world / "session.json").write_text(json.dumps(session.to_dict()))
            (world / "request.json").write_text(json.dumps(request.to_dict()))
            return {"requests": [request.type]}
        session = AgentSession.from_dict(json.loads((world / "session.json").read_text()))
        request = Content.from_dict(json.loads((world / "request.json").read_text()))
        approval = request.to_function_approval_response(approved=True)
        response = await agent.run(Message(role="user", contents=[approval]), session=session)
        results = [
            c.result for m in response.messages for c in m.contents if c.type == "function_result"
        ]
        return {"text": response.text, "results": [str(r) for r in results]}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(*sys.argv[1:]))))
