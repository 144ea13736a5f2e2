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
recorded. A reply cut off at its output limit (``finish_reason`` ``length``, a response
``incomplete``) while it wrote its last call is refused (``MalformedContentError``) before
anything is stored or run: that call's arguments may be cut short. Nothing here imports the
``openai`` SDK at import time: shapes are read by duck typing, and the SDK is looked at only
when a client is given.

This module tells which OpenAI shape a content or a client is; each API lives in its own module
(``openai_chat``, ``openai_responses``), and their public names are importable from here too.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from ..errors import MalformedContentError
from ..records import ToolCall
from ._openai_base import ERROR_PREFIX
from ._shapes import ResultShape, field
from .openai_chat import (
    OpenAIChat,
    chat_pairing_errors,
    chat_wire,
    read_chat_tool_calls,
    tool_message,
)
from .openai_responses import (
    OpenAIResponses,
    function_call_output,
    read_function_calls,
    responses_pairing_errors,
    responses_wire,
)

__all__ = [
    "ERROR_PREFIX",
    "OpenAIChat",
    "OpenAIResponses",
    "chat_pairing_errors",
    "chat_wire",
    "function_call_output",
    "provider_for_openai",
    "read_chat_tool_calls",
    "read_function_calls",
    "read_openai",
    "responses_pairing_errors",
    "responses_wire",
    "tool_message",
]


def _is_chat_call_list(items: list[Any]) -> bool:
    return any(field(i, "function") is not None and field(i, "id") is not None for i in items)


def read_openai(content: Any) -> tuple[list[ToolCall], ResultShape] | None:
    """The ``run_tool_uses`` reader for OpenAI shapes (``None``: not an OpenAI shape).

    Chat Completions: a ``ChatCompletion`` (its first choice), a ``ChatCompletionMessage`` or its
    dict, or a list of ``tool_calls``. Responses API: a ``Response`` or its dict, or a list of
    output items holding a ``function_call``.
    """
    if isinstance(content, (str, bytes)):
        return None
    if type(content) not in (list, tuple) and (  # a plain list has no choices: no lookup
        field(content, "choices") is not None and field(content, "object") != "response"
    ):
        choices = field(content, "choices")
        if not choices:
            raise MalformedContentError("the ChatCompletion has no choices")
        content = field(choices[0], "message")
    if isinstance(content, (list, tuple)):
        items = list(content)
        kinds = [field(i, "type") for i in items]  # read by shape, in one pass
        if "tool_use" in kinds:
            return None  # Anthropic content blocks: no OpenAI item has that type
        if "function_call" in kinds:
            return read_function_calls(items), function_call_output
        if _is_chat_call_list(items):
            return read_chat_tool_calls(items), tool_message
        return None
    if field(content, "object") == "response" or (
        isinstance(content, Mapping) and isinstance(content.get("output"), list)
    ):
        return read_function_calls(field(content, "output")), function_call_output
    if field(content, "tool_calls") is not None or _is_chat_assistant(content):
        return read_chat_tool_calls(field(content, "tool_calls")), tool_message
    return None


def _is_chat_assistant(content: Any) -> bool:
    """A Chat Completions assistant message without calls: its content is text or null (an
    Anthropic message's content is a list of blocks)."""
    if isinstance(content, Mapping):
        return content.get("role") == "assistant" and (
            "tool_calls" in content or isinstance(content.get("content"), (str, type(None)))
        )
    return (
        field(content, "role") == "assistant"
        and hasattr(content, "tool_calls")
        and not isinstance(field(content, "content"), list)
    )


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
