"""Microsoft Agent Framework: a function middleware that runs each tool call through the toolledger
ledger of its session.

```python
from agent_framework import Agent, AgentSession
from toolledger.integrations.agent_framework import LedgerMiddleware

store = tl.open_store("sqlite:///agent.db")
ledger = LedgerMiddleware(store, effects={"refund": {"effect": "non_idempotent"}})
agent = Agent(client=client, tools=[refund], middleware=[..., ledger])   # innermost: last
session = AgentSession(session_id="ticket-9")
response = await agent.run("refund order A-7", session=session)
```

The key: a call is ``(session, call id)`` = ``(context.session.session_id,
context.metadata["call_id"])``; ``session=`` names the session another way (a string, or a
function of the ``FunctionInvocationContext``). A run without a session is refused.

A call the ledger finished is answered from it — ``context.result`` is set and the tool is not
called; otherwise it runs (``call_next()``) under toolledger's rules: the intent before a
non-idempotent tool, an in-doubt call never re-run silently. A tool's exception is recorded
``failed``; an error result (failed, in doubt, declined) is answered to the model as toolledger's
text. ``LedgerMismatchError`` and ``EffectInProgressError`` abort the run as ``MiddlewareFailure``
(fail closed: the framework would turn an ordinary exception into a tool result).

Approvals: a tool with ``approval_mode="always_require"`` is approved by a person through the
framework (``to_function_approval_response(approved=True)``); when that approved call runs, the
approval is recorded as the call's, bound to its input. An approval never covers the re-run of a
call in doubt: that goes to ``approve=``, and without one the call stays in doubt for ``toolledger
resolve`` — so re-sending a saved approval after a crash does not refund twice. A tool declared
``high_impact`` that the framework did not have approved goes to ``approve=`` (declined without).

Keep the middleware innermost (last in ``middleware=``), so it keys the arguments as they reach the
tool. Limits: the answer is the recorded text (a tool's non-text content is recorded as its JSON);
a workflow resumed from a checkpoint taken before the agent's turn asks the model again — new call
ids, new calls.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextvars import ContextVar
from typing import Any

try:
    from agent_framework import FunctionInvocationContext, FunctionMiddleware, MiddlewareFailure
except ImportError as exc:  # pragma: no cover - the extra is installed wherever this is tested
    raise ImportError(
        f"toolledger.integrations.agent_framework needs Agent Framework: "
        f"pip install 'toolledger[agent-framework]' ({exc})"
    ) from exc

from .. import keys
from .._tool_uses import arun_tool_uses
from ..approvals._notify import Notifier, Target
from ..engine._drivers import AlertHook
from ..engine._gate import ApprovalRequest, Decision
from ..errors import ConfigurationError, EffectInProgressError, LedgerMismatchError
from ..stores import Ledger, Store
from ..tools import Tool, ToolContext
from ._approvals import ask
from ._declarations import Declaration, checked_declarations, one_call_tool

__all__ = ["FRAMEWORK_APPROVAL", "LedgerMiddleware", "session_id", "tool_context"]

SessionOf = Callable[[FunctionInvocationContext], str]

FRAMEWORK_APPROVAL = "agent-framework approval"
"""Who approved a call the framework's ``approval_mode`` had approved (``approved_by``)."""

_context: ContextVar[ToolContext | None] = ContextVar("toolledger_agent_framework", default=None)


def tool_context() -> ToolContext | None:
    """The ``ToolContext`` of the ledgered call running in this context, or ``None``."""
    return _context.get()


def session_id(context: FunctionInvocationContext) -> str:
    """The session of a call: ``context.session.session_id``. Raises ``ConfigurationError``
    when the run has no session."""
    found = getattr(context.session, "session_id", None)
    if not found:
        raise ConfigurationError(
            "a ledgered agent needs the run's session: call agent.run(..., "
            'session=AgentSession(session_id="...")) — the same one on every resume — or pass '
            "LedgerMiddleware(session=...)"
        )
    return str(found)


