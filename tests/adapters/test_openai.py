"""OpenAI: run_tool_uses on Chat Completions and Responses shapes, and the Agent on both APIs,
with the real ``openai`` SDK against the scripted OpenAI server."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import openai
import pytest

import toolledger as tl
from toolledger._verify import verify
from toolledger.adapters import provider_for
from toolledger.adapters.openai import (
    ERROR_PREFIX,
    OpenAIChat,
    OpenAIResponses,
)
from toolledger.ops import AppendMessages, PutSession
from toolledger.records import StoredMessage
from toolledger.testing.scripted import Flaky, Reply, ToolUse
from toolledger.testing.scripted_openai import RawArguments, ScriptedOpenAI
from toolledger.testing.world import World

TICKET = ToolUse("create_ticket", {"title": "Outage"})
APIS = ["chat", "responses"]


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path / "world")


def client_for(model: ScriptedOpenAI, api: str) -> Any:
    return model.client() if api == "chat" else OpenAIResponses(model.client())


def agent_for(
    model: ScriptedOpenAI, api: str, store: tl.Store, world: World, **kw: Any
) -> tl.Agent:
    return tl.Agent(
        client=client_for(model, api),
        model="gpt-test",
        tools=world.toolset(),
        store=store,
        **kw,
    )


# -- the provider is picked from the client -------------------------------------------------------


def test_importing_toolledger_does_not_import_the_openai_sdk() -> None:
    code = (
        "import sys, toolledger, toolledger.adapters.openai, toolledger._verify; "
        "print('openai' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"


def test_provider_for_openai_clients() -> None:
    sync = openai.OpenAI(api_key="x", base_url="http://127.0.0.1:9/v1")
    chat = provider_for(sync)
    assert isinstance(chat, OpenAIChat) and not chat.is_async
    aio = provider_for(openai.AsyncOpenAI(api_key="x", base_url="http://127.0.0.1:9/v1"))
    assert isinstance(aio, OpenAIChat) and aio.is_async
    responses = OpenAIResponses(sync, store=False)
    assert provider_for(responses) is responses
    import anthropic

    default = provider_for(anthropic.Anthropic(api_key="x", base_url="http://127.0.0.1:9"))
    assert default.name == "anthropic"  # the default stays Anthropic


def test_toolset_in_openai_shapes(world: World) -> None:
    tools = world.toolset()
    chat = tools.to_openai()[0]
    assert chat["type"] == "function" and chat["function"]["name"] == "create_ticket"
    assert chat["function"]["parameters"]["required"] == ["title"]
    resp = tools.to_openai_responses()[0]
    assert resp["name"] == "create_ticket" and resp["strict"] is False
    assert resp["parameters"] == chat["function"]["parameters"]


# -- run_tool_uses takes OpenAI shapes ------------------------------------------------------------


def counting_tool() -> tuple[list[str], tl.Tool[Any, Any]]:
    ran: list[str] = []

    @tl.tool(effect="non_idempotent")
    def create_ticket(title: str) -> dict[str, str]:
        """Open a ticket."""
        ran.append(title)
        return {"ticket": f"T-{len(ran)}"}

    return ran, create_ticket


def test_run_tool_uses_on_a_chat_completion_message(tmp_path: Path) -> None:
    ran, create_ticket = counting_tool()
    script = [Reply(tool_uses=[TICKET, ToolUse("create_ticket", {"title": "Second"})])]
    with ScriptedOpenAI(script) as model, tl.open_store(f"sqlite:///{tmp_path}/l.db") as store:
        completion = model.client().chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "go"}]
        )
        message = completion.choices[0].message
        ledger = store.ledger("s")
        results = tl.run_tool_uses(message, [create_ticket], ledger=ledger)
        ids = [tc.id for tc in message.tool_calls or []]
        assert results == [
            {"role": "tool", "tool_call_id": ids[0], "content": '{"ticket": "T-1"}'},
            {"role": "tool", "tool_call_id": ids[1], "content": '{"ticket": "T-2"}'},
        ]
        # Every shape of the same message answers from the ledger: nothing runs again.
        as_dict = message.model_dump()
        for shape in (message, completion, as_dict, as_dict["tool_calls"], message.tool_calls):
            assert tl.run_tool_uses(shape, [create_ticket], ledger=ledger) == results
    assert ran == ["Outage", "Second"]


def test_run_tool_uses_on_responses_output(tmp_path: Path) -> None:
    ran, create_ticket = counting_tool()
    script = [Reply(text="On it.", tool_uses=[TICKET])]
    with ScriptedOpenAI(script) as model, tl.open_store(f"sqlite:///{tmp_path}/l.db") as store:
        response = model.client().responses.create(model="gpt-test", input="go")
        ledger = store.ledger("s")
        results = tl.run_tool_uses(response.output, [create_ticket], ledger=ledger)
        (call,) = [item for item in response.output if item.type == "function_call"]
        assert results == [
            {"type": "function_call_output", "call_id": call.call_id, "output": '{"ticket": "T-1"}'}
        ]
        plain = [item.model_dump() for item in response.output]
        for shape in (response, plain, response.model_dump()):
            assert tl.run_tool_uses(shape, [create_ticket], ledger=ledger) == results
    assert ran == ["Outage"]


def test_an_async_run_on_openai_shapes(tmp_path: Path) -> None:
    ran, create_ticket = counting_tool()
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "create_ticket", "arguments": '{"title": "A"}'},
            }
        ],
    }
    with tl.open_store("memory://") as store:
        ledger = store.ledger("s")
        results = asyncio.run(tl.arun_tool_uses(message, [create_ticket], ledger=ledger))
    assert results[0]["content"] == '{"ticket": "T-1"}' and ran == ["A"]


@pytest.mark.parametrize(
    ("arguments", "why"),
    [("{not json", "invalid JSON"), ("[1, 2]", "got an array"), ("null", "got null")],
)
def test_arguments_that_are_not_a_json_object_answer_an_error(arguments: str, why: str) -> None:
    ran, create_ticket = counting_tool()
    message = {
        "role": "assistant",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "create_ticket", "arguments": arguments},
            }
        ],
    }
    with tl.open_store("memory://") as store:
        ledger = store.ledger("s")
        (result,) = tl.run_tool_uses(message, [create_ticket], ledger=ledger)
        assert ledger.records() == []
    assert ran == [], "nothing ran"
    assert result["tool_call_id"] == "call_1"
    assert result["content"].startswith(ERROR_PREFIX + "the arguments of 'create_ticket' are not")
    assert why in result["content"] and "call it again" in result["content"]


def test_empty_arguments_mean_no_arguments() -> None:
    @tl.tool(effect="read_only")
    def status() -> str:
        return "green"

    items = [{"type": "function_call", "call_id": "c1", "name": "status", "arguments": ""}]
    with tl.open_store("memory://") as store:
        (result,) = tl.run_tool_uses(items, [status], ledger=store.ledger("s"))
    assert result == {"type": "function_call_output", "call_id": "c1", "output": "green"}


def test_a_failing_tool_is_an_error_result_and_a_call_id_twice_is_refused() -> None:
    @tl.tool
    def boom(x: int) -> None:
        raise RuntimeError("down")

    call = {"id": "call_1", "type": "function", "function": {"name": "boom", "arguments": "{}"}}
    with tl.open_store("memory://") as store:
        ledger = store.ledger("s")
        (result,) = tl.run_tool_uses([call], [boom], ledger=ledger)
        assert (
            result["content"].startswith(ERROR_PREFIX) and "x: Field required" in result["content"]
        )
        good = {**call, "function": {"name": "boom", "arguments": '{"x": 1}'}}
        (result,) = tl.run_tool_uses([good], [boom], ledger=ledger)
        assert result["content"] == ERROR_PREFIX + "'boom' failed: RuntimeError: down"
        with pytest.raises(tl.MalformedContentError, match="appears twice"):
            tl.run_tool_uses([good, good], [boom], ledger=ledger)


# -- the agent on both APIs -----------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
def test_a_session_runs_to_completion(api: str, store: tl.Store, world: World) -> None:
    with ScriptedOpenAI(
        [Reply(text="On it.", tool_uses=[TICKET]), Reply(text="Ticket open.")]
    ) as m:
        run = agent_for(m, api, store, world, system="Be brief.").run(session="s", prompt="Outage!")
    assert run.status is tl.RunStatus.COMPLETED and run.final_text == "Ticket open."
    assert run.turns == 2 and run.usage.input_tokens > 0 and run.usage.output_tokens > 0
    assert len(world.tickets()) == 1 and m.rejected == []
    first, second = m.requests
    if api == "chat":
        assert m.paths == ["/v1/chat/completions"] * 2
        assert first["messages"][0] == {"role": "system", "content": "Be brief."}
        assert first["messages"][1] == {"role": "user", "content": "Outage!"}
        assert first["max_completion_tokens"] == 4096
        assert [t["function"]["name"] for t in first["tools"]] == world.toolset().names
        call = second["messages"][2]["tool_calls"][0]
        assert second["messages"][3]["tool_call_id"] == call["id"]
        final = {"role": "assistant", "content": "Ticket open."}
        assert run.messages == [*second["messages"][1:], final]
    else:
        assert m.paths == ["/v1/responses"] * 2
        assert first["instructions"] == "Be brief." and first["max_output_tokens"] == 4096
        assert first["input"] == [{"role": "user", "content": "Outage!"}]
        assert [t["name"] for t in first["tools"]] == world.toolset().names
        call = next(i for i in second["input"] if i.get("type") == "function_call")
        assert second["input"][-1]["call_id"] == call["call_id"]
        assert run.messages[: len(second["input"])] == second["input"]
    assert verify(store) == []


@pytest.mark.parametrize("api", APIS)
def test_resume_and_a_new_prompt(api: str, store: tl.Store, world: World) -> None:
    script = [Reply(tool_uses=[TICKET]), Reply(text="open"), Reply(text="closed")]
    with ScriptedOpenAI(script) as m:
        agent = agent_for(m, api, store, world)
        assert agent.run(session="s", prompt="open it").status is tl.RunStatus.COMPLETED
        assert agent.run(session="s", prompt="open it").final_text == "open"  # nothing re-run
        run = agent.run(session="s", prompt="close it")
    assert run.final_text == "closed" and len(world.tickets()) == 1 and m.rejected == []
    assert len(m.requests) == 3


@pytest.mark.parametrize("api", APIS)
def test_async_agent(api: str, store: tl.Store, world: World) -> None:
    with ScriptedOpenAI([Reply(tool_uses=[TICKET]), Reply(text="done")]) as m:
        client = m.async_client() if api == "chat" else OpenAIResponses(m.async_client())
        agent = tl.Agent(client=client, model="gpt-test", tools=world.toolset(), store=store)
        with pytest.raises(tl.ConfigurationError, match="arun"):
            agent.run(session="s", prompt="go")
        run = asyncio.run(agent.arun(session="s", prompt="go"))
    assert run.status is tl.RunStatus.COMPLETED and len(world.tickets()) == 1


@pytest.mark.parametrize("api", APIS)
def test_invalid_arguments_from_the_model_go_back_as_an_error(
    api: str, store: tl.Store, world: World
) -> None:
    script = [
        Reply(tool_uses=[RawArguments("create_ticket", arguments='{"title": ')]),
        Reply(tool_uses=[TICKET]),
        Reply(text="done"),
    ]
    with ScriptedOpenAI(script) as m:
        run = agent_for(m, api, store, world).run(session="s", prompt="go")
        second = m.requests[1]
    assert run.status is tl.RunStatus.COMPLETED and len(world.tickets()) == 1
    answer = second["messages"][-1]["content"] if api == "chat" else second["input"][-1]["output"]
    assert answer.startswith(ERROR_PREFIX + "the arguments of 'create_ticket' are not a JSON")
    assert m.rejected == [] and verify(store) == []


@pytest.mark.parametrize("arguments", ['{"title": NaN}', '{"title": "x", "n": 1e400}'])
@pytest.mark.parametrize("api", APIS)
def test_arguments_with_a_number_json_cannot_hold_go_back_as_an_error(
    api: str, arguments: str, store: tl.Store, world: World
) -> None:
    """``NaN`` (which Python's JSON reader takes) and ``1e400`` (read as infinity) cannot be
    hashed: the model is told, as for any arguments it can write again — the session goes on,
    not failed with the model asked the same question at every run."""
    script = [
        Reply(tool_uses=[RawArguments("create_ticket", arguments=arguments)]),
        Reply(tool_uses=[TICKET]),
        Reply(text="done"),
    ]
    with ScriptedOpenAI(script) as m:
        run = agent_for(m, api, store, world).run(session="s", prompt="go")
        second = m.requests[1]
    assert run.status is tl.RunStatus.COMPLETED and len(world.tickets()) == 1
    answer = second["messages"][-1]["content"] if api == "chat" else second["input"][-1]["output"]
    assert answer.startswith(ERROR_PREFIX + "the arguments of 'create_ticket' are not a JSON")
    assert m.rejected == [] and verify(store) == []


@pytest.mark.parametrize("api", APIS)
def test_a_flaky_model_fails_the_run_and_the_next_run_retries(
    api: str, store: tl.Store, world: World
) -> None:
    with ScriptedOpenAI([Flaky(Reply(text="hello"), status=503)]) as m:
        agent = agent_for(m, api, store, world)
        with pytest.raises(tl.ModelCallError) as failed:
            agent.run(session="s", prompt="hi")
        assert failed.value.status_code == 503
        assert isinstance(failed.value.__cause__, openai.APIStatusError)
        assert agent.run(session="s").final_text == "hello"


@pytest.mark.parametrize("api", APIS)
def test_queued_approval_stops_then_proceeds(api: str, store: tl.Store) -> None:
    @tl.tool(high_impact=True)
    def wire(amount: int) -> str:
        """Wire money."""
        return "wired"

    with ScriptedOpenAI(
        [Reply(tool_uses=[ToolUse("wire", {"amount": 5})]), Reply(text="paid")]
    ) as m:
        agent = tl.Agent(
            client=client_for(m, api),
            model="gpt",
            tools=[wire],
            store=store,
            approve=tl.approvals.queue,
        )
        assert agent.run(session="pay", prompt="pay").status is tl.RunStatus.AWAITING_APPROVAL
        (request,) = tl.approvals.pending(store, "pay")
        tl.approvals.decide(store, "pay", request.tool_use_id, approved=True, by="ana")
        assert agent.run(session="pay").status is tl.RunStatus.COMPLETED
    assert m.rejected == []


# -- the scripted server and verify speak OpenAI's pairing rule -----------------------------------


def test_the_scripted_server_rejects_broken_pairing_like_the_api() -> None:
    with ScriptedOpenAI([Reply(text="a"), Reply(text="b")]) as m:
        client = m.client()
        orphan = [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_x",
                        "type": "function",
                        "function": {"name": "f", "arguments": "{}"},
                    }
                ],
            },
            {"role": "user", "content": "and?"},
        ]
        with pytest.raises(openai.BadRequestError, match="call_x"):
            client.chat.completions.create(model="m", messages=orphan)
        items = [
            {"role": "user", "content": "hi"},
            {"type": "function_call_output", "call_id": "call_y", "output": "x"},
        ]
        with pytest.raises(openai.BadRequestError, match="No tool call found"):
            client.responses.create(model="m", input=items)
    assert len(m.rejected) == 2


def _append(store: tl.Store, sid: str, role: str, content: Any) -> None:
    state = store.backend.read_session(sid)
    assert state is not None
    store.backend.apply(
        sid,
        [
            AppendMessages(
                (StoredMessage(seq=state.messages, role=role, content=content, created_at=0.0),)
            ),
            PutSession(
                replace(state, version=state.version + 1, messages=state.messages + 1),
                state.version,
            ),
        ],
    )


@pytest.mark.parametrize("api", APIS)
def test_verify_finds_an_openai_transcript_that_lies(
    api: str, store: tl.Store, world: World
) -> None:
    with ScriptedOpenAI([Reply(tool_uses=[TICKET]), Reply(text="done")]) as m:
        agent_for(m, api, store, world).run(session="s", prompt="go")
    assert verify(store) == []
    if api == "chat":
        _append(
            store, "s", "tool", {"role": "tool", "tool_call_id": "call_forged", "content": "ok"}
        )
    else:
        forged = [{"type": "function_call_output", "call_id": "call_forged", "output": "ok"}]
        _append(store, "s", "tool", forged)
    found = [p.message for p in verify(store)]
    assert any("call_forged succeeded but the ledger has no record" in p for p in found), found
    assert any("call_forged" in p and "transcript:" in p for p in found), found


def test_run_messages_are_json(store: tl.Store, world: World) -> None:
    with ScriptedOpenAI([Reply(tool_uses=[TICKET]), Reply(text="done")]) as m:
        run = agent_for(m, "chat", store, world).run(session="s", prompt="go")
    json.dumps(run.messages)
    assert [m["role"] for m in run.messages] == ["user", "assistant", "tool", "assistant"]


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("arguments", ["", '{"env": "sta'], ids=["none-yet", "half"])
def test_a_call_cut_off_by_the_output_limit_is_neither_stored_nor_run(
    api: str, arguments: str, store: tl.Store
) -> None:
    """A reply that hit its output limit (``finish_reason`` ``length``, a response
    ``incomplete``) while it wrote a call: its arguments may be cut short — cut before they
    began they read as none, ``{}``, and a tool with defaults would run as nobody asked. Nothing
    runs; the session keeps only its prompt, and the next run asks the model again."""
    deployed: list[str] = []

    @tl.tool(effect="non_idempotent")
    def deploy(env: str = "production") -> str:
        """Deploy."""
        deployed.append(env)
        return f"deployed to {env}"

    stop = "length" if api == "chat" else "max_output_tokens"
    cut = Reply(tool_uses=[RawArguments("deploy", arguments=arguments)], stop_reason=stop)
    with ScriptedOpenAI([cut]) as m:
        agent = tl.Agent(client=client_for(m, api), model="gpt-test", tools=[deploy], store=store)
        with pytest.raises(tl.MalformedContentError, match="stopped at") as info:
            agent.run(session="s", prompt="deploy to staging")
    assert deployed == [], "a call cut short never runs"
    assert info.value.tool_use_id is not None
    assert [msg.role for msg in store.messages("s")] == ["user"]
    whole = Reply(tool_uses=[ToolUse("deploy", {"env": "staging"})])
    with ScriptedOpenAI([whole, Reply(text="done")]) as m:
        agent = tl.Agent(client=client_for(m, api), model="gpt-test", tools=[deploy], store=store)
        assert agent.run(session="s", prompt="deploy to staging").status is tl.RunStatus.COMPLETED
    assert deployed == ["staging"]


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("streamed", [False, True], ids=["unstreamed", "streamed"])
def test_a_call_cut_off_by_the_content_filter_is_neither_stored_nor_run(
    api: str, streamed: bool, store: tl.Store
) -> None:
    """A reply the content filter stopped (``finish_reason`` ``content_filter``; a response
    ``incomplete`` for that reason) while it wrote a call: as at the length limit, its
    arguments may be cut short — cut before they began they read as ``{}``, and a tool with
    defaults would run as nobody asked. Nothing runs; the session keeps only its prompt; the
    error says what gets the whole call (not a larger ``max_tokens``)."""
    deployed: list[str] = []

    @tl.tool(effect="non_idempotent")
    def deploy(env: str = "production") -> str:
        """Deploy."""
        deployed.append(env)
        return f"deployed to {env}"

    cut = Reply(tool_uses=[RawArguments("deploy", arguments="")], stop_reason="content_filter")
    with ScriptedOpenAI([cut, Reply(text="done")]) as m:
        agent = tl.Agent(client=client_for(m, api), model="gpt-test", tools=[deploy], store=store)
        on_text = {"on_text": lambda _: None} if streamed else {}
        with pytest.raises(tl.MalformedContentError, match="content filter") as info:
            agent.run(session="s", prompt="deploy to staging", **on_text)
    assert "change what the prompt asks for" in str(info.value)
    assert "max_tokens" not in str(info.value)
    assert deployed == [], "a call cut short never runs"
    assert info.value.tool_use_id is not None
    assert [msg.role for msg in store.messages("s")] == ["user"]


def test_a_stopped_stream_whose_sdk_kept_no_reply_is_a_stream_cut_off() -> None:
    """The SDK's stream raised for a reply stopped at its limit or filter, with nothing of it
    attached (a ``completion`` of ``None``, or none at all): nothing is at hand to store or
    run, and it is said so — a model API failure the run expects, not an ``AttributeError``."""
    from toolledger.adapters._shapes import StreamCutOff
    from toolledger.adapters.openai_chat import _completion_of

    class Bare(Exception):
        pass

    class NoReply(Exception):
        completion = None

    for stopped in (Bare(), NoReply()):
        with pytest.raises(StreamCutOff, match="kept nothing of the reply"):
            _completion_of(stopped)


@pytest.mark.parametrize(
    "status", ["failed", "cancelled", "queued", "in_progress"], ids=lambda s: s
)
def test_a_response_that_is_not_over_is_neither_stored_nor_run(
    status: str, store: tl.Store
) -> None:
    """``responses.create`` answers with a ``Response`` whatever its ``status``: one that
    ``failed`` (or was ``cancelled``) with a call in its output — its arguments as far as the
    model got —, or one not yet over (``queued``, ``in_progress``: ``background=True`` among the
    options) with no output at all. Only a ``completed`` or ``incomplete`` response is the
    model's reply: any other is refused, nothing of it stored or run (the stream already refuses
    ``response.failed``), not a call run or the session ``completed`` with an empty answer."""
    deployed: list[str] = []

    @tl.tool(effect="non_idempotent")
    def deploy(env: str = "production") -> str:
        """Deploy."""
        deployed.append(env)
        return f"deployed to {env}"

    call = Reply(tool_uses=[RawArguments("deploy", arguments='{"env": "sta')])
    with ScriptedOpenAI([call, Reply(text="done")]) as m:
        played = m.reply

        def reply(path: str, r: Reply, body: dict[str, Any]) -> dict[str, Any]:
            out = played(path, r, body)
            if status in ("queued", "in_progress"):
                out["output"] = []
            return {**out, "status": status, "error": None}

        m.reply = reply  # type: ignore[method-assign]
        agent = tl.Agent(
            client=OpenAIResponses(m.client()), model="gpt-test", tools=[deploy], store=store
        )
        with pytest.raises(tl.MalformedContentError, match=f"status {status!r}"):
            agent.run(session="s", prompt="deploy to staging")
    assert deployed == [], "a call of a response that is not over never runs"
    assert [msg.role for msg in store.messages("s")] == ["user"]
    state = store.session("s")
    assert state is not None and state.status is tl.RunStatus.FAILED, state
