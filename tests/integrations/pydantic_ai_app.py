"""A Pydantic AI agent for the integration tests: a scripted ``FunctionModel``, a ledgered
toolset, and a tool whose effect is a line appended to a "world" file.

Run as a script it is the process a test kills: ``python pydantic_ai_app.py STORE_URL HISTORY
WORLD start|resume``. ``start`` runs conversation ``outage-42`` and saves its messages to the
file HISTORY the moment the model's response (with its tool call) is in them — before any tool
runs; ``resume`` runs again from HISTORY. Either prints the final output and the messages as
JSON; ``TOOLLEDGER_CRASH_AT`` makes it ``SIGKILL`` itself at a named point.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.toolsets import FunctionToolset

import toolledger as tl
from toolledger.integrations.pydantic_ai import LedgerToolset

CONVERSATION = "outage-42"
CALL_ID = "call_1"  # a scripted model may reuse an id across conversations


def scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Asks for ``append_line`` (call id ``call_1``) with the user's text, then, once the tool
    answered, says what it answered."""
    last = messages[-1]
    returns = [p for p in last.parts if isinstance(p, ToolReturnPart)]
    if returns:
        return ModelResponse(parts=[TextPart(f"done: {returns[0].content}")])
    prompts = [p for m in messages for p in m.parts if isinstance(p, UserPromptPart)]
    text = str(prompts[-1].content)
    return ModelResponse(parts=[ToolCallPart("append_line", {"text": text}, CALL_ID)])


def world_toolset(world: Path, executions: list[str] | None = None) -> FunctionToolset[Any]:
    tools = FunctionToolset[Any]()

    @tools.tool_plain
    def append_line(text: str) -> str:
        """Append a line to the world."""
        with world.open("a") as f:
            f.write(text + "\n")
        if executions is not None:
            executions.append(text)
        return f"line {len(world.read_text().splitlines())}"

    return tools


def build(store: tl.Store, world: Path, executions: list[str] | None = None) -> Agent[None, str]:
    """One agent for every conversation: the ledger of each run is its conversation's."""
    ledgered = LedgerToolset(
        world_toolset(world, executions),
        store=store,
        effects={"append_line": {"effect": "non_idempotent"}},
    )
    return Agent(FunctionModel(scripted), toolsets=[ledgered])


async def start(agent: Agent[None, str], history: Path) -> tuple[str, list[ModelMessage]]:
    async with agent.iter("checkout is down", conversation_id=CONVERSATION) as run:
        async for node in run:
            if Agent.is_call_tools_node(node) and node.model_response.tool_calls:
                # The model's response is in the messages; no tool has run yet.
                history.write_bytes(ModelMessagesTypeAdapter.dump_json(run.all_messages()))
    assert run.result is not None
    return run.result.output, run.result.all_messages()


async def resume(agent: Agent[None, str], history: Path) -> tuple[str, list[ModelMessage]]:
    saved = ModelMessagesTypeAdapter.validate_json(history.read_bytes())
    result = await agent.run(message_history=saved)
    return result.output, result.all_messages()


def described(messages: list[ModelMessage]) -> list[dict[str, Any]]:
    return [
        {"kind": part.part_kind, "id": getattr(part, "tool_call_id", None)}
        for message in messages
        for part in message.parts
    ]


def main(store_url: str, history: str, world: str, phase: str) -> None:
    with tl.open_store(store_url) as store:
        agent = build(store, Path(world))
        step = start if phase == "start" else resume
        output, messages = asyncio.run(step(agent, Path(history)))
    returns = [p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    print(json.dumps({"output": output, "returns": returns, "parts": described(messages)}))


if __name__ == "__main__":
    main(*sys.argv[1:])
