"""toolledger: an effects ledger for LLM agents.

Resume an agent after a crash without doing a side effect twice. Everything public is
re-exported here; modules with a leading underscore, and names not in ``__all__``, are private.
"""

from __future__ import annotations

from . import approvals, keys, notify
from ._lineage import Branch, BranchKind, ForkedEffect
from ._tool_uses import arun_tool_uses, run_tool_uses
from ._verify import Problem, Severity, verify
from ._version import __version__
from .adapters.openai_responses import OpenAIResponses
from .agent._agent import Agent, Run, Usage
from .agent._resume import Resumed, resume_all
from .branches._branching import fork, rewind
from .codec import DEFAULT_MAX_RESULT_BYTES
from .engine._gate import ApprovalRequest, Decision
from .errors import (
    BranchPointError,
    ConfigurationError,
    CorruptLedgerError,
    EffectInProgressError,
    InvalidSessionIdError,
    LateOutcomeError,
    LeaseLostError,
    LedgerMismatchError,
    LedgerWriteError,
    MalformedContentError,
    MCPToolError,
    ModelCallError,
    NotInDoubtError,
    NotPendingError,
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
from .stores import DEFAULT_STORE_URL, Ledger, Store, open_store
from .stores._history import BranchHistory, CallState, Turn, TurnCall
from .tools import SchemaTool, Tool, ToolContext, ToolSet, tool

__all__ = [
    "DEFAULT_MAX_RESULT_BYTES",
    "DEFAULT_STORE_URL",
    "Agent",
    "ApprovalRecord",
    "ApprovalRequest",
    "ApprovalStatus",
    "Branch",
    "BranchHistory",
    "BranchKind",
    "BranchPointError",
    "CallState",
    "ConfigurationError",
    "CorruptLedgerError",
    "Decision",
    "EffectClass",
    "EffectInProgressError",
    "EffectRecord",
    "ForkedEffect",
    "InvalidSessionIdError",
    "LateOutcomeError",
    "LeaseLostError",
    "Ledger",
    "LedgerMismatchError",
    "LedgerWriteError",
    "MCPToolError",
    "MalformedContentError",
    "ModelCallError",
    "NotInDoubtError",
    "NotPendingError",
    "OpenAIResponses",
    "OutcomeUnknown",
    "Problem",
    "Resumed",
    "Run",
    "RunStatus",
    "SchemaTool",
    "SchemaVersionError",
    "SessionBusyError",
    "SessionConflictError",
    "SessionState",
    "Severity",
    "Status",
    "Store",
    "StoreError",
    "StoreUnavailableError",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolLedgerError",
    "ToolSet",
    "Turn",
    "TurnCall",
    "Usage",
    "__version__",
    "approvals",
    "arun_tool_uses",
    "fork",
    "keys",
    "notify",
    "open_store",
    "resume_all",
    "rewind",
    "run_tool_uses",
    "tool",
    "verify",
]

# Every public name says it is toolledger's (``repr``, tracebacks, pickling all find it here),
# not the private module that happens to define it.
for _name in __all__:
    _obj = globals()[_name]
    if callable(_obj) and str(getattr(_obj, "__module__", "")).startswith("toolledger."):
        _obj.__module__ = "toolledger"
del _name, _obj
