"""``read_calls`` tells a list holding a ``tool_use`` block as Anthropic's at once; whatever it
is given, it answers what the readers tried in order answer."""

from __future__ import annotations

from typing import Any

import pytest
from anthropic.types import TextBlock, ToolUseBlock

from toolledger import adapters
from toolledger.adapters import read_calls
from toolledger.adapters.anthropic import read_tool_uses, tool_result
from toolledger.adapters.openai import read_openai
from toolledger.errors import MalformedContentError


def _in_order(content: Any) -> Any:
    """The readers tried in order, with no shortcut: OpenAI's shapes, else Anthropic's."""
    found = read_openai(content)
    return found if found is not None else (read_tool_uses(content), tool_result)


def _use(call_id: str, name: str = "noop", **fields: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": {"n": 1}, **fields}


CONTENTS: list[Any] = [
    [_use("toolu_1")],
    [{"type": "text", "text": "first"}, _use("toolu_1"), _use("toolu_2", "other")],
    [
        TextBlock(type="text", text="an SDK message"),
        ToolUseBlock(type="tool_use", id="toolu_3", name="noop", input={"n": 2}),
    ],
    [{"type": "text", "text": "no calls"}],
    [],
    [{"type": "function_call", "call_id": "call_1", "name": "noop", "arguments": "{}"}],
    [{"id": "call_2", "type": "function", "function": {"name": "noop", "arguments": "{}"}}],
    {"role": "assistant", "content": [_use("toolu_4")]},
    {"role": "assistant", "content": None, "tool_calls": []},
    [{"type": ["text"], "text": "a type that cannot be hashed"}, _use("toolu_5")],
    [{"type": {"kind": "text"}}],
]


@pytest.mark.parametrize("content", CONTENTS)
def test_read_calls_answers_what_the_readers_in_order_answer(content: Any) -> None:
    calls, shape = read_calls(content)
    expected_calls, expected_shape = _in_order(content)
    assert calls == expected_calls and shape is expected_shape
    if any(isinstance(b, dict) and b.get("type") == "tool_use" for b in content or []):
        assert shape is tool_result and calls


@pytest.mark.parametrize(
    "content",
    [
        [_use("toolu_1"), {"text": "a block with no type"}],
        [_use("toolu_1"), _use("toolu_1")],
        [_use("toolu_1", input="not an object")],
        [_use("toolu_\x00")],
    ],
)
def test_a_list_holding_a_tool_use_is_refused_as_the_anthropic_reader_refuses_it(
    content: Any,
) -> None:
    with pytest.raises(MalformedContentError) as ours:
        read_calls(content)
    with pytest.raises(MalformedContentError) as theirs:
        read_tool_uses(content)
    assert str(ours.value) == str(theirs.value)


def test_a_registered_reader_is_asked_before_a_tool_use_list_is_told_anthropic(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The shortcut holds only while no other reader is registered: one that is (``register``)
    is asked in its turn, as before."""
    asked: list[Any] = []

    def mine(content: Any) -> Any:
        asked.append(content)
        return [], tool_result

    monkeypatch.setattr(adapters, "_READERS", list(adapters._READERS))
    adapters.register(reader=mine)
    content = [_use("toolu_1")]
    assert read_calls(content) == ([], tool_result) and asked == [content]
