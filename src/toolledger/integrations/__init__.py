"""toolledger under the engines and frameworks its users already run.

* ``toolledger.integrations.langgraph`` — ``LedgerInterceptor`` (``ToolNode``'s
  ``wrap_tool_call`` / ``awrap_tool_call``) and ``ledgered_tool_node``: the ledger of each run is
  the one of its ``thread_id``, so one compiled graph serves every thread.
* ``toolledger.integrations.pydantic_ai`` — ``LedgerToolset``, a ``WrapperToolset`` keyed by
  ``ctx.tool_call_id``; the ledger of each run is the one of its ``conversation_id``.
* ``toolledger.integrations.dbos`` — agent sessions as DBOS workflows on a queue served by a
  fleet of workers (``register``, ``register_queue``, ``enqueue``).
* ``toolledger.integrations.openai_agents`` — ``ledgered(agent)``: each ``FunctionTool``'s
  ``on_invoke_tool`` keyed by ``ToolContext.tool_call_id`` in the ledger of the run's
  ``group_id``; the SDK's approvals recorded.
* ``toolledger.integrations.agent_framework`` — ``LedgerMiddleware``, an innermost function
  middleware keyed by the call id in the ledger of the ``AgentSession``.
* ``toolledger.integrations.mcp_server`` — ``ServerLedger``: an MCP server's tools keyed by the
  idempotency key in ``_meta``, one ledger per authenticated client.

Each module imports its framework when it is imported (``pip install 'toolledger[langgraph]'``,
``'toolledger[pydantic-ai]'``, ``'toolledger[dbos]'``, ``'toolledger[openai-agents]'``,
``'toolledger[agent-framework]'``, ``'toolledger[mcp]'``); the core of toolledger imports none of
them. What the framework integrations share — how a tool is declared by name — is
``Declaration``.
"""

from __future__ import annotations

from ._declarations import Declaration

__all__ = ["Declaration"]
