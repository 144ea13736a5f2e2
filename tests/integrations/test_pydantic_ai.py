"""toolledger.integrations.pydantic_ai: one Agent, a ledger per conversation, and a real kill.

Offline: the model is a scripted ``FunctionModel``. Effects are counted in a "world" file the
tool appends to, and real executions in a list; the kill is a ``SIGKILL`` of a separate process,
resumed in another from the message history it saved before the tool ran.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from .apps import WORLD, finished, killed, run_app
from .conftest import require

require("pydantic_ai", "pydantic-ai")

from pydantic_ai import Agent, UnexpectedModelBehavior, capture_run_messages  # noqa: E402
from pydantic_ai.messages import ToolReturnPart  # noqa: E402
from pydantic_ai.models.function import FunctionModel  # noqa: E402
from pydantic_ai.toolsets import FunctionToolset  # noqa: E402

import toolledger as tl  # noqa: E402
from toolledger.integrations.pydantic_ai import LedgerToolset, tool_context  # noqa: E402
from toolledger.records import Status  # noqa: E402

from .pydantic_ai_app import CALL_ID, CONVERSATION, build, scripted  # noqa: E402

APP = str(Path(__file__).with_name("pydantic_ai_app.py"))


def returns(messages: list[Any]) -> list[Any]:
    return [p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]


def test_one_agent_serves_every_conversation_each_in_its_own_ledger(tmp_path: Path) -> None:
    world = tmp_path / "world.txt"
    executions: list[str] = []
    with tl.open_store(f"sqlite:///{tmp_path / 'ledger.db'}") as store:
        agent = build(store, world, executions)
        a = agent.run_sync("alpha", conversation_id="conv-a")
        b = agent.run_sync("beta", conversation_id="conv-b")
        # The model used the same call id in both: two calls, two effects, two ledgers.
        assert executions == ["alpha", "beta"]
        assert world.read_text() == "alpha\nbeta\n"
        (ra,) = store.ledger("conv-a").records()
        (rb,) = store.ledger("conv-b").records()
        assert (ra.tool_use_id, ra.status, ra.result) == (CALL_ID, Status.SUCCEEDED, '"line 1"')
        assert (rb.tool_use_id, rb.status, rb.result) == (CALL_ID, Status.SUCCEEDED, '"line 2"')
        assert set(store.sessions()) == {"conv-a", "conv-b"}
    assert (a.output, b.output) == ("done: line 1", "done: line 2")


def test_a_replayed_history_answers_from_the_ledger(tmp_path: Path) -> None:
    """The messages up to the model's tool call, passed back as ``message_history``: Pydantic AI
    runs the call again under the same id (and the same conversation, stamped on the history),
    and the ledger answers it; the tool does not run."""
    world = tmp_path / "world.txt"
    executions: list[str] = []
    with tl.open_store(f"sqlite:///{tmp_path / 'ledger.db'}") as store:
        agent = build(store, world, executions)
        first = agent.run_sync("alpha", conversation_id="conv")
        up_to_the_call = first.all_messages()[:2]  # the prompt, the response with the call
        again = agent.run_sync(message_history=up_to_the_call)
        (record,) = store.ledger("conv").records()
    assert executions == ["alpha"], "the tool ran once"
    assert world.read_text() == "alpha\n"
    assert record.attempt == 1
    assert returns(first.new_messages()) == returns(again.new_messages()) == ["line 1"]
    assert again.output == "done: line 1"


def test_session_from_deps_and_the_running_calls_context() -> None:
    """``session=`` as a function of the run (here of ``deps``); the running call sees its
    ToolContext and idempotency key; a failing tool is recorded failed and told to the model."""
    seen: list[tl.ToolContext | None] = []
    keys: list[str | None] = []
    tools = FunctionToolset[str]()

    @tools.tool_plain
    def append_line(text: str) -> str:
        """Append a line."""
        seen.append(tool_context())
        keys.append(tl.keys.current_key())
        if text == "boom":
            raise ValueError("backend down")
        return "ok"

    store = tl.open_store("memory://")
    ledgered = LedgerToolset(tools, store=store, session=lambda ctx: f"user-{ctx.deps}")
    agent = Agent(FunctionModel(scripted), toolsets=[ledgered], deps_type=str, retries=0)
    result = agent.run_sync("hello", deps="ana")
    assert result.output == "done: ok"
    (ctx,) = seen
    assert ctx is not None and (ctx.session_id, ctx.tool_use_id) == ("user-ana", CALL_ID)
    assert keys == [ctx.idempotency_key]

    with pytest.raises(UnexpectedModelBehavior):  # retries=0: the model may not retry
        agent.run_sync("boom", deps="bob")
    (failed,) = store.ledger("user-bob").records()
    assert failed.status is Status.FAILED and "backend down" in (failed.error or "")
    store.close()


def test_a_bad_declaration_is_refused_at_construction() -> None:
    with pytest.raises(tl.ConfigurationError, match="unknown keys"):
        LedgerToolset(
            FunctionToolset[Any](),
            store=tl.open_store("memory://"),
            effects={"x": {"effekt": "read_only"}},
        )
    with pytest.raises(tl.ConfigurationError, match="effect="):
        LedgerToolset(
            FunctionToolset[Any](),
            store=tl.open_store("memory://"),
            effects={"x": {"effect": "sometimes"}},
        )


def test_an_in_doubt_call_is_settled_by_the_check_of_its_tl_tool_declaration(
    tmp_path: Path,
) -> None:
    """A tool declared by a ``@tl.tool`` with a ``check``: its first attempt cannot tell whether
    it took effect (``OutcomeUnknown``), so the call is in doubt; the replayed call is settled by
    the check, not run again."""
    world = tmp_path / "world.txt"
    executions: list[str] = []
    tools = FunctionToolset[Any]()

    @tools.tool_plain
    async def append_line(text: str) -> str:
        """Append a line; the connection drops before the answer."""
        executions.append(text)
        with world.open("a") as f:
            f.write(text + "\n")
        raise tl.OutcomeUnknown("the connection dropped after the request was sent")

    @tl.tool(effect="non_idempotent")
    def declared(text: str) -> str:
        """What running append_line twice would do, and how to tell whether it happened."""
        raise AssertionError("only a declaration")

    @declared.check
    def _(text: str) -> str | None:
        return "line 1 (found)" if text in world.read_text().splitlines() else None

    store = tl.open_store("memory://")
    ledgered = LedgerToolset(tools, store=store, effects={"append_line": declared})
    agent = Agent(FunctionModel(scripted), toolsets=[ledgered], retries=0)
    with capture_run_messages() as messages, pytest.raises(UnexpectedModelBehavior):
        asyncio.run(agent.run("alpha", conversation_id="c"))
    (doubt,) = store.ledger("c").in_doubt()
    assert doubt.tool_use_id == CALL_ID

    again = asyncio.run(agent.run(message_history=messages[:2]))  # the prompt, the call
    assert again.output == "done: line 1 (found)"
    assert executions == ["alpha"], "settled by the check, never run again"
    (record,) = store.ledger("c").records()
    assert record.status is Status.SUCCEEDED and record.result == '"line 1 (found)"'
    store.close()


# -- a real kill ----------------------------------------------------------------------------------


def run_pa(tmp_path: Path, phase: str, crash_at: str | None = None) -> Any:
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    history, world = str(tmp_path / "history.json"), str(tmp_path / WORLD)
    return run_app(APP, ledger, history, world, phase, crash_at=crash_at)


def saved_parts(tmp_path: Path) -> list[str]:
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    saved = ModelMessagesTypeAdapter.validate_json((tmp_path / "history.json").read_bytes())
    return [p.part_kind for m in saved for p in m.parts]


def test_killed_after_the_outcome_then_resumed_from_the_saved_history(tmp_path: Path) -> None:
    """The effect happened and its outcome is recorded, but the process died before the tool's
    return reached the saved history. The resumed run makes the call again under the same id and
    gets the recorded result; the world holds one effect."""
    killed(run_pa(tmp_path, "start", crash_at="after_record"), tmp_path)
    assert saved_parts(tmp_path) == ["user-prompt", "tool-call"], "no tool return was saved"

    out = finished(run_pa(tmp_path, "resume"), tmp_path)
    assert out["returns"] == ["line 1"]
    assert out["output"] == "done: line 1"
    assert {"kind": "tool-return", "id": CALL_ID} in out["parts"]
    with tl.open_store(f"sqlite:///{tmp_path / 'ledger.db'}") as store:
        (record,) = store.ledger(CONVERSATION).records()
    assert (record.status, record.result, record.attempt) == (Status.SUCCEEDED, '"line 1"', 1)


def test_killed_while_the_tool_ran_is_in_doubt_never_rerun(tmp_path: Path) -> None:
    """Killed after the effect but before its outcome was written: the resumed run does not run
    the call again; the model is told (a retry prompt naming ``toolledger resolve``) and the
    ledger holds the call in doubt for a person."""
    killed(run_pa(tmp_path, "start", crash_at="before_record"), tmp_path)
    out = finished(run_pa(tmp_path, "resume"), tmp_path)  # never re-run silently
    (told,) = out["returns"]
    assert "may already have happened" in told and "toolledger resolve" in told
    with tl.open_store(f"sqlite:///{tmp_path / 'ledger.db'}") as store:
        (doubt,) = store.ledger(CONVERSATION).in_doubt()
    assert doubt.tool_use_id == CALL_ID
