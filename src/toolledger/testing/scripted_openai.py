"""A scripted model for OpenAI: a fake Chat Completions and Responses API on 127.0.0.1.

The same script types as ``toolledger.testing.scripted`` (``Reply``, ``ToolUse``, ``Flaky``), the
same behaviour where crash recovery is concerned, and real HTTP, so the real ``openai`` SDK is
exercised end to end:

* it mints **fresh call ids for every response** (``call_…``), as the API does;
* it picks the reply by **position**: the number of assistant turns in the request (Chat
  Completions: assistant messages; Responses: runs of output items in ``input``);
* it **streams** when the request says ``"stream": true``, as each API does (Chat Completions
  chunks, or the Responses API's typed events), the text in a few pieces;
* it **rejects a transcript that breaks the call/result pairing rule** with OpenAI's 400
  ``invalid_request_error`` (see ``toolledger.adapters.openai``), so a test fails the way
  production would; every request is logged (``requests``, ``paths``).

```python
with ScriptedOpenAI([Reply(tool_uses=[ToolUse("create_ticket", {"title": "Outage"})]),
                     Reply(text="Ticket opened.")]) as model:
    agent = tl.Agent(client=model.client(), model="gpt-test", tools=..., store=...)
    # or client=OpenAIResponses(model.client()) for the Responses API
```
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._extras import require
from ..adapters.openai import chat_pairing_errors, responses_pairing_errors
from ..adapters.openai_chat import OpenAIChat
from ..records import StoredMessage
from ._server import Flaky, Reply, ScriptedServer, Step, ToolUse, pieces, recorded_turns

if TYPE_CHECKING:
    from ..stores.store import Store

__all__ = ["Flaky", "RawArguments", "Reply", "ScriptedOpenAI", "ToolUse"]


@dataclass(frozen=True)
class RawArguments(ToolUse):
    """A tool call whose ``arguments`` string is sent as written (to script invalid JSON)."""

    arguments: str = ""


def _arguments(use: ToolUse) -> str:
    return use.arguments if isinstance(use, RawArguments) else json.dumps(use.input)


class ScriptedOpenAI(ScriptedServer):
    """A fake OpenAI API server playing ``script``; use as a context manager."""

    routes = ("/v1/chat/completions", "/v1/responses")
    base_path = "/v1"

    def __init__(self, script: Sequence[Step], *, model: str = "gpt-scripted") -> None:
        super().__init__(script, model=model)

    @classmethod
    def from_session(
        cls,
        store: Store,
        session_id: str,
        *,
        model: str = "gpt-scripted",
        branched: bool = False,
    ) -> ScriptedOpenAI:
        """A model that answers as the recorded Chat Completions session ``session_id`` did:
        each assistant message as a ``Reply`` — its text, and its tool calls with their recorded
        ids and ``arguments`` strings, byte for byte. An agent with the same prompt, system and
        tools run against it on another store stores the same transcript. As with
        ``ScriptedModel.from_session``, the replay's tools run (its ledger is empty).

        Reads only. Raises ``ConfigurationError`` for a session with no model turn, or a
        transcript of another API: a Responses API turn carries the ids of its output items,
        minted per response, which a ``Reply`` does not say; and a session a fork or a rewind
        made, unless ``branched=True`` (as ``ScriptedModel.from_session`` says).
        """
        turns = recorded_turns(
            store,
            session_id,
            kinds=(OpenAIChat.name,),
            replayer="ScriptedOpenAI",
            branched=branched,
        )
        return cls([_recorded_reply(m) for m in turns], model=model)

    def client(self, **kwargs: Any) -> Any:
        """An ``openai.OpenAI`` pointed at this server (no retries unless asked)."""
        openai = require("openai", "openai", what="ScriptedOpenAI.client()")
        kwargs.setdefault("max_retries", 0)
        return openai.OpenAI(base_url=self.url, api_key="scripted", **kwargs)

    def async_client(self, **kwargs: Any) -> Any:
        openai = require("openai", "openai", what="ScriptedOpenAI.async_client()")
        kwargs.setdefault("max_retries", 0)
        return openai.AsyncOpenAI(base_url=self.url, api_key="scripted", **kwargs)

    def turn_of(self, path: str, body: dict[str, Any]) -> int:
        if path == "/v1/chat/completions":
            return sum(1 for m in body.get("messages") or [] if m.get("role") == "assistant")
        return _turns(_input_items(body.get("input")))

    def problems(self, path: str, body: dict[str, Any]) -> list[str]:
        if path == "/v1/chat/completions":
            return chat_pairing_errors(body.get("messages") or [])
        return responses_pairing_errors(_input_items(body.get("input")))

    def reply(self, path: str, reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
        if path == "/v1/chat/completions":
            return self._completion(reply, body)
        return self._response(reply, body)

    def error(self, kind: str, message: str) -> dict[str, Any]:
        return {"error": {"message": message, "type": kind, "param": None, "code": None}}

    def events(self, path: str, payload: dict[str, Any]) -> list[tuple[str | None, Any]]:
        if path == "/v1/chat/completions":
            return _completion_chunks(payload)
        return _response_events(payload)

    def _completion(self, reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        if reply.tool_uses:
            message["tool_calls"] = [
                {
                    "id": use.id or _call_id(),  # minted per response, as the API does
                    "type": "function",
                    "function": {"name": use.name, "arguments": _arguments(use)},
                }
                for use in reply.tool_uses
            ]
        finish = reply.stop_reason or ("tool_calls" if reply.tool_uses else "stop")
        prompt, completion = _tokens(body.get("messages")), _tokens(message)
        return {
            "id": "chatcmpl-" + uuid.uuid4().hex[:24],
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", self.model),
            "choices": [
                {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }

    def _response(self, reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
        output: list[dict[str, Any]] = []
        if reply.text:
            output.append(
                {
                    "id": "msg_" + uuid.uuid4().hex[:24],
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
                }
            )
        for use in reply.tool_uses:
            output.append(
                {
                    "id": "fc_" + uuid.uuid4().hex[:24],
                    "type": "function_call",
                    "call_id": use.id or _call_id(),
                    "name": use.name,
                    "arguments": _arguments(use),
                    "status": "completed",
                }
            )
        prompt, completion = _tokens(body.get("input")), _tokens(output)
        return {
            "id": "resp_" + uuid.uuid4().hex[:24],
            "object": "response",
            "created_at": time.time(),
            # A stop reason for the Responses API is why a response is incomplete.
            "status": "incomplete" if reply.stop_reason else "completed",
            "incomplete_details": {"reason": reply.stop_reason} if reply.stop_reason else None,
            "model": body.get("model", self.model),
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": body.get("tools") or [],
            "usage": {
                "input_tokens": prompt,
                "output_tokens": completion,
                "total_tokens": prompt + completion,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        }


def _recorded_reply(message: StoredMessage) -> Reply:
    """A stored Chat Completions assistant message as the ``Reply`` that makes the server answer
    with it."""
    content = message.content
    calls = content.get("tool_calls") or []
    return Reply(
        text=content.get("content") or "",
        tool_uses=[
            RawArguments(c["function"]["name"], id=c["id"], arguments=c["function"]["arguments"])
            for c in calls
        ],
    )


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _tokens(value: Any) -> int:
    return max(1, len(json.dumps(value or "")) // 4)


def _input_items(raw: Any) -> list[dict[str, Any]]:
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    return [i for i in raw or [] if isinstance(i, dict)]


def _is_output_item(item: dict[str, Any]) -> bool:
    kind = item.get("type")
    if kind == "message" or (kind is None and "role" in item):
        return item.get("role") == "assistant"
    return kind not in (None, "function_call_output")


def _turns(items: list[dict[str, Any]]) -> int:
    """How many model turns ``input`` replays: runs of consecutive output items."""
    turns, inside = 0, False
    for item in items:
        out = _is_output_item(item)
        if out and not inside:
            turns += 1
        inside = out
    return turns


def _completion_chunks(completion: dict[str, Any]) -> list[tuple[str | None, Any]]:
    """A Chat Completions reply as the streaming endpoint sends it: chunks of deltas, the
    finish reason, the usage (``stream_options.include_usage``), then ``[DONE]``."""
    (choice,) = completion["choices"]
    message = choice["message"]
    head = {k: completion[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            **head,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }

    out: list[tuple[str | None, Any]] = [(None, chunk({"role": "assistant", "content": ""}))]
    out += [(None, chunk({"content": p})) for p in pieces(message.get("content") or "")]
    for i, call in enumerate(message.get("tool_calls") or []):
        start = {**call, "function": {**call["function"], "arguments": ""}}
        out.append((None, chunk({"tool_calls": [{"index": i, **start}]})))
        raw = call["function"]["arguments"]
        for part in (raw[: len(raw) // 2], raw[len(raw) // 2 :]):
            out.append(
                (None, chunk({"tool_calls": [{"index": i, "function": {"arguments": part}}]}))
            )
    out.append((None, chunk({}, choice["finish_reason"])))
    out.append((None, {**head, "choices": [], "usage": completion["usage"]}))
    out.append((None, "[DONE]"))
    return out


def _response_events(response: dict[str, Any]) -> list[tuple[str | None, Any]]:
    """A Responses API reply as its streaming endpoint sends it: the response created and in
    progress, each output item added, its text (or arguments) in deltas, done, then the response
    completed with every item."""
    events: list[tuple[str | None, Any]] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append((kind, {"type": kind, "sequence_number": len(events), **fields}))

    started = {**response, "status": "in_progress", "output": [], "usage": None}
    emit("response.created", response=started)
    emit("response.in_progress", response=started)
    for index, item in enumerate(response["output"]):
        where = {"output_index": index, "item_id": item["id"]}
        if item["type"] == "message":
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "content": []},
            )
            for c, part in enumerate(item["content"]):
                empty = {**part, "text": ""}
                emit("response.content_part.added", **where, content_index=c, part=empty)
                for piece in pieces(part["text"]):
                    emit(
                        "response.output_text.delta",
                        **where,
                        content_index=c,
                        delta=piece,
                        logprobs=[],
                    )
                emit(
                    "response.output_text.done",
                    **where,
                    content_index=c,
                    text=part["text"],
                    logprobs=[],
                )
                emit("response.content_part.done", **where, content_index=c, part=part)
        else:  # a function call: its arguments in two halves
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "arguments": ""},
            )
            raw = item["arguments"]
            for half in (raw[: len(raw) // 2], raw[len(raw) // 2 :]):
                emit("response.function_call_arguments.delta", **where, delta=half)
            emit("response.function_call_arguments.done", **where, arguments=raw, name=item["name"])
        emit("response.output_item.done", output_index=index, item=item)
    emit("response.completed", response=response)
    return events
