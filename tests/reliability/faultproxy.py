"""A TCP proxy between toolledger and PostgreSQL that breaks the network on command.

It runs an asyncio loop in a thread of its own, listens on ``127.0.0.1:<free port>`` and forwards
every connection to the server. The test thread (or a worker thread, at one of toolledger's named
crash points) changes what it does, thread-safely:

* ``set_mode(direction, mode)`` — per direction (``"up"``: client to server, ``"down"``: server
  to client, or ``"both"``), for every connection, open or new: ``PASS``, ``BLACK_HOLE`` (read
  and discard: the peer sees a silent connection, no RST, and the kernel acknowledges every
  byte, so keepalives and ``tcp_user_timeout`` see nothing wrong) or a delay in seconds;
* ``reset_all()`` — close every connection with a RST (``SO_LINGER`` 0) on both sides;
* ``drop_next_reply(on=...)`` — forward the client's next request but discard the server's
  answer to it: a reply lost after the server committed; that connection then stays silent;
* ``arm(fault, on=...)`` — a ``Fault`` struck at the next request that ``on`` matches (``ANY``,
  ``COMMIT``, ``statement(...)``), so a test aims at *the commit* of a given moment: the reply
  dropped, a black hole from then on, a RST instead of the reply, every connection slow from
  then on (``latency``), or that connection alone slow (``slow_request``).

Requests are recognised by reading the client's side of the wire protocol just enough: a simple
``Query``, or an extended-protocol group up to its ``Sync``, named by its SQL — which psycopg
sends once, in the ``Parse`` of a prepared statement, and afterwards only by name, so the names
are remembered per connection. Transaction commands (``BEGIN``, ``COMMIT``) are never prepared.

A black hole is a network partition: the server does not see the client go away either, so a
transaction cut off before its ``COMMIT`` stays open on the server, holding its row locks, until
``heal()``. Struck at a request, it loses that request and everything after it, but not what the
client sent before it in the same write: a pipelined transaction — ``BEGIN``, its statements and
``COMMIT`` sent at once — reaches the server up to its ``COMMIT``.
``heal(server_notices=False)`` leaves those server connections open, as a real partition does
until the server's own TCP keepalive gives up (two hours by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = [
    "ANY",
    "BLACK_HOLE",
    "COMMIT",
    "PASS",
    "Fault",
    "FaultProxy",
    "Matcher",
    "Request",
    "running_proxy",
    "statement",
]

PASS = "pass"
BLACK_HOLE = "black_hole"
Mode = str | float  # PASS, BLACK_HOLE, or a delay in seconds

_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104
_CANCEL_REQUEST = 80877102


class Fault(StrEnum):
    """What ``arm`` does when its request comes."""

    DROP_REPLY = "drop_reply"  # the request reaches the server; its answer never comes back
    BLACK_HOLE = "black_hole"  # the request is lost, and so is everything after, both ways
    RESET = "reset"  # the request reaches the server; a RST comes back instead of its answer
    LATENCY = "latency"  # from this request on, every byte takes `latency` seconds each way
    SLOW_REQUEST = "slow_request"  # this request's connection alone: `latency` seconds each way


@dataclass(frozen=True, slots=True)
class Request:
    """One request of the client: its SQL, and whether it was sent inside a transaction."""

    sql: str
    in_transaction: bool
    start: int = 0
    """Where its first message begins in the client's byte stream (a pipelined transaction sends
    several requests in one write: a black hole keeps what came before this one)."""

    @property
    def verb(self) -> str:
        return self.sql.lstrip().split(None, 1)[0].upper() if self.sql.strip() else ""


Matcher = Callable[[Request], bool]


def ANY(request: Request) -> bool:
    return True


def COMMIT(request: Request) -> bool:
    """The ``COMMIT`` of a transaction: where its writes land."""
    return request.verb == "COMMIT"


def statement(prefix: str) -> Matcher:
    """A statement sent on its own (autocommit: its execution is its commit) whose SQL starts
    with ``prefix`` (whitespace-insensitive)."""
    wanted = " ".join(prefix.split())

    def matches(request: Request) -> bool:
        return not request.in_transaction and " ".join(request.sql.split()).startswith(wanted)

    matches.__name__ = f"statement({prefix!r})"
    return matches


class _Frontend:
    """The client's side of the PostgreSQL protocol, read just enough to name its requests."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.started = False
        self.prepared: dict[str, str] = {}
        self.group: str | None = None  # SQL of the extended-protocol group under way
        self.group_start: int | None = None  # where that group's first message began
        self.in_transaction = False
        self.offset = 0  # bytes of the stream read into messages so far

    @property
    def received(self) -> int:
        """Bytes of the stream received so far (read into messages, or waiting to be)."""
        return self.offset + len(self.buffer)

    def feed(self, data: bytes) -> list[Request]:
        self.buffer += data
        out: list[Request] = []
        while True:
            if not self.started:
                if len(self.buffer) < 8:
                    return out
                (length,) = struct.unpack("!i", self.buffer[:4])
                if len(self.buffer) < length:
                    return out
                (code,) = struct.unpack("!i", self.buffer[4:8])
                del self.buffer[:length]
                self.offset += length
                if code not in (_SSL_REQUEST, _GSSENC_REQUEST, _CANCEL_REQUEST):
                    self.started = True  # the startup message; typed messages follow
                continue
            if len(self.buffer) < 5:
                return out
            kind = chr(self.buffer[0])
            (length,) = struct.unpack("!i", self.buffer[1:5])
            if len(self.buffer) < 1 + length:
                return out
            body = bytes(self.buffer[5 : 1 + length])
            del self.buffer[: 1 + length]
            start, self.offset = self.offset, self.offset + 1 + length
            request = self._message(kind, body, start)
            if request is not None:
                out.append(request)

    def _message(self, kind: str, body: bytes, start: int) -> Request | None:
        if kind == "Q":
            sql = _cstring(body, 0)[0]
            request = Request(sql, self.in_transaction, start)
            verb = request.verb
            if verb in ("BEGIN", "START"):
                self.in_transaction = True
            elif verb in ("COMMIT", "ROLLBACK", "END", "ABORT"):
                self.in_transaction = False
            return request
        if kind == "P":
            name, at = _cstring(body, 0)
            sql, _ = _cstring(body, at)
            if name:
                self.prepared[name] = sql
            if self.group is None:
                self.group, self.group_start = sql, start
        elif kind == "B":
            _, at = _cstring(body, 0)  # the portal
            name, _ = _cstring(body, at)
            if self.group is None:
                self.group = self.prepared.get(name, f"<prepared {name}>") if name else ""
                self.group_start = start
        elif kind == "S":
            sql, self.group = self.group or "", None
            began, self.group_start = self.group_start, None
            return Request(sql, self.in_transaction, start if began is None else began)
        return None


