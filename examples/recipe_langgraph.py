"""LangGraph: a `ToolNode` whose tool calls go through the toolledger ledger of their thread.

`ledgered_tool_node(tools, store=..., effects={...})` from `toolledger.integrations.langgraph`:
the LangChain tools stay as they are; each call is looked up in the ledger of the run's
`thread_id` by its `tool_call["id"]` first, and runs (through LangGraph's `execute`, so its own
validation, injection and error handling apply) only if the ledger has no outcome for it. One
compiled graph serves every thread. See docs/integrations/langgraph.md. Runs offline; exits 0
with a note when langgraph is not installed:

    pip install 'toolledger[langgraph]' && python examples/recipe_langgraph.py
"""

from __future__ import annotations

import sys
from typing import Any

import toolledger as tl

try:
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, MessagesState, StateGraph

    from toolledger.integrations.langgraph import ledgered_tool_node
except ImportError:
    print("langgraph is not installed: pip install langgraph (skipping this recipe)")
    sys.exit(0)


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
    graph = StateGraph(MessagesState)
    graph.add_node(
        "tools",
        ledgered_tool_node(
            [create_ticket, status_page],
            store=store,
            effects={
                "create_ticket": {"effect": "non_idempotent"},
                "status_page": {"effect": "read_only"},
            },
        ),
    )
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    app = graph.compile(checkpointer=InMemorySaver())  # compiled once, for every thread

    turn = AIMessage(
        content="",
        tool_calls=[
            {"name": "status_page", "args": {}, "id": "call_1"},
            {"name": "create_ticket", "args": {"title": "Checkout down"}, "id": "call_2"},
        ],
    )
    config: Any = {"configurable": {"thread_id": "thread-1"}}
    first = app.invoke({"messages": [turn]}, config)["messages"][1:]
    (before_tools,) = [s for s in app.get_state_history(config) if s.next == ("tools",)]
    again = app.invoke(None, before_tools.config)["messages"][1:]  # the same turn, replayed
    print("first:", [m.content for m in first])
    print("again:", [m.content for m in again])
    print("ledger of thread-1:", [r.tool_use_id for r in store.ledger("thread-1").records()])
    print(f"tickets opened: {len(tickets)}")
    store.close()
    if len(tickets) != 1 or [m.content for m in first] != [m.content for m in again]:
        sys.exit("a ticket was opened twice")


if __name__ == "__main__":
    main()
