"""Streaming (``Agent.run(on_text=...)``, ``Agent.stream``, ``arun(on_text=...)``) through the
real ``anthropic`` and ``openai`` SDKs (Chat Completions and the Responses API) against scripted
servers that send server-sent events:
the text arrives piece by piece, the stored transcript is the one a non-streamed run stores, and
a process ``SIGKILL``ed mid-stream loses only the partial text — the resume asks again, and the
tool that ran before the kill does not run twice (counted in the world: ticket files)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse
from toolledger.testing.scripted_openai import ScriptedOpenAI

TEXT_1 = "Opening a ticket for the outage now."
TEXT_2 = "Ticket T-1 is open; the on-call engineer has it."


def script() -> list[Reply]:
    return [
        Reply(text=TEXT_1, tool_uses=[ToolUse("create_ticket", {"title": "Outage"}, id="call_1")]),
        Reply(text=TEXT_2),
    ]


def tools(world: Path) -> list[tl.Tool]:
    @tl.tool(effect="non_idempotent")
    def create_ticket(title: str) -> dict[str, str]:
        """Open a ticket (a file in the world)."""
        world.mkdir(parents=True, exist_ok=True)
        n = len(list(world.glob("ticket-*"))) + 1
        (world / f"ticket-{n}").write_text(title)
        return {"ticket": f"T-{n}"}

    return [create_ticket]


APIS = ["anthropic", "openai-chat", "openai-responses"]


def stored(store: tl.Store, session: str) -> list[tuple[str, Any]]:
    """The session's transcript, without the ids the Responses API mints for each output item
    (``msg_…``, ``fc_…``: new in every response, streamed or not; call ids are kept)."""
    return [(m.role, _unminted(m.content)) for m in store.messages(session)]


def _unminted(content: Any) -> Any:
    if isinstance(content, list):
        return [_unminted(item) for item in content]
    if isinstance(content, dict):
        minted = content.get("type") in ("message", "function_call")
        return {k: _unminted(v) for k, v in content.items() if not (minted and k == "id")}
    return content


def server_for(api: str) -> ScriptedModel | ScriptedOpenAI:
    return ScriptedModel(script()) if api == "anthropic" else ScriptedOpenAI(script())


def client_for(api: str, model: ScriptedModel | ScriptedOpenAI, *, aio: bool = False) -> Any:
    client = model.async_client() if aio else model.client()
    return tl.OpenAIResponses(client) if api == "openai-responses" else client


@pytest.mark.parametrize("api", APIS)
def test_text_arrives_in_pieces_and_the_transcript_is_the_unstreamed_one(
    api: str, tmp_path: Path
) -> None:
    with server_for(api) as model, tl.open_store(f"sqlite:///{tmp_path / 's.db'}") as store:
        agent = tl.Agent(
            client=client_for(api, model), model="m", tools=tools(tmp_path / "w1"), store=store
        )
        pieces: list[str] = []
        streamed = agent.run(session="streamed", prompt="outage", on_text=pieces.append)
        plain = tl.Agent(
            client=client_for(api, model), model="m", tools=tools(tmp_path / "w2"), store=store
        ).run(session="plain", prompt="outage")
        assert streamed.status is plain.status is tl.RunStatus.COMPLETED
        assert "".join(pieces) == TEXT_1 + TEXT_2 and len(pieces) >= 4
        assert all(p for p in pieces)
        assert [r.get("stream") for r in model.requests] == [True, True, None, None]
        assert stored(store, "streamed") == stored(store, "plain")
        assert streamed.usage.output_tokens > 0 and streamed.final_text == TEXT_2


def test_stream_is_an_iterator_and_raises_what_the_run_raises(tmp_path: Path) -> None:
    with ScriptedModel(script()) as model, tl.open_store("memory://") as store:
        agent = tl.Agent(client=model.client(), model="m", tools=tools(tmp_path), store=store)
        stream = agent.stream(session="s", prompt="outage")
        assert "".join(stream) == TEXT_1 + TEXT_2
        assert stream.run.status is tl.RunStatus.COMPLETED and stream.run.final_text == TEXT_2
        # The script has two turns: asking for a third is refused by the API (a 400).
        again = agent.stream(session="s", prompt="and then?")
        with pytest.raises(tl.ModelCallError):
            list(again)
        with pytest.raises(tl.ModelCallError):
            again.run  # noqa: B018 - the property raises


@pytest.mark.parametrize("api", APIS)
def test_arun_streams_to_a_coroutine(api: str, tmp_path: Path) -> None:
    pieces: list[str] = []

    async def show(text: str) -> None:
        await asyncio.sleep(0)
        pieces.append(text)

    with server_for(api) as model, tl.open_store("memory://") as store:
        client = client_for(api, model, aio=True)
        agent = tl.Agent(client=client, model="m", tools=tools(tmp_path), store=store)
        run = asyncio.run(agent.arun(session="s", prompt="outage", on_text=show))
        assert [r.get("stream") for r in model.requests] == [True, True]
    assert run.status is tl.RunStatus.COMPLETED and "".join(pieces) == TEXT_1 + TEXT_2
    assert run.final_text == TEXT_2 and len(pieces) >= 4
    assert sorted(p.name for p in tmp_path.glob("ticket-*")) == ["ticket-1"]


def test_the_responses_api_streams_through_agent_stream(tmp_path: Path) -> None:
    with ScriptedOpenAI(script()) as model, tl.open_store("memory://") as store:
        client = tl.OpenAIResponses(model.client())
        agent = tl.Agent(client=client, model="m", tools=tools(tmp_path), store=store)
        stream = agent.stream(session="s", prompt="outage")
        assert "".join(stream) == TEXT_1 + TEXT_2
        assert stream.run.status is tl.RunStatus.COMPLETED and stream.run.final_text == TEXT_2
        # What the model was sent on turn 2: turn 1's items as streamed, and the tool's output.
        second = model.requests[1]["input"]
        call = next(i for i in second if i.get("type") == "function_call")
        output = next(i for i in second if i.get("type") == "function_call_output")
        assert (call["call_id"], call["name"], json.loads(call["arguments"])) == (
            "call_1",
            "create_ticket",
            {"title": "Outage"},
        )
        assert (output["call_id"], json.loads(output["output"])) == ("call_1", {"ticket": "T-1"})


def _run_killed_mid_stream(
    url: str, api: str, model: ScriptedModel | ScriptedOpenAI, world: Path, at: str
) -> int:
    """Run the session in a forked child that SIGKILLs itself on the first piece of text that
    starts with ``at``; returns its exit status."""
    pid = os.fork()
    if pid == 0:
        try:

            def on_text(text: str) -> None:
                (world.parent / "seen").open("a").write(json.dumps(text) + "\n")
                if text.startswith(at):
                    os.kill(os.getpid(), signal.SIGKILL)

            with tl.open_store(url) as store:
                client = client_for(api, model)
                agent = tl.Agent(client=client, model="m", tools=tools(world), store=store)
                agent.run(session="s", prompt="outage", on_text=on_text)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("at", ["Opening", "Ticket"])
def test_a_process_killed_mid_stream_loses_only_the_partial_text(
    at: str, api: str, tmp_path: Path
) -> None:
    """Killed on turn 1's text (before its checkpoint A: the tool has not run) or on turn 2's
    (after the tool ran and checkpoint B): the resume asks the model again for that turn, no
    partial text is stored, and the world holds one ticket."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    world = tmp_path / "world"
    with server_for(api) as model:
        model.stream_pause = 0.01  # the events come one by one: the kill is mid-transfer too
        assert _run_killed_mid_stream(url, api, model, world, at) == -signal.SIGKILL
        asked = len(model.requests)
        with tl.open_store(url) as store:
            kept = stored(store, "s")
            assert not any(role == "assistant" and TEXT_2 in json.dumps(c) for role, c in kept)
            pieces: list[str] = []
            client = client_for(api, model)
            agent = tl.Agent(client=client, model="m", tools=tools(world), store=store)
            run = agent.run(session="s", prompt="outage", on_text=pieces.append)
        assert run.status is tl.RunStatus.COMPLETED and run.final_text == TEXT_2
        assert len(model.requests) == asked + (2 if at == "Opening" else 1)
        assert "".join(pieces) == (TEXT_1 + TEXT_2 if at == "Opening" else TEXT_2)
    assert sorted(p.name for p in world.glob("ticket-*")) == ["ticket-1"]
    seen = (tmp_path / "seen").read_text().splitlines()
    assert json.loads(seen[-1]).startswith(at), "the kill came mid-stream, at that piece"


