"""What every model API adapter shares: the shapes the runner and the agent loop talk in, the
field readers and the check every call id passes, and which API a stored transcript was written
for. (The adapters import this, never their package.)"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import MalformedContentError
from ..records import StoredMessage, ToolCall

if TYPE_CHECKING:
    from ..tools import ToolSet

__all__ = [
    "MAX_ID_CHARS",
    "MessageParts",
    "ModelTurn",
    "Provider",
    "ResultShape",
    "StreamCutOff",
    "as_text",
    "check_call_id",
    "check_fresh_ids",
    "field",
    "transcript_kind",
]


class StreamCutOff(Exception):
    """A streamed reply whose stream ended before the API's last event (Anthropic's
    ``message_delta``, a Chat Completions ``finish_reason``, the Responses API's
    ``response.completed``): what arrived may end mid-text or mid-call (the SDKs read a call's
    partial JSON as far as it goes). The agent loop takes it as a failure of the model API:
    nothing of the reply is stored or run, and the session is asked again when it resumes."""


class ResultShape(Protocol):
    """Writes one call's result in the shape its API expects back."""

    def __call__(self, tool_use_id: str, content: str, *, is_error: bool) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class ModelTurn:
    """One model response, reduced to what the agent stores and decides on."""

    content: Any  # what is stored as the assistant message (the API's own shape)
    stop_reason: str | None
    input_tokens: int
    output_tokens: int
    calls: list[ToolCall]
    stored_as_is: bool = False
    """The adapter made ``content`` storable itself (no lone surrogate, nothing nested too deep:
    ``codec.valid_unicode``, ``codec.shallow``), so checkpoint A need not check it again."""


@dataclass(frozen=True, slots=True)
class MessageParts:
    """What a stored message says, whatever its API: its texts, the calls it asks for, and the
    results it carries as ``(call id, content, is_error)`` — ``is_error`` true for every result
    that does not report success."""

    texts: list[str]
    calls: list[ToolCall]
    results: list[tuple[str, str, bool]]


class Provider(Protocol):
    """What the agent loop needs from a model API, and what reads its stored transcripts."""

    name: str
    is_async: bool
    can_stream: bool
    """Whether ``stream`` and ``astream`` work (``Agent.run(on_text=...)``)."""

    def create(self, kwargs: dict[str, Any]) -> Any: ...

    async def acreate(self, kwargs: dict[str, Any]) -> Any: ...

    def stream(self, kwargs: dict[str, Any], on_text: Callable[[str], object]) -> Any:
        """``create`` over the API's streaming endpoint: ``on_text`` is given each piece of
        the reply's text as it arrives; returns the whole response, as ``create`` would (so it
        is read, and checkpointed, only once complete)."""
        ...

    async def astream(self, kwargs: dict[str, Any], on_text: Callable[[str], object]) -> Any:
        """The async twin of ``stream`` (``on_text`` may be a coroutine function)."""
        ...

    def is_api_error(self, exc: BaseException) -> bool: ...

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
        """The request's arguments. ``wire``, when given, is ``wire(messages)`` already built
        (the request takes it as it is, and hands it to the API)."""
        ...

    def wire(
        self, messages: Sequence[StoredMessage], start: Sequence[dict[str, Any]] = ()
    ) -> list[dict[str, Any]]:
        """The request's messages (or input items) for a transcript: those of its earlier part,
        ``start`` (``wire`` of the messages before ``messages``), followed by those of
        ``messages``. A new list; ``start`` and its entries are never changed (an entry that a
        message merges into is copied), so a list once handed out never changes."""
        ...

    def call_ids(self, message: StoredMessage) -> list[str]:
        """The call ids a stored message holds (none for messages that are not model turns):
        ``tool_calls(message)``'s ids, without reading or hashing the calls' inputs."""
        ...

    def read_response(self, response: Any) -> ModelTurn: ...

    def tool_calls(self, message: StoredMessage) -> list[ToolCall]:
        """The calls a stored assistant message asks for (none for other messages)."""
        ...

    def results_messages(self, results: list[tuple[str, str, bool]]) -> list[tuple[str, Any]]:
        """The ``(role, content)`` messages carrying ``(tool_use_id, content, is_error)``
        results, in call order."""
        ...

    def prompt_message(self, prompt: str) -> tuple[str, Any]: ...

    def prompt_text(self, message: StoredMessage) -> str | None:
        """The prompt a stored message holds, or ``None`` (a result message, a model turn)."""
        ...

    def final_text(self, message: StoredMessage) -> str: ...

    def read_message(self, message: StoredMessage) -> MessageParts:
        """Everything a stored message says (for ``verify`` and ``toolledger show``). Raises
        ``MalformedContentError``, ``AttributeError``, ``TypeError`` or ``ValueError`` for a
        message it cannot read."""
        ...

    def transcript(self, messages: list[StoredMessage]) -> list[dict[str, Any]]:
        """The stored transcript in the API's own message shape (``Run.messages``)."""
        ...

    def transcript_errors(self, messages: list[StoredMessage]) -> list[str]:
        """Violations of the API's call/result pairing rule (a pending last turn allowed)."""
        ...


