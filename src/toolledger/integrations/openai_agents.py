"""OpenAI Agents SDK: an agent whose function tools run through the toolledger ledger of their run.

```python
from agents import Agent, RunConfig, Runner, RunState
from toolledger.integrations.openai_agents import ledgered, settle_interruptions

store = tl.open_store("sqlite:///agent.db")
agent = ledgered(Agent(name="support", tools=[refund, lookup_order]), store=store, effects={
    "refund": {"effect": "non_idempotent", "high_impact": True},   # the SDK asks a person
    "lookup_order": {"effect": "read_only"},
})
config = RunConfig(group_id="ticket-9")          # the session: pass it again on every resume
result = await Runner.run(agent, "refund order A-7", run_config=config)
state = result.to_state()                         # an interruption: a person approves refund
state.approve(state.get_interruptions()[0])
result = await Runner.run(agent, state, run_config=config)
```

The seam is ``FunctionTool.on_invoke_tool``: the SDK still parses the arguments, runs its
guardrails and hooks, asks for approval; the ledger gate runs inside, under ``(session,
ToolContext.tool_call_id)``. The session is the run's ``RunConfig.group_id`` unless ``session=``
names it another way (a string, or a function of the ``ToolContext`` — e.g. of ``ctx.context``,
which ``RunState`` keeps; under DBOS, ``lambda ctx: DBOS.workflow_id``). A call without one is a
``ConfigurationError``.

* **Outcomes reach the ledger.** The inner tool's failure formatter is turned off: an exception is
  recorded ``failed`` (and answered to the model as toolledger's error text), and
  ``tl.OutcomeUnknown`` leaves the call in doubt — the SDK's default formatter would turn both into
  a "success" string. A ``CancelledError`` the tool raises while its run was not cancelled is
  ``OutcomeUnknown`` too (the SDK would answer it "Please try again").
* **Timeouts move into the declaration.** ``FunctionTool.timeout_seconds`` would cancel the gate
  mid-commit; it becomes the declaration's ``timeout`` (set both: ``ConfigurationError``).
* **Approvals are the SDK's.** A tool declared ``high_impact`` gets ``needs_approval=True``; when
  the SDK runs the call, the person's ``RunState.approve`` is recorded as the call's approval, bound
  to its input. An approval never covers the re-run of a call in doubt: that question goes to
  ``approve=`` (a toolledger approver), and without one the call stays in doubt for ``toolledger
  resolve``. ``settle_interruptions`` approves interruptions whose call the ledger already
  finished, so nobody is asked twice.
* **Answers are text**: the JSON the ledger recorded (a string result as itself), the first time
  and on every replay. ``LedgerMismatchError`` and ``EffectInProgressError`` fail the run.

Not ledgered, and refused: an agent used as a tool (``Agent.as_tool``: a nested run with its own
interruptions) and ``Agent(mcp_servers=...)`` (tools made per run; use
``toolledger.adapters.mcp`` with a server that honours the key). Hosted tools run on OpenAI's side;
shell, computer, apply-patch and custom tools are not ``FunctionTool``\\ s and run unledgered.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from typing import Any, TypeVar

try:
    from agents import Agent, FunctionTool, RunState, ToolApprovalItem
    from agents.tool import set_function_tool_failure_error_function
    from agents.tool_context import ToolContext as SDKToolContext
except ImportError as exc:  # pragma: no cover - the extra is installed wherever this is tested
    raise ImportError(
        f"toolledger.integrations.openai_agents needs the OpenAI Agents SDK: "
        f"pip install 'toolledger[openai-agents]' ({exc})"
    ) from exc

from .. import keys
from .._tool_uses import arun_tool_uses
from ..approvals._notify import Notifier, Target
from ..engine._drivers import AlertHook
from ..engine._gate import ApprovalRequest, Decision
from ..errors import ConfigurationError, OutcomeUnknown
from ..records import Status
from ..stores import Ledger, Store
from ..tools import Tool, ToolContext
from ._approvals import ask
from ._declarations import Declaration, checked_declarations, one_call_tool

__all__ = ["group_id", "ledgered", "settle_interruptions", "tool_context"]

AgentT = TypeVar("AgentT", bound=Agent[Any])
SessionOf = Callable[[SDKToolContext[Any]], str]

SDK_APPROVAL = "openai-agents approval"
"""Who approved a call the SDK's own human-in-the-loop approved (``approved_by``)."""

