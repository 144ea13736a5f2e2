"""toolledger.integrations.mcp_server and the client's key: a server that honours the key does a
repeated call once, counted in the world the server writes (one line per real effect).

The kill: the client process is ``SIGKILL``ed after the server did the effect, before the client
recorded the answer; a new client process resumes, finds the call in doubt, and — the tool
forwards its key — sends it again under the same key. A plain server runs it again (two lines);
a server under ``ServerLedger`` answers the first result (one line). On SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from .apps import WORLD, finished, killed, run_app
from .conftest import require

require("mcp", "mcp")

from mcp import ClientSession, StdioServerParameters, stdio_client  # noqa: E402
from mcp.server.mcpserver import Context  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402

import toolledger as tl  # noqa: E402
from toolledger.adapters.mcp import (  # noqa: E402
    KEY_META,
    OUTCOME_UNKNOWN_CODE,
    tools_from_list,
    tools_from_session,
)
from toolledger.codec import idempotency_key  # noqa: E402
from toolledger.integrations.mcp_server import ServerLedger  # noqa: E402
from toolledger.records import Status  # noqa: E402

from ..conftest import url_for  # noqa: E402

HERE = Path(__file__).parent
CLIENT = str(HERE / "mcp_client_app.py")
SERVER = str(HERE / "mcp_keyed_server.py")
LINE = "checkout is down\n"


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("postgres_store_url"))
    return url_for("sqlite", tmp_path)


def received(tmp_path: Path) -> list[str | None]:
    """The key of every call of create_ticket that reached the server."""
    log = (tmp_path / "received.log").read_text().splitlines()
    return [json.loads(line).get(KEY_META) for line in log]


def client(tmp_path: Path, mode: str, url: str, crash_at: str | None = None) -> Any:
    return run_app(CLIENT, str(tmp_path), mode, url, crash_at=crash_at)


# -- the kill -------------------------------------------------------------------------------------


def test_a_plain_server_does_the_resumed_call_twice(tmp_path: Path) -> None:
    """Without a ledger on the server the forwarded key is dropped on the floor: the resumed
    client sends the call again and the server runs it again."""
    url = url_for("sqlite", tmp_path)
    killed(client(tmp_path, "plain", url, crash_at="before_record"), tmp_path)
    done = client(tmp_path, "plain", url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / WORLD).read_text() == LINE * 2, "the duplicate a key alone cannot stop"
    key = idempotency_key("outage-42", "toolu_1")
    assert received(tmp_path) == [key, key]


def test_a_ledgered_server_answers_the_resumed_call_with_the_first_result(
    url: str, tmp_path: Path
) -> None:
    killed(client(tmp_path, "ledgered", url, crash_at="before_record"), tmp_path)
    out = finished(client(tmp_path, "ledgered", url), tmp_path)  # one line in the world
    assert not out["is_error"] and json.loads(out["content"])["title"] == "checkout is down"
    assert out["status"] == "succeeded"
    key = idempotency_key("outage-42", "toolu_1")
    assert received(tmp_path) == [key, key], "the resumed client sent the call again, keyed"
    with tl.open_store(url) as store:
        (served,) = store.ledger("mcp:local").records()
    assert served.tool_use_id == key
    assert (served.status, served.attempt) == (Status.SUCCEEDED, 1), "the server ran it once"
    assert json.loads(served.result or "") == json.loads(out["content"]), "the first result"


def test_killed_after_the_client_recorded_it_the_server_is_not_asked_again(
    url: str, tmp_path: Path
) -> None:
    killed(client(tmp_path, "ledgered", url, crash_at="after_record"), tmp_path)
    out = finished(client(tmp_path, "ledgered", url), tmp_path)
    assert out["status"] == "succeeded" and len(received(tmp_path)) == 1


# -- one server, in this process's client ----------------------------------------------------------


def with_server(tmp_path: Path, mode: str, body: Callable[[ClientSession], Awaitable[Any]]) -> Any:
    url = url_for("sqlite", tmp_path)

    async def main() -> Any:
        params = StdioServerParameters(
            command=sys.executable, args=[SERVER, str(tmp_path), mode, url], env=dict(os.environ)
        )
        with open(tmp_path / "server.log", "a") as errlog:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                return await body(session)

    return asyncio.run(main())


def lines(tmp_path: Path) -> list[str]:
    world = tmp_path / WORLD
    return world.read_text().splitlines() if world.exists() else []


def test_the_same_key_with_other_arguments_is_refused_not_replayed(tmp_path: Path) -> None:
    async def body(session: ClientSession) -> list[Any]:
        first = await session.call_tool("create_ticket", {"title": "a"}, meta={KEY_META: "k-1"})
        again = await session.call_tool("create_ticket", {"title": "a"}, meta={KEY_META: "k-1"})
        other = await session.call_tool("create_ticket", {"title": "b"}, meta={KEY_META: "k-1"})
        return [first, again, other]

    first, again, other = with_server(tmp_path, "ledgered", body)
    assert lines(tmp_path) == ["a"]
    assert not first.is_error and again.structured_content == first.structured_content
    assert other.is_error
    assert "'k-1' was first used for another call" in other.content[0].text


def test_a_call_without_a_key_runs_every_time(tmp_path: Path) -> None:
    async def body(session: ClientSession) -> None:
        for _ in range(2):
            result = await session.call_tool("create_ticket", {"title": "a"})
            assert not result.is_error

    with_server(tmp_path, "ledgered", body)
    assert lines(tmp_path) == ["a", "a"]


def test_a_key_from_a_client_nobody_named_is_refused(tmp_path: Path) -> None:
    """A stdio server has no authenticated client: with the default principal a keyed call is
    refused (keys are predictable; ledgers are per client), and nothing runs."""

    async def body(session: ClientSession) -> Any:
        return await session.call_tool("create_ticket", {"title": "a"}, meta={KEY_META: "k-1"})

    refused = with_server(tmp_path, "unnamed", body)
    assert refused.is_error and "principal=" in refused.content[0].text
    assert lines(tmp_path) == []


def test_a_repeat_while_the_first_runs_is_not_a_failure_on_the_client(tmp_path: Path) -> None:
    """The client gave up on its first attempt (still running on the server) and sent the call
    again under the same key: the server answers OUTCOME_UNKNOWN_CODE, so the client records no
    failure (which would answer the model "failed" for good and invite a new call); asked once
    more after the first attempt ended, it gets that attempt's result. One effect."""
    key = idempotency_key("s", "toolu_1")
    call = {"type": "tool_use", "id": "toolu_1", "name": "slow_ticket", "input": {"title": "a"}}

    async def body(session: ClientSession) -> Any:
        first = asyncio.ensure_future(
            session.call_tool("slow_ticket", {"title": "a"}, meta={KEY_META: key})
        )
        await asyncio.sleep(0.3)
        with pytest.raises(MCPError) as raised:
            await session.call_tool("slow_ticket", {"title": "a"}, meta={KEY_META: key})
        assert raised.value.error.code == OUTCOME_UNKNOWN_CODE
        tools = await tools_from_session(
            session, overrides={"slow_ticket": {"forwards_idempotency_key": True}}
        )
        with tl.open_store("memory://") as store:
            (unknown,) = await tl.arun_tool_uses([call], tools, ledger=store.ledger("s"))
            assert store.ledger("s").records() == [], "nothing recorded: not a failure"
            answered = (await first).structured_content
            (result,) = await tl.arun_tool_uses([call], tools, ledger=store.ledger("s"))
            (record,) = store.ledger("s").records()
        return unknown, answered, result, record

    unknown, answered, result, record = with_server(tmp_path, "ledgered", body)
    assert unknown["is_error"] and "still running" in unknown["content"]
    assert record.status is Status.SUCCEEDED and json.loads(result["content"]) == answered
    assert lines(tmp_path) == ["a"]