async def told(on_text: Callable[[str], object], text: str) -> None:
    """Give ``text`` to a streaming callback, awaiting it if it is a coroutine function."""
    answer = on_text(text)
    if inspect.isawaitable(answer):
        await answer


def field(obj: Any, name: str) -> Any:
    """``obj[name]`` of a dict, ``obj.name`` of an SDK object; ``None`` when it has none."""
    if type(obj) is dict or isinstance(obj, Mapping):  # a plain dict skips the ABC check
        return obj.get(name)
    return getattr(obj, name, None)


def as_text(value: Any) -> str:
    """A stored value as text: a string as it is, anything else as its JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


MAX_ID_CHARS = 1024
_NOT_IN_AN_ID = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")  # control characters, lone surrogates


def check_call_id(call_id: str, where: str) -> str:
    """A call id the ledger can key on: text without control characters or lone surrogates (no
    store could hold those, and no API sends them), at most ``MAX_ID_CHARS`` long."""
    bad = len(call_id) > MAX_ID_CHARS or _NOT_IN_AN_ID.search(call_id) is not None
    if bad:
        shown = call_id[:60].encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
        raise MalformedContentError(
            f"{where} has an id that cannot be a ledger key ({shown!r}…): "
            f"ids are at most {MAX_ID_CHARS} characters of text, without control characters "
            "or lone surrogates. Nothing was run.",
        )
    return call_id


def check_fresh_ids(
    calls: list[ToolCall],
    earlier: AbstractSet[str],
    later: Sequence[StoredMessage],
    call_ids: Callable[[StoredMessage], list[str]],
) -> None:
    """Raise ``MalformedContentError`` when a new reply's call has an id that a call of the
    transcript so far already has (``earlier``: the ids of its first messages; ``later``: the
    messages after them, read with ``call_ids``). The APIs mint a new id for every call, and the
    ledger keys a call's record on its id: a reply that repeats one (a server that numbers its
    calls ``call_0``, ``call_1``… in every reply) would have its call answered with the earlier
    call's record — not run, the model told it was — or, with another input, refused on every
    resume. Nothing of the reply is stored or run. (Each turn looks up its few new ids; the
    session's earlier ids are not copied.)"""
    new = {call.tool_use_id: call for call in calls}
    again = [i for i in new if i in earlier]
    if not again:
        for m in later:
            again = [i for i in call_ids(m) if i in new]
            if again:
                break
    if again:
        call = new[again[0]]
        raise MalformedContentError(
            f"the model's reply calls {call.name!r} with id {call.tool_use_id!r}, which an "
            "earlier call of this session already has: nothing of the reply was stored or "
            "run. toolledger keys each call's record on its id, so the API (or the server "
            "in front of it) must give every call an id of its own.",
            tool_use_id=call.tool_use_id,
        )


_RESPONSES_ITEMS = frozenset({"function_call", "function_call_output", "reasoning", "message"})


def transcript_kind(messages: list[StoredMessage]) -> str:
    """The ``Provider.name`` of the API a stored transcript was written for, by its shape:
    ``"openai-chat"`` (a model turn or a result is one message dict), ``"openai-responses"`` (a
    list of Responses API items), else ``"anthropic"`` (content blocks, or no model turn yet)."""
    for m in messages:
        if m.role not in ("assistant", "tool"):
            continue
        if isinstance(m.content, Mapping):
            return "openai-chat"
        if isinstance(m.content, list) and any(
            isinstance(i, Mapping) and i.get("type") in _RESPONSES_ITEMS for i in m.content
        ):
            return "openai-responses"
        return "anthropic"
    return "anthropic"
