"""LangGraph: a `ToolNode` whose tool calls go through the toolledger ledger.

`ToolNode(tools, wrap_tool_call=ledgered(...))` — the LangChain tools stay as they are; each
call is looked up in the ledger by its `tool_call["id"]` first, and runs (through `execute`,
so LangGraph's own validation, injection and error handling apply) only if the ledger has no
outcome for it. The effect class of each tool is declared by name. See
docs/recipes/langgraph.md. Runs offline; exits 0 with a note when langgraph is not installed:

    pip install langgraph && python examples/recipe_langgraph.py
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

import toolledger as tl
from toolledger.tools import SchemaTool

try:
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode
    from langgraph.prebuilt.tool_node import ToolCallRequest
except ImportError:
    print("langgraph is not installed: pip install langgraph (skipping this recipe)")
    sys.exit(0)


def ledgered(
    ledger: tl.Ledger, effects: Mapping[str, Mapping[str, Any]], *, approve: Any = None
) -> Callable[[ToolCallRequest, Callable[[ToolCallRequest], Any]], Any]:
    """A `wrap_tool_call` for `ToolNode`: the ledger gate (and approval gate) before `execute`.

    `effects` maps a tool name to its declaration (`effect`, `high_impact`,
    `forwards_idempotency_key`); an undeclared tool is non_idempotent.
    """

    def wrap(request: ToolCallRequest, execute: Callable[[ToolCallRequest], Any]) -> Any:
        call = request.tool_call
        produced: list[Any] = []

        def run(arguments: dict[str, Any]) -> Any:
            message = execute(request)  # LangGraph runs the tool
            produced.append(message)
            if isinstance(message, ToolMessage) and message.status == "error":
                raise RuntimeError(str(message.content))  # recorded failed, answered is_error
            return message.content if isinstance(message, ToolMessage) else str(message)

        declared = SchemaTool(
            run, name=call["name"], input_schema={"type": "object"}, **effects.get(call["name"], {})
        )
        block = {"type": "tool_use", "id": call["id"], "name": call["name"], "input": call["args"]}
        (result,) = tl.run_tool_uses([block], [declared], ledger=ledger, approve=approve)
        if produced and not result.get("is_error"):
            return produced[0]  # ran now: LangGraph's own message
        return ToolMessage(  # answered from the ledger (or refused): nothing ran
            content=result["content"],
            tool_call_id=call["id"],
            name=call["name"],
            status="error" if result.get("is_error") else "success",
        )

    return wrap


tickets: list[str] = []


@tool
def create_ticket(title: str) -> str:
    """Open a support ticket."""
    tickets.append(title)
    return f"T-{len(tickets)}"


@tool
def status_page() -> str:
    """Read the status page."""
    return "checkout: degraded"


def main() -> None:
    store = tl.open_store("memory://langgraph-recipe")
    node = ToolNode(
        [create_ticket, status_page],
        wrap_tool_call=ledgered(
            store.ledger("thread-1"),
            {"create_ticket": {"effect": "non_idempotent"}, "status_page": {"effect": "read_only"}},
        ),
    )
    turn = AIMessage(
        content="",
        tool_calls=[
            {"name": "status_page", "args": {}, "id": "call_1"},
            {"name": "create_ticket", "args": {"title": "Checkout down"}, "id": "call_2"},
        ],
    )
    graph = StateGraph(MessagesState)
    graph.add_node("tools", node)
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    app = graph.compile()
    first = app.invoke({"messages": [turn]})["messages"][1:]
    again = app.invoke({"messages": [turn]})["messages"][1:]  # a resume replays the same turn
    print("first:", [m.content for m in first])
    print("again:", [m.content for m in again])
    print(f"tickets opened: {len(tickets)}")
    store.close()
    if len(tickets) != 1 or [m.content for m in first] != [m.content for m in again]:
        sys.exit("a ticket was opened twice")


if __name__ == "__main__":
    main()
