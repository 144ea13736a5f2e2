"""Adapters between model APIs and toolledger: reading calls, writing results, driving the loop,
reading stored transcripts.

Two seams, so a new API plugs in without a second copy of the runner or the agent loop:

* ``read_calls(content)`` — the tool calls in a model message, whatever its shape, and the
  ``ResultShape`` that writes their results back in the same shape (used by ``run_tool_uses``);
* ``Provider`` — what ``Agent`` needs from an API: build a request, call it, read the response,
  find the pending calls of a stored message, and store results and prompts
  (``provider_for(client)`` picks one from the client's type). ``verify`` and
  ``toolledger show`` read a stored transcript through the provider of its kind
  (``transcript_reader(messages)``).

One reader per transcript kind: ``anthropic`` (Messages API), ``openai_chat`` (Chat
Completions), ``openai_responses`` (Responses API); ``openai`` tells the OpenAI shapes apart.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..errors import ToolLedgerError
from ..records import StoredMessage, ToolCall
from ._shapes import (
    MAX_ID_CHARS,
    MessageParts,
    ModelTurn,
    Provider,
    ResultShape,
    check_call_id,
    field,
    transcript_kind,
)
from .anthropic import AnthropicProvider, read_tool_uses, tool_result
from .openai import provider_for_openai, read_openai
from .openai_chat import OpenAIChat
from .openai_responses import OpenAIResponses

__all__ = [
    "MAX_ID_CHARS",
    "MessageParts",
    "ModelTurn",
    "Provider",
    "ResultShape",
    "check_call_id",
    "provider_for",
    "read_calls",
    "read_or_text",
    "transcript_reader",
]


# Tried in order before the Anthropic default. The OpenAI shapes are read by duck typing:
# listing them imports no SDK.
_READERS: list[Callable[[Any], tuple[list[ToolCall], ResultShape] | None]] = [read_openai]
_PROVIDERS: list[Callable[[Any], Provider | None]] = [provider_for_openai]


def read_calls(content: Any) -> tuple[list[ToolCall], ResultShape]:
    """The tool calls of ``content`` and the shape their results take.

    Anthropic content blocks (SDK objects or dicts, or a whole message) are the default; other
    adapters register readers for their shapes. A list holding a ``tool_use`` block is
    Anthropic's whatever else it holds (no other API has that type): while no other reader is
    registered, it is told so at once, without the OpenAI probes.
    """
    if type(content) is list and len(_READERS) == 1:  # ``read_openai`` alone: it would pass
        for b in content:
            if (b.get("type") if type(b) is dict else field(b, "type")) == "tool_use":
                return read_tool_uses(content), tool_result
    for reader in _READERS:
        found = reader(content)
        if found is not None:
            return found
    return read_tool_uses(content), tool_result


def provider_for(client: Any) -> Provider:
    """The provider for ``client``: a registered one that claims it, else Anthropic's."""
    for factory in _PROVIDERS:
        provider = factory(client)
        if provider is not None:
            return provider
    return AnthropicProvider(client)


def transcript_reader(messages: list[StoredMessage]) -> Provider:
    """The provider that reads a stored transcript — its pairing rule, calls, results and
    texts —, picked by the transcript's shape (a session does not record its API). It has no
    client: it only reads."""
    kind = transcript_kind(messages)
    if kind == OpenAIChat.name:
        return OpenAIChat(None)
    if kind == OpenAIResponses.name:
        return OpenAIResponses(None)
    return AnthropicProvider(None)


def read_or_text(m: StoredMessage, reader: Provider) -> MessageParts:
    """``m``'s texts, calls and results as ``reader`` reads them; a shape it cannot read is
    its text, whole (for showing a transcript, never for running it)."""
    try:
        return reader.read_message(m)
    except (ToolLedgerError, AttributeError, TypeError, ValueError):
        shown = (
            m.content if isinstance(m.content, str) else json.dumps(m.content, ensure_ascii=False)
        )
        return MessageParts([shown], [], [])


def register(
    reader: Callable[[Any], tuple[list[ToolCall], ResultShape] | None] | None = None,
    provider: Callable[[Any], Provider | None] | None = None,
) -> None:
    """Add a content reader and/or a provider factory (tried before the Anthropic default)."""
    if reader is not None:
        _READERS.append(reader)
    if provider is not None:
        _PROVIDERS.append(provider)
