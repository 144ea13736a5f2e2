"""OpenAI shapes: Chat Completions ``tool_calls`` and Responses API ``function_call`` items.

Both seams of ``toolledger.adapters`` are filled, so the ledger, the approval gate and the
durable loop are the same code as for Anthropic:

* ``run_tool_uses`` accepts a ``ChatCompletionMessage`` (SDK object or dict), a whole
  ``ChatCompletion``, or a list of its ``tool_calls`` — and returns one
  ``{"role": "tool", "tool_call_id": …, "content": …}`` message per call; or a Responses API
  ``Response`` / its ``output`` items — and returns ``{"type": "function_call_output", …}``
  items. The call id (``id`` / ``call_id``) is the ledger key, as ``tool_use_id`` is for
  Anthropic.
* ``Agent(client=openai.OpenAI())`` (or ``AsyncOpenAI``) runs on Chat Completions;
  ``Agent(client=OpenAIResponses(openai.OpenAI()))`` on the Responses API.

OpenAI has no ``is_error`` flag on a tool result, so an error result is sent as text starting
with ``ERROR_PREFIX`` ("Error: "). Arguments arrive as a JSON *string*; arguments that are not a
JSON object never reach the tool: the call answers an error naming the problem, and nothing is
recorded. Nothing here imports the ``openai`` SDK at import time: shapes are read by duck typing,
and the SDK is looked at only when a client is given.
"""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..codec import MAX_NESTING, input_hash, nesting, shallow, valid_unicode
from ..errors import MalformedContentError
from ..records import StoredMessage, ToolCall
from ._shapes import ModelTurn, ResultShape, check_call_id

if TYPE_CHECKING:
    from ..tools import ToolSet

__all__ = [
    "ERROR_PREFIX",
    "OpenAIChat",
    "OpenAIResponses",
    "chat_pairing_errors",
    "chat_wire",
    "function_call_output",
    "read_chat_tool_calls",
    "read_function_calls",
    "read_openai",
    "responses_pairing_errors",
    "responses_wire",
    "successes",
    "tool_message",
    "transcript_kind",
]

ERROR_PREFIX = "Error: "
"""How an ``is_error`` result starts: OpenAI tool results have no error flag of their own."""

