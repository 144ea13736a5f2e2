"""Microsoft Agent Framework: a function middleware that runs each call through the ledger.

`LedgerMiddleware(store, effects={...})` from `toolledger.integrations.agent_framework`, innermost
in `Agent(middleware=[...])`: a call is looked up in the ledger of the run's session by its call
id, and answered from it without calling the tool when the ledger has its outcome. Here a person
approves the ticket, and the approval is sent again (as an app that crashed after the tool ran
would): one ticket. See docs/integrations/agent-framework.md. Runs offline against a scripted
Chat Completions server; exits 0 with a note when agent-framework is not installed:

    pip install 'toolledger[agent-framework]' agent-framework-openai
    python examples/recipe_agent_framework.py
"""

from __future__ import annotations

import asyncio
import json
import sys

import toolledger as tl
from toolledger.testing.scripted_openai import Reply, ScriptedOpenAI, ToolUse

try:
    from agent_framework import Agent, AgentSession, Content, Message, tool
    from agent_framework_openai import OpenAIChatCompletionClient

    from toolledger.integrations.agent_framework import LedgerMiddleware
except ImportError:
    print("agent-framework is not installed: pip install agent-framework (skipping this recipe)")
    sys.exit(0)

tickets: list[str] = []


@tool(approval_mode="always_require")
def create_ticket(title: str) -> str:
    """Open a support ticket."""
    tickets.append(title)
    return f"T-{len(tickets)}"


async def main() -> None:
    script = [
        Reply(tool_uses=[ToolUse("create_ticket", {"title": "Checkout down"}, id="call_1")]),
        Reply(text="Ticket opened."),
    ]
    with ScriptedOpenAI(script) as model, tl.open_store("memory://agent-framework") as store:
        client = OpenAIChatCompletionClient(model="gpt-scripted", base_url=model.url, api_key="k")
        ledger = LedgerMiddleware(
            store, effects={"create_ticket": {"effect": "non_idempotent", "high_impact": True}}
        )
        agent = Agent(client=client, tools=[create_ticket], middleware=[ledger])
        session = AgentSession(session_id="conversation-1")
        asked = await agent.run("Checkout is failing.", session=session)
        kept = json.dumps(session.to_dict())  # the app keeps the session and the request
        (request,) = asked.user_input_requests
        answers = []
        for _ in range(2):  # the approval, then the same approval re-sent after a "crash"
            again = AgentSession.from_dict(json.loads(kept))
            approval = Content.from_dict(request.to_dict()).to_function_approval_response(
                approved=True
            )
            reply = await agent.run(Message(role="user", contents=[approval]), session=again)
            answers.append(reply.text)
        (record,) = store.ledger("conversation-1").records()
    print(f"answers: {answers}")
    print(f"ledger: {record.tool_use_id} {record.status.value}, approved by {record.approved_by}")
    print(f"tickets opened: {len(tickets)}")
    if len(tickets) != 1:
        sys.exit("a ticket was opened twice")


if __name__ == "__main__":
    asyncio.run(main())
