"""toolledger under other agent frameworks: the ledger gate in front of their own tool execution.

* ``toolledger.integrations.langgraph`` — ``LedgerInterceptor`` (``ToolNode``'s
  ``wrap_tool_call`` / ``awrap_tool_call``) and ``ledgered_tool_node``: the ledger of each run is
  the one of its ``thread_id``, so one compiled graph serves every thread.
* ``toolledger.integrations.pydantic_ai`` — ``LedgerToolset``, a ``WrapperToolset`` keyed by
  ``ctx.tool_call_id``; the ledger of each run is the one of its ``conversation_id``.

Each module imports its framework when it is imported (``pip install 'toolledger[langgraph]'`` or
``'toolledger[pydantic-ai]'``); the core of toolledger imports none of them. What every
integration shares — how a tool is declared by name — is ``Declaration``.
"""

from __future__ import annotations

from ._declarations import Declaration

__all__ = ["Declaration"]