_JSON_NAMES = {
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


def _field(obj: Any, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _plain(obj: Any) -> Any:
    """An SDK object as the plain JSON the API sent (and accepts back)."""
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if isinstance(obj, Mapping):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    to_dict = getattr(obj, "to_dict", None)  # openai's BaseModel: what the API sent, API names
    if callable(to_dict):
        out: Any = to_dict(mode="json")
        return out
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        dumped: Any = dump(mode="json", by_alias=True, exclude_unset=True)
        return dumped
    raise MalformedContentError(f"cannot read {obj!r:.200} as OpenAI JSON")


def _text(content: str, is_error: bool) -> str:
    return ERROR_PREFIX + content if is_error else content


def _call(call_id: Any, name: Any, arguments: Any, where: str) -> ToolCall:
    """A ``ToolCall`` from an id, a name and a JSON-string (or already parsed) ``arguments``.

    Arguments that are not a JSON object make a call with a ``problem``: the runner answers it
    with an error and runs and records nothing.
    """
    if not isinstance(call_id, str) or not call_id:
        raise MalformedContentError(f"{where} has no string id")
    check_call_id(call_id, where)
    if not isinstance(name, str) or not name:
        raise MalformedContentError(f"{where} ({call_id}) has no string name", tool_use_id=call_id)
    parsed: Any
    why: str | None = None
    if isinstance(arguments, Mapping):
        parsed = dict(arguments)
    elif arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        parsed = {}
    elif isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError as exc:
            parsed, why = None, f"invalid JSON ({exc})"
        except RecursionError:
            parsed, why = None, "nested too deep to read"
        else:
            if not isinstance(parsed, dict):
                why = f"got {_JSON_NAMES.get(type(parsed), type(parsed).__name__)}"
    else:
        raise MalformedContentError(
            f"{where} ({call_id}) has arguments that are neither a string nor an object",
            tool_use_id=call_id,
        )
    if why is None and isinstance(parsed, dict) and nesting(parsed) > MAX_NESTING:
        why = f"nested more than {MAX_NESTING} levels deep"
    if why is not None:
        raw = arguments if isinstance(arguments, str) else ""
        bad = {"arguments": raw}
        return ToolCall(
            tool_use_id=call_id,
            name=name,
            input=bad,
            input_hash=input_hash(bad),
            problem=(
                f"the arguments of {name!r} cannot be used: {why}; call it again with a flatter "
                "JSON object"
                if why.startswith("nested")
                else f"the arguments of {name!r} are not a JSON object: {why}; call it again "
                "with its arguments as a JSON object"
            ),
        )
    try:
        digest = input_hash(parsed)
    except (TypeError, ValueError) as exc:
        raise MalformedContentError(
            f"{where} ({call_id}) has arguments that are not JSON: {exc}", tool_use_id=call_id
        ) from exc
    return ToolCall(tool_use_id=call_id, name=name, input=parsed, input_hash=digest)


def _unique(calls: list[ToolCall]) -> list[ToolCall]:
    seen: set[str] = set()
    for c in calls:
        if c.tool_use_id in seen:
            raise MalformedContentError(
                f"tool call id {c.tool_use_id!r} appears twice in one message; each call needs "
                "its own id",
                tool_use_id=c.tool_use_id,
            )
        seen.add(c.tool_use_id)
    return calls


# -- Chat Completions ----------------------------------------------------------------------------


def read_chat_tool_calls(tool_calls: Iterable[Any] | None) -> list[ToolCall]:
    """The calls of a Chat Completions ``tool_calls`` list (SDK objects or dicts), in order."""
    calls: list[ToolCall] = []
    for index, tc in enumerate(tool_calls or []):
        kind = _field(tc, "type")
        if kind not in (None, "function"):
            raise MalformedContentError(
                f"tool_calls[{index}] is of type {kind!r}; only function tools are supported"
            )
        function = _field(tc, "function")
        calls.append(
            _call(
                _field(tc, "id"),
                _field(function, "name"),
                _field(function, "arguments"),
                f"tool_calls[{index}]",
            )
        )
    return _unique(calls)


def tool_message(tool_use_id: str, content: str, *, is_error: bool) -> dict[str, Any]:
    """The ``{"role": "tool", …}`` message answering the Chat Completions tool call whose id is
    ``tool_use_id``."""
    return {"role": "tool", "tool_call_id": tool_use_id, "content": _text(content, is_error)}


def _chat_message(message: Any) -> dict[str, Any]:
    """An assistant message as the plain dict we store and send back: role, content, refusal,
    tool_calls — and nothing the API would refuse as input (annotations, audio data)."""
    out: dict[str, Any] = {"role": "assistant", "content": _field(message, "content")}
    refusal = _field(message, "refusal")
    if refusal:
        out["refusal"] = refusal
    tool_calls = _field(message, "tool_calls")
    if tool_calls:
        out["tool_calls"] = [
            {
                "id": _field(tc, "id"),
                "type": _field(tc, "type") or "function",
                "function": {
                    "name": _field(_field(tc, "function"), "name"),
                    "arguments": _field(_field(tc, "function"), "arguments"),
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


class _OpenAIBase:
    """What both OpenAI APIs share: the client, its errors, prompts."""

    name = "openai"
    _resource: tuple[str, ...] = ()

    def __init__(self, client: Any, **options: Any) -> None:
        self.client = client
        self.options = dict(options)  # extra request arguments (temperature, store, …)
        self.is_async = _is_async(client, self._resource)

    def _create_fn(self) -> Callable[..., Any]:
        target: Any = self.client
        for part in self._resource:
            target = getattr(target, part)
        fn: Callable[..., Any] = target.create
        return fn

    def create(self, kwargs: dict[str, Any]) -> Any:
        return self._create_fn()(**kwargs)

    async def acreate(self, kwargs: dict[str, Any]) -> Any:
        return await self._create_fn()(**kwargs)

    def is_api_error(self, exc: BaseException) -> bool:
        """An error of the API (HTTP status, timeout, connection), not of our own code."""
        openai = sys.modules.get("openai")
        error = getattr(openai, "APIError", None)
        return isinstance(error, type) and isinstance(exc, error)

    def prompt_message(self, prompt: str) -> tuple[str, Any]:
        return "user", prompt

    def prompt_text(self, message: StoredMessage) -> str | None:
        if message.role == "user" and isinstance(message.content, str):
            return message.content
        return None


class OpenAIChat(_OpenAIBase):
    """The Chat Completions API for ``Agent``: ``OpenAIChat(openai.OpenAI(), **options)``.

    ``Agent(client=openai.OpenAI())`` uses it with no options. ``options`` are added to every
    request (``temperature=0``, ``parallel_tool_calls=False`` …); ``max_tokens_param`` names the
    token limit (``"max_tokens"`` for servers that predate ``max_completion_tokens``).

    Stored transcript: the prompt as a plain string (``role="user"``); each model turn as its
    assistant message dict (``{"role": "assistant", "content", "tool_calls"}``); each result as
    its own ``{"role": "tool", "tool_call_id", "content"}`` dict.
    """

    name = "openai-chat"
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
    ) -> dict[str, Any]:
        wire = chat_wire(messages)
        if system:
            wire.insert(0, {"role": "system", "content": system})
        kwargs: dict[str, Any] = {
            "model": model,
            "messages": wire,
            self.max_tokens_param: max_tokens,
        }
        if len(tools):
            kwargs["tools"] = tools.to_openai()
        return {**kwargs, **self.options}

    def read_response(self, response: Any) -> ModelTurn:
        choices = _field(response, "choices") or []
        if not choices:
            raise MalformedContentError("the Chat Completions response has no choices")
        message = valid_unicode(shallow(_chat_message(_field(choices[0], "message"))))
        usage = _field(response, "usage")
        return ModelTurn(
            content=message,
            stop_reason=_field(choices[0], "finish_reason"),
            input_tokens=int(_field(usage, "prompt_tokens") or 0),
            output_tokens=int(_field(usage, "completion_tokens") or 0),
            calls=read_chat_tool_calls(message.get("tool_calls")),
        )

    def tool_calls(self, message: StoredMessage) -> list[ToolCall]:
        if message.role != "assistant" or not isinstance(message.content, Mapping):
            return []
        return read_chat_tool_calls(message.content.get("tool_calls"))

    def results_messages(self, results: list[tuple[str, str, bool]]) -> list[tuple[str, Any]]:
        # One tool message per call, in call order, right after the assistant message.
        return [("tool", tool_message(tid, text, is_error=err)) for tid, text, err in results]

    def final_text(self, message: StoredMessage) -> str:
        content = message.content
        if isinstance(content, Mapping):
            return str(content.get("content") or "")
        return content if isinstance(content, str) else ""

    def transcript(self, messages: list[StoredMessage]) -> list[dict[str, Any]]:
        return chat_wire(messages)

    def transcript_errors(self, messages: list[StoredMessage]) -> list[str]:
        wire = chat_wire(messages)
        if wire and wire[-1].get("role") == "assistant" and wire[-1].get("tool_calls"):
            wire = wire[:-1]  # a pending turn: its results are not due yet
        return chat_pairing_errors(wire)


def _role_content(m: StoredMessage | Mapping[str, Any]) -> tuple[str, Any]:
    if isinstance(m, Mapping):
        return m["role"], m["content"]
    return m.role, m.content


def chat_wire(messages: Iterable[StoredMessage | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A stored Chat Completions transcript as the ``messages`` list of a request (what
    ``Run.messages`` holds)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role, content = _role_content(m)
        out.append(
            dict(content) if isinstance(content, Mapping) else {"role": role, "content": content}
        )
    return out


# -- Responses API -------------------------------------------------------------------------------


def read_function_calls(items: Iterable[Any] | None) -> list[ToolCall]:
    """The ``function_call`` items of a Responses API output (SDK objects or dicts), in order;
    other items (messages, reasoning) are skipped."""
    calls: list[ToolCall] = []
    for index, item in enumerate(items or []):
        if _field(item, "type") != "function_call":
            continue
        calls.append(
            _call(
                _field(item, "call_id"),
                _field(item, "name"),
                _field(item, "arguments"),
                f"output[{index}] (function_call)",
            )
        )
    return _unique(calls)


def function_call_output(tool_use_id: str, content: str, *, is_error: bool) -> dict[str, Any]:
    """The ``function_call_output`` input item answering the Responses API function call whose
    ``call_id`` is ``tool_use_id``."""
    return {
        "type": "function_call_output",
        "call_id": tool_use_id,
        "output": _text(content, is_error),
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


class OpenAIResponses(_OpenAIBase):
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
    _resource = ("responses",)

    def request(
        self,
        *,
        model: str,
        max_tokens: int,
        system: str | None,
        tools: ToolSet,
        messages: list[StoredMessage],
    ) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": model,
            "input": responses_wire(messages),
            "max_output_tokens": max_tokens,
        }
        if system:
            kwargs["instructions"] = system
        if len(tools):
            kwargs["tools"] = tools.to_openai_responses()
        return {**kwargs, **self.options}

    def read_response(self, response: Any) -> ModelTurn:
        output = valid_unicode(shallow([_plain(item) for item in _field(response, "output") or []]))
        usage = _field(response, "usage")
        calls = read_function_calls(output)
        return ModelTurn(
            content=output,
            stop_reason="tool_calls" if calls else _field(response, "status"),
            input_tokens=int(_field(usage, "input_tokens") or 0),
            output_tokens=int(_field(usage, "output_tokens") or 0),
            calls=calls,
        )

    def tool_calls(self, message: StoredMessage) -> list[ToolCall]:
        if message.role != "assistant" or not isinstance(message.content, list):
            return []
        return read_function_calls(message.content)

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

    def transcript(self, messages: list[StoredMessage]) -> list[dict[str, Any]]:
        return responses_wire(messages)

    def transcript_errors(self, messages: list[StoredMessage]) -> list[str]:
        if messages and self.tool_calls(messages[-1]):
            messages = messages[:-1]  # a pending turn: its results are not due yet
        return responses_pairing_errors(responses_wire(messages))


def responses_wire(messages: Iterable[StoredMessage | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A stored Responses API transcript as the ``input`` items of a request (what
    ``Run.messages`` holds)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role, content = _role_content(m)
        if isinstance(content, list):
            out.extend(dict(item) for item in content)
        else:
            out.append({"role": role, "content": content})
    return out


# -- which shape is this? ----------------------------------------------------------------------

_RESPONSES_ITEMS = frozenset({"function_call", "function_call_output", "reasoning"})


def _is_responses_list(items: list[Any]) -> bool:
    return any(_field(i, "type") == "function_call" for i in items)


def _is_chat_call_list(items: list[Any]) -> bool:
    return any(_field(i, "function") is not None and _field(i, "id") is not None for i in items)


def read_openai(content: Any) -> tuple[list[ToolCall], ResultShape] | None:
    """The ``run_tool_uses`` reader for OpenAI shapes (``None``: not an OpenAI shape).

    Chat Completions: a ``ChatCompletion`` (its first choice), a ``ChatCompletionMessage`` or its
    dict, or a list of ``tool_calls``. Responses API: a ``Response`` or its dict, or a list of
    output items holding a ``function_call``.
    """
    if isinstance(content, (str, bytes)):
        return None
    if _field(content, "choices") is not None and _field(content, "object") != "response":
        choices = _field(content, "choices")
        if not choices:
            raise MalformedContentError("the ChatCompletion has no choices")
        content = _field(choices[0], "message")
    if isinstance(content, (list, tuple)):
        items = list(content)
        if _is_responses_list(items):
            return read_function_calls(items), function_call_output
        if _is_chat_call_list(items):
            return read_chat_tool_calls(items), tool_message
        return None
    if _field(content, "object") == "response" or (
        isinstance(content, Mapping) and isinstance(content.get("output"), list)
    ):
        return read_function_calls(_field(content, "output")), function_call_output
    if _field(content, "tool_calls") is not None or _is_chat_assistant(content):
        return read_chat_tool_calls(_field(content, "tool_calls")), tool_message
    return None


def _is_chat_assistant(content: Any) -> bool:
    """A Chat Completions assistant message without calls: its content is text or null (an
    Anthropic message's content is a list of blocks)."""
    if isinstance(content, Mapping):
        return content.get("role") == "assistant" and (
            "tool_calls" in content or isinstance(content.get("content"), (str, type(None)))
        )
    return (
        _field(content, "role") == "assistant"
        and hasattr(content, "tool_calls")
        and not isinstance(_field(content, "content"), list)
    )


def successes(message: StoredMessage) -> list[str]:
    """The call ids a stored OpenAI result message reports as succeeded (its text does not start
    with ``ERROR_PREFIX``)."""
    if message.role != "tool":
        return []
    content = message.content
    if isinstance(content, Mapping):
        text = content.get("content")
        ok = isinstance(text, str) and not text.startswith(ERROR_PREFIX)
        return [content.get("tool_call_id", "")] if ok else []
    items = content if isinstance(content, list) else []
    return [
        i.get("call_id", "")
        for i in items
        if i.get("type") == "function_call_output"
        and not str(i.get("output", "")).startswith(ERROR_PREFIX)
    ]


def transcript_kind(messages: list[StoredMessage]) -> str | None:
    """``"openai-chat"`` or ``"openai-responses"`` for a stored transcript in that shape, else
    ``None`` (an Anthropic transcript, or one with no model turn yet)."""
    for m in messages:
        if m.role not in ("assistant", "tool"):
            continue
        if isinstance(m.content, Mapping):
            return "openai-chat"
        if isinstance(m.content, list) and any(
            isinstance(i, Mapping)
            and (i.get("type") in _RESPONSES_ITEMS or (i.get("type") == "message"))
            for i in m.content
        ):
            return "openai-responses"
        return None
    return None


# -- clients -------------------------------------------------------------------------------------


def _is_async(client: Any, resource: tuple[str, ...]) -> bool:
    openai = sys.modules.get("openai")
    if openai is not None:
        if isinstance(client, openai.AsyncOpenAI):
            return True
        if isinstance(client, openai.OpenAI):
            return False
    # A duck-typed client: the SDK's own methods are wrapped, so ask the function itself.
    target: Any = client
    for part in resource:
        target = getattr(target, part, None)
    create = getattr(target, "create", None)
    return create is not None and inspect.iscoroutinefunction(inspect.unwrap(create))


def provider_for_openai(client: Any) -> OpenAIChat | OpenAIResponses | None:
    """The ``provider_for`` factory: an ``OpenAIChat``/``OpenAIResponses`` as given; an
    ``openai.OpenAI``/``AsyncOpenAI`` (Azure's included) on Chat Completions; a duck-typed client
    with ``chat.completions.create`` and no Anthropic ``messages``, likewise."""
    if isinstance(client, (OpenAIChat, OpenAIResponses)):
        return client
    # The SDK is never imported here: a client of its types cannot exist without it.
    openai = sys.modules.get("openai")
    if openai is not None and isinstance(client, (openai.OpenAI, openai.AsyncOpenAI)):
        return OpenAIChat(client)
    chat = getattr(client, "chat", None)
    completions = getattr(chat, "completions", None)
    if callable(getattr(completions, "create", None)) and not hasattr(client, "messages"):
        return OpenAIChat(client)
    return None
