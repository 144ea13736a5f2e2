"""OpenAI Chat Completions: ``tool_calls`` of an assistant message, answered by one
``{"role": "tool", "tool_call_id": …, "content": …}`` message per call.

The call id (``id``) is the ledger key, as ``tool_use_id`` is for Anthropic. An error result is
sent as text starting with ``ERROR_PREFIX`` (the API has no error flag). Nothing here imports the
``openai`` SDK.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..codec import shallow, valid_unicode
from ..errors import MalformedContentError
from ..records import StoredMessage, ToolCall
from ._openai_base import (
    ERROR_PREFIX,
    FILTERED,
    OpenAIBase,
    cut_off_call,
    read_call,
    result_text,
    role_content,
    unique,
)
from ._shapes import MessageParts, ModelTurn, StreamCutOff, as_text, field, told

if TYPE_CHECKING:
    from ..tools import ToolSet

__all__ = [
    "OpenAIChat",
    "chat_pairing_errors",
    "chat_wire",
    "read_chat_tool_calls",
    "tool_message",
]


def read_chat_tool_calls(tool_calls: Iterable[Any] | None) -> list[ToolCall]:
    """The calls of a Chat Completions ``tool_calls`` list (SDK objects or dicts), in order."""
    calls: list[ToolCall] = []
    for index, tc in enumerate(tool_calls or []):
        kind = field(tc, "type")
        if kind not in (None, "function"):
            raise MalformedContentError(
                f"tool_calls[{index}] is of type {kind!r}; only function tools are supported"
            )
        function = field(tc, "function")
        calls.append(
            read_call(
                field(tc, "id"),
                field(function, "name"),
                field(function, "arguments"),
                f"tool_calls[{index}]",
            )
        )
    return unique(calls)


def tool_message(tool_use_id: str, content: str, *, is_error: bool) -> dict[str, Any]:
    """The ``{"role": "tool", …}`` message answering the Chat Completions tool call whose id is
    ``tool_use_id``."""
    return {"role": "tool", "tool_call_id": tool_use_id, "content": result_text(content, is_error)}


def _chat_message(message: Any) -> dict[str, Any]:
    """An assistant message as the plain dict we store and send back: role, content, refusal,
    tool_calls — and nothing the API would refuse as input (annotations, audio data)."""
    out: dict[str, Any] = {"role": "assistant", "content": field(message, "content")}
    refusal = field(message, "refusal")
    if refusal:
        out["refusal"] = refusal
    tool_calls = field(message, "tool_calls")
    if tool_calls:
        out["tool_calls"] = [
            {
                "id": field(tc, "id"),
                "type": field(tc, "type") or "function",
                "function": {
                    "name": field(field(tc, "function"), "name"),
                    "arguments": field(field(tc, "function"), "arguments"),
                },
            }
            for tc in tool_calls
        ]
    return out


def chat_pairing_errors(messages: list[dict[str, Any]]) -> list[str]:
    """Violations of the Chat Completions rule: every ``tool_call`` of an assistant message is
    answered by exactly one ``tool`` message, after it and before the next assistant or user
    message; a tool message answers a call of the assistant message just before. Worded as the
    API words them."""
    problems: list[str] = []
    open_ids: list[str] = []  # calls of the last assistant message not answered yet
    answered: set[str] = set()
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "tool":
            tid = m.get("tool_call_id")
            if tid in answered:
                problems.append(f"messages.[{i}]: duplicate tool message for tool_call_id {tid}")
            elif tid not in open_ids:
                problems.append(
                    f"Invalid parameter: messages.[{i}]: messages with role 'tool' must be a "
                    f"response to a preceeding message with 'tool_calls' ({tid})."
                )
            else:
                open_ids.remove(tid)
                answered.add(tid)
            continue
        if open_ids:
            problems.append(
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(open_ids)}"
            )
        open_ids, answered = [], set()
        if role == "assistant":
            open_ids = [tc.get("id") for tc in m.get("tool_calls") or []]
    if open_ids:
        problems.append(
            "messages: the last assistant message has tool_call_ids without tool messages: "
            + ", ".join(open_ids)
        )
    return problems


class OpenAIChat(OpenAIBase):
    """The Chat Completions API for ``Agent``: ``OpenAIChat(openai.OpenAI(), **options)``.

    ``Agent(client=openai.OpenAI())`` uses it with no options. ``options`` are added to every
    request (``temperature=0``, ``parallel_tool_calls=False`` …); ``max_tokens_param`` names the
    token limit (``"max_tokens"`` for servers that predate ``max_completion_tokens``).

    Stored transcript: the prompt as a plain string (``role="user"``); each model turn as its
    assistant message dict (``{"role": "assistant", "content", "tool_calls"}``); each result as
    its own ``{"role": "tool", "tool_call_id", "content"}`` dict.
    """

    name = "openai-chat"
    can_stream = True
    _resource = ("chat", "completions")

    def __init__(
        self, client: Any, *, max_tokens_param: str = "max_completion_tokens", **options: Any
    ) -> None:
        super().__init__(client, **options)
        self.max_tokens_param = max_tokens_param

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
        sent = chat_wire(messages) if wire is None else wire
        if system:
            sent = [{"role": "system", "content": system}, *sent]
        kwargs: dict[str, Any] = {
            "model": model,
            "messages": sent,
            self.max_tokens_param: max_tokens,
        }
        if len(tools):
            kwargs["tools"] = tools.to_openai()
        return {**kwargs, **self.options}

    def stream(self, kwargs: dict[str, Any], on_text: Callable[[str], object]) -> Any:
        try:
            with self.client.chat.completions.stream(**_streamed(kwargs)) as events:
                for event in events:
                    if event.type == "content.delta" and event.delta:
                        on_text(event.delta)
                return _whole(events.get_final_completion())
        except _stopped() as exc:
            return _whole(_completion_of(exc))

    async def astream(self, kwargs: dict[str, Any], on_text: Callable[[str], object]) -> Any:
        try:
            async with self.client.chat.completions.stream(**_streamed(kwargs)) as events:
                async for event in events:
                    if event.type == "content.delta" and event.delta:
                        await told(on_text, event.delta)
                return _whole(await events.get_final_completion())
        except _stopped() as exc:
            return _whole(_completion_of(exc))

    def read_response(self, response: Any) -> ModelTurn:
        choices = field(response, "choices") or []
        if not choices:
            raise MalformedContentError("the Chat Completions response has no choices")
        message = valid_unicode(shallow(_chat_message(field(choices[0], "message"))))
        usage = field(response, "usage")
        finish = field(choices[0], "finish_reason")
        calls = read_chat_tool_calls(message.get("tool_calls"))
        if finish == "length":  # the calls come last: the limit cut the last one
            cut_off_call("length", calls)
        elif finish == "content_filter":  # as the limit does, the filter stops a call midway
            cut_off_call("its content filter (finish_reason 'content_filter')", calls, FILTERED)
        return ModelTurn(
            content=message,
            stop_reason=finish,
            input_tokens=int(field(usage, "prompt_tokens") or 0),
            output_tokens=int(field(usage, "completion_tokens") or 0),
            calls=calls,
            stored_as_is=True,
        )

    def wire(
        self, messages: Sequence[StoredMessage], start: Sequence[dict[str, Any]] = ()
    ) -> list[dict[str, Any]]:
        return [*start, *chat_wire(messages)]

    def tool_calls(self, message: StoredMessage) -> list[ToolCall]:
        if message.role != "assistant" or not isinstance(message.content, Mapping):
            return []
        return read_chat_tool_calls(message.content.get("tool_calls"))

    def call_ids(self, message: StoredMessage) -> list[str]:
        if message.role != "assistant" or not isinstance(message.content, Mapping):
            return []
        calls = message.content.get("tool_calls") or []
        return [
            tc["id"] for tc in calls if isinstance(tc, Mapping) and isinstance(tc.get("id"), str)
        ]

    def results_messages(self, results: list[tuple[str, str, bool]]) -> list[tuple[str, Any]]:
        # One tool message per call, in call order, right after the assistant message.
        return [("tool", tool_message(tid, text, is_error=err)) for tid, text, err in results]

    def final_text(self, message: StoredMessage) -> str:
        content = message.content
        if isinstance(content, Mapping):
            return str(content.get("content") or "")
        return content if isinstance(content, str) else ""

    def read_message(self, message: StoredMessage) -> MessageParts:
        content = message.content
        if not isinstance(content, Mapping):
            return MessageParts([as_text(content)], [], [])
        if message.role == "tool" or content.get("role") == "tool":
            text = content.get("content")
            # Only text without the error prefix reports success.
            failed = not isinstance(text, str) or text.startswith(ERROR_PREFIX)
            return MessageParts(
                [], [], [(str(content.get("tool_call_id", "")), as_text(text), failed)]
            )
        words = content.get("content")
        calls = read_chat_tool_calls(content.get("tool_calls"))
        return MessageParts([as_text(words)] if words else [], calls, [])

    def transcript(self, messages: list[StoredMessage]) -> list[dict[str, Any]]:
        return chat_wire(messages)

    def transcript_errors(self, messages: list[StoredMessage]) -> list[str]:
        wire = chat_wire(messages)
        if wire and wire[-1].get("role") == "assistant" and wire[-1].get("tool_calls"):
            wire = wire[:-1]  # a pending turn: its results are not due yet
        return chat_pairing_errors(wire)


def chat_wire(messages: Iterable[StoredMessage | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A stored Chat Completions transcript as the ``messages`` list of a request (what
    ``Run.messages`` holds)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role, content = role_content(m)
        out.append(
            dict(content) if isinstance(content, Mapping) else {"role": role, "content": content}
        )
    return out


def _stopped() -> tuple[type[Any], ...]:
    """What the SDK's stream raises for a reply that ended at its length limit or its content
    filter (``LengthFinishReasonError``, ``ContentFilterFinishReasonError``), its completion
    as it arrived attached: read as the same reply unstreamed is — a text as it is, a call cut
    off refused (``read_response``) — not raised as an error the run does not expect."""
    from openai import ContentFilterFinishReasonError, LengthFinishReasonError

    return (LengthFinishReasonError, ContentFilterFinishReasonError)


def _completion_of(stopped: Exception) -> Any:
    """The completion the SDK attached to ``stopped`` (``_stopped``) — or, where it kept none,
    ``StreamCutOff``: the reply stopped, and nothing of it is at hand to store or run."""
    completion = getattr(stopped, "completion", None)
    if completion is None:
        raise StreamCutOff(
            f"the response stream stopped ({type(stopped).__name__}) and the SDK kept nothing "
            "of the reply: nothing of it was stored or run"
        ) from stopped
    return completion


def _whole(completion: Any) -> Any:
    """A streamed completion, once its stream has ended: ``StreamCutOff`` unless its choice
    came with a ``finish_reason`` — the SDK hands back whatever arrived."""
    choices = field(completion, "choices") or []
    if not choices or field(choices[0], "finish_reason") is None:
        raise StreamCutOff(
            "the response stream ended before the reply did (no finish_reason): nothing of it "
            "was stored or run"
        )
    return completion


def _streamed(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A request streamed: the usage comes in the stream's last chunk only when asked for."""
    options = dict(kwargs.get("stream_options") or {})
    options.setdefault("include_usage", True)
    return {**kwargs, "stream_options": options}
