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
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..adapters.anthropic import pairing_errors

__all__ = ["Flaky", "Reply", "ScriptedModel", "ToolUse", "pairing_errors"]


@dataclass(frozen=True)
class ToolUse:
    name: str
    input: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Reply:
    """One assistant turn: optional text, then tool_use blocks. ``stop_reason`` defaults to
    ``tool_use`` when there are tool uses and ``end_turn`` otherwise."""

    text: str = ""
    tool_uses: Sequence[ToolUse] = ()
    stop_reason: str | None = None


@dataclass(frozen=True)
class Flaky:
    """Fail the first ``times`` requests of this turn with HTTP ``status``, then play ``then``."""

    then: Reply
    status: int = 529
    times: int = 1
    error_type: str = "overloaded_error"


Step = Reply | Flaky | Callable[[dict[str, Any]], Reply]


class ScriptedModel:
    """A fake Messages API server playing ``script``; use as a context manager."""

    def __init__(self, script: Sequence[Step], *, model: str = "claude-scripted") -> None:
        self.script = list(script)
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self.rejected: list[str] = []
        self._lock = threading.Lock()
        self._failures: dict[int, int] = {}
        self._server: ThreadingHTTPServer | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> ScriptedModel:
        handler = _handler_for(self)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> ScriptedModel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the model first"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def client(self, **kwargs: Any) -> Any:
        """An ``anthropic.Anthropic`` pointed at this server (no retries unless asked)."""
        import anthropic

        kwargs.setdefault("max_retries", 0)
        return anthropic.Anthropic(base_url=self.url, api_key="scripted", **kwargs)

    def async_client(self, **kwargs: Any) -> Any:
        import anthropic

        kwargs.setdefault("max_retries", 0)
        return anthropic.AsyncAnthropic(base_url=self.url, api_key="scripted", **kwargs)

    # -- answering -------------------------------------------------------------------------------

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.requests.append(body)
        messages = body.get("messages") or []
        problems = pairing_errors(messages)
        if problems:
            with self._lock:
                self.rejected.extend(problems)
            return 400, _error("invalid_request_error", problems[0])
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        if turn >= len(self.script):
            message = (
                f"the script has {len(self.script)} turns; the request asks for turn {turn + 1}"
            )
            with self._lock:
                self.rejected.append(message)
            return 400, _error("invalid_request_error", message)
        step = self.script[turn]
        if isinstance(step, Flaky):
            with self._lock:
                failed = self._failures.get(turn, 0)
                if failed < step.times:
                    self._failures[turn] = failed + 1
                    return step.status, _error(step.error_type, f"scripted {step.status}")
            step = step.then
        reply = step if isinstance(step, Reply) else step(body)
        return 200, self._message(reply, body)

    def _message(self, reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
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


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def _handler_for(model: ScriptedModel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # small responses on a kept-alive socket: no 40 ms stall

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length)
            if self.path.split("?")[0] != "/v1/messages":
                self._send(404, _error("not_found_error", f"no route {self.path}"))
                return
            try:
                body = json.loads(raw)
            except ValueError:
                self._send(400, _error("invalid_request_error", "body is not JSON"))
                return
            status, payload = model.answer(body)
            self._send(status, payload)

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.send_header("request-id", "req_" + uuid.uuid4().hex[:12])
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler
