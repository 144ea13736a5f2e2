"""A scripted model for OpenAI: a fake Chat Completions and Responses API on 127.0.0.1.

The same script types as ``toolledger.testing.scripted`` (``Reply``, ``ToolUse``, ``Flaky``), the
same behaviour where crash recovery is concerned, and real HTTP, so the real ``openai`` SDK is
exercised end to end:

* it mints **fresh call ids for every response** (``call_…``), as the API does;
* it picks the reply by **position**: the number of assistant turns in the request (Chat
  Completions: assistant messages; Responses: runs of output items in ``input``);
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
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..adapters.openai import chat_pairing_errors, responses_pairing_errors
from .scripted import Flaky, Reply, Step, ToolUse

__all__ = ["Flaky", "RawArguments", "Reply", "ScriptedOpenAI", "ToolUse"]


@dataclass(frozen=True)
class RawArguments(ToolUse):
    """A tool call whose ``arguments`` string is sent as written (to script invalid JSON)."""

    arguments: str = ""


def _arguments(use: ToolUse) -> str:
    return use.arguments if isinstance(use, RawArguments) else json.dumps(use.input)


class ScriptedOpenAI:
    """A fake OpenAI API server playing ``script``; use as a context manager."""

    def __init__(self, script: Sequence[Step], *, model: str = "gpt-scripted") -> None:
        self.script = list(script)
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.rejected: list[str] = []
        self._lock = threading.Lock()
        self._failures: dict[int, int] = {}
        self._server: ThreadingHTTPServer | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> ScriptedOpenAI:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
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

    def __enter__(self) -> ScriptedOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """The ``base_url`` for the SDK (it ends in ``/v1``)."""
        assert self._server is not None, "start() the model first"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def client(self, **kwargs: Any) -> Any:
        """An ``openai.OpenAI`` pointed at this server (no retries unless asked)."""
        import openai

        kwargs.setdefault("max_retries", 0)
        return openai.OpenAI(base_url=self.url, api_key="scripted", **kwargs)

    def async_client(self, **kwargs: Any) -> Any:
        import openai

        kwargs.setdefault("max_retries", 0)
        return openai.AsyncOpenAI(base_url=self.url, api_key="scripted", **kwargs)

    # -- answering -------------------------------------------------------------------------------

    def answer(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.requests.append(body)
            self.paths.append(path)
        if path == "/v1/chat/completions":
            messages = body.get("messages") or []
            problems = chat_pairing_errors(messages)
            turn = sum(1 for m in messages if m.get("role") == "assistant")
        else:
            items = _input_items(body.get("input"))
            problems = responses_pairing_errors(items)
            turn = _turns(items)
        if problems:
            return self._reject(problems[0], problems)
        if turn >= len(self.script):
            message = (
                f"the script has {len(self.script)} turns; the request asks for turn {turn + 1}"
            )
            return self._reject(message, [message])
        step = self.script[turn]
        if isinstance(step, Flaky):
            with self._lock:
                failed = self._failures.get(turn, 0)
                if failed < step.times:
                    self._failures[turn] = failed + 1
                    return step.status, _error(step.error_type, f"scripted {step.status}")
            step = step.then
        reply = step if isinstance(step, Reply) else step(body)
        if path == "/v1/chat/completions":
            return 200, self._completion(reply, body)
        return 200, self._response(reply, body)

    def _reject(self, message: str, problems: list[str]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.rejected.extend(problems)
        return 400, _error("invalid_request_error", message)

    def _completion(self, reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        if reply.tool_uses:
            message["tool_calls"] = [
                {
                    "id": _call_id(),  # minted per response, as the API does
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
                    "call_id": _call_id(),
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
            "status": "completed",
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


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


_ROUTES = ("/v1/chat/completions", "/v1/responses")


def _handler_for(model: ScriptedOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out at once: no delayed-ACK stall

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length)
            path = self.path.split("?")[0]
            if path not in _ROUTES:
                self._send(404, _error("not_found_error", f"no route {self.path}"))
                return
            try:
                body = json.loads(raw)
            except ValueError:
                self._send(400, _error("invalid_request_error", "body is not JSON"))
                return
            status, payload = model.answer(path, body)
            self._send(status, payload)

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.send_header("x-request-id", "req_" + uuid.uuid4().hex[:12])
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler
