"""Pydantic AI: a toolset whose calls go through the toolledger ledger of their conversation.

`LedgerToolset(wrapped, store=..., effects={...})` from `toolledger.integrations.pydantic_ai` is
a `WrapperToolset`: every call is looked up in the ledger of the run's `conversation_id` by
`ctx.tool_call_id` first, and reaches the wrapped toolset only if the ledger has no outcome for
it. Pydantic AI validates the arguments before `call_tool`, as usual; one `Agent` serves every
conversation. See docs/integrations/pydantic-ai.md. Runs offline with `FunctionModel`; exits 0
with a note when pydantic-ai is not installed:

    pip install 'toolledger[pydantic-ai]' && python examples/recipe_pydantic_ai.py
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import toolledger as tl

try:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.toolsets import FunctionToolset

    from toolledger.integrations.pydantic_ai import LedgerToolset
except ImportError:
    print("pydantic-ai is not installed: pip install pydantic-ai-slim (skipping this recipe)")
    sys.exit(0)


tickets: list[str] = []
tools = FunctionToolset[Any]()


@tools.tool_plain
def create_ticket(title: str) -> dict[str, str]:
    """Open a support ticket."""
    tickets.append(title)
    return {"ticket": f"T-{len(tickets)}"}


def scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The model: one call, then an answer."""
    if len(messages) == 1:
        return ModelResponse(
            parts=[ToolCallPart("create_ticket", {"title": "Checkout down"}, "call_1")]
        )
    return ModelResponse(parts=[TextPart("Ticket opened.")])


async def main() -> None:
    with tl.open_store("memory://pydantic-ai-recipe") as store:
        ledgered = LedgerToolset(
            tools, store=store, effects={"create_ticket": {"effect": "non_idempotent"}}
        )
        agent = Agent(FunctionModel(scripted), toolsets=[ledgered])  # one agent, every conversation
        first = await agent.run("Checkout is failing.", conversation_id="conversation-1")
        # A resume: the saved messages up to the model's call, so the same call id again.
        again = await agent.run(message_history=first.all_messages()[:2])
        recorded = [r.tool_use_id for r in store.ledger("conversation-1").records()]
    print(f"first: {first.output!r}, again: {again.output!r}, ledger: {recorded}")
    print(f"tickets opened: {len(tickets)}")
    if len(tickets) != 1:
        sys.exit("a ticket was opened twice")


if __name__ == "__main__":
    asyncio.run(main())
