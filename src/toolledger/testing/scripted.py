"""A scripted model: a fake Messages API on 127.0.0.1 that plays a script of turns.

It speaks real HTTP, so the real ``anthropic`` SDK is exercised end to end, and it behaves like
the API where it matters for crash recovery:

* it mints a **fresh tool_use id for every response**, as the API does — a turn lost before
  checkpoint A comes back with new ids — unless a ``ToolUse`` names its ``id``, as the turns of
  ``ScriptedModel.from_session`` (a recorded session, replayed) do;
* it picks the reply by **position**: the number of assistant turns in the request. A resumed
  conversation gets the next step; a re-asked turn gets the same step again;
* it **rejects a transcript that breaks the tool_use / tool_result pairing rule** with the API's
  400 ``invalid_request_error``, so a test fails the way production would;
* it **streams** a request that asks for it (``stream: true``, as ``messages.stream`` does) as
  the API's server-sent events, its text in pieces (``stream_pause`` seconds apart).

```python
with ScriptedModel([Reply(tool_uses=[ToolUse("create_ticket", {"title": "Outage"})]),
                    Reply(text="Ticket opened.")]) as model:
    agent = tl.Agent(client=model.client(), model="claude-test", tools=..., store=...)
    run = agent.run(session="s", prompt="...")
    assert model.requests[-1]["messages"][-1]["content"][0]["type"] == "tool_result"
```
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._extras import require
from ..adapters.anthropic import AnthropicProvider, pairing_errors
from ..errors import ConfigurationError
from ..records import StoredMessage
from ._server import Flaky, Reply, ScriptedServer, Step, ToolUse, pieces, recorded_turns

if TYPE_CHECKING:
    from ..stores.store import Store

__all__ = ["Flaky", "Reply", "ScriptedModel", "Step", "ToolUse", "pairing_errors"]


class ScriptedModel(ScriptedServer):
    """A fake Messages API server playing ``script``; use as a context manager."""

    routes = ("/v1/messages",)

    def __init__(self, script: Sequence[Step], *, model: str = "claude-scripted") -> None:
        super().__init__(script, model=model)

    @classmethod
    def from_session(
        cls,
        store: Store,
        session_id: str,
        *,
        model: str = "claude-scripted",
        branched: bool = False,
    ) -> ScriptedModel:
        """A model that answers as the recorded ``session_id`` did: its script is the session's
        assistant messages, in order, each a ``Reply`` with the recorded text and tool calls —
        their ids and inputs as recorded. An agent with the same prompt, system and tools run
        against it, on another store, stores the same transcript, ids included: a production
        session becomes a regression test.

        The replay's tools **run**: a ledger record answers a call only in its own session
        (records are keyed by session and tool_use_id), and a new session's ledger is empty.
        Give the replay test doubles (``toolledger.testing.Counter``, a ``World``), not tools
        that touch the real world.

        Reads only. Raises ``ConfigurationError`` for a session with no model turn, a
        transcript of another API (OpenAI), or a turn the script cannot say: a block other
        than text and tool_use, or text after a tool call or in more than one block. A session
        a fork or a rewind made is refused too: its transcript holds the note toolledger wrote
        at the branch point, which a replay does not — ``branched=True`` replays the model's
        answers alone, knowing the transcript will differ.
        """
        turns = recorded_turns(
            store,
            session_id,
            kinds=(AnthropicProvider.name,),
            replayer="ScriptedModel",
            branched=branched,
        )
        script: list[Step] = [_recorded_reply(m, session_id, n) for n, m in enumerate(turns, 1)]
        return cls(script, model=model)

    def client(self, **kwargs: Any) -> Any:
        """An ``anthropic.Anthropic`` pointed at this server (no retries unless asked)."""
        anthropic = require("anthropic", "anthropic", what="ScriptedModel.client()")
        kwargs.setdefault("max_retries", 0)
        return anthropic.Anthropic(base_url=self.url, api_key="scripted", **kwargs)

    def async_client(self, **kwargs: Any) -> Any:
        anthropic = require("anthropic", "anthropic", what="ScriptedModel.async_client()")
        kwargs.setdefault("max_retries", 0)
        return anthropic.AsyncAnthropic(base_url=self.url, api_key="scripted", **kwargs)

    def turn_of(self, path: str, body: dict[str, Any]) -> int:
        return sum(1 for m in body.get("messages") or [] if m.get("role") == "assistant")

    def problems(self, path: str, body: dict[str, Any]) -> list[str]:
        return pairing_errors(body.get("messages") or [])

    def error(self, kind: str, message: str) -> dict[str, Any]:
        return {"type": "error", "error": {"type": kind, "message": message}}

    def events(self, path: str, payload: dict[str, Any]) -> list[tuple[str | None, Any]]:
        return _message_events(payload)

    def reply(self, path: str, reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if reply.text:
            content.append({"type": "text", "text": reply.text})
        for use in reply.tool_uses:
            content.append(
                {
                    "type": "tool_use",
                    # minted per response, as the API does (a replay keeps the recorded id)
                    "id": use.id or "toolu_" + uuid.uuid4().hex[:24],
                    "name": use.name,
                    "input": use.input,
                }
            )
        stop = reply.stop_reason or ("tool_use" if reply.tool_uses else "end_turn")
        return {
            "id": "msg_" + uuid.uuid4().hex[:24],
            "type": "message",
            "role": "assistant",
            "model": body.get("model", self.model),
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {
                "input_tokens": max(1, len(json.dumps(body.get("messages", []))) // 4),
                "output_tokens": max(1, len(json.dumps(content)) // 4),
            },
        }


def _message_events(message: dict[str, Any]) -> list[tuple[str | None, Any]]:
    """A Messages API reply as the streaming endpoint sends it."""
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {**message["usage"], "output_tokens": 1}
    events: list[tuple[str | None, Any]] = [
        ("message_start", {"type": "message_start", "message": start})
    ]
    for i, block in enumerate(message["content"]):
        empty: dict[str, Any]
        if block["type"] == "text":
            empty = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in pieces(block["text"])]
        else:
            empty = {**block, "input": {}}
            raw = json.dumps(block["input"])
            half = len(raw) // 2
            deltas = [
                {"type": "input_json_delta", "partial_json": part}
                for part in (raw[:half], raw[half:])
            ]
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": i, "content_block": empty},
            )
        )
        events += [
            ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": d})
            for d in deltas
        ]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": message["usage"]["output_tokens"]},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def _recorded_reply(message: StoredMessage, session_id: str, turn: int) -> Reply:
    """A stored assistant message as the ``Reply`` that makes the server answer with it."""
    content = message.content
    if isinstance(content, str):
        return Reply(text=content)
    texts: list[str] = []
    uses: list[ToolUse] = []
    for block in content if isinstance(content, list) else []:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and not uses:
            texts.append(str(block["text"]))
        elif kind == "tool_use":
            uses.append(ToolUse(str(block["name"]), dict(block["input"]), id=str(block["id"])))
        else:
            what = "text after a tool call" if kind == "text" else f"a {kind!r} block"
            raise ConfigurationError(
                f"turn {turn} of session {session_id!r} has {what}: a Reply says one text, "
                "then tool calls"
            )
    if len(texts) > 1:
        raise ConfigurationError(
            f"turn {turn} of session {session_id!r} has {len(texts)} text blocks: a Reply says one"
        )
    return Reply(text=texts[0] if texts else "", tool_uses=uses)
