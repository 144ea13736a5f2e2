"""Anthropic Messages API shapes: reading ``tool_use`` blocks, writing ``tool_result`` ones.

Blocks may be SDK objects (``anthropic.types.ToolUseBlock``) or plain dicts; this module imports
nothing from the SDK.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from ..codec import MAX_NESTING, input_hash, nesting, shallow, valid_unicode
from ..errors import MalformedContentError
from ..records import StoredMessage, ToolCall
from ._shapes import (
    MessageParts,
    ModelTurn,
    StreamCutOff,
    as_text,
    check_call_id,
    field,
    told,
)

if TYPE_CHECKING:
    from ..tools import ToolSet

__all__ = [
    "AnthropicProvider",
    "merged",
    "pairing_errors",
    "read_tool_uses",
    "tool_result",
]


def read_tool_uses(content: Any) -> list[ToolCall]:
    """The ``tool_use`` blocks of a message's content, in order; other blocks are skipped.

    Accepts the content list, or a whole message (SDK ``Message`` or dict with ``content``).
    Raises ``MalformedContentError`` for a block we cannot read, a tool_use id seen twice, or a
    whole message cut off while it wrote a call.
    """
    if isinstance(content, dict) and "content" in content and "type" not in content:
        _cut_off_call(content.get("stop_reason"), content["content"])
        content = content["content"]
    elif not isinstance(content, (list, tuple, dict, str)) and hasattr(content, "content"):
        _cut_off_call(getattr(content, "stop_reason", None), content.content)
        content = content.content
    if type(content) is not list and (  # the common case skips the ABC check
        isinstance(content, (str, bytes, dict)) or not isinstance(content, Iterable)
    ):
        raise MalformedContentError(
            f"expected a list of content blocks, got {type(content).__name__}"
        )
    calls: list[ToolCall] = []
    seen: set[str] = set()
    for index, block in enumerate(content):
        read = block.get if type(block) is dict else partial(field, block)  # a dict read as one
        kind = read("type")
        if kind is None:
            raise MalformedContentError(f"content block {index} has no 'type': {block!r:.200}")
        if kind != "tool_use":
            continue
        tool_use_id, name, raw_input = read("id"), read("name"), read("input")
        if not isinstance(tool_use_id, str) or not tool_use_id:
            raise MalformedContentError(f"tool_use block {index} has no string 'id'")
        check_call_id(tool_use_id, f"tool_use block {index}")
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
        calls.append(_call(tool_use_id, name, raw_input))
    return calls


_RAISE_LIMIT = "Raise max_tokens and run the session again."
_CUT_OFF = {
    "max_tokens": _RAISE_LIMIT,
    "model_context_window_exceeded": _RAISE_LIMIT,
    # The API's safety classifiers stopped the reply where it was (a larger limit gets the
    # same): the model declined to go on with it.
    "refusal": "The model refused to go on: change the prompt, or settle the work another way.",
}
"""Stop reasons of a reply the API ended mid-block (its last block may be incomplete), each
with what gets a whole reply."""


def _cut_off_call(stop_reason: Any, blocks: Any) -> None:
    """Raise ``MalformedContentError`` when a reply that stopped at its token limit (or that
    the API's classifiers stopped: ``refusal``) ends with a ``tool_use`` block: the stop may
    have cut that call's input short (the SDK's stream reads partial JSON as far as it goes:
    ``{"amount": 10`` of ``{"amount": 1000}`` is ``10``), and running it would do something
    nobody asked for. Nothing is stored or run; the error says what gets a whole reply
    (``_CUT_OFF``)."""
    remedy = _CUT_OFF.get(stop_reason) if isinstance(stop_reason, str) else None
    if remedy is None:
        return
    if not isinstance(blocks, (list, tuple)) or not blocks:
        return
    last = blocks[-1]
    if field(last, "type") != "tool_use":
        return
    tool_use_id = field(last, "id")
    raise MalformedContentError(
        f"the model's reply stopped at {stop_reason} while it wrote a call of "
        f"{field(last, 'name')!r} ({tool_use_id}), whose input may be cut short: nothing was "
        f"stored or run. {remedy}",
        tool_use_id=tool_use_id if isinstance(tool_use_id, str) else None,
    )


def _call(tool_use_id: str, name: str, raw_input: dict[str, Any]) -> ToolCall:
    if nesting(raw_input) > MAX_NESTING:
        # Answered with an error, like arguments that are not an object: nothing runs.
        cut = {"input": f"(nested more than {MAX_NESTING} levels deep)"}
        return ToolCall(
            tool_use_id=tool_use_id,
            name=name,
            input=cut,
            input_hash=input_hash(cut),
            problem=(
                f"the input of {name!r} is nested more than {MAX_NESTING} levels deep; call it "
                "again with a flatter input"
            ),
        )
    try:
        digest = input_hash(raw_input)
    except (TypeError, ValueError) as exc:
        raise MalformedContentError(
            f"tool_use {tool_use_id!r} has an input that is not JSON (a number JSON cannot "
            f"hold — NaN, Infinity, 1e400 — or an object that is not JSON): {exc}. Nothing "
            "was stored or run.",
            tool_use_id=tool_use_id,
        ) from exc
    return ToolCall(tool_use_id=tool_use_id, name=name, input=raw_input, input_hash=digest)


def tool_result(tool_use_id: str, content: str, *, is_error: bool) -> dict[str, Any]:
    """A ``tool_result`` block; ``is_error`` appears only when true."""
    out: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_use_id, "content": content}
    if is_error:
        out["is_error"] = True
    return out


# -- the agent's provider: requests, responses, transcripts --------------------------------------


class AnthropicProvider:
    """The Messages API: ``client`` is ``anthropic.Anthropic`` or ``anthropic.AsyncAnthropic``
    (or anything with the same ``messages.create``); ``None`` makes a provider that only reads
    stored transcripts."""

    name = "anthropic"

    def __init__(self, client: Any) -> None:
        self.client = client
        self.is_async = client is not None and _is_async_client(client)

    # calling

    def create(self, kwargs: dict[str, Any]) -> Any:
        return self.client.messages.create(**kwargs)

    async def acreate(self, kwargs: dict[str, Any]) -> Any:
        return await self.client.messages.create(**kwargs)

    can_stream = True

    def stream(self, kwargs: dict[str, Any], on_text: Callable[[str], object]) -> Any:
        with self.client.messages.stream(**kwargs) as events:
            for text in events.text_stream:
                if text:
                    on_text(text)
            return _whole(events.get_final_message())

    async def astream(self, kwargs: dict[str, Any], on_text: Callable[[str], object]) -> Any:
        async with self.client.messages.stream(**kwargs) as events:
            async for text in events.text_stream:
                if text:
                    await told(on_text, text)
            return _whole(await events.get_final_message())

    def is_api_error(self, exc: BaseException) -> bool:
        """An error of the API (HTTP status, timeout, connection), not of our own code."""
        try:
            import anthropic
        except ImportError:  # a duck-typed client without the SDK
            return False
        return isinstance(exc, anthropic.APIError)

    # shapes

    def request(
        self,
        *,
        model: str,
        max_tokens: int,
        system: str | None,
        tools: ToolSet,
        messages: list[StoredMessage],
        wire: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": model,
            "max_tokens": max_tokens,
            "messages": merged(messages) if wire is None else wire,
        }
        if len(tools):
            kwargs["tools"] = tools.to_anthropic()
        if system:
            kwargs["system"] = system
        return kwargs

    def read_response(self, response: Any) -> ModelTurn:
        # As stored, and as the API can take back: no lone surrogate, nothing nested too deep.
        content = valid_unicode(shallow([_plain(b) for b in field(response, "content") or []]))
        stop_reason = field(response, "stop_reason")
        if type(stop_reason) is str and stop_reason in _CUT_OFF:
            _cut_off_call(stop_reason, content)
        usage = field(response, "usage")
        return ModelTurn(
            content=content,
            stop_reason=stop_reason,
            input_tokens=int(field(usage, "input_tokens") or 0) if usage is not None else 0,
            output_tokens=int(field(usage, "output_tokens") or 0) if usage is not None else 0,
            calls=read_tool_uses(content),
            stored_as_is=True,
        )

    def wire(
        self, messages: Sequence[StoredMessage], start: Sequence[dict[str, Any]] = ()
    ) -> list[dict[str, Any]]:
        return merged(messages, start)

    def tool_calls(self, message: StoredMessage) -> list[ToolCall]:
        if message.role != "assistant" or not isinstance(message.content, list):
            return []
        return read_tool_uses(message.content)

    def call_ids(self, message: StoredMessage) -> list[str]:
        if message.role != "assistant" or not isinstance(message.content, list):
            return []
        return [
            b["id"]
            for b in message.content
            if isinstance(b, Mapping)
            and b.get("type") == "tool_use"
            and isinstance(b.get("id"), str)
        ]

    def results_messages(self, results: list[tuple[str, str, bool]]) -> list[tuple[str, Any]]:
        # One user message, every tool_result first and in call order (the pairing rule).
        return [("user", [tool_result(tid, text, is_error=err) for tid, text, err in results])]

    def prompt_message(self, prompt: str) -> tuple[str, Any]:
        return "user", prompt

    def prompt_text(self, message: StoredMessage) -> str | None:
        content = message.content
        if message.role != "user":
            return None
        if isinstance(content, str):
            return content
        texts = [b.get("text", "") for b in content if b.get("type") == "text"]
        has_results = any(b.get("type") == "tool_result" for b in content)
        return None if has_results or not texts else "\n".join(texts)

    def final_text(self, message: StoredMessage) -> str:
        content = message.content
        if isinstance(content, str):
            return content
        return "\n".join(b.get("text", "") for b in content if b.get("type") == "text")

    def read_message(self, message: StoredMessage) -> MessageParts:
        content = message.content
        if isinstance(content, str):
            return MessageParts([content], [], [])
        blocks = [b for b in content if isinstance(b, Mapping)]
        texts = [str(b.get("text", "")) for b in blocks if b.get("type") == "text"]
        if message.role == "assistant":
            return MessageParts(texts, read_tool_uses(content), [])
        results = []
        for b in blocks:
            if b.get("type") != "tool_result":
                continue
            value = b.get("content")
            if isinstance(value, list):
                value = "\n".join(
                    str(p.get("text", "")) if isinstance(p, Mapping) else str(p) for p in value
                )
            results.append((str(b.get("tool_use_id", "")), as_text(value), bool(b.get("is_error"))))
        return MessageParts(texts, [], results)

    def transcript(self, messages: list[StoredMessage]) -> list[dict[str, Any]]:
        return [{"role": m.role, "content": m.content} for m in messages]

    def transcript_errors(self, messages: list[StoredMessage]) -> list[str]:
        wire = merged(messages)
        last = wire[-1] if wire else None
        if last and last["role"] == "assistant" and read_tool_uses(_blocks(last["content"])):
            wire = wire[:-1]  # a pending turn: its results are not due yet
        return pairing_errors(wire)


def _whole(message: Any) -> Any:
    """A streamed reply, once its stream has ended: ``StreamCutOff`` unless it ended after the
    ``message_delta`` event that says why the model stopped (``stop_reason``) — the SDK hands
    back whatever arrived, a call's input read from partial JSON as far as it goes."""
    if field(message, "stop_reason") is None:
        raise StreamCutOff(
            "the response stream ended before the reply did (no stop_reason): nothing of it "
            "was stored or run"
        )
    return message


def _is_async_client(client: Any) -> bool:
    try:
        import anthropic
    except ImportError:
        pass
    else:
        if isinstance(client, anthropic.AsyncAnthropic):
            return True
        if isinstance(client, anthropic.Anthropic):
            return False
    # A duck-typed client: the SDK's own methods are wrapped, so ask the function itself.
    return inspect.iscoroutinefunction(inspect.unwrap(client.messages.create))


def _plain(block: Any) -> dict[str, Any]:
    """An SDK content block as the plain JSON the API accepts back."""
    if isinstance(block, dict):
        return dict(block)
    dump = getattr(block, "model_dump", None)
    if callable(dump):
        out: dict[str, Any] = dump(mode="json", exclude_none=True)
        raw_input = getattr(block, "input", None)
        if out.get("type") == "tool_use" and isinstance(raw_input, dict):
            # The input as the SDK read it: the JSON dump writes a number JSON cannot hold
            # (1e400, read as infinity) as null, and the tool would run with an input nobody
            # sent. Kept, it is refused (``_call``).
            out["input"] = raw_input
        return out
    raise MalformedContentError(f"cannot read content block {block!r:.200}")


def merged(
    messages: Iterable[StoredMessage], start: Sequence[dict[str, Any]] = ()
) -> list[dict[str, Any]]:
    """The transcript as the Messages API wants it: consecutive messages of one role become one
    (the tool_result message and a following prompt are sent as a single user turn, results
    first), and a model turn with nothing to say is sent saying ``NO_CONTENT`` (``said``).
    ``start``, the merged messages before ``messages``, is continued: a new list, and a last
    entry that a message merges into is replaced by a new one, never changed."""
    out: list[dict[str, Any]] = list(start)
    for m in messages:
        content = said(m.content) if m.role == "assistant" else m.content
        if out and out[-1]["role"] == m.role:
            out[-1] = {"role": m.role, "content": _blocks(out[-1]["content"]) + _blocks(content)}
        else:
            out.append({"role": m.role, "content": content})
    return out


NO_CONTENT = "(no content)"
"""What a model turn that said nothing says when it is sent back."""


def said(content: Any) -> Any:
    """A stored model turn's content as the API takes it back: the model may end a turn with no
    content (``end_turn`` and ``[]``) or with an empty text block, which it stores as it came;
    the API refuses both in a request (only a final assistant message may be empty, and a text
    block never), so empty text blocks are left out, and a turn left with nothing says
    ``NO_CONTENT``. Content with nothing empty is returned as it is."""
    if content and (isinstance(content, str) or not any(_empty_text(b) for b in content)):
        return content
    kept = [] if isinstance(content, str) else [b for b in content if not _empty_text(b)]
    return kept or [{"type": "text", "text": NO_CONTENT}]


def _empty_text(block: Any) -> bool:
    return isinstance(block, Mapping) and block.get("type") == "text" and not block.get("text")


def _blocks(content: Any) -> list[Any]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def pairing_errors(messages: list[dict[str, Any]]) -> list[str]:
    """Violations of the Messages API's tool_use/tool_result rule, worded as the API words them."""
    problems: list[str] = []
    if not messages or messages[0].get("role") != "user":
        problems.append('messages: first message must use the "user" role')
    previous_ids: list[str] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        blocks = content if isinstance(content, list) else []
        final_assistant = i == len(messages) - 1 and message.get("role") == "assistant"
        if not content and not final_assistant:
            problems.append(
                f"messages.{i}: all messages must have non-empty content except for the "
                "optional final assistant message"
            )
        if any(_empty_text(b) for b in blocks):
            problems.append(f"messages.{i}: text content blocks must be non-empty")
        if message.get("role") == "user":
            leading = []
            seen_other = False
            for j, block in enumerate(blocks):
                if block.get("type") == "tool_result":
                    if seen_other:
                        problems.append(
                            f"messages.{i}.content.{j}: tool_result blocks must come first in "
                            "the user message, before any other content"
                        )
                    leading.append(block.get("tool_use_id"))
                else:
                    seen_other = True
            for tid in leading:
                if tid not in previous_ids:
                    problems.append(
                        f"messages.{i}.content: unexpected `tool_use_id` found in `tool_result` "
                        f"blocks: {tid}. Each `tool_result` block must have a corresponding "
                        "`tool_use` block in the previous message."
                    )
            if len(set(leading)) != len(leading):
                problems.append(f"messages.{i}.content: duplicate tool_result for one tool_use")
            missing = [tid for tid in previous_ids if tid not in leading]
            if missing:
                problems.append(
                    f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(missing)}. Each `tool_use` block must have a "
                    "corresponding `tool_result` block in the next message."
                )
            previous_ids = []
        else:
            if previous_ids:
                problems.append(
                    f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(previous_ids)}."
                )
            previous_ids = [b.get("id") for b in blocks if b.get("type") == "tool_use"]
    if previous_ids:
        problems.append(
            f"messages: the last message has `tool_use` ids without `tool_result` blocks: "
            f"{', '.join(previous_ids)}"
        )
    return problems
