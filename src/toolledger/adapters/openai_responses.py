"""OpenAI Responses API: ``function_call`` output items, answered by ``function_call_output``
input items.

The ``call_id`` is the ledger key, as ``tool_use_id`` is for Anthropic. An error result is sent
as text starting with ``ERROR_PREFIX`` (the API has no error flag). Nothing here imports the
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
    plain,
    read_call,
    result_text,
    role_content,
    unique,
)
from ._shapes import MessageParts, ModelTurn, StreamCutOff, as_text, field, told

if TYPE_CHECKING:
    from ..tools import ToolSet

__all__ = [
    "OpenAIResponses",
    "function_call_output",
    "read_function_calls",
    "responses_pairing_errors",
    "responses_wire",
]


def read_function_calls(items: Iterable[Any] | None) -> list[ToolCall]:
    """The ``function_call`` items of a Responses API output (SDK objects or dicts), in order;
    other items (messages, reasoning) are skipped."""
    calls: list[ToolCall] = []
    for index, item in enumerate(items or []):
        if field(item, "type") != "function_call":
            continue
        calls.append(
            read_call(
                field(item, "call_id"),
                field(item, "name"),
                field(item, "arguments"),
                f"output[{index}] (function_call)",
            )
        )
    return unique(calls)


def function_call_output(tool_use_id: str, content: str, *, is_error: bool) -> dict[str, Any]:
    """The ``function_call_output`` input item answering the Responses API function call whose
    ``call_id`` is ``tool_use_id``."""
    return {
        "type": "function_call_output",
        "call_id": tool_use_id,
        "output": result_text(content, is_error),
    }


def responses_pairing_errors(items: list[dict[str, Any]]) -> list[str]:
    """Violations of the Responses API rule: every ``function_call`` gets exactly one
    ``function_call_output`` with its ``call_id``, after it and before the next user message;
    every output answers an earlier call."""
    problems: list[str] = []
    open_ids: list[str] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        kind = item.get("type")
        if kind == "function_call":
            call_id = str(item.get("call_id"))
            if call_id in seen:
                problems.append(f"input[{i}]: duplicate function_call call_id {call_id}")
            seen.add(call_id)
            open_ids.append(call_id)
        elif kind == "function_call_output":
            call_id = str(item.get("call_id"))
            if call_id not in open_ids:
                problems.append(
                    f"input[{i}]: No tool call found for function call output with call_id "
                    f"{call_id}."
                )
            else:
                open_ids.remove(call_id)
        elif item.get("role") == "user" and open_ids:
            problems.append(f"No tool output found for function call {', '.join(open_ids)}.")
            open_ids = []
    if open_ids:
        problems.append(f"No tool output found for function call {', '.join(open_ids)}.")
    return problems


class OpenAIResponses(OpenAIBase):
    """The Responses API for ``Agent``: ``Agent(client=OpenAIResponses(openai.OpenAI()), …)``.

    Each request rebuilds ``input`` from the stored transcript (no ``previous_response_id``: the
    transcript in the store is the truth, and a resumed session may run anywhere). ``options``
    are added to every request — e.g. ``store=False`` and
    ``include=["reasoning.encrypted_content"]`` to keep reasoning items without server state.

    Stored transcript: the prompt as a plain string (``role="user"``); each model turn as the list
    of its ``output`` items (``role="assistant"``: messages, reasoning, ``function_call`` items);
    each turn's results as one list of ``function_call_output`` items (``role="tool"``).
    """

    name = "openai-responses"
    can_stream = True
    _resource = ("responses",)

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
            "input": responses_wire(messages) if wire is None else wire,
            "max_output_tokens": max_tokens,
        }
        if system:
            kwargs["instructions"] = system
        if len(tools):
            kwargs["tools"] = tools.to_openai_responses()
        return {**kwargs, **self.options}

    def stream(self, kwargs: dict[str, Any], on_text: Callable[[str], object]) -> Any:
        last = None
        with self.client.responses.stream(**kwargs) as events:
            for event in events:
                if event.type == "response.output_text.delta" and event.delta:
                    on_text(event.delta)
                elif event.type in _ENDS or event.type == "error":
                    last = event
            return _as_sent(_whole(last))

    async def astream(self, kwargs: dict[str, Any], on_text: Callable[[str], object]) -> Any:
        last = None
        async with self.client.responses.stream(**kwargs) as events:
            async for event in events:
                if event.type == "response.output_text.delta" and event.delta:
                    await told(on_text, event.delta)
                elif event.type in _ENDS or event.type == "error":
                    last = event
            return _as_sent(_whole(last))

    def read_response(self, response: Any) -> ModelTurn:
        _over(response)
        output = valid_unicode(shallow([plain(item) for item in field(response, "output") or []]))
        usage = field(response, "usage")
        calls = read_function_calls(output)
        # Cut at the output limit (or a filter): a call as the last item may be cut short.
        last = output[-1] if output else None
        if (
            field(response, "status") == "incomplete"
            and isinstance(last, Mapping)
            and last.get("type") == "function_call"
        ):
            why = field(field(response, "incomplete_details"), "reason")
            if why == "content_filter":
                cut_off_call("its content filter (status 'incomplete')", calls, FILTERED)
            else:
                cut_off_call("its output limit (status 'incomplete')", calls)
        return ModelTurn(
            content=output,
            stop_reason="tool_calls" if calls else field(response, "status"),
            input_tokens=int(field(usage, "input_tokens") or 0),
            output_tokens=int(field(usage, "output_tokens") or 0),
            calls=calls,
            stored_as_is=True,
        )

    def wire(
        self, messages: Sequence[StoredMessage], start: Sequence[dict[str, Any]] = ()
    ) -> list[dict[str, Any]]:
        return [*start, *responses_wire(messages)]

    def tool_calls(self, message: StoredMessage) -> list[ToolCall]:
        if message.role != "assistant" or not isinstance(message.content, list):
            return []
        return read_function_calls(message.content)

    def call_ids(self, message: StoredMessage) -> list[str]:
        if message.role != "assistant" or not isinstance(message.content, list):
            return []
        return [
            item["call_id"]
            for item in message.content
            if isinstance(item, Mapping)
            and item.get("type") == "function_call"
            and isinstance(item.get("call_id"), str)
        ]

    def results_messages(self, results: list[tuple[str, str, bool]]) -> list[tuple[str, Any]]:
        items = [function_call_output(tid, text, is_error=err) for tid, text, err in results]
        return [("tool", items)]

    def final_text(self, message: StoredMessage) -> str:
        content = message.content
        if isinstance(content, str):
            return content
        texts: list[str] = []
        for item in content if isinstance(content, list) else []:
            if item.get("type") != "message":
                continue
            for part in item.get("content") or []:
                if part.get("type") == "output_text":
                    texts.append(part.get("text", ""))
        return "\n".join(texts)

    def read_message(self, message: StoredMessage) -> MessageParts:
        content = message.content
        if not isinstance(content, list):
            return MessageParts([as_text(content)], [], [])
        texts: list[str] = []
        results: list[tuple[str, str, bool]] = []
        for item in content:
            if not isinstance(item, Mapping):
                continue
            if item.get("type") == "message" or "role" in item:
                parts = item.get("content")
                if isinstance(parts, str):
                    texts.append(parts)
                for part in parts if isinstance(parts, list) else []:
                    if isinstance(part, Mapping) and "text" in part:
                        texts.append(str(part["text"]))
            elif item.get("type") == "function_call_output":
                text = as_text(item.get("output"))
                results.append((str(item.get("call_id", "")), text, text.startswith(ERROR_PREFIX)))
        calls = read_function_calls(content) if message.role == "assistant" else []
        return MessageParts(texts, calls, results)

    def transcript(self, messages: list[StoredMessage]) -> list[dict[str, Any]]:
        return responses_wire(messages)

    def transcript_errors(self, messages: list[StoredMessage]) -> list[str]:
        if messages and self.tool_calls(messages[-1]):
            messages = messages[:-1]  # a pending turn: its results are not due yet
        return responses_pairing_errors(responses_wire(messages))


_OVER = frozenset({"completed", "incomplete"})
"""The statuses of a response that is the model's reply (an ``incomplete`` one stopped at its
limit or a filter: ``read_response`` refuses a call it may have cut)."""


def _over(response: Any) -> None:
    """Raise ``MalformedContentError`` for a response that is not the model's reply:
    ``responses.create`` returns one whatever its ``status`` — ``failed`` or ``cancelled``, its
    output as far as the model got (a call's arguments cut short), or not over yet (``queued``,
    ``in_progress``: a request made with ``background=True``), with no output. Nothing of it
    is stored or run (a stream that ends with ``response.failed`` is refused too: ``_whole``).
    A response without a status (a plain dict) is read as it is."""
    status = field(response, "status")
    if status is None or status in _OVER:
        return
    error = field(response, "error")
    why = f" ({field(error, 'code')}: {field(error, 'message')})" if error else ""
    hint = (
        " Agent reads each response whole: do not pass background=True."
        if status in ("queued", "in_progress")
        else " Run the session again."
    )
    raise MalformedContentError(
        f"the response has status {status!r}{why}, not the model's whole reply: nothing of it "
        "was stored or run." + hint
    )


_ENDS = frozenset({"response.completed", "response.incomplete", "response.failed"})
"""The events that end a streamed response, each with the whole response."""


def _whole(last: Any) -> Any:
    """The response a stream ended with (``last``: its ending event, if one came) — completed,
    or incomplete (``max_output_tokens``), as ``create`` returns it. ``StreamCutOff`` for a
    stream that ended before any, with ``response.failed``, or with an ``error`` event (which
    the SDK hands over as an event, not an exception): nothing of it is stored or run.
    (The SDK's ``get_final_response`` raises a ``RuntimeError`` for both.)"""
    if last is None:
        raise StreamCutOff(
            "the response stream ended before the reply did (no response.completed): nothing "
            "of it was stored or run"
        )
    if last.type == "error":  # the API's own word on why the stream stopped
        raise StreamCutOff(
            f"the response stream ended with an error ({field(last, 'code')}: "
            f"{field(last, 'message')}): nothing of the reply was stored or run"
        )
    response = field(last, "response")
    if last.type == "response.failed":
        error = field(response, "error")
        raise StreamCutOff(
            f"the response stream ended with response.failed ({field(error, 'code')}: "
            f"{field(error, 'message')}): nothing of it was stored or run"
        )
    return response


def _as_sent(response: Any) -> dict[str, Any]:
    """A streamed response as the API sent it: its output items without the fields the SDK's
    stream helper adds while it parses (``parsed`` on a text part, ``parsed_arguments`` on a
    function call — not API fields: the API refuses them in a later request's ``input``), its
    status, why it is incomplete, and its usage (what ``read_response`` reads)."""
    output = [_unparsed(plain(item)) for item in field(response, "output") or []]
    return {
        "output": output,
        "status": field(response, "status"),
        "incomplete_details": plain(field(response, "incomplete_details")),
        "usage": plain(field(response, "usage")),
    }


def _unparsed(item: Any) -> Any:
    if not isinstance(item, dict):
        return item
    if item.get("type") == "function_call":
        return {k: v for k, v in item.items() if k != "parsed_arguments"}
    if item.get("type") == "message" and isinstance(item.get("content"), list):
        parts = [
            {k: v for k, v in p.items() if k != "parsed"}
            if isinstance(p, dict) and p.get("type") == "output_text"
            else p
            for p in item["content"]
        ]
        return {**item, "content": parts}
    return item


def responses_wire(messages: Iterable[StoredMessage | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A stored Responses API transcript as the ``input`` items of a request (what
    ``Run.messages`` holds)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role, content = role_content(m)
        if isinstance(content, list):
            out.extend(dict(item) for item in content)
        else:
            out.append({"role": role, "content": content})
    return out