_context: ContextVar[ToolContext | None] = ContextVar("toolledger_openai_agents_call", default=None)


def tool_context() -> ToolContext | None:
    """The ``ToolContext`` of the ledgered call running in this context (its idempotency key,
    whether an earlier attempt is in doubt, its attempt number), or ``None`` outside one."""
    return _context.get()


def group_id(ctx: SDKToolContext[Any]) -> str:
    """The session of a run: its ``RunConfig.group_id``. Raises ``ConfigurationError`` when the
    run has none."""
    found = getattr(ctx.run_config, "group_id", None) if ctx.run_config is not None else None
    if not found:
        raise ConfigurationError(
            "a ledgered agent needs to know the session of the run: pass "
            'run_config=RunConfig(group_id="...") to Runner.run — the same on every resume, '
            "since RunState does not keep it — or ledgered(session=...)"
        )
    return str(found)


def ledgered(
    agent: AgentT,
    *,
    store: Store,
    effects: Mapping[str, Declaration] | Iterable[Tool[..., Any]] | None = None,
    approve: Any = None,
    session: str | SessionOf | None = None,
    on_alert: AlertHook | None = None,
    on_in_doubt: Notifier | Target | None = None,
    wait: float = 0.0,
) -> AgentT:
    """A copy of ``agent`` (and of the agents it hands off to) whose function tools go through
    the ledger of each run.

    ``effects`` declares tools by name (``Declaration``: a mapping such as ``{"effect":
    "read_only"}`` or a ``@tl.tool`` declaration, whose ``check`` settles a call in doubt); an
    undeclared tool is ``non_idempotent``. ``approve`` answers what the SDK's approval does not
    cover (a call in doubt; a high-impact call the SDK was not asked about). ``on_alert``,
    ``on_in_doubt`` and ``wait`` are those of ``tl.arun_tool_uses``. Raises
    ``ConfigurationError`` for a bad declaration, an agent used as a tool, MCP servers, or a tool
    with a timeout both in the SDK and in its declaration.
    """
    gate = _Gate(
        store=store,
        declarations=checked_declarations(effects),
        approve=approve,
        session=session,
        on_alert=on_alert,
        on_in_doubt=on_in_doubt,
        wait=wait,
    )
    return gate.agent(agent, {})


