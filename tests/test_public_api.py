"""The public surface is pinned: adding a name is a decision, removing one is a breaking change."""

from __future__ import annotations

import toolledger as tl

EXPECTED = {
    "Agent",
    "ApprovalRecord",
    "ApprovalStatus",
    "ModelCallError",
    "Run",
    "RunStatus",
    "SessionConflictError",
    "SessionBusyError",
    "LateOutcomeError",
    "LeaseLostError",
    "Resumed",
    "resume_all",
    "SessionState",
    "Usage",
    "ApprovalRequest",
    "ConfigurationError",
    "CorruptLedgerError",
    "DEFAULT_MAX_RESULT_BYTES",
    "DEFAULT_STORE_URL",
    "Decision",
    "Branch",
    "BranchHistory",
    "BranchKind",
    "BranchPointError",
    "CallState",
    "ForkedEffect",
    "EffectClass",
    "EffectInProgressError",
    "EffectRecord",
    "InvalidSessionIdError",
    "Ledger",
    "LedgerMismatchError",
    "LedgerWriteError",
    "MalformedContentError",
    "OutcomeUnknown",
    "SchemaVersionError",
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
    "fork",
    "rewind",
    "__version__",
    "approvals",
    "arun_tool_uses",
    "keys",
    "notify",
    "open_store",
    "run_tool_uses",
    "tool",
    "MCPToolError",
    "OpenAIResponses",
    "Problem",
    "SchemaTool",
    "Severity",
    "verify",
    "NotInDoubtError",
    "NotPendingError",
}


def test_all_is_pinned_and_sorted() -> None:
    assert set(tl.__all__) == EXPECTED
    # isort-style, as ruff's RUF022 keeps it: CONSTANTS, then Classes, then functions.
    assert tl.__all__ == sorted(
        tl.__all__, key=lambda n: (0 if n.isupper() else 1 if n[0].isupper() else 2, n)
    )
    for name in tl.__all__:
        assert hasattr(tl, name), name


def test_every_public_name_is_at_home_in_toolledger() -> None:
    """``repr``, tracebacks and pickling show ``toolledger.Store``, not the private module
    that defines it — and find it there."""
    import pickle

    for name in tl.__all__:
        obj = getattr(tl, name)
        if isinstance(obj, type) or (callable(obj) and not isinstance(obj, type(tl))):
            assert obj.__module__ == "toolledger", name
    assert "toolledger.Store" in repr(tl.Store)
    error = pickle.loads(pickle.dumps(tl.StoreError("gone", url="memory://x")))
    assert type(error) is tl.StoreError and error.url == "memory://x"


def test_every_error_is_a_toolledger_error_and_the_builtin_it_means() -> None:
    assert issubclass(tl.CorruptLedgerError, tl.StoreError)
    assert issubclass(tl.StoreError, OSError)
    assert issubclass(tl.LedgerMismatchError, ValueError)
    assert issubclass(tl.ConfigurationError, ValueError)
    for name in tl.__all__:
        obj = getattr(tl, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, tl.ToolLedgerError), name


