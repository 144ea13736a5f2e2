"""Anthropic Messages API shapes: reading ``tool_use`` blocks, writing ``tool_result`` ones.

Blocks may be SDK objects (``anthropic.types.ToolUseBlock``) or plain dicts; this module imports
nothing from the SDK.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..codec import input_hash
from ..errors import MalformedContentError
from ..records import ToolCall

__all__ = ["read_tool_uses", "tool_result"]


def _field(block: Any, name: str) -> Any:
    if isinstance(block, dict):
        return block.get(name)
    return getattr(block, name, None)


def read_tool_uses(content: Any) -> list[ToolCall]:
    """The ``tool_use`` blocks of a message's content, in order; other blocks are skipped.

    Accepts the content list, or a whole message (SDK ``Message`` or dict with ``content``).
    Raises ``MalformedContentError`` for a block we cannot read or a tool_use id seen twice.
    """
    if isinstance(content, dict) and "content" in content and "type" not in content:
        content = content["content"]
    elif not isinstance(content, (list, tuple, dict, str)) and hasattr(content, "content"):
        content = content.content
    if isinstance(content, (str, bytes, dict)) or not isinstance(content, Iterable):
        raise MalformedContentError(
            f"expected a list of content blocks, got {type(content).__name__}"
        )
    calls: list[ToolCall] = []
    seen: set[str] = set()
    for index, block in enumerate(content):
        kind = _field(block, "type")
        if kind is None:
            raise MalformedContentError(f"content block {index} has no 'type': {block!r:.200}")
        if kind != "tool_use":
            continue
        tool_use_id, name, raw_input = (
            _field(block, "id"),
            _field(block, "name"),
            _field(block, "input"),
        )
        if not isinstance(tool_use_id, str) or not tool_use_id:
            raise MalformedContentError(f"tool_use block {index} has no string 'id'")
        if not isinstance(name, str) or not name:
            raise MalformedContentError(
                f"tool_use block {index} ({tool_use_id}) has no string 'name'",
                tool_use_id=tool_use_id,
            )
        if raw_input is None:
            raw_input = {}
        if not isinstance(raw_input, dict):
            raise MalformedContentError(
                f"tool_use block {index} ({tool_use_id}) has an 'input' that is not an object",
                tool_use_id=tool_use_id,
            )
        if tool_use_id in seen:
            raise MalformedContentError(
                f"tool_use id {tool_use_id!r} appears twice in one message; each call needs its "
                "own id (the Messages API would reject two results for one id)",
                tool_use_id=tool_use_id,
            )
        seen.add(tool_use_id)
        try:
            digest = input_hash(raw_input)
        except (TypeError, ValueError) as exc:
            raise MalformedContentError(
                f"tool_use {tool_use_id!r} has an input that is not JSON: {exc}",
                tool_use_id=tool_use_id,
            ) from exc
        calls.append(
            ToolCall(tool_use_id=tool_use_id, name=name, input=raw_input, input_hash=digest)
        )
    return calls


def tool_result(tool_use_id: str, content: str, *, is_error: bool) -> dict[str, Any]:
    """A ``tool_result`` block; ``is_error`` appears only when true."""
    out: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_use_id, "content": content}
    if is_error:
        out["is_error"] = True
    return out
