"""Pydantic AI: a toolset whose calls go through the toolledger ledger of their conversation.

```python
from pydantic_ai import Agent
from toolledger.integrations.pydantic_ai import LedgerToolset

store = tl.open_store("sqlite:///agent.db")
agent = Agent(model, toolsets=[LedgerToolset(my_toolset, store=store, effects={
    "create_ticket": {"effect": "non_idempotent"},
    "status_page": {"effect": "read_only"},
})])
result = await agent.run(prompt, conversation_id="outage-42")
...  # after a crash: the saved messages come back with their call ids
result = await agent.run(message_history=saved_messages)
```

The key: a call is ``(session, tool_use_id)`` = ``(conversation_id, ctx.tool_call_id)``. The
session is read at each call from the run (``ctx.conversation_id``: the run's
``conversation_id=``, else the one stamped on ``message_history``), so one ``Agent`` serves every
conversation, each with its own ledger; ``session=`` names it another way (a fixed string, or a
function of the ``RunContext``, e.g. of ``ctx.deps``).

Each call is looked up in its conversation's ledger first and reaches the wrapped toolset only
when the ledger has no outcome for it, under toolledger's rules (intent before a non-idempotent
tool, approval of a high-impact one, in-doubt handling after a crash). Pydantic AI validates the
arguments before ``call_tool``, as usual. While the tool runs, ``tool_context()`` is its
``ToolContext`` and ``toolledger.keys.current_key()`` its idempotency key.

Limits: the tool's answer is what the ledger recorded — its JSON text as Pydantic AI
serialises it for the model (a string result as itself) — the first time and on every replay,
so a ``ToolReturn``'s metadata or binary content is not passed through as such. Deferral
(``ApprovalRequired``, ``CallDeferred``) raised inside the ledger would be recorded as the call's
outcome: put ``.approval_required()`` around the ``LedgerToolset``, not inside it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar, assert_never

try:
    from pydantic_ai import ModelRetry, RunContext
    from pydantic_ai import exceptions as _exceptions
    from pydantic_ai import messages as _messages
    from pydantic_ai.toolsets import WrapperToolset
    from pydantic_ai.toolsets.abstract import ToolsetTool
except ImportError as exc:  # pragma: no cover - the extra is installed wherever this is tested
    raise ImportError(
        f"toolledger.integrations.pydantic_ai needs Pydantic AI: "
        f"pip install 'toolledger[pydantic-ai]' ({exc})"
    ) from exc

from .. import keys
from .._tool_uses import arun_calls
from ..approvals._notify import Notifier, Target
from ..engine._drivers import AlertHook
from ..engine._outcomes import CallOutcome, Disposition
from ..errors import ConfigurationError
from ..records import Status
from ..stores import Ledger, Store
from ..tools import Tool, ToolContext
from ._declarations import Declaration, checked_declarations, one_call_tool

__all__ = ["LedgerToolset", "conversation", "tool_context"]

DepsT = TypeVar("DepsT")
SessionOf = Callable[[RunContext[Any]], str]

_ToolFailed: type[Exception] | None = getattr(_exceptions, "ToolFailed", None)
"""Pydantic AI's failed tool return that asks for no retry (``None`` before it had one: the
message is then the tool's return)."""

_context: ContextVar[ToolContext | None] = ContextVar("toolledger_pydantic_ai_call", default=None)

_tool_return: Any = getattr(_messages, "tool_return_ta", None)
"""How Pydantic AI serialises a tool's return for the model (``None`` where it has no such
adapter: the ledger's own encoding then applies alone)."""


def tool_context() -> ToolContext | None:
    """The ``ToolContext`` of the ledgered call running in this context (its idempotency key,
    whether an earlier attempt is in doubt, its attempt number), or ``None`` outside one."""
    return _context.get()


def conversation(ctx: RunContext[Any]) -> str:
    """The session of a run: its ``conversation_id``. Raises ``ConfigurationError`` when the
    run has none (a Pydantic AI older than ``RunContext.conversation_id``)."""
    found: str | None = getattr(ctx, "conversation_id", None)
    if not found:
        raise ConfigurationError(
            "a LedgerToolset needs the run's conversation_id, which this Pydantic AI does not "
            "give: pass session= (a string, or a function of the RunContext) to name the session"
        )
    return found


