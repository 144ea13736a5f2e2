"""toolledger.integrations.langgraph: one compiled graph, a ledger per thread, and a real kill.

Effects are counted in a "world" file the tool appends to, and real executions in a list; the
kill is a ``SIGKILL`` of a separate process running the graph with LangGraph's ``SqliteSaver``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import pytest

from .apps import WORLD, finished, killed, run_app
from .conftest import require

require("langgraph.prebuilt", "langgraph")

from langchain_core.messages import AIMessage, ToolMessage  # noqa: E402
from langchain_core.tools import BaseTool, InjectedToolCallId, StructuredTool, tool  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.graph import END, START, MessagesState, StateGraph  # noqa: E402
from langgraph.prebuilt import InjectedState, ToolNode, ToolRuntime  # noqa: E402
from pydantic import BaseModel  # noqa: E402

import toolledger as tl  # noqa: E402
from toolledger.codec import idempotency_key  # noqa: E402
from toolledger.integrations.langgraph import (  # noqa: E402
    LedgerInterceptor,
    ledgered_tool_node,
    tool_context,
)
from toolledger.records import Status  # noqa: E402

from .langgraph_app import CALL_ID, THREAD, build  # noqa: E402

APP = str(Path(__file__).with_name("langgraph_app.py"))


def config(thread: str) -> Any:
    return {"configurable": {"thread_id": thread}}


def tool_messages(messages: list[Any]) -> list[ToolMessage]:
    return [m for m in messages if isinstance(m, ToolMessage)]


def test_one_graph_serves_every_thread_each_in_its_own_ledger(tmp_path: Path) -> None:
    world = tmp_path / "world.txt"
    executions: list[str] = []
    with tl.open_store(f"sqlite:///{tmp_path / 'ledger.db'}") as store:
        app = build(store, world, InMemorySaver(), executions)  # compiled once
        out_a = app.invoke({"messages": [("user", "alpha")]}, config("thread-a"))
        out_b = app.invoke({"messages": [("user", "beta")]}, config("thread-b"))

        # The model used the same call id in both threads: two calls, two effects, two ledgers.
        assert executions == ["alpha", "beta"]
        assert world.read_text() == "alpha\nbeta\n"
        (a,) = store.ledger("thread-a").records()
        (b,) = store.ledger("thread-b").records()
        assert (a.tool_use_id, a.status, a.result) == (CALL_ID, Status.SUCCEEDED, '"line 1"')
        assert (b.tool_use_id, b.status, b.result) == (CALL_ID, Status.SUCCEEDED, '"line 2"')
        assert set(store.sessions()) == {"thread-a", "thread-b"}
    assert out_a["messages"][-1].content == "done: line 1"
    assert out_b["messages"][-1].content == "done: line 2"


def test_a_replayed_call_answers_from_the_ledger(tmp_path: Path) -> None:
    """Time travel: the thread is run again from its checkpoint before the tools node, so the
    ToolNode sees the same call id again — the ledger answers it; the tool does not run."""
    world = tmp_path / "world.txt"
    executions: list[str] = []
    with tl.open_store(f"sqlite:///{tmp_path / 'ledger.db'}") as store:
        app = build(store, world, InMemorySaver(), executions)
        first = app.invoke({"messages": [("user", "alpha")]}, config("t"))
        (before_tools,) = [s for s in app.get_state_history(config("t")) if s.next == ("tools",)]
        again = app.invoke(None, before_tools.config)
        (record,) = store.ledger("t").records()
    assert executions == ["alpha"], "the tool ran once"
    assert world.read_text() == "alpha\n"
    assert record.attempt == 1
    (ran,) = tool_messages(first["messages"])
    (replayed,) = tool_messages(again["messages"])
    assert (replayed.content, replayed.status, replayed.tool_call_id) == (
        "line 1",
        "success",
        CALL_ID,
    )
    assert replayed.content == ran.content
    assert again["messages"][-1].content == "done: line 1"


def tools_only_graph(node: Any) -> Any:
    graph = StateGraph(MessagesState)
    graph.add_node("tools", node)
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    return graph.compile()


def test_async_graph_and_declarations_from_tl_tool() -> None:
    """``ainvoke`` goes through ``awrap_tool_call``; a ``@tl.tool`` declaration names the effect
    class, and the running call sees its ToolContext (its idempotency key)."""
    seen: list[tl.ToolContext | None] = []
    keys: list[str | None] = []

    @tool
    async def send_email(to: str) -> str:
        """Send an e-mail."""
        seen.append(tool_context())
        keys.append(tl.keys.current_key())
        return f"sent to {to}"

    @tl.tool(effect="non_idempotent", forwards_idempotency_key=True)
    def send_email_declared(to: str) -> str:
        """Only a declaration: what running it twice would do."""
        return to

    store = tl.open_store("memory://")
    node = ledgered_tool_node(
        [send_email], store=store, effects={"send_email": send_email_declared}
    )
    app = tools_only_graph(node)
    turn = AIMessage(
        content="", tool_calls=[{"name": "send_email", "args": {"to": "ops"}, "id": "c1"}]
    )
    for _ in range(2):
        out = asyncio.run(app.ainvoke({"messages": [turn]}, config("mail")))
        assert tool_messages(out["messages"])[0].content == "sent to ops"
    assert len(seen) == 1, "the second run answered from the ledger"
    ctx = seen[0]
    assert ctx is not None and (ctx.session_id, ctx.tool_use_id) == ("mail", "c1")
    assert keys == [ctx.idempotency_key]
    (record,) = store.ledger("mail").records()
    assert record.attempt == 1, "non_idempotent: its intent was written before it ran"
    store.close()


def test_tl_tools_run_in_the_tool_node_with_their_context() -> None:
    """A ``@tl.tool`` given to ``ledgered_tool_node`` is a LangChain tool declared by itself:
    its schema reaches the model's side, its function gets the call's ToolContext, and its
    arguments are validated by its signature."""
    sent: list[tuple[str, str]] = []

    @tl.tool(effect="non_idempotent", forwards_idempotency_key=True)
    def send_email(to: str, ctx: tl.ToolContext) -> dict[str, str]:
        """Send an e-mail."""
        sent.append((to, ctx.idempotency_key))
        return {"sent_to": to}

    @tl.tool(effect="read_only")
    def inbox(limit: int = 3) -> list[str]:
        """Read the inbox."""
        return [f"mail {i}" for i in range(limit)]

    store = tl.open_store("memory://")
    node = ledgered_tool_node([send_email, inbox], store=store)
    assert node.tools_by_name["inbox"].tool_call_schema == {
        **inbox.input_schema,
        "description": "Read the inbox.",
    }
    app = tools_only_graph(node)
    turn = AIMessage(
        content="",
        tool_calls=[
            {"name": "send_email", "args": {"to": "ops"}, "id": "c1"},
            {"name": "inbox", "args": {"limit": 2}, "id": "c2"},
        ],
    )
    for invoke in (app.invoke, lambda *a: asyncio.run(app.ainvoke(*a))):
        out = invoke({"messages": [turn]}, config("t"))
        email, mails = tool_messages(out["messages"])
        assert json.loads(str(email.content)) == {"sent_to": "ops"}
        assert json.loads(str(mails.content)) == ["mail 0", "mail 1"]
    (record,) = [r for r in store.ledger("t").records() if r.tool_use_id == "c1"]
    assert sent == [("ops", idempotency_key("t", "c1"))], "ran once, with the call's own key"
    assert record.attempt == 1, "declared non_idempotent by its @tl.tool: intent first"

    bad = AIMessage(content="", tool_calls=[{"name": "inbox", "args": {"limit": "x"}, "id": "c3"}])
    out = app.invoke({"messages": [bad]}, config("t"))
    (refused,) = tool_messages(out["messages"])
    assert refused.status == "error" and "limit" in str(refused.content)
    store.close()


def test_errors_are_recorded_failed_and_a_missing_thread_is_refused() -> None:
    runs: list[int] = []

    @tool
    def flaky() -> str:
        """Fails."""
        runs.append(1)
        raise ValueError("backend down")

    store = tl.open_store("memory://")
    app = tools_only_graph(ledgered_tool_node([flaky], store=store, handle_tool_errors=True))
    turn = AIMessage(content="", tool_calls=[{"name": "flaky", "args": {}, "id": "c1"}])
    out = app.invoke({"messages": [turn]}, config("t"))
    (message,) = tool_messages(out["messages"])
    assert message.status == "error" and "backend down" in str(message.content)
    (record,) = store.ledger("t").records()
    assert record.status is Status.FAILED
    assert runs == [1]

    # (handle_tool_errors=True would hand toolledger's own refusals to the model as well)
    strict = tools_only_graph(ledgered_tool_node([flaky], store=store))
    with pytest.raises(tl.ConfigurationError, match="thread_id"):
        strict.invoke({"messages": [turn]})
    assert runs == [1]
    with pytest.raises(tl.ConfigurationError, match="unknown keys"):
        LedgerInterceptor(store, effects={"flaky": {"effekt": "read_only"}})
    store.close()


def charge_tool(world: Path) -> BaseTool:
    """``charge``: its effect is a line in ``world``; then the connection drops before the answer
    (``OutcomeUnknown``), or, for order ``boom``, the backend refuses (``ValueError``)."""

    @tool
    def charge(order: str) -> str:
        """Charge an order."""
        with world.open("a") as f:
            f.write(order + "\n")
        if order == "boom":
            raise ValueError("backend down")
        raise tl.OutcomeUnknown("the connection dropped after the request was sent")

    return charge


def handler(exc: Exception) -> str:
    return f"the tool failed: {exc}"


def hand_built(tools: list[Any], store: tl.Store, **options: Any) -> ToolNode:
    """The ``ToolNode`` a user builds around ``LedgerInterceptor``."""
    interceptor = LedgerInterceptor(store)
    return ToolNode(
        tools,
        wrap_tool_call=interceptor.wrap_tool_call,
        awrap_tool_call=interceptor.awrap_tool_call,
        **options,
    )


NODES: dict[str, Callable[[list[Any], tl.Store], ToolNode]] = {
    "default": lambda tools, store: ledgered_tool_node(tools, store=store),
    "handle_tool_errors=True": lambda tools, store: ledgered_tool_node(
        tools, store=store, handle_tool_errors=True
    ),
    "a handler": lambda tools, store: ledgered_tool_node(
        tools, store=store, handle_tool_errors=handler
    ),
    "ToolNode(handle_tool_errors=True)": lambda tools, store: hand_built(
        tools, store, handle_tool_errors=True
    ),
    "ToolNode(a handler)": lambda tools, store: hand_built(
        tools, store, handle_tool_errors=handler
    ),
}


def invoker(mode: str, app: Any) -> Callable[..., Any]:
    if mode == "invoke":
        return app.invoke
    return lambda *args: asyncio.run(app.ainvoke(*args))


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
@pytest.mark.parametrize("node", list(NODES))
def test_a_tool_that_cannot_tell_leaves_its_call_in_doubt(
    tmp_path: Path, node: str, mode: str
) -> None:
    """The tool raises ``OutcomeUnknown``: whatever ``handle_tool_errors`` says, the call is in
    doubt and the model is told not to retry it — never LangGraph's "please fix your mistakes",
    which a model answers with a new call id the ledger cannot match (a second charge)."""
    world = tmp_path / "world.txt"
    store = tl.open_store("memory://")
    run = invoker(mode, tools_only_graph(NODES[node]([charge_tool(world)], store)))
    turn = AIMessage(
        content="", tool_calls=[{"name": "charge", "args": {"order": "A-1"}, "id": "c1"}]
    )
    for _ in range(2):  # the same call again (a replay): answered from the ledger, not run
        (told,) = tool_messages(run({"messages": [turn]}, config("t"))["messages"])
        assert world.read_text() == "A-1\n", "the effect happened once"
        (record,) = store.ledger("t").records()
        assert record.status is Status.STARTED, "in doubt, not failed"
        assert store.ledger("t").in_doubt() == [record]
        assert told.status == "error" and told.tool_call_id == "c1"
        assert "may already have happened" in str(told.content)
        assert "Do not retry it under a new call" in str(told.content)
        assert "fix" not in str(told.content) and "failed" not in str(told.content)
    store.close()


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
@pytest.mark.parametrize("node", [n for n in NODES if n != "default"])
def test_other_exceptions_keep_langgraphs_error_handling(
    tmp_path: Path, node: str, mode: str
) -> None:
    world = tmp_path / "world.txt"
    store = tl.open_store("memory://")
    run = invoker(mode, tools_only_graph(NODES[node]([charge_tool(world)], store)))
    turn = AIMessage(
        content="", tool_calls=[{"name": "charge", "args": {"order": "boom"}, "id": "c1"}]
    )
    (told,) = tool_messages(run({"messages": [turn]}, config("t"))["messages"])
    expected = (
        "the tool failed: backend down"
        if "handler" in node
        else "Error: ValueError('backend down')\n Please fix your mistakes."
    )
    assert (told.content, told.status) == (expected, "error"), "LangGraph's own message"
    (record,) = store.ledger("t").records()
    assert record.status is Status.FAILED and "backend down" in (record.error or "")
    assert world.read_text() == "boom\n"
    store.close()


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
@pytest.mark.parametrize("node", list(NODES))
def test_a_failed_call_replays_the_message_the_model_first_saw(
    tmp_path: Path, node: str, mode: str
) -> None:
    """The same call again (a resume from a checkpoint before the tools step) answers, from the
    ledger, the very text the first answer sent — and the record names no internal class."""
    world = tmp_path / "world.txt"
    store = tl.open_store("memory://")
    run = invoker(mode, tools_only_graph(NODES[node]([charge_tool(world)], store)))
    turn = AIMessage(
        content="", tool_calls=[{"name": "charge", "args": {"order": "boom"}, "id": "c1"}]
    )
    answers = []
    for _ in range(2):
        (told,) = tool_messages(run({"messages": [turn]}, config("t"))["messages"])
        answers.append((told.content, told.status, told.tool_call_id))
    assert answers[1] == answers[0], "the replay sends what the first answer sent"
    assert answers[0][1] == "error" and "backend down" in str(answers[0][0])
    assert world.read_text() == "boom\n", "the tool ran once"
    (record,) = store.ledger("t").records()
    assert record.status is Status.FAILED and "backend down" in (record.error or "")
    assert "_Failed" not in (record.error or "") and "_Failed" not in str(answers[0][0])
    store.close()


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_injected_state_call_id_and_runtime_reach_the_tool(mode: str) -> None:
    """LangGraph still injects what the model does not send, with ``handle_tool_errors`` on."""
    seen: list[tuple[int, str, str, int]] = []

    @tool
    def note(
        text: str,
        messages: Annotated[list[Any], InjectedState("messages")],
        call_id: Annotated[str, InjectedToolCallId],
        runtime: ToolRuntime,
    ) -> str:
        """Note something."""
        seen.append(
            (len(messages), call_id, str(runtime.tool_call_id), len(runtime.state["messages"]))
        )
        if text == "lost":
            raise tl.OutcomeUnknown("the connection dropped after the request was sent")
        return f"noted {text}"

    store = tl.open_store("memory://")
    node = ledgered_tool_node([note], store=store, handle_tool_errors=True)
    run = invoker(mode, tools_only_graph(node))
    turn = AIMessage(
        content="",
        tool_calls=[
            {"name": "note", "args": {"text": "kept"}, "id": "c1"},
            {"name": "note", "args": {"text": "lost"}, "id": "c2"},
        ],
    )
    kept, lost = tool_messages(run({"messages": [turn]}, config("t"))["messages"])
    assert (kept.content, kept.status) == ("noted kept", "success")
    assert lost.status == "error" and "may already have happened" in str(lost.content)
    assert sorted(seen) == [(1, "c1", "c1", 1), (1, "c2", "c2", 1)]
    statuses = {r.tool_use_id: r.status for r in store.ledger("t").records()}
    assert statuses == {"c1": Status.SUCCEEDED, "c2": Status.STARTED}
    store.close()


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_tool_another_interceptor_hands_in_keeps_its_injected_state(mode: str) -> None:
    """An interceptor around the ledger's swaps in a tool the ``ToolNode`` does not hold, whose
    injected state is declared on its function only (its ``args_schema`` names what the model
    sends): LangGraph reads it from the tool it is handed, and still injects it."""
    seen: list[int] = []

    class Args(BaseModel):
        text: str

    def note(text: str, messages: Annotated[list[Any], InjectedState("messages")]) -> str:
        seen.append(len(messages))
        return f"noted {text}"

    async def anote(text: str, messages: Annotated[list[Any], InjectedState("messages")]) -> str:
        return note(text, messages)

    handed = StructuredTool.from_function(
        func=note, coroutine=anote, name="note", description="Note.", args_schema=Args
    )

    @tool
    def placeholder(text: str) -> str:
        """Registered under another name."""
        return text

    store = tl.open_store("memory://")
    ledger = LedgerInterceptor(store)

    def swap(request: Any, execute: Any) -> Any:
        return ledger.wrap_tool_call(request.override(tool=handed), execute)

    async def aswap(request: Any, execute: Any) -> Any:
        return await ledger.awrap_tool_call(request.override(tool=handed), execute)

    node = ToolNode([placeholder], wrap_tool_call=swap, awrap_tool_call=aswap)
    run = invoker(mode, tools_only_graph(node))
    turn = AIMessage(content="", tool_calls=[{"name": "note", "args": {"text": "a"}, "id": "c1"}])
    (told,) = tool_messages(run({"messages": [turn]}, config("t"))["messages"])
    assert (told.content, told.status) == ("noted a", "success")
    assert seen == [1], "ran once, with the thread's messages injected"
    (record,) = store.ledger("t").records()
    assert record.status is Status.SUCCEEDED
    store.close()


def test_a_high_impact_call_asks_the_approver_once() -> None:
    runs: list[str] = []
    asked: list[str] = []

    @tool
    def wire_money(amount: int) -> str:
        """Send money."""
        runs.append(str(amount))
        return "sent"

    def approve(request: tl.ApprovalRequest) -> bool:
        asked.append(request.tool_use_id)
        return bool(request.input["amount"] < 100)

    store = tl.open_store("memory://")
    app = tools_only_graph(
        ledgered_tool_node(
            [wire_money],
            store=store,
            effects={"wire_money": {"high_impact": True}},
            approve=approve,
        )
    )
    turn = AIMessage(
        content="",
        tool_calls=[
            {"name": "wire_money", "args": {"amount": 10}, "id": "small"},
            {"name": "wire_money", "args": {"amount": 500}, "id": "large"},
        ],
    )
    for _ in range(2):
        out = app.invoke({"messages": [turn]}, config("bank"))
        small, large = tool_messages(out["messages"])
        assert (small.content, small.status) == ("sent", "success")
        assert large.status == "error"
    assert runs == ["10"], "the declined call never ran"
    assert sorted(asked) == ["large", "small"], (
        "asked once each; the replay answered from the ledger"
    )
    statuses = {r.tool_use_id: r.status for r in store.ledger("bank").records()}
    assert statuses == {"small": Status.SUCCEEDED, "large": Status.DENIED}
    store.close()


def test_a_queued_call_runs_under_its_id_from_the_checkpoint_before_the_tools_step(
    tmp_path: Path,
) -> None:
    """``approve=tl.approvals.queue``: the call answers "awaiting approval", and that answer is
    the tools step's, checkpointed; the model goes on. Once a person approved, the documented way
    back is the checkpoint before the tools step: the call comes back under its id and runs once,
    nobody asked again."""
    world = tmp_path / "world.txt"
    executions: list[str] = []
    store = tl.open_store("memory://")
    app = build(
        store,
        world,
        InMemorySaver(),
        executions,
        effects={"append_line": {"high_impact": True}},
        approve=tl.approvals.queue,
    )

    first = app.invoke({"messages": [("user", "deploy")]}, config(THREAD))
    (waiting,) = tool_messages(first["messages"])
    assert waiting.status == "error" and "awaiting approval" in str(waiting.content)
    assert executions == [] and app.get_state(config(THREAD)).next == (), "the run went on"
    (request,) = tl.approvals.pending(store, THREAD)
    assert request.tool_use_id == CALL_ID

    tl.approvals.decide(store, THREAD, CALL_ID, approved=True, by="alice")
    app.invoke(None, config(THREAD))
    assert executions == [], "resuming the thread where it stands does not make the call again"

    before_tools = next(s for s in app.get_state_history(config(THREAD)) if s.next == ("tools",))
    again = app.invoke(None, before_tools.config)
    ran = tool_messages(again["messages"])[-1]
    assert (ran.content, ran.status, ran.tool_call_id) == ("line 1", "success", CALL_ID)
    assert executions == ["deploy"] and world.read_text() == "deploy\n"
    assert tl.approvals.pending(store, THREAD) == []
    (record,) = store.ledger(THREAD).records()
    assert record.status is Status.SUCCEEDED and record.approved_by == "alice"
    store.close()


# -- a real kill ----------------------------------------------------------------------------------


def run_lg(tmp_path: Path, phase: str, crash_at: str | None = None) -> Any:
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    checkpoints, world = str(tmp_path / "checkpoints.db"), str(tmp_path / WORLD)
    return run_app(APP, ledger, checkpoints, world, phase, crash_at=crash_at)


def checkpointed_messages(tmp_path: Path) -> tuple[tuple[str, ...], list[Any]]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    with SqliteSaver.from_conn_string(str(tmp_path / "checkpoints.db")) as saver:
        app = build(tl.open_store("memory://"), tmp_path / "unused.txt", saver)
        state = app.get_state(config(THREAD))
    return state.next, state.values["messages"]


def test_killed_after_the_outcome_then_resumed_from_the_checkpointer(tmp_path: Path) -> None:
    """The gap the ledger closes: the effect happened and its outcome is recorded, but the process
    died before LangGraph checkpointed the tool message. The resumed thread re-enters the tools
    node with the same call id and gets the recorded result; the world holds one effect."""
    killed(run_lg(tmp_path, "start", crash_at="after_record"), tmp_path)
    pending, messages = checkpointed_messages(tmp_path)
    assert pending == ("tools",), "LangGraph never checkpointed the tool message"
    assert not tool_messages(messages)

    out = finished(run_lg(tmp_path, "resume"), tmp_path)
    (answer,) = [m for m in out if m["type"] == "tool"]
    assert (answer["content"], answer["status"], answer["tool_call_id"]) == (
        "line 1",
        "success",
        CALL_ID,
    )
    assert out[-1]["content"] == "done: line 1"
    with tl.open_store(f"sqlite:///{tmp_path / 'ledger.db'}") as store:
        (record,) = store.ledger(THREAD).records()
    assert (record.status, record.result, record.attempt) == (Status.SUCCEEDED, '"line 1"', 1)


def test_killed_while_the_tool_ran_is_in_doubt_never_rerun(tmp_path: Path) -> None:
    """Killed after the effect but before its outcome was written: nobody knows whether it
    happened, so the resumed thread does not run it again — the model is told, the ledger holds
    the call in doubt for a person, and the world still holds one effect."""
    killed(run_lg(tmp_path, "start", crash_at="before_record"), tmp_path)
    out = finished(run_lg(tmp_path, "resume"), tmp_path)  # never re-run silently
    (answer,) = [m for m in out if m["type"] == "tool"]
    assert answer["status"] == "error" and "toolledger resolve" in answer["content"]
    with tl.open_store(f"sqlite:///{tmp_path / 'ledger.db'}") as store:
        (doubt,) = store.ledger(THREAD).in_doubt()
    assert doubt.tool_use_id == CALL_ID
