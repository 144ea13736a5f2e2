"""MCP tools as toolledger tools: the annotation mapping, overrides, results and errors, against
a real MCP server (tests/adapters/mcp_ticket_server.py) over stdio with the ``mcp`` SDK."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.types import ToolAnnotations

import toolledger as tl
from toolledger.adapters.mcp import KEY_META, MCPToolError, effect_of, tools_from_session
from toolledger.codec import idempotency_key
from toolledger.records import EffectClass
from toolledger.testing.world import World

from .mcp_agent import SERVER

READ_ONLY, IDEMPOTENT, NON_IDEMPOTENT = (
    EffectClass.READ_ONLY,
    EffectClass.IDEMPOTENT,
    EffectClass.NON_IDEMPOTENT,
)


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        (None, (NON_IDEMPOTENT, False)),
        (ToolAnnotations(read_only_hint=True), (READ_ONLY, False)),
        (ToolAnnotations(read_only_hint=True, destructive_hint=True), (READ_ONLY, False)),
        (ToolAnnotations(idempotent_hint=True), (IDEMPOTENT, False)),
        (ToolAnnotations(destructive_hint=True), (NON_IDEMPOTENT, True)),
        (ToolAnnotations(idempotent_hint=True, destructive_hint=True), (IDEMPOTENT, True)),
        (ToolAnnotations(destructive_hint=False, open_world_hint=True), (NON_IDEMPOTENT, False)),
        ({"readOnlyHint": True}, (READ_ONLY, False)),  # the wire's camelCase, SDK v1's fields
        ({"idempotentHint": True, "destructiveHint": True}, (IDEMPOTENT, True)),
        ({}, (NON_IDEMPOTENT, False)),
    ],
)
def test_annotations_map_to_effect_classes(annotations: Any, expected: Any) -> None:
    assert effect_of(annotations) == expected


def with_server(world: World, body: Callable[[ClientSession], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        params = StdioServerParameters(command=sys.executable, args=[SERVER, str(world.path)])
        with open(world.path / "server.log", "a") as errlog:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                return await body(session)

    return asyncio.run(main())


def use(name: str, tool_use_id: str = "toolu_1", **input: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_use_id, "name": name, "input": input}


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path / "world")


def test_tools_from_a_real_server(world: World) -> None:
    async def body(session: ClientSession) -> tl.ToolSet:
        return await tools_from_session(session)

    tools = with_server(world, body)
    declared = {t.name: (t.effect, t.high_impact) for t in tools}
    assert declared == {
        "create_ticket": (NON_IDEMPOTENT, False),
        "create_ticket_checked": (NON_IDEMPOTENT, False),
        "create_ticket_keyed": (NON_IDEMPOTENT, False),
        "ensure_ticket": (IDEMPOTENT, False),
        "find_ticket": (READ_ONLY, False),
        "list_tickets": (READ_ONLY, False),
        "close_ticket": (IDEMPOTENT, True),
        "flaky_export": (NON_IDEMPOTENT, False),
    }
    schema = tools["find_ticket"].input_schema
    assert schema["required"] == ["external_id"] and schema["type"] == "object"
    assert (
        tools["create_ticket"].description == "Open a support ticket (every call opens a new one)."
    )
    (entry,) = [t for t in tools.to_anthropic() if t["name"] == "ensure_ticket"]
    assert entry["input_schema"]["properties"]["title"]["type"] == "string"


def test_overrides_prefix_and_distrust(world: World) -> None:
    async def body(session: ClientSession) -> tuple[tl.ToolSet, tl.ToolSet]:
        tuned = await tools_from_session(
            session,
            overrides={
                "create_ticket": {"effect": "idempotent", "high_impact": True},
                "create_ticket_keyed": {"forwards_idempotency_key": True},
            },
            prefix="tickets_",
        )
        distrusted = await tools_from_session(session, trust_hints=False)
        with pytest.raises(tl.ConfigurationError, match="does not list: nope"):
            await tools_from_session(session, overrides={"nope": {"effect": "read_only"}})
        with pytest.raises(tl.ConfigurationError, match="unknown keys"):
            await tools_from_session(session, overrides={"create_ticket": {"readonly": True}})
        return tuned, distrusted

    tuned, distrusted = with_server(world, body)
    assert (tuned["tickets_create_ticket"].effect, tuned["tickets_create_ticket"].high_impact) == (
        IDEMPOTENT,
        True,
    )
    assert tuned["tickets_create_ticket_keyed"].rerun_safe
    assert {t.effect for t in distrusted} == {NON_IDEMPOTENT}
    assert not any(t.high_impact for t in distrusted)


def test_calls_go_through_the_ledger_to_the_server(world: World, tmp_path: Path) -> None:
    store = tl.open_store(f"sqlite:///{tmp_path / 'l.db'}")
    ledger = store.ledger("s")
    message = [
        use("create_ticket", "toolu_1", title="Outage"),
        use("list_tickets", "toolu_2"),
        use("flaky_export", "toolu_3", fmt="csv"),
        use("create_ticket", "toolu_4", title=42),
        use("create_ticket", "toolu_5"),
    ]

    async def body(session: ClientSession) -> list[list[dict[str, Any]]]:
        tools = await tools_from_session(session)
        first = await tl.arun_tool_uses(message, tools, ledger=ledger)
        again = await tl.arun_tool_uses(message, tools, ledger=ledger)
        return [first, again]

    first, again = with_server(world, body)
    created = json.loads(first[0]["content"])
    assert created["title"] == "Outage" and "is_error" not in first[0]
    assert json.loads(first[1]["content"]) == {"result": [created]}  # structured content
    assert first[2]["is_error"] and "MCPToolError" in first[2]["content"]
    assert "export to csv is down" in first[2]["content"]
    assert first[3]["is_error"] and "title: expected string, got int" in first[3]["content"]
    assert first[4]["is_error"] and "title: Field required" in first[4]["content"]
    assert again[:3] == first[:3], "answered from the ledger"
    assert len(world.tickets()) == 1 and len(world.executions("create_ticket")) == 1
    statuses = {r.tool_use_id: r.status.value for r in ledger.records()}
    assert statuses == {"toolu_1": "succeeded", "toolu_2": "succeeded", "toolu_3": "failed"}
    (execution,) = world.executions("create_ticket")
    assert execution["key"] == idempotency_key("s", "toolu_1"), "the key travels in _meta"
    store.close()


def test_a_keyed_server_drops_a_repeat_of_the_same_call(world: World) -> None:
    """The key depends on (session, tool_use_id) only: a re-run of the same call — here on a
    ledger that lost its record — reaches the server with the same key, and the server drops
    it."""

    async def body(session: ClientSession) -> list[str]:
        tools = await tools_from_session(
            session, overrides={"create_ticket_keyed": {"forwards_idempotency_key": True}}
        )
        call = [use("create_ticket_keyed", "toolu_k", title="Outage")]
        answers = []
        for _ in range(2):
            with tl.open_store("memory://") as store:  # a fresh, empty ledger each time
                (result,) = await tl.arun_tool_uses(call, tools, ledger=store.ledger("s"))
                answers.append(result["content"])
        return answers

    first, second = with_server(world, body)
    assert first == second and json.loads(first)["id"] == idempotency_key("s", "toolu_k")
    assert len(world.executions("create_ticket_keyed")) == 2 and len(world.tickets()) == 1
    assert KEY_META == "toolledger/idempotency-key"


def test_sync_runner_refuses_mcp_tools_clearly(world: World) -> None:
    async def body(session: ClientSession) -> tl.ToolSet:
        return await tools_from_session(session)

    tools = with_server(world, body)
    with tl.open_store("memory://") as store:
        (result,) = tl.run_tool_uses([use("list_tickets")], tools, ledger=store.ledger("s"))
    assert result["is_error"] and "event loop of its session" in result["content"]


def test_mcp_tool_error_is_a_toolledger_error() -> None:
    assert issubclass(MCPToolError, tl.ToolLedgerError) and issubclass(MCPToolError, RuntimeError)


# -- SchemaTool: a tool declared by a JSON schema ------------------------------------------------


def test_schema_tool_validates_lightly_and_takes_the_input_dict() -> None:
    from toolledger.tools import SchemaTool

    seen: list[tuple[dict[str, Any], str]] = []

    def send(arguments: dict[str, Any], ctx: tl.ToolContext) -> str:
        seen.append((arguments, ctx.tool_use_id))
        return "sent"

    schema = {
        "type": "object",
        "properties": {"to": {"type": "string"}, "n": {"type": ["integer", "null"]}},
        "required": ["to"],
        "additionalProperties": False,
    }
    tool = SchemaTool(send, name="send", input_schema=schema, effect="non_idempotent")
    with tl.open_store("memory://") as store:
        ledger = store.ledger("s")
        results = tl.run_tool_uses(
            [
                use("send", "t1", to="a", n=None),
                use("send", "t2", to=1),
                use("send", "t3", to="a", cc="b"),
                use("send", "t4", n=True),
            ],
            [tool],
            ledger=ledger,
        )
    assert results[0]["content"] == "sent" and seen == [({"to": "a", "n": None}, "t1")]
    assert "to: expected string, got int" in results[1]["content"]
    assert "cc: Extra inputs are not permitted" in results[2]["content"]
    assert "to: Field required" in results[3]["content"]
    assert "n: expected ['integer', 'null'], got bool" in results[3]["content"]


def test_schema_tool_check_and_declaration_errors() -> None:
    from toolledger.tools import SchemaTool

    async def create(arguments: dict[str, Any]) -> str:
        return "created"

    tool = SchemaTool(create, name="create", input_schema={"type": "object"})
    assert tool.is_async and not tool.has_check

    @tool.check
    def _(arguments: dict[str, Any], ctx: tl.ToolContext) -> str | None:
        return None

    assert tool.has_check
    with pytest.raises(tl.ConfigurationError, match="must take"):
        SchemaTool(lambda a, b, c: None, name="x", input_schema={})
    with pytest.raises(tl.ConfigurationError, match="effect="):
        SchemaTool(create, name="x", input_schema={}, effect="sometimes")  # type: ignore[arg-type]