def test_a_repeat_of_a_call_the_tool_could_not_tell_says_so(tmp_path: Path) -> None:
    """The tool raised OutcomeUnknown: the call is in doubt, and a repeat under the same key is
    answered OUTCOME_UNKNOWN_CODE with the reason it is in doubt — the tool could not tell — not
    a process that stopped (this server is alive and answered the first attempt itself)."""

    async def body(session: ClientSession) -> list[MCPError]:
        raised = []
        for _ in range(2):
            with pytest.raises(MCPError) as error:
                await session.call_tool("unsure_ticket", {"title": "a"}, meta={KEY_META: "k-1"})
            raised.append(error.value)
        return raised

    first, again = with_server(tmp_path, "ledgered", body)
    assert lines(tmp_path) == ["a"], "run once"
    for error in (first, again):
        assert error.error.code == OUTCOME_UNKNOWN_CODE
        assert "the ticket service timed out after it was sent" in error.error.message
    assert "process stopped" not in again.error.message


@pytest.mark.parametrize("tool", ["full_ticket", "bare_ticket"])
def test_a_repeat_answers_the_call_tool_result_the_tool_returned(tmp_path: Path, tool: str) -> None:
    """A tool that answers the SDK's CallToolResult itself — here an error result — is answered
    the same on a repeat: an error, with its text, not a success whose text is its JSON; with
    or without a return annotation that says so."""

    async def body(session: ClientSession) -> list[Any]:
        first = await session.call_tool(tool, {"title": "a"}, meta={KEY_META: "k-1"})
        refused = await session.call_tool(tool, {"title": "b"}, meta={KEY_META: "k-2"})
        again = await session.call_tool(tool, {"title": "b"}, meta={KEY_META: "k-2"})
        first_again = await session.call_tool(tool, {"title": "a"}, meta={KEY_META: "k-1"})
        return [first, refused, again, first_again]

    first, refused, again, first_again = with_server(tmp_path, "ledgered", body)
    assert lines(tmp_path) == ["a"]
    assert refused.is_error and refused.content[0].text == "a ticket is open already"
    assert again.is_error and again.content == refused.content
    assert not first_again.is_error and first_again.content == first.content