@dataclass
class LedgerToolset(WrapperToolset[DepsT]):
    """The ledger gate (and approval gate) in front of another toolset's tools.

    ``store`` holds the ledgers; ``session`` names the session of a run — ``None`` (default) for
    its ``conversation_id``, a string for one fixed session, or a function of the
    ``RunContext``. ``effects`` declares tools by name (``Declaration``: a mapping such as
    ``{"effect": "read_only"}`` or a ``@tl.tool`` declaration, whose ``check`` is used for a
    call in doubt); an undeclared tool is ``non_idempotent``. ``approve``, ``on_alert``,
    ``on_in_doubt`` and ``wait`` are those of ``tl.arun_tool_uses``. Raises
    ``ConfigurationError`` at construction for a bad declaration.

    A call answers the JSON the ledger recorded (a string result as itself). A call whose tool
    raised (recorded ``failed``) is raised as ``ModelRetry`` with toolledger's message: retrying
    it is the model's business. A call in doubt, declined (or with no approver), awaiting
    approval or not executed is raised as Pydantic AI's ``ToolFailed`` (a failed return that
    asks for no retry and uses up none; the message is the return where Pydantic AI has no
    ``ToolFailed``): a retry would be a new call id the ledger cannot match, running an in-doubt
    effect twice. A replay (the same id) answers the same way. ``LedgerMismatchError`` and
    ``EffectInProgressError`` are raised, as ``run_tool_uses`` does.
    """

    store: Store = field(kw_only=True)
    effects: Mapping[str, Declaration] | Iterable[Tool[..., Any]] | None = field(
        default=None, kw_only=True
    )
    approve: Any = field(default=None, kw_only=True)
    session: str | SessionOf | None = field(default=None, kw_only=True)
    on_alert: AlertHook | None = field(default=None, kw_only=True)
    on_in_doubt: Notifier | Target | None = field(default=None, kw_only=True)
    wait: float = field(default=0.0, kw_only=True)

    def __post_init__(self) -> None:
        self._declarations = checked_declarations(self.effects)

    def ledger_for(self, ctx: RunContext[Any]) -> Ledger:
        """The ledger of the run ``ctx`` belongs to."""
        if self.session is None:
            return self.store.ledger(conversation(ctx))
        if isinstance(self.session, str):
            return self.store.ledger(self.session)
        return self.store.ledger(self.session(ctx))

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[DepsT], tool: ToolsetTool[DepsT]
    ) -> Any:
        if not ctx.tool_call_id:
            raise ConfigurationError(
                f"tool call {name!r} has no id: the ledger keys every call by its id"
            )
        ledger = self.ledger_for(ctx)

        async def run(arguments: dict[str, Any], call: ToolContext) -> Any:
            token = _context.set(call)
            try:
                with keys.forwarding(call):
                    return _jsonable(await self.wrapped.call_tool(name, tool_args, ctx, tool))
            finally:
                _context.reset(token)

        block = {"type": "tool_use", "id": ctx.tool_call_id, "name": name, "input": tool_args}
        (outcome,) = await arun_calls(
            [block],
            [one_call_tool(name, run, self._declarations.get(name))],
            ledger=ledger,
            approve=self.approve,
            on_alert=self.on_alert,
            on_in_doubt=self.on_in_doubt,
            wait=self.wait,
        )
        if not outcome.is_error:
            return outcome.content  # the JSON the ledger recorded: a replay answers the same
        if _model_may_retry(outcome):
            raise ModelRetry(outcome.content)
        # In doubt, declined, awaiting a person, not executed: a retry would be a new call id
        # the ledger cannot match (an in-doubt effect run twice, a declined action asked again),
        # so the model is told the outcome, not asked to try again.
        if _ToolFailed is None:
            return outcome.content
        raise _ToolFailed(outcome.content)


def _jsonable(value: Any) -> Any:
    """A tool's return as Pydantic AI would send it to the model (a date as its ISO text, a UUID,
    a Decimal, bytes as base64), so the ledger records — and every answer gives — that data in
    full rather than a note with a Python repr. A value Pydantic AI cannot serialise either is
    left to the ledger's own encoding."""
    if _tool_return is None or isinstance(value, str):
        return value
    try:
        return _tool_return.dump_python(value, mode="json", by_alias=True)
    except Exception:
        return value


def _model_may_retry(outcome: CallOutcome) -> bool:
    """Whether a call that did not succeed is the model's to retry (``ModelRetry``): its tool
    raised and the call is recorded failed, or its input was refused before anything ran. A
    call in doubt, declined, awaiting approval or not executed is not: it stands for its id."""
    match outcome.disposition:
        case Disposition.FAILED | Disposition.REJECTED:
            return True
        case Disposition.REPLAYED:
            return outcome.replayed is Status.FAILED
        case (
            Disposition.EXECUTED
            | Disposition.DECLINED
            | Disposition.IN_DOUBT
            | Disposition.NOT_EXECUTED
            | Disposition.AWAITING_APPROVAL
        ):
            return False
        case _:
            assert_never(outcome.disposition)
