"""What every scripted fake API shares: a real HTTP server on 127.0.0.1, a request log, the
script played by position, ``Flaky`` turns, and the refusal of a transcript that breaks the API's
pairing rule. ``ScriptedModel`` (Anthropic) and ``ScriptedOpenAI`` differ only in their routes,
their turn counting, their pairing rule and their JSON shapes.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Self

from ..adapters._shapes import transcript_kind
from ..errors import ConfigurationError
from ..records import StoredMessage

if TYPE_CHECKING:
    from ..stores.store import Store

__all__ = [
    "Flaky",
    "Reply",
    "ScriptedServer",
    "Step",
    "ToolUse",
    "pieces",
    "recorded_turns",
]


@dataclass(frozen=True)
class ToolUse:
    """A tool call the model makes. Its id is minted per response, as the API does, unless
    ``id`` is given (a replayed session's calls keep the ids they were recorded with)."""

    name: str
    input: dict[str, Any] = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True)
class Reply:
    """One assistant turn: optional text, then tool calls. ``stop_reason`` defaults to the API's
    "tool use" reason when there are tool calls and its "end of turn" otherwise."""

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


class ScriptedServer:
    """The shared machinery; subclasses say what a request means (``turn_of``, ``problems``)
    and how a reply and an error look (``reply``, ``error``)."""

    routes: tuple[str, ...] = ()
    base_path = ""  # what ``url`` ends with (the SDK's base_url)

    def __init__(self, script: Sequence[Step], *, model: str) -> None:
        self.script = list(script)
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.rejected: list[str] = []
        self._lock = threading.Lock()
        self._failures: dict[int, int] = {}
        self._server: ThreadingHTTPServer | None = None
        self.stream_pause = 0.0
        """Seconds between two events of a streamed reply (their text arrives piece by piece)."""

    # -- what subclasses say -----------------------------------------------------------------

    def turn_of(self, path: str, body: dict[str, Any]) -> int:
        """Which turn of the script the request asks for (its assistant turns so far)."""
        raise NotImplementedError

    def problems(self, path: str, body: dict[str, Any]) -> list[str]:
        """The request's violations of the API's pairing rule, worded as the API words them."""
        raise NotImplementedError

    def reply(self, path: str, reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def error(self, kind: str, message: str) -> dict[str, Any]:
        raise NotImplementedError

    def events(self, path: str, payload: dict[str, Any]) -> list[tuple[str | None, Any]]:
        """A reply as the server-sent events of the API's streaming endpoint: ``(event name
        or None, data)``, the data JSON (or a literal string such as ``[DONE]``)."""
        raise NotImplementedError

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> Self:
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

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """The ``base_url`` to give the SDK."""
        assert self._server is not None, "start() the model first"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}{self.base_path}"

    # -- answering -----------------------------------------------------------------------------

    def answer(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.requests.append(body)
            self.paths.append(path)
        problems = self.problems(path, body)
        if problems:
            return self._reject(problems[0], problems)
        turn = self.turn_of(path, body)
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
                    return step.status, self.error(step.error_type, f"scripted {step.status}")
            step = step.then
        reply = step if isinstance(step, Reply) else step(body)
        return 200, self.reply(path, reply, body)

    def _reject(self, message: str, problems: list[str]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.rejected.extend(problems)
        return 400, self.error("invalid_request_error", message)


def recorded_turns(
    store: Store,
    session_id: str,
    *,
    kinds: tuple[str, ...],
    replayer: str,
    branched: bool = False,
) -> list[StoredMessage]:
    """The assistant messages of a recorded session whose transcript is one of ``kinds`` (a
    ``Provider.name``), in order — what ``from_session`` turns into a script. Reads only;
    raises ``ConfigurationError`` for another kind of transcript, no model turn, or — unless
    ``branched`` — a session a fork or a rewind made: its transcript holds what toolledger wrote
    at the branch point, and not the turns it left behind, so a replay of the model's answers
    would store another transcript."""
    state = store.session(session_id)
    if state is not None and state.lineage and not branched:
        last = state.lineage[-1]
        how = (
            f"forked from {last.source!r} at turn {last.turn}"
            if last.kind.value == "fork"
            else f"rewound to turn {last.turn}"
        )
        raise ConfigurationError(
            f"session {session_id!r} was {how}: a branch's transcript holds the note "
            "toolledger wrote there and not the turns it left behind, and a replay of the "
            "model's answers would not be the same transcript. Replay the session it was made "
            f"from, or pass branched=True to {replayer}.from_session to replay the model's "
            "answers alone."
        )
    messages = store.messages(session_id)
    kind = transcript_kind(messages)
    if kind not in kinds:
        raise ConfigurationError(
            f"session {session_id!r} is a {kind} transcript: {replayer} replays "
            f"{' and '.join(kinds)} transcripts"
        )
    turns = [m for m in messages if m.role == "assistant"]
    if not turns:
        raise ConfigurationError(f"session {session_id!r} has no model turn to replay")
    return turns


def _handler_for(server: ScriptedServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # small responses on a kept-alive socket: no 40 ms stall

        def do_POST(self) -> None:  # the name http.server dispatches on
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length)
            path = self.path.split("?")[0]
            if path not in server.routes:
                self._send(404, server.error("not_found_error", f"no route {self.path}"))
                return
            try:
                body = json.loads(raw)
            except ValueError:
                self._send(400, server.error("invalid_request_error", "body is not JSON"))
                return
            status, payload = server.answer(path, body)
            if status == 200 and body.get("stream"):
                self._send_events(server.events(path, payload))
                return
            self._send(status, payload)

        def _send_events(self, events: list[tuple[str | None, Any]]) -> None:
            """Server-sent events, each written and flushed as it comes; the body ends when
            the connection closes."""
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("cache-control", "no-cache")
            self.send_header("connection", "close")
            self.end_headers()
            self.close_connection = True
            for name, data in events:
                text = data if isinstance(data, str) else json.dumps(data)
                head = f"event: {name}\n" if name is not None else ""
                self.wfile.write(f"{head}data: {text}\n\n".encode())
                self.wfile.flush()
                if server.stream_pause:
                    time.sleep(server.stream_pause)

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            request_id = "req_" + uuid.uuid4().hex[:12]
            self.send_header("request-id", request_id)  # as Anthropic names it
            self.send_header("x-request-id", request_id)  # as OpenAI does
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler


def pieces(text: str, n: int = 3) -> list[str]:
    """``text`` cut in up to ``n`` pieces (at spaces where it can be): what a stream sends."""
    if not text:
        return []
    words = text.split(" ")
    size = max(1, -(-len(words) // n))
    out = [" ".join(words[i : i + size]) for i in range(0, len(words), size)]
    return [p + (" " if i < len(out) - 1 else "") for i, p in enumerate(out)]
