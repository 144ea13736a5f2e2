"""Pydantic AI: a toolset whose calls go through the toolledger ledger.

`LedgerToolset(wrapped, ledger=..., effects={...})` is a `WrapperToolset`: every call is looked
up in the ledger by `ctx.tool_call_id` first and reaches the wrapped toolset only if the ledger
has no outcome for it. Pydantic AI validates the arguments before `call_tool`, as usual. See
docs/recipes/pydantic-ai.md. Runs offline with `FunctionModel`; exits 0 with a note when
pydantic-ai is not installed:

    pip install pydantic-ai-slim && python examples/recipe_pydantic_ai.py
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import toolledger as tl
from toolledger.tools import SchemaTool

try:
    from pydantic_ai import Agent, ModelRetry, RunContext
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.toolsets import FunctionToolset, WrapperToolset
except ImportError:
    print("pydantic-ai is not installed: pip install pydantic-ai-slim (skipping this recipe)")
    sys.exit(0)


@dataclass
class LedgerToolset(WrapperToolset[Any]):
    """The ledger gate (and approval gate) in front of another toolset's tools."""

    ledger: tl.Ledger | None = None
    effects: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    approve: Any = None

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: Any
    ) -> Any:
        assert self.ledger is not None and ctx.tool_call_id is not None

        async def run(arguments: dict[str, Any]) -> Any:
            return await self.wrapped.call_tool(name, arguments, ctx, tool)

        declared = SchemaTool(
            run, name=name, input_schema={"type": "object"}, **self.effects.get(name, {})
        )
        block = {"type": "tool_use", "id": ctx.tool_call_id, "name": name, "input": tool_args}
        (result,) = await tl.arun_tool_uses(
            [block], [declared], ledger=self.ledger, approve=self.approve
        )
        if result.get("is_error"):
            raise ModelRetry(str(result["content"]))
        return result["content"]  # the JSON the ledger recorded (a replay returns the same)


tickets: list[str] = []
tools = FunctionToolset[Any]()


@tools.tool_plain
def create_ticket(title: str) -> dict[str, str]:
    """Open a support ticket."""
    tickets.append(title)
    return {"ticket": f"T-{len(tickets)}"}


def scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The model: one call (with a fixed id, as a resumed transcript has), then an answer."""
    if len(messages) == 1:
        return ModelResponse(
            parts=[ToolCallPart("create_ticket", {"title": "Checkout down"}, "call_1")]
        )
    return ModelResponse(parts=[TextPart("Ticket opened.")])


async def main() -> None:
    with tl.open_store("memory://pydantic-ai-recipe") as store:
        ledgered = LedgerToolset(
            tools, ledger=store.ledger("conversation-1"), effects={"create_ticket": {}}
        )
        agent = Agent(FunctionModel(scripted), toolsets=[ledgered])
        first = await agent.run("Checkout is failing.")
        again = await agent.run("Checkout is failing.")  # the same call id again: a replay
    print(f"first: {first.output!r}, again: {again.output!r}, tickets opened: {len(tickets)}")
    if len(tickets) != 1:
        sys.exit("a ticket was opened twice")


if __name__ == "__main__":
    asyncio.run(main())