def _cstring(body: bytes, at: int) -> tuple[str, int]:
    end = body.index(b"\0", at)
    return body[at:end].decode("utf-8", "replace"), end + 1


@dataclass(eq=False)
class _Link:
    """One proxied connection."""

    client: asyncio.StreamWriter
    server: asyncio.StreamWriter | None = None
    frontend: _Frontend = field(default_factory=_Frontend)
    silent: bool = False  # both directions swallowed (a reply dropped, a black hole)
    reset_on_reply: bool = False  # the next bytes from the server become a RST
    delay: float | None = None  # this connection alone is slow
    closed: bool = False


@dataclass
class _Armed:
    fault: Fault
    on: Matcher
    latency: float


class FaultProxy:
    """See the module docstring. ``start()`` before use, ``stop()`` after (the fixture does)."""

    def __init__(self, upstream: tuple[str, int] = ("127.0.0.1", 5432)) -> None:
        self.upstream = upstream
        self.port = 0
        self.fired: Counter[str] = Counter()
        """Faults that struck, by kind (``arm``/``drop_next_reply`` count when their request
        comes, ``set_mode``/``reset_all`` when called)."""
        self.struck: list[tuple[Fault, str]] = []  # (fault, the SQL it struck) in order
        self._lock = threading.Lock()
        self._modes: dict[str, Mode] = {"up": PASS, "down": PASS}
        self._armed: list[_Armed] = []
        self._links: set[_Link] = set()
        self._tainted: set[_Link] = set()  # cut off by a fault: never trusted again
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._abandoned: list[asyncio.StreamWriter] = []  # server sides a partition left open

    # -- life -------------------------------------------------------------------------------------

    def start(self) -> None:
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._main, args=(ready,), name="fault-proxy", daemon=True
        )
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the fault proxy did not start")

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return
        self._call(self._shutdown)
        loop.call_soon_threadsafe(loop.stop)
        assert self._thread is not None
        self._thread.join(10)
        self._loop = None

    def url(self, admin_url: str) -> str:
        """``admin_url`` (``postgresql://user@127.0.0.1:5432/db…``) sent through this proxy."""
        host, port = self.upstream
        target = f"@{host}:{port}/"
        assert target in admin_url, f"{admin_url} does not name {host}:{port}"
        return admin_url.replace(target, f"@127.0.0.1:{self.port}/")

    # -- controls (any thread) --------------------------------------------------------------------

    def set_mode(self, direction: str, mode: Mode) -> None:
        """``direction``: ``"up"`` (client to server), ``"down"`` or ``"both"``; ``mode``:
        ``PASS``, ``BLACK_HOLE`` or a delay in seconds. Applies to open and new connections."""
        with self._lock:
            for d in ("up", "down") if direction == "both" else (direction,):
                self._modes[d] = mode
            if mode == BLACK_HOLE:
                self._tainted.update(self._links)
            if mode != PASS:
                self.fired[BLACK_HOLE if mode == BLACK_HOLE else "latency"] += 1

    def reset_all(self) -> None:
        """RST every connection, both sides."""
        with self._lock:
            self.fired["reset"] += 1
        self._call(self._reset_all)

    def drop_next_reply(self, on: Matcher = ANY) -> None:
        """Forward the client's next request ``on`` matches (by default the very next one, on
        any connection) and discard the server's answer: the connection goes silent."""
        self.arm(Fault.DROP_REPLY, on=on)

    def arm(self, fault: Fault, *, on: Matcher = ANY, latency: float = 0.0) -> None:
        """Strike ``fault`` at the next request ``on`` matches (one shot)."""
        with self._lock:
            self._armed.append(_Armed(Fault(fault), on, latency))

    def disarm(self) -> bool:
        """Forget armed faults; whether one was still waiting for its request."""
        with self._lock:
            waiting = bool(self._armed)
            self._armed.clear()
            return waiting

    def heal(self, *, server_notices: bool = True) -> None:
        """Pass everything again. Connections a fault cut off are closed with a RST (their
        streams lost bytes): the client side always; the server side too when
        ``server_notices`` — otherwise it stays open, as after a real partition."""
        with self._lock:
            self._armed.clear()
            self._modes = {"up": PASS, "down": PASS}
            tainted = [link for link in self._tainted if not link.closed]
            self._tainted.clear()
        self._call(lambda: self._cut_off(tainted, server_notices))

    @property
    def mode(self) -> tuple[Mode, Mode]:
        """What every connection does now: (client to server, server to client)."""
        with self._lock:
            return self._modes["up"], self._modes["down"]

    # -- the loop ---------------------------------------------------------------------------------

    def _main(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        self._server = loop.run_until_complete(
            asyncio.start_server(self._accept, "127.0.0.1", 0, reuse_address=True)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        ready.set()
        try:
            loop.run_forever()
        finally:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

    def _call(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on the proxy's loop and wait for it."""
        loop = self._loop
        assert loop is not None, "start() the proxy first"

        async def run() -> None:
            result = fn()
            if asyncio.iscoroutine(result):
                await result

        asyncio.run_coroutine_threadsafe(run(), loop).result(10)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _shutdown(self) -> None:
        assert self._server is not None
        self._server.close()
        for link in list(self._links):
            self._close(link, rst=True)
        for writer in self._abandoned:
            _shut(writer, True)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with self._lock:
            link = _Link(writer)
            self._links.add(link)
            partitioned = BLACK_HOLE in self._modes.values()
            if partitioned:
                self._tainted.add(link)
        if not partitioned:
            try:
                up_reader, link.server = await asyncio.open_connection(*self.upstream)
            except OSError:
                self._close(link, rst=True)
                return
            self._spawn(self._pump(link, up_reader, "down"))
        self._spawn(self._pump(link, reader, "up"))

    async def _pump(self, link: _Link, reader: asyncio.StreamReader, direction: str) -> None:
        queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue()
        self._spawn(self._deliver(link, queue, direction))
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                routed = self._route(link, direction, data)
                if routed is not None:
                    queue.put_nowait(routed)
        except (ConnectionError, OSError):
            pass
        if direction == "up":
            with self._lock:
                keep_server = link in self._tainted and link.silent is False and self._partitioned
            if keep_server:
                return  # a partition: the server does not hear the client go
        queue.put_nowait((time.monotonic(), None))

    @property
    def _partitioned(self) -> bool:
        return BLACK_HOLE in self._modes.values()

    def _route(self, link: _Link, direction: str, data: bytes) -> tuple[float, bytes] | None:
        """When to deliver what of ``data`` (monotonic time, bytes), or ``None`` to swallow it."""
        now = time.monotonic()
        strike: _Armed | None = None
        struck: Request | None = None
        begins = link.frontend.received  # where ``data`` begins in the client's stream
        with self._lock:
            if direction == "down" and link.reset_on_reply:
                link.reset_on_reply = False
                self._tainted.add(link)
                asyncio.get_running_loop().call_soon(self._close, link, True)
                return None
            if direction == "up":
                for request in link.frontend.feed(data):
                    for armed in self._armed:
                        if armed.on(request):
                            self._armed.remove(armed)
                            strike, struck = armed, request
                            self.fired[armed.fault.value] += 1
                            self.struck.append((armed.fault, request.sql))
                            break
            if strike is not None:
                assert struck is not None
                due = self._strike(link, strike, now)
                if due is None:  # lost from the struck request on; what came before it goes
                    before = data[: max(0, struck.start - begins)]
                    return (now, before) if before else None
                return due, data
            if link.silent:
                return None
            if link.delay is not None:
                return now + link.delay, data
            mode = self._modes[direction]
            if mode == BLACK_HOLE:
                self._tainted.add(link)
                return None
            return now + (float(mode) if mode != PASS else 0.0), data

    def _strike(self, link: _Link, armed: _Armed, now: float) -> float | None:
        """Called under the lock with the chunk that carries the request ``armed`` waited for."""
        if armed.fault is Fault.DROP_REPLY:
            link.silent = True
            self._tainted.add(link)
            return now
        if armed.fault is Fault.RESET:
            link.reset_on_reply = True
            return now
        if armed.fault is Fault.BLACK_HOLE:
            self._modes = {"up": BLACK_HOLE, "down": BLACK_HOLE}
            self._tainted.update(self._links)
            return None
        if armed.fault is Fault.SLOW_REQUEST:
            link.delay = armed.latency
            return now + armed.latency
        self._modes = {"up": armed.latency, "down": armed.latency}
        return now + armed.latency

    async def _deliver(
        self, link: _Link, queue: asyncio.Queue[tuple[float, bytes | None]], direction: str
    ) -> None:
        writer = link.server if direction == "up" else link.client
        try:
            while True:
                due, data = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if data is None:
                    break
                if writer is None or writer.is_closing():
                    continue
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        self._close(link, rst=False)

    def _close(self, link: _Link, rst: bool) -> None:
        if link.closed:
            return
        link.closed = True
        with self._lock:
            self._links.discard(link)
        for writer in (link.client, link.server):
            if writer is not None:
                _shut(writer, rst)

    def _reset_all(self) -> None:
        for link in list(self._links):
            self._close(link, rst=True)

    def _cut_off(self, links: list[_Link], server_notices: bool) -> None:
        for link in links:
            if server_notices:
                self._close(link, rst=True)
            else:
                link.closed = True
                with self._lock:
                    self._links.discard(link)
                _shut(link.client, rst=True)
                # The server side is left as it is: open, silent, its transaction (if any) too.
                if link.server is not None:
                    self._abandoned.append(link.server)

    def let_server_notice(self) -> None:
        """The server's keepalive finally gives up on the connections a partition left open."""

        def close() -> None:
            for writer in self._abandoned:
                _shut(writer, True)
            self._abandoned.clear()

        self._call(close)


def _shut(writer: asyncio.StreamWriter, rst: bool) -> None:
    if writer.is_closing():
        return
    if rst:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
    else:
        writer.close()


@contextlib.contextmanager
def running_proxy(upstream: tuple[str, int] = ("127.0.0.1", 5432)) -> Iterator[FaultProxy]:
    """A started ``FaultProxy``, stopped (every connection closed) on the way out."""
    proxy = FaultProxy(upstream)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()