def _cut_short(server: ScriptedModel | ScriptedOpenAI, what: str) -> None:
    """Make ``server`` end its first streamed reply early, cleanly (as a proxy that closes the
    stream may): after the first piece of the call's arguments (``call``), or of turn 2's text
    (``text``) — before the event that says the reply is complete."""
    events = server.events
    cut: list[bool] = []

    def mid(data: Any) -> bool:
        marker = "Ticket T-1" if what == "text" else '"{\\"title'  # turn 2's text, the call's input
        return isinstance(data, dict) and marker in json.dumps(data)

    def cut_events(path: str, payload: dict[str, Any]) -> list[tuple[str | None, Any]]:
        sent = events(path, payload)
        at = next((i for i, (_, data) in enumerate(sent) if mid(data)), None)
        if cut or at is None:
            return sent
        cut.append(True)
        return sent[: at + 1]

    server.events = cut_events  # type: ignore[method-assign]


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("what", ["call", "text"])
@pytest.mark.parametrize("aio", [False, True], ids=["sync", "async"])
def test_a_stream_that_ends_before_the_reply_is_neither_stored_nor_run(
    what: str, api: str, aio: bool, tmp_path: Path
) -> None:
    """A reply's stream that ends cleanly mid-reply: the SDK hands back what arrived (Anthropic:
    a call's input read from its partial JSON; Chat Completions: partial text). It is a failure
    of the model API: the run raises ``ModelCallError``, the session is ``failed`` with nothing
    of the reply stored or run, and the resume asks the model again — the call runs once, with
    its whole input, and the final text is whole."""
    world = tmp_path / "world"
    with server_for(api) as model, tl.open_store(f"sqlite:///{tmp_path / 's.db'}") as store:
        _cut_short(model, what)
        agent = tl.Agent(
            client=client_for(api, model, aio=aio), model="m", tools=tools(world), store=store
        )

        def run() -> tl.Run:
            if aio:
                return asyncio.run(agent.arun(session="s", prompt="outage", on_text=len))
            return agent.run(session="s", prompt="outage", on_text=len)

        with pytest.raises(tl.ModelCallError, match="stream ended before the reply did") as info:
            run()
        assert info.value.session_id == "s" and info.value.status_code is None
        state = store.session("s")
        assert state is not None and state.status is tl.RunStatus.FAILED
        answers = [c for role, c in stored(store, "s") if role == "assistant"]
        assert len(answers) == (0 if what == "call" else 1), "turn 2's partial text is not kept"
        tickets = len(list(world.glob("ticket-*")))
        assert tickets == (0 if what == "call" else 1), "a call cut short never runs"
        done = run()
        assert done.status is tl.RunStatus.COMPLETED and done.final_text == TEXT_2
    assert [p.read_text() for p in world.glob("ticket-*")] == ["Outage"]


