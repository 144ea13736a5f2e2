"""toolledger: an effects ledger for LLM agents.

Resume an agent after a crash without doing a side effect twice. Everything public is
re-exported here; modules with a leading underscore, and names not in ``__all__``, are private.
"""

from __future__ import annotations

from . import approvals, keys
from .agent import Agent, Run, Usage
from .approvals import ApprovalRequest, Decision
from .codec import DEFAULT_MAX_RESULT_BYTES
from .errors import (
    ConfigurationError,
    CorruptLedgerError,
    EffectInProgressError,
    InvalidSessionIdError,
    LateOutcomeError,
    LeaseLostError,
    LedgerMismatchError,
    LedgerWriteError,
    MalformedContentError,
    ModelCallError,
    OutcomeUnknown,
    SchemaVersionError,
    SessionBusyError,
    SessionConflictError,
    StoreError,
    StoreUnavailableError,
    ToolLedgerError,
)
from .records import (
    ApprovalRecord,
    ApprovalStatus,
    EffectClass,
    EffectRecord,
    RunStatus,
    SessionState,
    Status,
    ToolCall,
)
from .resume import Resumed, resume_all
from .runner import arun_tool_uses, run_tool_uses
from .stores import DEFAULT_STORE_URL, Ledger, Store, open_store
from .tools import Tool, ToolContext, ToolSet, tool

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MAX_RESULT_BYTES",
    "DEFAULT_STORE_URL",
    "Agent",
    "ApprovalRecord",
    "ApprovalRequest",
    "ApprovalStatus",
    "ConfigurationError",
    "CorruptLedgerError",
    "Decision",
    "EffectClass",
    "EffectInProgressError",
    "EffectRecord",
    "InvalidSessionIdError",
    "LateOutcomeError",
    "LeaseLostError",
    "Ledger",
    "LedgerMismatchError",
    "LedgerWriteError",
    "MalformedContentError",
    "ModelCallError",
    "OutcomeUnknown",
    "Resumed",
    "Run",
    "RunStatus",
    "SchemaVersionError",
    "SessionBusyError",
    "SessionConflictError",
    "SessionState",
    "Status",
    "Store",
    "StoreError",
    "StoreUnavailableError",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolLedgerError",
    "ToolSet",
    "Usage",
    "__version__",
    "approvals",
    "arun_tool_uses",
    "keys",
    "open_store",
    "resume_all",
    "run_tool_uses",
    "tool",
]