def settle_interruptions(state: RunState[Any, Any], ledger: Ledger) -> list[ToolApprovalItem]:
    """Approve, in ``state``, each pending interruption whose call ``ledger`` (the run's session)
    already finished — a person approved it, it ran, and the process died before a later state
    was saved — so the resumed run gets the recorded answer and nobody is asked twice. Returns the
    interruptions still waiting for a person."""
    waiting: list[ToolApprovalItem] = []
    for item in state.get_interruptions():
        record = ledger.get(item.call_id) if item.call_id else None
        if record is not None and record.status in (Status.SUCCEEDED, Status.FAILED):
            state.approve(item)
        else:
            waiting.append(item)
    return waiting


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Gate:
    store: Store
    declarations: dict[str, Declaration]
    approve: Any
    session: str | SessionOf | None
    on_alert: AlertHook | None
    on_in_doubt: Notifier | Target | None
    wait: float

    def agent(self, agent: AgentT, done: dict[int, Agent[Any]]) -> AgentT:
        if id(agent) in done:
            return done[id(agent)]  # type: ignore[return-value]
        if agent.mcp_servers:
            raise ConfigurationError(
                f"agent {agent.name!r} has MCP servers, whose tools are made per run and would "
                "run unledgered: give it toolledger.adapters.mcp tools over a server that honours "
                "the idempotency key, or leave the MCP servers out"
            )
        copy: AgentT = agent.clone(tools=[self.tool(t) for t in agent.tools])  # type: ignore[assignment]
        done[id(agent)] = copy
        copy.handoffs = [self.agent(h, done) if isinstance(h, Agent) else h for h in agent.handoffs]
        return copy

    def tool(self, tool: Any) -> Any:
        if not isinstance(tool, FunctionTool):
            return tool  # hosted, shell, computer, custom: not a FunctionTool (see the docs)
        if tool._is_agent_tool:
            raise ConfigurationError(
                f"tool {tool.name!r} is an agent used as a tool: its nested run (and its "
                "interruptions) cannot be ledgered as one call; ledger the inner agent's tools "
                "instead (ledgered(inner_agent, ...).as_tool(...))"
            )
        declaration = self.declarations.get(tool.name)
        declared = _declared(declaration)
        if tool.timeout_seconds is not None:
            if "timeout" in declared or isinstance(declaration, Tool):
                raise ConfigurationError(
                    f"tool {tool.name!r} has a timeout in the SDK (timeout_seconds) and in its "
                    "declaration: keep the declaration's (the SDK's would cancel the ledger's "
                    "commit)"
                )
            declaration = {**declared, "timeout": tool.timeout_seconds}
        inner = dataclasses.replace(tool)
        set_function_tool_failure_error_function(inner, None)  # outcomes reach the ledger
        needs_approval = True if declared.get("high_impact") else tool.needs_approval

        async def on_invoke_tool(ctx: SDKToolContext[Any], raw: str) -> Any:
            return await self.call(inner, declaration, ctx, raw)

        return dataclasses.replace(
            tool, on_invoke_tool=on_invoke_tool, timeout_seconds=None, needs_approval=needs_approval
        )

    def ledger_for(self, ctx: SDKToolContext[Any]) -> Ledger:
        if self.session is None:
            return self.store.ledger(group_id(ctx))
        if isinstance(self.session, str):
            return self.store.ledger(self.session)
        return self.store.ledger(self.session(ctx))

    async def call(
        self,
        inner: FunctionTool,
        declaration: Declaration | None,
        ctx: SDKToolContext[Any],
        raw: str,
    ) -> Any:
        if not ctx.tool_call_id:
            raise ConfigurationError(
                f"tool call {inner.name!r} has no id: the ledger keys every call by its id"
            )
        ledger = self.ledger_for(ctx)

        async def run(arguments: dict[str, Any], call: ToolContext) -> Any:
            token = _context.set(call)
            try:
                with keys.forwarding(call):
                    return await inner.on_invoke_tool(ctx, raw)
            except asyncio.CancelledError as exc:
                _raise_unless_the_tool_cancelled_itself(exc)
                raise
            finally:
                _context.reset(token)

        async def bridge(request: ApprovalRequest) -> Any:
            """The SDK's approval for a first run; ``approve=`` for everything else."""
            if not request.in_doubt and ctx.is_tool_approved(inner.name, ctx.tool_call_id):
                return Decision(approved=True, by=SDK_APPROVAL)
            if self.approve is None:
                return Decision(approved=False, by="no approver for what the SDK did not ask")
            return await ask(self.approve, request)

        block = {"type": "tool_use", "id": ctx.tool_call_id, "name": inner.name}
        (result,) = await arun_tool_uses(
            [{**block, "input": _arguments(raw)}],
            [one_call_tool(inner.name, run, declaration)],
            ledger=ledger,
            approve=bridge,
            on_alert=self.on_alert,
            on_in_doubt=self.on_in_doubt,
            wait=self.wait,
        )
        return result["content"]  # the JSON the ledger recorded: a replay answers the same


def _raise_unless_the_tool_cancelled_itself(exc: asyncio.CancelledError) -> None:
    """A ``CancelledError`` the tool raised while nobody cancelled its task (an await inside it
    was cancelled) is ``OutcomeUnknown``: the call is left in doubt and the model told so. Let
    through, the SDK would answer it with its failure formatter ("An error occurred while running
    the tool. Please try again.") and the model would make the call again under a new id, which
    the ledger cannot match. A cancellation of the task (the run's, or the deadline's) goes on
    up, as it should."""
    task = asyncio.current_task()
    if task is not None and not task.cancelling():
        raise OutcomeUnknown(
            f"the tool raised CancelledError before it answered ({exc!r})"
        ) from exc


def _declared(declaration: Declaration | None) -> dict[str, Any]:
    """A declaration's keywords (a ``@tl.tool``'s taken from it)."""
    if declaration is None:
        return {}
    if isinstance(declaration, Tool):
        return {
            "effect": declaration.effect,
            "high_impact": declaration.high_impact,
            "forwards_idempotency_key": declaration.forwards_idempotency_key,
        }
    return dict(declaration)


def _arguments(raw: str) -> dict[str, Any]:
    """The call's input as the ledger keys it: the arguments object, or the raw text when the
    model sent something else (the SDK then refuses it inside the gate, recorded ``failed``)."""
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {"raw_arguments": raw}
    return value if isinstance(value, dict) else {"raw_arguments": raw}
