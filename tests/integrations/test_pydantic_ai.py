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
from pydantic_ai.messages import (  # noqa: E402
    ModelMessage,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402
from pydantic_ai.toolsets import FunctionToolset  # noqa: E402

import toolledger as tl  # noqa: E402
from toolledger.integrations.pydantic_ai import LedgerToolset, tool_context  # noqa: E402
from toolledger.records import Status  # noqa: E402

from .pydantic_ai_app import CALL_ID, CONVERSATION, build, scripted, world_toolset  # noqa: E402

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

    with capture_run_messages() as messages, pytest.raises(UnexpectedModelBehavior):
        agent.run_sync("boom", deps="bob")  # a ModelRetry, and retries=0: the model may not
    (failed,) = store.ledger("user-bob").records()
    assert failed.status is Status.FAILED and "backend down" in (failed.error or "")
    with pytest.raises(UnexpectedModelBehavior):  # a replay answers the same: a ModelRetry
        agent.run_sync(message_history=messages[:2], deps="bob")
    assert len(seen) == 2, "the failed call did not run again"
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
    with capture_run_messages() as messages:
        first = asyncio.run(agent.run("alpha", conversation_id="c"))
    assert "may already have happened" in first.output  # told, as the call's answer
    (doubt,) = store.ledger("c").in_doubt()
    assert doubt.tool_use_id == CALL_ID

    again = asyncio.run(agent.run(message_history=messages[:2]))  # the prompt, the call
    assert again.output == "done: line 1 (found)"
    assert executions == ["alpha"], "settled by the check, never run again"
    (record,) = store.ledger("c").records()
    assert record.status is Status.SUCCEEDED and record.result == '"line 1 (found)"'
    store.close()


# -- what the model is told ----------------------------------------------------------------------


def obliging(sent: list[str]) -> Any:
    """A scripted model that does what it is told: asked to retry a call (a retried tool return,
    or a retry prompt), it makes the call again, under a new id as a model does; told the call's
    answer, it says what it was. ``sent`` collects the text of every answer it was sent, as
    rendered for a model."""
    calls = 0

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        nonlocal calls
        answers = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart | RetryPromptPart)]
        for part in answers:
            rendered = (
                part.model_response_str()
                if isinstance(part, ToolReturnPart)
                else part.model_response()
            )
            sent.append(rendered)
        if answers and not any(asks_for_a_retry(p) for p in answers):
            return ModelResponse(parts=[TextPart(f"done: {answers[0].content}")])
        calls += 1
        return ModelResponse(
            parts=[ToolCallPart("append_line", {"text": "alpha"}, f"call_{calls}")]
        )

    return respond


def asks_for_a_retry(part: Any) -> bool:
    return isinstance(part, RetryPromptPart) or getattr(part, "outcome", None) == "retried"


def test_a_call_left_in_doubt_is_not_retried_under_a_new_id(tmp_path: Path) -> None:
    """The tool cannot tell whether its effect happened (``OutcomeUnknown``): the call is in
    doubt, and the model is told so as the call's answer — never asked to retry, which a model
    does under a new call id the ledger cannot match, running the effect twice."""
    world = tmp_path / "world.txt"
    tools = FunctionToolset[Any]()

    @tools.tool_plain
    def append_line(text: str) -> str:
        """Append a line; the connection drops before the answer."""
        with world.open("a") as f:
            f.write(text + "\n")
        raise tl.OutcomeUnknown("the connection dropped after the request was sent")

    sent: list[str] = []
    store = tl.open_store("memory://")
    agent = Agent(FunctionModel(obliging(sent)), toolsets=[LedgerToolset(tools, store=store)])
    with capture_run_messages() as messages:
        result = agent.run_sync("alpha", conversation_id="c")
    assert world.read_text() == "alpha\n", "the effect happened once"
    (doubt,) = store.ledger("c").in_doubt()
    assert doubt.tool_use_id == "call_1"
    (told,) = sent
    assert "may already have happened" in told and "Do not retry it under a new call" in told
    assert "try again" not in told.lower()
    (answer,) = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    assert not asks_for_a_retry(answer)
    assert result.output == f"done: {answer.content}"

    again = agent.run_sync(message_history=messages[:2])  # the prompt, the call: the same id
    assert world.read_text() == "alpha\n", "never run again"
    (still,) = sent[1:]  # still in doubt, and still not to be retried
    assert "may already have happened" in still and "Do not retry it under a new call" in still
    assert [p.outcome for p in again.new_messages()[0].parts] == ["failed"]
    assert store.ledger("c").in_doubt() == [doubt]
    store.close()


