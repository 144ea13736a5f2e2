"""LangGraph: a ``ToolNode`` whose tool calls go through the toolledger ledger of their thread.

```python
from toolledger.integrations.langgraph import ledgered_tool_node

store = tl.open_store("sqlite:///agent.db")
tools = ledgered_tool_node(
    [create_ticket, status_page],                   # LangChain tools, unchanged
    store=store,
    effects={"create_ticket": {"effect": "non_idempotent"},
             "status_page": {"effect": "read_only"}},
)
graph.add_node("tools", tools)                      # compiled once, with a checkpointer
app.invoke(inputs, {"configurable": {"thread_id": "outage-42"}})
```

The key: a call is ``(session, tool_use_id)`` = ``(thread_id, tool_call["id"])``. The session is
read from the run's config (``config["configurable"]["thread_id"]``, which every checkpointed run
has) at each call, so one compiled graph serves every thread, each with its own ledger.

Each call is looked up in its thread's ledger first; it runs — through LangGraph's own ``execute``,
with its argument validation, injected state and error handling — only when the ledger has no
outcome for it, and under toolledger's rules (intent before a non-idempotent tool, approval of a
high-impact one, in-doubt handling after a crash). While it runs, ``tool_context()`` is its
``ToolContext`` and ``toolledger.keys.current_key()`` its idempotency key.

Limits: a replayed call is answered with a ``ToolMessage`` holding the recorded content (the
string, or the list of content blocks); a tool's ``artifact`` and a ``Command`` it returned (its
state update) are not replayed — the ``Command``'s tool message content is what is recorded. A
tool that calls ``interrupt()`` must not be ledgered: the interrupt would be recorded as the call's
outcome. Put approvals behind ``high_impact`` and ``approve=``, or interrupt in a node before the
``ToolNode``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

try:
    from langchain_core.messages import ToolMessage
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool, StructuredTool
    from langgraph.prebuilt import ToolNode
    from langgraph.prebuilt.tool_node import ToolCallRequest
    from langgraph.types import Command
except ImportError as exc:  # pragma: no cover - the extra is installed wherever this is tested
    raise ImportError(
        f"toolledger.integrations.langgraph needs LangGraph: "
        f"pip install 'toolledger[langgraph]' ({exc})"
    ) from exc

from .. import keys
from .._tool_uses import arun_tool_uses, run_tool_uses
from ..approvals._notify import Notifier, Target
from ..engine._drivers import AlertHook
from ..engine._messages import failed_message
from ..errors import ConfigurationError, OutcomeUnknown
from ..records import Status
from ..stores import Ledger, Store
from ..tools import SchemaTool, Tool, ToolContext
from ._declarations import Declaration, checked_declarations, one_call_tool

__all__ = [
    "LedgerInterceptor",
    "langchain_tool",
    "ledgered_tool_node",
    "thread_id",
    "tool_context",
]

Result = ToolMessage | Command[Any]
SessionOf = Callable[[RunnableConfig], str]

_context: ContextVar[ToolContext | None] = ContextVar("toolledger_langgraph_call", default=None)


def tool_context() -> ToolContext | None:
    """The ``ToolContext`` of the ledgered call running in this context (its idempotency key,
    whether an earlier attempt is in doubt, its attempt number), or ``None`` outside one."""
    return _context.get()


def thread_id(config: RunnableConfig) -> str:
    """The session of a run: ``config["configurable"]["thread_id"]``. Raises
    ``ConfigurationError`` when the run has none (a ledger needs to know the conversation)."""
    configurable = config.get("configurable") or {}
    found = configurable.get("thread_id")
    if found is None or found == "":
        raise ConfigurationError(
            "a ledgered ToolNode needs the run's thread_id: invoke the graph with "
            'config={"configurable": {"thread_id": ...}} (or pass session= to name the session '
            "another way)"
        )
    return str(found)


class ToolErrorMessage(Exception):
    """LangGraph answered the call with an error message (``ToolMessage(status="error")``), whose
    text this is: recorded ``failed`` (its ``error`` reads ``'<tool>' failed: ToolErrorMessage:
    <text>``), and answered with that text the first time and on every replay."""


class _WatchedTool(BaseTool):
    """``tool`` as LangGraph's ``execute`` runs it for one call: ``invoke`` and ``ainvoke`` are
    ``tool``'s own (callbacks, injected arguments and all), and an ``OutcomeUnknown`` the tool
    raises is kept in ``unknown`` before ``handle_tool_errors`` turns it into an error message —
    which toolledger would record as a failure the model is invited to retry under a new id.
    ``func`` and ``coroutine`` are ``tool``'s, read by LangGraph for the annotations of what it
    injects (state, store, runtime) into a tool it does not hold."""

    tool: BaseTool
    unknown: OutcomeUnknown | None = None
    func: Any = None
    coroutine: Any = None

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        try:
            return self.tool.invoke(input, config, **kwargs)
        except OutcomeUnknown as exc:
            self.unknown = exc
            raise

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        try:
            return await self.tool.ainvoke(input, config, **kwargs)
        except OutcomeUnknown as exc:
            self.unknown = exc
            raise

    def get_input_schema(self, config: RunnableConfig | None = None) -> Any:
        return self.tool.get_input_schema(config)

    def _run(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - invoke runs ``tool``
        raise NotImplementedError


class _Watched:
    """One call's request to LangGraph's ``execute``, its tool watched for ``OutcomeUnknown``."""

    def __init__(self, request: ToolCallRequest, tool: _WatchedTool | None) -> None:
        self.request = request
        self.tool = tool

    @classmethod
    def over(cls, request: ToolCallRequest) -> _Watched:
        if request.tool is None:  # not a tool of the node: LangGraph answers it, nothing runs
            return cls(request, None)
        tool = _WatchedTool(
            name=request.tool.name,
            description=request.tool.description,
            args_schema=request.tool.args_schema,
            tool=request.tool,
            func=getattr(request.tool, "func", None),
            coroutine=getattr(request.tool, "coroutine", None),
        )
        return cls(request.override(tool=tool), tool)

    def raise_unknown(self) -> None:
        """Raise the ``OutcomeUnknown`` the tool raised, if LangGraph answered it with a message:
        raised inside the ledgered run, it leaves the call in doubt whatever
        ``handle_tool_errors`` says, as it does when LangGraph lets it through."""
        if self.tool is not None and self.tool.unknown is not None:
            raise self.tool.unknown


class LedgerInterceptor:
    """``ToolNode``'s ``wrap_tool_call`` and ``awrap_tool_call``: the ledger gate (and approval
    gate) before LangGraph's ``execute``, in the ledger of the run's thread.

    ``effects`` declares tools by name (``Declaration``: a mapping such as
    ``{"effect": "read_only"}`` or a ``@tl.tool`` declaration, whose ``check`` is used for a call
    in doubt); an undeclared tool is ``non_idempotent``. ``session(config)`` names the session of
    a run (default: its ``thread_id``). ``approve``, ``on_alert``, ``on_in_doubt`` and ``wait`` are
    those of ``tl.run_tool_uses``. Raises ``ConfigurationError`` at construction for a bad
    declaration.

    What each call answers: one that ran now, LangGraph's own message (a ``ToolMessage`` or a
    ``Command``); one answered from the ledger, or refused (in doubt, declined), a
    ``ToolMessage`` built from the ledger's result (``status="error"`` for a refusal or a
    recorded failure). A ``ToolMessage`` with ``status="error"`` from ``execute`` is recorded
    ``failed``, and a replay answers its content as the first answer did; an exception
    ``execute`` raises is recorded ``failed`` and answered as an error message, as toolledger
    answers every failed tool. A tool that raises ``tl.OutcomeUnknown``
    leaves its call in doubt (the model is told not to retry it), whatever the ``ToolNode``'s
    ``handle_tool_errors`` says; the other exceptions it handles keep its error message.
    ``LedgerMismatchError`` (the id recorded with another tool or input) and
    ``EffectInProgressError`` are raised, as ``run_tool_uses`` does.
    """

    def __init__(
        self,
        store: Store,
        *,
        effects: Mapping[str, Declaration] | Iterable[Tool[..., Any]] | None = None,
        approve: Any = None,
        session: SessionOf = thread_id,
        on_alert: AlertHook | None = None,
        on_in_doubt: Notifier | Target | None = None,
        wait: float = 0.0,
    ) -> None:
        self.store = store
        self.effects = checked_declarations(effects)
        self.approve = approve
        self.session = session
        self.on_alert = on_alert
        self.on_in_doubt = on_in_doubt
        self.wait = wait

    def ledger_for(self, request: ToolCallRequest) -> Ledger:
        """The ledger of the run ``request`` belongs to."""
        return self.store.ledger(self.session(request.runtime.config))

    def wrap_tool_call(
        self, request: ToolCallRequest, execute: Callable[[ToolCallRequest], Result]
    ) -> Result:
        """The sync interceptor: ``ToolNode(tools, wrap_tool_call=interceptor.wrap_tool_call)``."""
        ledger = self.ledger_for(request)
        produced: list[Result] = []

        def run(arguments: dict[str, Any], ctx: ToolContext) -> Any:
            token = _context.set(ctx)
            try:
                with keys.forwarding(ctx):
                    watched = _Watched.over(request)
                    message = execute(watched.request)
                    watched.raise_unknown()
                    return _recorded(message, produced)
            finally:
                _context.reset(token)

        (result,) = run_tool_uses(
            [_block(request)],
            [self._tool(request, run)],
            ledger=ledger,
            approve=self.approve,
            on_alert=self.on_alert,
            on_in_doubt=self.on_in_doubt,
            wait=self.wait,
        )
        return _answer(request, result, produced, ledger)

    async def awrap_tool_call(
        self, request: ToolCallRequest, execute: Callable[[ToolCallRequest], Awaitable[Result]]
    ) -> Result:
        """The async interceptor: ``ToolNode(tools, awrap_tool_call=...)``, for ``ainvoke``."""
        ledger = self.ledger_for(request)
        produced: list[Result] = []

        async def run(arguments: dict[str, Any], ctx: ToolContext) -> Any:
            token = _context.set(ctx)
            try:
                with keys.forwarding(ctx):
                    watched = _Watched.over(request)
                    message = await execute(watched.request)
                    watched.raise_unknown()
                    return _recorded(message, produced)
            finally:
                _context.reset(token)

        (result,) = await arun_tool_uses(
            [_block(request)],
            [self._tool(request, run)],
            ledger=ledger,
            approve=self.approve,
            on_alert=self.on_alert,
            on_in_doubt=self.on_in_doubt,
            wait=self.wait,
        )
        return _answer(request, result, produced, ledger)

    def _tool(self, request: ToolCallRequest, run: Callable[..., Any]) -> SchemaTool:
        name = request.tool_call["name"]
        return one_call_tool(name, run, self.effects.get(name))


def langchain_tool(tool: Tool[..., Any]) -> BaseTool:
    """A ``@tl.tool`` as a LangChain tool: its name, description and input schema, its function
    called with the arguments its signature validates — and, if it asks for one, the
    ``ToolContext`` of the ledgered call it serves (so it must run in a ledgered ``ToolNode``).
    """

    def arguments(raw: dict[str, Any]) -> tuple[dict[str, Any], ToolContext]:
        ctx = _context.get()
        if ctx is None:
            raise ConfigurationError(
                f"tool {tool.name!r} ran outside a ledgered ToolNode: it has no ToolContext"
            )
        return tool.validate(raw), ctx

    def run(**raw: Any) -> Any:
        return tool.invocation(*arguments(raw))()

    async def arun(**raw: Any) -> Any:
        return await tool.invocation(*arguments(raw))()

    return StructuredTool.from_function(
        func=None if tool.is_async else run,
        coroutine=arun if tool.is_async else None,
        name=tool.name,
        description=tool.description or tool.name,
        args_schema=tool.input_schema,
    )


def ledgered_tool_node(
    tools: Sequence[Any],
    *,
    store: Store,
    effects: Mapping[str, Declaration] | Iterable[Tool[..., Any]] | None = None,
    approve: Any = None,
    session: SessionOf = thread_id,
    on_alert: AlertHook | None = None,
    on_in_doubt: Notifier | Target | None = None,
    wait: float = 0.0,
    **tool_node_options: Any,
) -> ToolNode:
    """A ``ToolNode`` over ``tools`` whose calls, sync and async, go through a
    ``LedgerInterceptor`` built from the other arguments; ``tool_node_options`` (``name=``,
    ``handle_tool_errors=``, ...) go to ``ToolNode``.

    ``tools`` are what ``ToolNode`` takes (LangChain tools, functions) and ``@tl.tool``
    declarations, which become LangChain tools (``langchain_tool``) declared by themselves —
    their effect class, ``check`` and ``ToolContext`` — unless ``effects`` names them too.
    """
    declared = {t.name: t for t in tools if isinstance(t, Tool)}
    named = checked_declarations(effects)
    interceptor = LedgerInterceptor(
        store,
        effects={**declared, **named},
        approve=approve,
        session=session,
        on_alert=on_alert,
        on_in_doubt=on_in_doubt,
        wait=wait,
    )
    return ToolNode(
        [langchain_tool(t) if isinstance(t, Tool) else t for t in tools],
        wrap_tool_call=interceptor.wrap_tool_call,
        awrap_tool_call=interceptor.awrap_tool_call,
        **tool_node_options,
    )


# -- one call ------------------------------------------------------------------------------------


def _block(request: ToolCallRequest) -> dict[str, Any]:
    call = request.tool_call
    if not call.get("id"):
        raise ConfigurationError(
            f"tool call {call['name']!r} has no id: the ledger keys every call by its id"
        )
    return {"type": "tool_use", "id": call["id"], "name": call["name"], "input": call["args"]}


def _recorded(message: Result, produced: list[Result]) -> Any:
    """What the ledger records for LangGraph's answer to a call (its content), keeping the answer
    itself to return when the call ran now."""
    produced.append(message)
    tool_message = _tool_message_of(message)
    if tool_message is None:
        return ""  # a Command without a tool message: its state update is not replayable
    if tool_message.status == "error":
        raise ToolErrorMessage(_text(tool_message.content))
    return tool_message.content


def _tool_message_of(message: Result) -> ToolMessage | None:
    if isinstance(message, ToolMessage):
        return message
    update = message.update
    messages = update.get("messages", []) if isinstance(update, dict) else []
    return next((m for m in messages if isinstance(m, ToolMessage)), None)


def _answer(
    request: ToolCallRequest, result: dict[str, Any], produced: list[Result], ledger: Ledger
) -> Result:
    call = request.tool_call
    if produced:
        return produced[-1]  # ran now: LangGraph's own answer (or its error message)
    is_error = bool(result.get("is_error"))
    sent: str = result["content"]
    if is_error:
        content = _failed_content(ledger, call["id"], call["name"], sent)
    else:
        content = _recorded_content(ledger, call["id"], sent)
    return ToolMessage(
        content=content,
        tool_call_id=call["id"],
        name=call["name"],
        status="error" if is_error else "success",
    )


def _recorded_content(
    ledger: Ledger, tool_call_id: str | None, sent: str
) -> str | list[str | dict[Any, Any]]:
    """The content a replayed call answers with: the recorded one exactly when it was a list of
    content blocks (``sent`` is its JSON text), else ``sent``."""
    record = ledger.get(tool_call_id or "")
    if record is None or record.status is not Status.SUCCEEDED or record.result is None:
        return sent
    value = json.loads(record.result)
    return value if isinstance(value, list) else sent


def _failed_content(
    ledger: Ledger, tool_call_id: str | None, name: str, sent: str
) -> str | list[str | dict[Any, Any]]:
    """The content a refused or failed call answers with: ``sent`` (toolledger's text), except
    for a recorded ``ToolErrorMessage`` — LangGraph's error message, answered as it was the first
    time (its list of content blocks again when it was one), not as the record's wording."""
    record = ledger.get(tool_call_id or "")
    head = failed_message(name, ToolErrorMessage(_MARK)).partition(_MARK)[0]
    if record is None or record.status is not Status.FAILED or not sent.startswith(head):
        return sent
    text = sent.removeprefix(head)
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, list) else text


_MARK = "\x1f"  # where the text of a ToolErrorMessage goes in toolledger's failure wording


def _text(content: str | list[str | dict[Any, Any]]) -> str:
    return content if isinstance(content, str) else json.dumps(content)