def test_a_repeat_answers_the_image_the_tool_returned(tmp_path: Path) -> None:
    """The SDK's ``Image`` is not JSON: it is recorded as the image content the SDK sends, and
    a repeat answers that image — not a note that the result could not be stored."""

    async def body(session: ClientSession) -> list[Any]:
        first = await session.call_tool("badge_ticket", {"title": "a"}, meta={KEY_META: "k-1"})
        again = await session.call_tool("badge_ticket", {"title": "a"}, meta={KEY_META: "k-1"})
        return [first, again]

    first, again = with_server(tmp_path, "ledgered", body)
    assert lines(tmp_path) == ["a"]
    assert not first.is_error and first.content[0].type == "image"
    assert first.content[0].data == "YQ==" and first.content[0].mime_type == "image/png"
    assert not again.is_error and again.content == first.content


def test_the_key_is_mirrored_and_merged_with_the_callers_meta(tmp_path: Path) -> None:
    async def body(session: ClientSession) -> list[dict[str, Any]]:
        tools = await tools_from_session(
            session,
            meta_keys=(KEY_META, "idempotencyKey"),
            meta=lambda name, arguments, ctx: {"example.com/trace": f"trace-{ctx.tool_use_id}"},
        )
        clashing = await tools_from_session(
            session, meta={"idempotencyKey": "mine"}, meta_keys=(KEY_META, "idempotencyKey")
        )
        with tl.open_store("memory://") as store:
            use = {"type": "tool_use", "id": "toolu_9", "name": "echo_meta", "input": {}}
            (sent,) = await tl.arun_tool_uses([use], tools, ledger=store.ledger("s"))
            (clash,) = await tl.arun_tool_uses(
                [{**use, "id": "toolu_10"}], clashing, ledger=store.ledger("s")
            )
        return [sent, clash]

    sent, clash = with_server(tmp_path, "plain", body)
    key = idempotency_key("s", "toolu_9")
    assert json.loads(sent["content"]) == {
        KEY_META: key,
        "idempotencyKey": key,
        "example.com/trace": "trace-toolu_9",
    }
    assert clash["is_error"] and "'idempotencyKey'" in clash["content"]
    assert "nothing was sent" in clash["content"]