def test_a_declined_call_is_not_retried_under_a_new_id(tmp_path: Path) -> None:
    """A high-impact call the approver declined: the model is told it was declined as the call's
    answer, not asked to retry it (which would put the same action to the approver again under a
    new id); the denial stands for the call's id."""
    world = tmp_path / "world.txt"
    asked: list[str] = []

    def approve(request: Any) -> tl.Decision:
        asked.append(request.tool_use_id)
        return tl.Decision(approved=False, by="ana")

    sent: list[str] = []
    store = tl.open_store("memory://")
    ledgered = LedgerToolset(
        world_toolset(world),
        store=store,
        effects={"append_line": {"effect": "non_idempotent", "high_impact": True}},
        approve=approve,
    )
    agent = Agent(FunctionModel(obliging(sent)), toolsets=[ledgered])
    with capture_run_messages() as messages:
        result = agent.run_sync("alpha", conversation_id="c")
    assert not world.exists(), "nothing ran"
    assert asked == ["call_1"], "asked once"
    (record,) = store.ledger("c").records()
    assert (record.tool_use_id, record.status) == ("call_1", Status.DENIED)
    (told,) = sent
    assert "declined by ana" in told and "try again" not in told.lower()
    assert result.output.startswith("done: declined by ana")

    again = agent.run_sync(message_history=messages[:2])
    assert asked == ["call_1"], "the denial answers the replay; nobody is asked again"
    assert sent[1:] == [told]
    assert again.output == result.output
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
    the call again; the model is told (a failed return naming ``toolledger resolve``, not a
    retry) and the ledger holds the call in doubt for a person."""
    killed(run_pa(tmp_path, "start", crash_at="before_record"), tmp_path)
    out = finished(run_pa(tmp_path, "resume"), tmp_path)  # never re-run silently
    (told,) = out["returns"]
    assert "may already have happened" in told and "toolledger resolve" in told
    with tl.open_store(f"sqlite:///{tmp_path / 'ledger.db'}") as store:
        (doubt,) = store.ledger(CONVERSATION).in_doubt()
    assert doubt.tool_use_id == CALL_ID


def test_a_result_pydantic_serialises_reaches_the_model_and_the_ledger_in_full() -> None:
    """A tool returning what Pydantic AI serialises for the model (a date, a UUID, a Decimal)
    gives the model the same data through the ledger as without it, recorded in full — not
    toolledger's "result not stored in full" note with a Python repr."""
    import datetime
    import decimal
    import json
    import uuid

    def invoice(order: str) -> dict[str, Any]:
        """Invoice an order."""
        return {
            "order": order,
            "due": datetime.date(2026, 1, 2),
            "ref": uuid.UUID("12345678-1234-5678-1234-567812345678"),
            "amount": decimal.Decimal("9.50"),
        }

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            call = ToolCallPart("invoice", {"order": "A-7"}, tool_call_id="c-1")
            return ModelResponse(parts=[call])
        return ModelResponse(parts=[TextPart("done")])

    sent: list[str] = []
    with tl.open_store("memory://") as store:
        for toolset in (
            FunctionToolset([invoice]),
            LedgerToolset(FunctionToolset([invoice]), store=store),
        ):
            with capture_run_messages() as messages:
                Agent(FunctionModel(model), toolsets=[toolset]).run_sync("go", conversation_id="s")
            (part,) = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
            sent.append(part.model_response_str())
        record = store.ledger("s").get("c-1")
    plain, ledgered = (json.loads(text) for text in sent)
    assert (
        ledgered
        == plain
        == {
            "order": "A-7",
            "due": "2026-01-02",
            "ref": "12345678-1234-5678-1234-567812345678",
            "amount": "9.50",
        }
    )
    assert record is not None and json.loads(record.result or "null") == plain
