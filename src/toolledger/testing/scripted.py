"""A scripted model: a fake Messages API on 127.0.0.1 that plays a script of turns.

It speaks real HTTP, so the real ``anthropic`` SDK is exercised end to end, and it behaves like
the API where it matters for crash recovery:

* it mints a **fresh tool_use id for every response**, as the API does — a turn lost before
  checkpoint A comes back with new ids;
* it picks the reply by **position**: the number of assistant turns in the request. A resumed
  conversation gets the next step; a re-asked turn gets the same step again;
* it **rejects a transcript that breaks the tool_use / tool_result pairing rule** with the API's
  400 ``invalid_request_error``, so a test fails the way production would.

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
from typing import Any

from ..adapters.anthropic import pairing_errors
from ._server import Flaky, Reply, ScriptedServer, Step, ToolUse

__all__ = ["Flaky", "Reply", "ScriptedModel", "Step", "ToolUse", "pairing_errors"]


class ScriptedModel(ScriptedServer):
    """A fake Messages API server playing ``script``; use as a context manager."""

    routes = ("/v1/messages",)

    def __init__(self, script: Sequence[Step], *, model: str = "claude-scripted") -> None:
        super().__init__(script, model=model)

    def client(self, **kwargs: Any) -> Any:
        """An ``anthropic.Anthropic`` pointed at this server (no retries unless asked)."""
        import anthropic

        kwargs.setdefault("max_retries", 0)
        return anthropic.Anthropic(base_url=self.url, api_key="scripted", **kwargs)

    def async_client(self, **kwargs: Any) -> Any:
        import anthropic

        kwargs.setdefault("max_retries", 0)
        return anthropic.AsyncAnthropic(base_url=self.url, api_key="scripted", **kwargs)

    def turn_of(self, path: str, body: dict[str, Any]) -> int:
        return sum(1 for m in body.get("messages") or [] if m.get("role") == "assistant")

    def problems(self, path: str, body: dict[str, Any]) -> list[str]:
        return pairing_errors(body.get("messages") or [])

    def error(self, kind: str, message: str) -> dict[str, Any]:
        return {"type": "error", "error": {"type": kind, "message": message}}

    def reply(self, path: str, reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if reply.text:
            content.append({"type": "text", "text": reply.text})
        for use in reply.tool_uses:
            content.append(
                {
                    "type": "tool_use",
                    "id": "toolu_" + uuid.uuid4().hex[:24],  # minted per response, as the API does
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
