"""@tool and ToolSet: schemas from signatures, descriptions from docstrings, ToolContext."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any, Literal

import pydantic
import pytest

import toolledger as tl
from toolledger.codec import idempotency_key
from toolledger.tools import SchemaTool


def test_schema_and_description_come_from_the_function() -> None:
    @tl.tool(effect="idempotent")
    def set_config(
        key: Annotated[str, "the setting's name"],
        value: Annotated[int, pydantic.Field(ge=0, description="a non-negative value")],
        mode: Literal["soft", "hard"] = "soft",
        tags: list[str] | None = None,
        ctx: tl.ToolContext | None = None,
    ) -> str:
        """Set a configuration key.

        Overwrites the previous value.
        """
        return "ok"

    assert set_config.name == "set_config"
    assert set_config.effect is tl.EffectClass.IDEMPOTENT
    assert set_config.to_anthropic() == {
        "name": "set_config",
        "description": "Set a configuration key.\n\nOverwrites the previous value.",
        "input_schema": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "key": {"type": "string", "description": "the setting's name"},
                "value": {"type": "integer", "minimum": 0, "description": "a non-negative value"},
                "mode": {"enum": ["soft", "hard"], "type": "string", "default": "soft"},
                "tags": {
                    "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
                    "default": None,
                },
            },
            "required": ["key", "value"],
        },
    }


def test_context_parameter_is_injected_not_advertised() -> None:
    @tl.tool
    def send(to: str, ctx: tl.ToolContext) -> str:
        return ctx.idempotency_key

    assert "ctx" not in send.input_schema["properties"]
    ctx = tl.ToolContext(session_id="s", tool_use_id="t", idempotency_key="k")
    assert send.invocation(send.validate({"to": "x"}), ctx)() == "k"


def test_defaults_and_names() -> None:
    @tl.tool
    def plain(x: int) -> int:
        return x

    @tl.tool(name="renamed", description="custom", high_impact=True, forwards_idempotency_key=True)
    def other(x: int) -> int:
        return x

    assert plain.effect is tl.EffectClass.NON_IDEMPOTENT and not plain.high_impact
    assert plain.needs_intent and not plain.rerun_safe
    assert other.name == "renamed" and other.description == "custom"
    assert other.rerun_safe and other.needs_intent, "high-impact always writes its intent"
    assert plain(3) == 3, "calling a Tool calls the function"


def test_parameters_that_collide_with_pydantic_names_work() -> None:
    @tl.tool
    def weird(json: str, model_config: int, schema: bool = False) -> str:
        return f"{json}-{model_config}-{schema}"

    kwargs = weird.validate({"json": "j", "model_config": 2})
    assert (
        weird.invocation(
            kwargs, tl.ToolContext(session_id="s", tool_use_id="t", idempotency_key="k")
        )()
        == "j-2-False"
    )
    assert set(weird.input_schema["properties"]) == {"json", "model_config", "schema"}


@pytest.mark.parametrize(
    "fn",
    [
        lambda *args: None,
        lambda **kwargs: None,
    ],
)
def test_signatures_the_model_cannot_fill_are_refused(fn: object) -> None:
    with pytest.raises(tl.ConfigurationError, match="must be nameable"):
        tl.tool(fn)  # type: ignore[call-overload]


def _generator(x: int) -> Iterator[int]:
    yield x


async def _async_generator(x: int) -> AsyncIterator[int]:
    yield x


@pytest.mark.parametrize("fn", [_generator, _async_generator])
def test_generator_functions_are_refused_as_tools(fn: Any) -> None:
    """Calling one runs none of its body: the ledger would record ``succeeded`` — the call
    answered for ever — for an effect that never happened."""
    with pytest.raises(tl.ConfigurationError, match="generator"):
        tl.tool(fn)
    with pytest.raises(tl.ConfigurationError, match="generator"):
        tl.ToolSet([fn])
    with pytest.raises(tl.ConfigurationError, match="generator"):
        SchemaTool(fn, name="g", input_schema={"type": "object"})

    @tl.tool
    def send(x: int) -> int:
        return x

    with pytest.raises(tl.ConfigurationError, match="generator"):
        send.check(fn)  # its answer, never None, would read as "it happened"


def test_bad_declarations_fail_at_import_time() -> None:
    with pytest.raises(tl.ConfigurationError, match="effect='sometimes'"):
        tl.tool(effect="sometimes")(lambda: None)  # type: ignore[call-overload]

    def f(x: int) -> int:
        return x

    with pytest.raises(tl.ConfigurationError, match="two tools are named 'f'"):
        tl.ToolSet([f, f])
    with pytest.raises(tl.ConfigurationError, match="max_result_bytes"):
        tl.ToolSet([], max_result_bytes=0)


@pytest.mark.parametrize("name", ["a\x00b", "send\nmail", "pay\u202etfel", "zero\u200bwidth"])
def test_a_tool_name_with_a_control_or_invisible_character_is_refused(name: str) -> None:
    """A tool's name is stored, compared on every replay and printed: a NUL in it fails every
    write on PostgreSQL (its text holds none), and a control or invisible character shows a
    person another name than the one that ran."""

    def f(x: int) -> int:
        return x

    with pytest.raises(tl.ConfigurationError, match="control or invisible"):
        tl.tool(name=name)(f)
    with pytest.raises(tl.ConfigurationError, match="control or invisible"):
        tl.SchemaTool(lambda arguments: None, name=name, input_schema={"type": "object"})


def test_plain_functions_in_a_toolset_are_non_idempotent() -> None:
    def delete_everything() -> None:
        """Dangerous."""

    tools = tl.ToolSet([delete_everything])
    assert tools["delete_everything"].effect is tl.EffectClass.NON_IDEMPOTENT
    assert tools.names == ["delete_everything"] and "delete_everything" in tools
    assert len(tools) == 1 and tools.get("nope") is None


def test_idempotency_key_is_stable_and_distinct() -> None:
    key = idempotency_key("session-1", "toolu_1")
    assert key == idempotency_key("session-1", "toolu_1")
    # Pinned: a key that changed between versions would defeat downstream de-duplication.
    assert key == "tl-ed936a4f81c2a63665f770ab5faff2f756204169"
    others = {
        idempotency_key("session-2", "toolu_1"),
        idempotency_key("session-1", "toolu_2"),
        idempotency_key("session-1t", "oolu_1"),
    }
    assert key not in others and len(others) == 3


def test_idempotency_key_is_the_same_in_another_process() -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from toolledger.codec import idempotency_key as k; print(k('session-1', 'toolu_1'))",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123"},
    ).stdout.strip()
    assert out == idempotency_key("session-1", "toolu_1")


@pytest.mark.parametrize("straight", [True, False], ids=["straight", "general"])
def test_the_context_is_made_only_for_a_tool_that_asks_for_it(
    straight: bool, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tool without a ``ToolContext`` parameter costs no key (a SHA-256 each call); one with
    it gets the call's context, its key the session's, on either path of the engine."""
    from toolledger import _switches as switches
    from toolledger.engine import _attempt

    monkeypatch.setattr(switches, "STRAIGHT", straight)
    made: list[tuple[str, str]] = []

    def counted(session_id: str, tool_use_id: str) -> str:
        made.append((session_id, tool_use_id))
        return idempotency_key(session_id, tool_use_id)

    monkeypatch.setattr(_attempt, "idempotency_key", counted)
    seen: list[tl.ToolContext] = []

    @tl.tool
    def plain(n: int) -> int:
        return n

    @tl.tool
    def keyed(n: int, ctx: tl.ToolContext) -> int:
        seen.append(ctx)
        return n

    def block(name: str, call_id: str) -> dict[str, Any]:
        return {"type": "tool_use", "id": call_id, "name": name, "input": {"n": 1}}

    with tl.open_store(f"sqlite:///{tmp_path / 'ledger.db'}") as store:
        ledger = store.ledger("s")
        out = tl.run_tool_uses([block("plain", "toolu_a")], [plain, keyed], ledger=ledger)
        assert [r["content"] for r in out] == ["1"] and made == []
        out = tl.run_tool_uses([block("keyed", "toolu_b")], [plain, keyed], ledger=ledger)
        assert [r["content"] for r in out] == ["1"] and made == [("s", "toolu_b")]
        assert [(c.session_id, c.tool_use_id, c.attempt, c.in_doubt) for c in seen] == [
            ("s", "toolu_b", 1, False)
        ]
        assert seen[0].idempotency_key == idempotency_key("s", "toolu_b")
        assert seen[0].remaining() is not None and 0 < seen[0].remaining() <= keyed.timeout