def test_importing_toolledger_loads_no_terminal_code() -> None:
    """The core takes an approver callable; the terminal prompt (``toolledger.approvals``) loads
    rich only when a person is asked, and nothing loads the CLI. A library user pays for neither."""
    import subprocess
    import sys

    probe = (
        "import sys, toolledger as tl; "
        "assert callable(tl.approvals.terminal); "
        "print(sorted(m for m in sys.modules "
        "if m.split('.')[0] == 'rich' or m.startswith('toolledger.cli')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_terminal_approver_declines_when_no_terminal_can_answer() -> None:
    import subprocess
    import sys

    probe = (
        "import toolledger as tl; "
        "d = tl.approvals.terminal(tl.ApprovalRequest(session_id='s', tool_use_id='t1', "
        "tool='send_email', input={'to': 'a@b.c'}, in_doubt=True, reason='high impact')); "
        "print(d.approved, d.by)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False terminal: no terminal to ask on"
    assert "IN DOUBT" in done.stderr and "send_email" in done.stderr


# -- the public modules: everything else is internal, whatever its name ------------------------
#
# The package's own name and these modules are the API (docs/architecture.md lists them). Every
# other module — underscored or not (``toolledger.records``, ``toolledger.cli.render``, the
# engine) — is internal and may change in any release.

PUBLIC_MODULES = {
    "toolledger.adapters": {
        "MAX_ID_CHARS",
        "MessageParts",
        "ModelTurn",
        "Provider",
        "ResultShape",
        "check_call_id",
        "provider_for",
        "read_calls",
        "read_or_text",
        "transcript_reader",
    },
    "toolledger.approvals": {
        "ApprovalQueue",
        "ApprovalRequest",
        "Approver",
        "Decision",
        "PENDING",
        "decide",
        "pending",
        "queue",
        "terminal",
    },
    "toolledger.integrations.agent_framework": {
        "FRAMEWORK_APPROVAL",
        "LedgerMiddleware",
        "session_id",
        "tool_context",
    },
    "toolledger.integrations.dbos": {
        "DEFAULT_AGENT",
        "QUEUE",
        "SessionOutcome",
        "SessionQueuedError",
        "SessionWorkflowError",
        "WORKFLOW",
        "enqueue",
        "register",
        "register_queue",
    },
    "toolledger.integrations.langgraph": {
        "LedgerInterceptor",
        "langchain_tool",
        "ledgered_tool_node",
        "thread_id",
        "tool_context",
    },
    "toolledger.integrations.mcp_server": {
        "OUTCOME_UNKNOWN_CODE",
        "ServerLedger",
        "authenticated_principal",
    },
    "toolledger.integrations.openai_agents": {
        "group_id",
        "ledgered",
        "settle_interruptions",
        "tool_context",
    },
    "toolledger.integrations.pydantic_ai": {
        "LedgerToolset",
        "conversation",
        "tool_context",
    },
    "toolledger.keys": {
        "IDEMPOTENCY_HEADER",
        "IdempotencyKeyAuth",
        "ahttpx_event_hook",
        "current_key",
        "forwarding",
        "httpx_event_hook",
        "idempotency_headers",
        "message_id",
    },
    "toolledger.notify": {
        "Notifier",
        "notifier",
        "verify_signature",
    },
    "toolledger.stores": {
        "DEFAULT_STORE_URL",
        "Ledger",
        "Store",
        "open_store",
    },
    "toolledger.stores.contract": {
        "AsyncBackend",
        "Backend",
        "GroupCommit",
        "InlineAsync",
        "Inspectable",
        "OP_BUDGET",
        "Pending",
        "op_deadline",
        "operations_within",
    },
    "toolledger.testing": {
        "AgentSpec",
        "CRASH_POINTS",
        "Counter",
        "Flaky",
        "Reply",
        "ScriptedModel",
        "ToolUse",
        "World",
        "arm_crash",
        "elsewhere",
        "run_agent",
    },
    "toolledger.testing.conformance": {
        "StoreConformance",
        "make_approval",
        "make_message",
        "make_record",
        "make_state",
    },
    "toolledger.testing.scripted": {
        "Flaky",
        "Reply",
        "ScriptedModel",
        "Step",
        "ToolUse",
        "pairing_errors",
    },
    "toolledger.testing.scripted_openai": {
        "Flaky",
        "RawArguments",
        "Reply",
        "ScriptedOpenAI",
        "ToolUse",
    },
}


def test_the_public_modules_are_pinned() -> None:
    import importlib

    for name, expected in PUBLIC_MODULES.items():
        module = importlib.import_module(name)
        assert set(module.__all__) == expected, name
        for attr in module.__all__:
            assert hasattr(module, attr), f"{name}.{attr}"


def test_the_architecture_page_lists_the_public_modules() -> None:
    from pathlib import Path

    page = (Path(__file__).parents[1] / "docs" / "architecture.md").read_text()
    for name in PUBLIC_MODULES:
        assert f"`{name}`" in page, name


def test_the_harness_is_not_public() -> None:
    """The tortures and the simulation are the project's proving ground, not an API."""
    from toolledger import testing

    for gone in ("run_torture", "run_concurrent_torture", "TortureReport", "ConcurrentReport"):
        assert not hasattr(testing, gone), gone
