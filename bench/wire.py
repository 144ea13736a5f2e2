"""Counting what a PostgreSQL client sends and waits for, on the wire.

``WireCounter`` is a TCP relay on 127.0.0.1 between the client and the server. It counts, over
every connection through it:

* ``round_trips``: the times the server answered after the client had sent something — each is
  one wait for the server, however many statements the client sent first (a pipeline is one);
* ``ready``: the server's ReadyForQuery messages — one per simple query, or per Sync ending a
  batch of extended-protocol messages;
* ``statements``: the client's Query and Execute messages — the statements sent.

Whatever driver calls or pipelining produce them, these are what crossed the wire. The client
must not use TLS or GSS encryption (``sslmode=disable&gssencmode=disable``): the relay reads the
protocol's message frames.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

PROTOCOL_3 = 196608  # the StartupMessage's version code; anything else first is not read


@dataclass(frozen=True)
class Counts:
    round_trips: int
    ready: int
    statements: int

    def __sub__(self, other: Counts) -> Counts:
        return Counts(
            self.round_trips - other.round_trips,
            self.ready - other.ready,
            self.statements - other.statements,
        )


class _Frames:
    """Splits one direction's bytes into messages; ``feed`` returns their type bytes (0 for
    the untyped startup message)."""

    def __init__(self, *, startup: bool) -> None:
        self.buf = bytearray()
        self.startup = startup
        self.unreadable = False

    def feed(self, data: bytes) -> list[int]:
        if self.unreadable:
            return []
        self.buf += data
        kinds = []
        while True:
            if self.startup:
                if len(self.buf) < 8:
                    break
                size = int.from_bytes(self.buf[:4], "big")
                if int.from_bytes(self.buf[4:8], "big") != PROTOCOL_3:
                    self.unreadable = True  # TLS/GSS negotiation or a cancel request
                    break
                kind = 0
            else:
                if len(self.buf) < 5:
                    break
                kind = self.buf[0]
                size = 1 + int.from_bytes(self.buf[1:5], "big")
            if len(self.buf) < size:
                break
            del self.buf[:size]
            self.startup = False
            kinds.append(kind)
        return kinds


class WireCounter:
    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._round_trips = self._ready = self._statements = 0
        self.unreadable = False
        self._closed = False
        threading.Thread(target=self._accept, name="wire-counter", daemon=True).start()

    @classmethod
    def for_url(cls, url: str) -> tuple[WireCounter, str]:
        """A counter in front of ``url``'s server, and the URL that goes through it."""
        parts = urlsplit(url)
        counter = cls(parts.hostname or "127.0.0.1", parts.port or 5432)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@127.0.0.1:{counter.port}" if userinfo else f"127.0.0.1:{counter.port}"
        query = "&".join(filter(None, [parts.query, "sslmode=disable&gssencmode=disable"]))
        return counter, urlunsplit((parts.scheme, netloc, parts.path, query, ""))

    def counts(self) -> Counts:
        with self._lock:
            return Counts(self._round_trips, self._ready, self._statements)

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            spoke = [False]  # the client sent something the server has not answered yet
            threading.Thread(
                target=self._relay, args=(client, server, True, spoke), daemon=True
            ).start()
            threading.Thread(
                target=self._relay, args=(server, client, False, spoke), daemon=True
            ).start()

    def _relay(
        self, src: socket.socket, dst: socket.socket, from_client: bool, spoke: list[bool]
    ) -> None:
        frames = _Frames(startup=from_client)
        try:
            while data := src.recv(65536):
                kinds = frames.feed(data)
                with self._lock:
                    if from_client:
                        spoke[0] = True
                        self._statements += sum(k in (ord("Q"), ord("E")) for k in kinds)
                    else:
                        if spoke[0]:
                            self._round_trips += 1
                            spoke[0] = False
                        self._ready += kinds.count(ord("Z"))
                    self.unreadable |= frames.unreadable
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
