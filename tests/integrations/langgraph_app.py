"""A LangGraph agent for the integration tests: a scripted chat model, a ledgered ToolNode, and a
tool whose effect is a line appended to a "world" file.

Run as a script it is the process a test kills: ``python langgraph_app.py STORE_URL CHECKPOINTS
WORLD start|resume`` runs (or resumes) thread ``outage-42`` with a ``SqliteSaver`` on the file
CHECKPOINTS and prints the thread's messages as JSON; ``TOOLLEDGER_CRASH_AT`` makes it
``SIGKILL`` itself at a named point.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph

import toolledger as tl
from toolledger.integrations.langgraph import ledgered_tool_node

THREAD = "outage-42"
CALL_ID = "call_1"  # a scripted model may reuse an id across threads; the ledger must not mix them


class ScriptedChat(BaseChatModel):
    """Asks for ``append_line`` (call id ``call_1``) with the user's text, then, once the tool
    answered, says what it answered. No network: the script is the conversation itself."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        last = messages[-1]
        if isinstance(last, ToolMessage):
            reply = AIMessage(content=f"done: {last.content}")
        else:
            text = str(last.content)
            reply = AIMessage(
                content="",
                tool_calls=[{"name": "append_line", "args": {"text": text}, "id": CALL_ID}],
            )
        return ChatResult(generations=[ChatGeneration(message=reply)])


def world_tool(world: Path, executions: list[str] | None = None) -> BaseTool:
    """``append_line``: appends ``text`` to ``world`` (the effect), answers ``line <n>``."""

    @tool
    def append_line(text: str) -> str:
        """Append a line to the world."""
        with world.open("a") as f:
            f.write(text + "\n")
        if executions is not None:
            executions.append(text)
        return f"line {len(world.read_text().splitlines())}"

    return append_line


def build(
    store: tl.Store,
    world: Path,
    checkpointer: BaseCheckpointSaver[Any] | None,
    executions: list[str] | None = None,
    extra_tools: Sequence[BaseTool] = (),
    **ledger: Any,
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """model → tools → model → end, the ToolNode ledgered in ``store`` per thread (``ledger``:
    ``ledgered_tool_node``'s other options; ``append_line`` non-idempotent unless ``effects``
    says otherwise)."""
    model = ScriptedChat()

    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node(
        "tools",
        ledgered_tool_node(
            [world_tool(world, executions), *extra_tools],
            store=store,
            **{"effects": {"append_line": {"effect": "non_idempotent"}}, **ledger},
        ),
    )
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tools", END])
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=checkpointer)


def described(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    return [
        {
            "type": m.type,
            "content": m.content,
            "status": getattr(m, "status", None),
            "tool_call_id": getattr(m, "tool_call_id", None),
        }
        for m in messages
    ]


def main(store_url: str, checkpoints: str, world: str, phase: str) -> None:
    from langgraph.checkpoint.sqlite import SqliteSaver

    config: Any = {"configurable": {"thread_id": THREAD}}
    with tl.open_store(store_url) as store, SqliteSaver.from_conn_string(checkpoints) as saver:
        app = build(store, Path(world), saver)
        inputs = {"messages": [("user", "checkout is down")]} if phase == "start" else None
        # "sync": the model's message (with its tool calls) is durable before a tool runs. With
        # LangGraph's default ("async") a kill may lose it, and the resume asks the model again.
        out = app.invoke(inputs, config, durability="sync")
    print(json.dumps(described(out["messages"])))


if __name__ == "__main__":
    main(*sys.argv[1:])