class LedgerMiddleware(FunctionMiddleware):
    """The ledger gate (and approval gate) around each function call of an agent.

    ``effects`` declares tools by name (``Declaration``); an undeclared tool is
    ``non_idempotent``. ``approve`` answers what the framework's approval does not cover (a call
    in doubt; a high-impact call it did not ask about). ``on_alert``, ``on_in_doubt`` and ``wait``
    are those of ``tl.arun_tool_uses``. Raises ``ConfigurationError`` at construction for a bad
    declaration.
    """

    def __init__(
        self,
        store: Store,
        *,
        effects: Mapping[str, Declaration] | Iterable[Tool[..., Any]] | None = None,
        approve: Any = None,
        session: str | SessionOf | None = None,
        on_alert: AlertHook | None = None,
        on_in_doubt: Notifier | Target | None = None,
        wait: float = 0.0,
    ) -> None:
        self.store = store
        self.declarations = checked_declarations(effects)
        self.approve = approve
        self.session = session
        self.on_alert = on_alert
        self.on_in_doubt = on_in_doubt
        self.wait = wait

    def ledger_for(self, context: FunctionInvocationContext) -> Ledger:
        """The ledger of the session ``context`` belongs to."""
        if self.session is None:
            return self.store.ledger(session_id(context))
        if isinstance(self.session, str):
            return self.store.ledger(self.session)
        return self.store.ledger(self.session(context))

    async def process(
        self, context: FunctionInvocationContext, call_next: Callable[[], Awaitable[None]]
    ) -> None:
        name = context.function.name
        call_id = context.metadata.get("call_id")
        try:
            if not call_id:
                raise ConfigurationError(
                    f"tool call {name!r} has no call id: the ledger keys every call by its id"
                )
            ledger = self.ledger_for(context)
        except ConfigurationError as exc:
            raise MiddlewareFailure(str(exc)) from exc
        produced: list[Any] = []

        async def run(arguments: dict[str, Any], call: ToolContext) -> Any:
            token = _context.set(call)
            try:
                with keys.forwarding(call):
                    await call_next()
            finally:
                _context.reset(token)
            produced.append(context.result)
            return _recorded(context.result)

        block = {"type": "tool_use", "id": str(call_id), "name": name}
        try:
            (result,) = await arun_tool_uses(
                [{**block, "input": _arguments(context.arguments)}],
                [one_call_tool(name, run, self.declarations.get(name))],
                ledger=ledger,
                approve=self._bridge(context),
                on_alert=self.on_alert,
                on_in_doubt=self.on_in_doubt,
                wait=self.wait,
            )
        except (LedgerMismatchError, EffectInProgressError) as exc:
            raise MiddlewareFailure(str(exc)) from exc
        if produced and not result.get("is_error"):
            return  # ran now: the framework's own result stays
        context.result = result["content"]  # the ledger's answer, or toolledger's error text

    def _bridge(
        self, context: FunctionInvocationContext
    ) -> Callable[[ApprovalRequest], Awaitable[Any]]:
        async def bridge(request: ApprovalRequest) -> Any:
            """The framework's approval for a first run; ``approve=`` for everything else."""
            response = context.metadata.get("approval_response")
            if not request.in_doubt and getattr(response, "approved", False) is True:
                return Decision(approved=True, by=FRAMEWORK_APPROVAL)
            if self.approve is None:
                return Decision(approved=False, by="no approver for what the framework did not ask")
            return await ask(self.approve, request)

        return bridge


def _arguments(arguments: Any) -> dict[str, Any]:
    """The call's arguments as a JSON object (a pydantic model dumped)."""
    dump = getattr(arguments, "model_dump", None)
    if callable(dump):
        dumped: dict[str, Any] = dump(mode="json")
        return dumped
    return dict(arguments or {})


def _recorded(result: Any) -> Any:
    """What the ledger records for the framework's result: its text when it is all text, else
    its content items as JSON."""
    if isinstance(result, str) or result is None:
        return result or ""
    items = list(result) if isinstance(result, list) else [result]
    if all(getattr(c, "type", None) == "text" for c in items):
        return "".join(str(getattr(c, "text", "") or "") for c in items)
    return [c.to_dict() if hasattr(c, "to_dict") else str(c) for c in items]
