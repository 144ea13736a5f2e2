"""OpenAI Agents SDK: function tools through the toolledger ledger of their run.

`ledgered(agent, store=..., effects={...})` from `toolledger.integrations.openai_agents` wraps each
`FunctionTool`: a call is looked up in the ledger of the run's session (`RunConfig.group_id`) by
its `tool_call_id` first, and runs only if the ledger has no outcome for it. A high-impact tool is
approved through the SDK's own human-in-the-loop. See docs/integrations/openai-agents.md. Runs
offline against a scripted Responses API server; exits 0 with a note when openai-agents is not
installed:

    pip install 'toolledger[openai-agents]' && python examples/recipe_openai_agents.py
"""

from __future__ import annotations

import asyncio
import sys

import toolledger as tl
from toolledger.testing.scripted_openai import Reply, ScriptedOpenAI, ToolUse

try:
    from agents import (
        Agent,
        RunConfig,
        Runner,
        RunState,
        function_tool,
        set_default_openai_client,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    from toolledger.integrations.openai_agents import ledgered
except ImportError:
    print("openai-agents is not installed: pip install openai-agents (skipping this recipe)")
    sys.exit(0)

tickets: list[str] = []


@function_tool
def create_ticket(title: str) -> str:
    """Open a support ticket."""
    tickets.append(title)
    return f"T-{len(tickets)}"


async def main() -> None:
    script = [
        Reply(tool_uses=[ToolUse("create_ticket", {"title": "Checkout down"}, id="call_1")]),
        Reply(text="Ticket opened."),
    ]
    with ScriptedOpenAI(script) as model, tl.open_store("memory://openai-agents") as store:
        set_tracing_disabled(True)
        set_default_openai_client(AsyncOpenAI(base_url=model.url, api_key="scripted"))
        agent = ledgered(
            Agent(name="support", model="gpt-scripted", tools=[create_ticket]),
            store=store,
            effects={"create_ticket": {"effect": "non_idempotent", "high_impact": True}},
        )
        config = RunConfig(group_id="conversation-1")  # the session: the same on every resume
        asked = await Runner.run(agent, "Checkout is failing.", run_config=config)
        saved = asked.to_state()
        saved.approve(saved.get_interruptions()[0])  # a person approves the ticket
        kept = saved.to_string()  # what the app keeps while the approved call runs
        first = await Runner.run(agent, saved, run_config=config)
        # A crash after the ticket was opened would resume from the approved state it kept:
        again = await Runner.run(agent, await RunState.from_string(agent, kept), run_config=config)
        (record,) = store.ledger("conversation-1").records()
    print(f"first: {first.final_output!r}, again: {again.final_output!r}")
    print(f"ledger: {record.tool_use_id} {record.status.value}, approved by {record.approved_by}")
    print(f"tickets opened: {len(tickets)}")
    if len(tickets) != 1:
        sys.exit("a ticket was opened twice")


if __name__ == "__main__":
    asyncio.run(main())
