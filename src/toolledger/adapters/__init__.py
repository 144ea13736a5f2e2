"""Adapters between model APIs and toolledger: reading calls, writing results, driving the loop.

Two seams, so a new API plugs in without a second copy of the runner or the agent loop:

* ``read_calls(content)`` — the tool calls in a model message, whatever its shape, and the
  ``ResultShape`` that writes their results back in the same shape (used by ``run_tool_uses``);
* ``Provider`` — what ``Agent`` needs from an API: build a request, call it, read the response,
  find the pending calls of a stored message, and store results and prompts
  (``provider_for(client)`` picks one from the client's type).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..records import StoredMessage, ToolCall

if TYPE_CHECKING:
    from ..tools import ToolSet

__all__ = [
    "MAX_ID_CHARS",
    "ModelTurn",
    "Provider",
    "ResultShape",
    "check_call_id",
    "provider_for",
    "read_calls",
]


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


class Provider(Protocol):
    """What the agent loop needs from a model API."""

    name: str
    is_async: bool

    def create(self, kwargs: dict[str, Any]) -> Any: ...

    async def acreate(self, kwargs: dict[str, Any]) -> Any: ...

    def is_api_error(self, exc: BaseException) -> bool: ...

    def request(
        self,
        *,
        model: str,
        max_tokens: int,
        system: str | None,
        tools: ToolSet,
        messages: list[StoredMessage],
    ) -> dict[str, Any]: ...

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

    def transcript(self, messages: list[StoredMessage]) -> list[dict[str, Any]]:
        """The stored transcript in the API's own message shape (``Run.messages``)."""
        ...

    def transcript_errors(self, messages: list[StoredMessage]) -> list[str]:
        """Violations of the API's call/result pairing rule (a pending last turn allowed)."""
        ...


_READERS: list[Callable[[Any], tuple[list[ToolCall], ResultShape] | None]] = []
_PROVIDERS: list[Callable[[Any], Provider | None]] = []


MAX_ID_CHARS = 1024


def check_call_id(call_id: str, where: str) -> str:
    """A call id the ledger can key on: text without control characters or lone surrogates (no
    store could hold those, and no API sends them), at most ``MAX_ID_CHARS`` long."""
    from ..errors import MalformedContentError

    bad = len(call_id) > MAX_ID_CHARS or any(
        ord(c) < 0x20 or ord(c) == 0x7F or 0xD800 <= ord(c) <= 0xDFFF for c in call_id
    )
    if bad:
        shown = call_id[:60].encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
        raise MalformedContentError(
            f"{where} has an id that cannot be a ledger key ({shown!r}…): "
            f"ids are at most {MAX_ID_CHARS} characters of text, without control characters "
            "or lone surrogates. Nothing was run.",
        )
    return call_id


def read_calls(content: Any) -> tuple[list[ToolCall], ResultShape]:
    """The tool calls of ``content`` and the shape their results take.

    Anthropic content blocks (SDK objects or dicts, or a whole message) are the default; other
    adapters register readers for their shapes.
    """
    for reader in _READERS:
        found = reader(content)
        if found is not None:
            return found
    from .anthropic import read_tool_uses, tool_result

    return read_tool_uses(content), tool_result


def provider_for(client: Any) -> Provider:
    """The provider for ``client``: a registered one that claims it, else Anthropic's."""
    for factory in _PROVIDERS:
        provider = factory(client)
        if provider is not None:
            return provider
    from .anthropic import AnthropicProvider

    return AnthropicProvider(client)


def register(
    reader: Callable[[Any], tuple[list[ToolCall], ResultShape] | None] | None = None,
    provider: Callable[[Any], Provider | None] | None = None,
) -> None:
    """Add a content reader and/or a provider factory (tried before the Anthropic default)."""
    if reader is not None:
        _READERS.append(reader)
    if provider is not None:
        _PROVIDERS.append(provider)


def _register_builtin() -> None:
    # The OpenAI shapes are read by duck typing: registering them imports no SDK.
    from .openai import provider_for_openai, read_openai

    register(reader=read_openai, provider=provider_for_openai)


_register_builtin()