class NoMetaSession:
    """A session whose ``call_tool`` cannot carry ``_meta`` (an old or wrapped client)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        self.calls.append((name, arguments))
        return {"content": [{"type": "text", "text": "done"}]}


def test_a_key_forwarding_tool_over_a_session_without_meta_is_refused_at_set_up() -> None:
    session = NoMetaSession()
    listed = [{"name": "create_ticket"}, {"name": "status"}]
    with pytest.raises(tl.ConfigurationError, match=r"forward its idempotency key.*meta="):
        tools_from_list(
            session, listed, overrides={"create_ticket": {"forwards_idempotency_key": True}}
        )
    # The tools that do not rely on the key are called without _meta, as before.
    tools = tools_from_list(session, listed)
    with tl.open_store("memory://") as store:
        use = {"type": "tool_use", "id": "toolu_1", "name": "status", "input": {}}
        (result,) = asyncio.run(tl.arun_tool_uses([use], tools, ledger=store.ledger("s")))
    assert result["content"] == "done" and session.calls == [("status", {})]


def test_a_tool_without_a_context_or_with_a_bad_declaration_is_refused() -> None:
    keyed = ServerLedger(tl.open_store("memory://"), principal=lambda ctx: "local")
    with pytest.raises(tl.ConfigurationError, match="Context"):
        keyed.tool(lambda title: title)
    with pytest.raises(tl.ConfigurationError, match="unknown keys"):
        keyed.tool(effekt="read_only")
    with pytest.raises(tl.ConfigurationError, match="meta_keys"):
        ServerLedger(tl.open_store("memory://"), meta_keys="idempotencyKey")


def test_a_high_impact_tool_is_refused_for_a_server_has_no_one_to_ask() -> None:
    """A server's tool has no approval gate: a keyed call would be declined for ever (asking
    for an ``approve=`` nobody can pass), and a call without a key runs as without the ledger —
    approved by nobody. Declaring it high-impact would promise what the server cannot keep."""
    keyed = ServerLedger(tl.open_store("memory://"), principal=lambda ctx: "local")

    def pay(amount: int, ctx: Context) -> str:
        return "paid"

    with pytest.raises(tl.ConfigurationError, match="no approval") as info:
        keyed.tool(high_impact=True)(pay)
    assert "pay" in str(info.value)
    keyed.tool(high_impact=False)(pay)  # said explicitly: as any other tool


@pytest.mark.parametrize("keyed_call", [False, True], ids=["no key", "a key"])
def test_a_plain_tool_runs_off_the_event_loop(keyed_call: bool) -> None:
    """The SDK runs a plain (``def``) tool on a worker thread, so the server goes on answering
    while it works — a repeat of it among them. Wrapped, it still does: run on the event loop,
    it would stop the whole server for as long as it took."""
    keyed = ServerLedger(tl.open_store("memory://"), principal=lambda ctx: "local")
    go_on = threading.Event()

    @keyed.tool(effect="idempotent")
    def wait_for_the_loop(title: str, ctx: Context) -> str:
        return "ran beside the loop" if go_on.wait(5) else "the loop stood still"

    meta = {KEY_META: "k-1"} if keyed_call else None
    ctx = SimpleNamespace(request_context=SimpleNamespace(meta=meta))

    async def body() -> Any:
        async def meanwhile() -> None:
            await asyncio.sleep(0.05)
            go_on.set()

        answer, _ = await asyncio.gather(wait_for_the_loop(title="t", ctx=ctx), meanwhile())
        return answer

    assert asyncio.run(body()) == "ran beside the loop"
