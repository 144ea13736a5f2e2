"""What both OpenAI APIs share: reading a call's JSON-string arguments, the error prefix of a
result, the plain JSON of an SDK object, and the client (its calls, its errors, prompts).

Nothing here imports the ``openai`` SDK: shapes are read by duck typing, and the SDK is looked
at only when a client is given.
"""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..codec import MAX_NESTING, input_hash, nesting
from ..errors import ConfigurationError, MalformedContentError
from ..records import StoredMessage, ToolCall
from ._shapes import check_call_id

__all__ = [
    "ERROR_PREFIX",
    "FILTERED",
    "OpenAIBase",
    "cut_off_call",
    "plain",
    "read_call",
    "result_text",
    "role_content",
    "unique",
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


def plain(obj: Any) -> Any:
    """An SDK object as the plain JSON the API sent (and accepts back)."""
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if isinstance(obj, Mapping):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    to_dict = getattr(obj, "to_dict", None)  # openai's BaseModel: what the API sent, API names
    if callable(to_dict):
        out: Any = to_dict(mode="json")
        return out
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        dumped: Any = dump(mode="json", by_alias=True, exclude_unset=True)
        return dumped
    raise MalformedContentError(f"cannot read {obj!r:.200} as OpenAI JSON")


def result_text(content: str, is_error: bool) -> str:
    """A result's text as sent: an error starts with ``ERROR_PREFIX``."""
    return ERROR_PREFIX + content if is_error else content


def read_call(call_id: Any, name: Any, arguments: Any, where: str) -> ToolCall:
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
    digest = ""
    if why is None:
        try:
            digest = input_hash(parsed)
        except ValueError as exc:
            # NaN, Infinity, 1e400 (read as infinity): Python's reader takes them, JSON cannot
            # hold them. The model wrote them; it can write its arguments again.
            why = f"it holds a number JSON cannot hold ({exc})"
        except TypeError as exc:
            raise MalformedContentError(
                f"{where} ({call_id}) has arguments that are not JSON: {exc}", tool_use_id=call_id
            ) from exc
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
    return ToolCall(tool_use_id=call_id, name=name, input=parsed, input_hash=digest)


FILTERED = "Run the session again; if the filter stops it again, change what the prompt asks for."
"""What gets the whole call of a reply a content filter stopped (``cut_off_call``)."""


def cut_off_call(
    stopped: str, calls: list[ToolCall], remedy: str = "Raise max_tokens and run the session again."
) -> None:
    """Raise ``MalformedContentError`` for a reply that ``stopped`` at its limit or its content
    filter (``finish_reason`` ``length`` or ``content_filter``, a response ``incomplete``) while
    it wrote its last call, ``calls[-1]``: its arguments may be cut short — arguments cut before
    they began read as none at all, ``{}``, and a tool with defaults would run as nobody asked.
    Nothing is stored or run; ``remedy`` says what gets the whole call (for the limit, a larger
    ``max_tokens``, as for Anthropic: ``anthropic._cut_off_call``)."""
    if not calls:
        return
    last = calls[-1]
    raise MalformedContentError(
        f"the model's reply stopped at {stopped} while it wrote a call of {last.name!r} "
        f"({last.tool_use_id}), whose arguments may be cut short: nothing was stored or run. "
        + remedy,
        tool_use_id=last.tool_use_id,
    )


def unique(calls: list[ToolCall]) -> list[ToolCall]:
    """``calls``, after checking no id appears twice in them."""
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


def role_content(m: StoredMessage | Mapping[str, Any]) -> tuple[str, Any]:
    if isinstance(m, Mapping):
        return m["role"], m["content"]
    return m.role, m.content


class OpenAIBase:
    """What both OpenAI APIs share: the client, its errors, prompts. A provider made with
    ``client=None`` only reads stored transcripts."""

    name = "openai"
    can_stream = False  # each API streams in its own subclass
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

    def stream(self, kwargs: dict[str, Any], on_text: Callable[[str], object]) -> Any:
        raise ConfigurationError(f"streaming is not supported for the {self.name} API")

    async def astream(self, kwargs: dict[str, Any], on_text: Callable[[str], object]) -> Any:
        raise ConfigurationError(f"streaming is not supported for the {self.name} API")

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


def _is_async(client: Any, resource: Iterable[str]) -> bool:
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
