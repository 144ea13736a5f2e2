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
from typing import Any

from ..records import ToolCall
from ._shapes import MAX_ID_CHARS, ModelTurn, Provider, ResultShape, check_call_id

__all__ = [
    "MAX_ID_CHARS",
    "ModelTurn",
    "Provider",
    "ResultShape",
    "check_call_id",
    "provider_for",
    "read_calls",
]


_READERS: list[Callable[[Any], tuple[list[ToolCall], ResultShape] | None]] = []
_PROVIDERS: list[Callable[[Any], Provider | None]] = []


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