@pytest.mark.parametrize("aio", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("api", APIS)
def test_a_streamed_reply_that_stops_at_its_limit_is_read_as_the_same_reply_unstreamed(
    api: str, aio: bool, tmp_path: Path
) -> None:
    """A streamed reply that stopped at the output limit (``max_tokens``, ``length``, an
    incomplete response): its text is the session's answer, as unstreamed — not an error the
    SDK raises (Chat Completions' stream raised ``LengthFinishReasonError``, which left the
    session running) — and a call it was writing is refused and never run, its session failed
    with the reason."""
    limit = "max_tokens" if api == "anthropic" else "length"
    text = [Reply(text="an answer cut", stop_reason=limit)]
    call = [Reply(tool_uses=[ToolUse("create_ticket", {"title": "Out"})], stop_reason=limit)]
    world = tmp_path / "w"
    for n, replies in enumerate((text, call)):
        server = ScriptedModel(replies) if api == "anthropic" else ScriptedOpenAI(replies)
        with server as model, tl.open_store(f"sqlite:///{tmp_path / f'{n}.db'}") as store:
            agent = tl.Agent(
                client=client_for(api, model, aio=aio), model="m", tools=tools(world), store=store
            )
            pieces: list[str] = []
            if replies is text:
                run = _streamed_run(agent, aio, pieces)
                assert run.status is tl.RunStatus.COMPLETED
                assert "an answer cut" in json.dumps(store.messages("s")[-1].content)
                assert "".join(pieces) == "an answer cut"
            else:
                with pytest.raises(tl.MalformedContentError, match="Raise max_tokens"):
                    _streamed_run(agent, aio, pieces)
                assert [m.role for m in store.messages("s")] == ["user"]
                state = store.session("s")
                assert state is not None and state.status is tl.RunStatus.FAILED, state
    assert not world.exists() or list(world.iterdir()) == [], "a call cut off never runs"


def _streamed_run(agent: tl.Agent, aio: bool, pieces: list[str]) -> tl.Run:
    if aio:
        return asyncio.run(agent.arun(session="s", prompt="go", on_text=pieces.append))
    return agent.run(session="s", prompt="go", on_text=pieces.append)


@pytest.mark.parametrize("aio", [False, True], ids=["sync", "async"])
def test_a_responses_stream_that_ends_with_an_error_event_says_the_api_s_error(
    aio: bool, tmp_path: Path
) -> None:
    """The Responses API ends a stream that fails midway with an ``error`` event (its code and
    message; the SDK hands it over as an event, not an exception). The run fails with that
    error — not "the stream ended before the reply did", which hides what the API said — and
    nothing of the reply, a call cut mid-arguments, is stored or run."""
    world = tmp_path / "world"
    with ScriptedOpenAI(script()) as model, tl.open_store("memory://") as store:
        events = model.events

        def failing(path: str, payload: dict[str, Any]) -> list[tuple[str | None, Any]]:
            sent = events(path, payload)
            at = next(i for i, (name, _) in enumerate(sent) if name and "arguments.delta" in name)
            error = {
                "type": "error",
                "code": "server_error",
                "message": "The server had an error while processing your request.",
                "param": None,
                "sequence_number": at + 1,
            }
            return [*sent[: at + 1], ("error", error)]

        model.events = failing  # type: ignore[method-assign]
        client = tl.OpenAIResponses(model.async_client() if aio else model.client())
        agent = tl.Agent(client=client, model="m", tools=tools(world), store=store)

        def run() -> tl.Run:
            if aio:
                return asyncio.run(agent.arun(session="s", prompt="outage", on_text=len))
            return agent.run(session="s", prompt="outage", on_text=len)

        with pytest.raises(tl.ModelCallError, match="server_error: The server had an error"):
            run()
        state = store.session("s")
        assert state is not None and state.status is tl.RunStatus.FAILED
        assert "server_error" in (state.reason or ""), state.reason
        assert [m.role for m in store.messages("s")] == ["user"]
    assert not world.exists(), "a call cut mid-arguments never runs"


@pytest.mark.parametrize("aio", [False, True], ids=["sync", "async"])
def test_an_error_event_mid_call_fails_the_run_with_no_http_status(
    aio: bool, tmp_path: Path
) -> None:
    """The Messages API stops a stream midway with an ``error`` event (``overloaded_error``)
    after a status of 200: the run fails (``ModelCallError``), nothing of the reply — a call
    cut mid-input — is stored or run, and ``status_code`` is ``None``, as for Chat Completions:
    no HTTP error happened, and a 200 there reads as a success to code that retries on it."""
    world = tmp_path / "world"
    with ScriptedModel(script()) as model, tl.open_store("memory://") as store:
        events = model.events

        def overloaded(path: str, payload: dict[str, Any]) -> list[tuple[str | None, Any]]:
            sent = events(path, payload)
            at = next(i for i, (_, data) in enumerate(sent) if "partial_json" in json.dumps(data))
            error = {"type": "error", "error": {"type": "overloaded_error", "message": "Over"}}
            return [*sent[: at + 1], ("error", error)]

        model.events = overloaded  # type: ignore[method-assign]
        client = model.async_client() if aio else model.client()
        agent = tl.Agent(client=client, model="m", tools=tools(world), store=store)

        def run() -> tl.Run:
            if aio:
                return asyncio.run(agent.arun(session="s", prompt="outage", on_text=len))
            return agent.run(session="s", prompt="outage", on_text=len)

        with pytest.raises(tl.ModelCallError, match="overloaded_error") as info:
            run()
        assert info.value.status_code is None
        state = store.session("s")
        assert state is not None and state.status is tl.RunStatus.FAILED
        assert [m.role for m in store.messages("s")] == ["user"]
    assert not world.exists(), "a call cut mid-input never runs"
