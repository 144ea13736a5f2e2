"""What keeps a PostgreSQL store safe on an unreliable network (docs/design.md, rule 16): the
watchdog that cuts an operation past its deadline, the orphans (server transactions of cut
connections) ended before the store reads again, each connection's identity on the server, and
the server's clock.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import socket
import threading
import time
import weakref
from typing import Any

import psycopg

from ...errors import StoreError, StoreUnavailableError
from .._sql.plans import Plan, Step

Conn = psycopg.Connection[tuple[Any, ...]]
AsyncConn = psycopg.AsyncConnection[tuple[Any, ...]]
_log = logging.getLogger("toolledger")

SERVER_TIME = "SELECT extract(epoch from clock_timestamp())::float8"
_OUR_POOLS = ("toolledger", "toolledger-async")
our_conns: weakref.WeakSet[Any] = weakref.WeakSet()


class _QuietAboutOurPools(logging.Filter):
    """psycopg_pool logs a stack of warnings per network fault ("discarding broken
    connection", "error connecting in …"). For our pools toolledger says it once, with the
    session and what happens next; theirs are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not any((isinstance(a, str) and a in _OUR_POOLS) or _is_ours(a) for a in args)


def _is_ours(value: object) -> bool:
    try:
        return value in our_conns
    except TypeError:
        return False


logging.getLogger("psycopg.pool").addFilter(_QuietAboutOurPools())


def cut(conn: Conn | AsyncConn) -> None:
    """Shut the connection's socket down, from any thread: a call blocked on it returns with an
    error at once, and the pool discards the connection."""
    with contextlib.suppress(OSError, psycopg.Error):
        sock = socket.socket(fileno=os.dup(conn.pgconn.socket))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()


def cut_noting(conn: AsyncConn, fired: list[bool]) -> None:
    fired.append(True)
    cut(conn)


class Watchdog:
    """One thread per process cutting the connections of sync store operations that outlive
    their deadline (``?op_timeout=``). Arming and disarming cost a lock and a dict entry: the
    thread is woken only by a deadline earlier than the one it sleeps until — under a steady
    stream of operations it wakes about once per ``op_timeout``, not once per operation."""

    def __init__(self) -> None:
        self._forget()
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        """A new start (and, in a forked child, no thread yet, no lock held by a thread of the
        parent, nothing to cut: the parent's operations are the parent's)."""
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._armed: dict[int, tuple[float, Conn]] = {}
        self._fired: set[int] = set()
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None
        self._wakes_at = -math.inf  # when the sleeping thread wakes; -inf: it is not asleep

    def arm(self, conn: Conn, seconds: float) -> int:
        token = next(self._tokens)
        at = time.monotonic() + seconds
        with self._lock:
            self._armed[token] = (at, conn)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, daemon=True, name="toolledger-pg-deadlines"
                )
                self._thread.start()
            elif at < self._wakes_at:
                self._cv.notify()
        return token

    def disarm(self, token: int) -> bool:
        """Whether the deadline had passed and the connection was cut."""
        with self._lock:
            self._armed.pop(token, None)
            if token in self._fired:
                self._fired.discard(token)
                return True
            return False

    def _loop(self) -> None:
        while True:
            with self._cv:
                now = time.monotonic()
                late = [(t, c) for t, (at, c) in self._armed.items() if at <= now]
                for token, _ in late:
                    del self._armed[token]
                    self._fired.add(token)
                wait = max(
                    min((at for at, _ in self._armed.values()), default=now + 3600) - now, 0.001
                )
                if not late:
                    self._wakes_at = now + wait
                    self._cv.wait(timeout=wait)
                    self._wakes_at = -math.inf  # it looks at every deadline before sleeping again
                    continue
            for _, conn in late:
                cut(conn)


watchdog = Watchdog()

# What each of our connections is on the server: (backend pid, backend start), read when it is
# made. The start tells that backend from a later one given the same pid.
identity: weakref.WeakKeyDictionary[Any, tuple[int, Any]] = weakref.WeakKeyDictionary()

IDENTIFY = (
    "SELECT pid, backend_start, set_config('idle_in_transaction_session_timeout', ?, false) "
    "FROM pg_stat_activity WHERE pid = pg_backend_pid()"
)
# Signal the backend (the one-argument form: every server version), then watch it go.
SIGNAL_BACKEND = (
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = ? AND backend_start = ?"
)
BACKEND_GONE = (
    "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = ? AND backend_start = ?)"
)
PAUSE = "SELECT pg_sleep(?)"  # between two looks, on the connection that looks
ORPHAN_POLL_S = 0.01


def idle_ms(op_timeout: float) -> str:
    """``idle_in_transaction_session_timeout`` for our connections: a transaction of ours is
    never idle longer than one operation's deadline unless its client is gone (cut off, paused,
    killed), so the server ends it then, with its row locks — the lease row among them."""
    return str(max(1, int(op_timeout * 1000)))


class Orphans:
    """Server backends of connections cut or lost in the middle of a write: their transaction
    may still be open on the server, its COMMIT perhaps still on the network. Before the next
    operation of the store reads or writes anything, each is ended (``pg_terminate_backend``,
    then watched until it has exited, within half the operation's deadline) — so the read-back
    of a commit whose answer was lost is conclusive: the commit has landed, or it never will
    (docs/design.md, rule 16). One that will not end fails the operation (``StoreUnavailableError``)
    rather than let it read a state that may still change."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: set[tuple[int, Any]] = set()

    def add(self, ident: tuple[int, Any] | None) -> None:
        if ident is not None:
            with self._lock:
                self._pending.add(ident)

    def pending(self) -> list[tuple[int, Any]]:
        with self._lock:
            return list(self._pending)

    def ended(self, ident: tuple[int, Any]) -> None:
        with self._lock:
            self._pending.discard(ident)

    def still_open(self, ident: tuple[int, Any], url: str) -> StoreError:
        return StoreUnavailableError(
            f"{url}: a transaction of a connection cut earlier is still open on the server "
            f"(backend {ident[0]}) and did not end when asked to; its commit may still land, so "
            "nothing is read or written until it ends. Try again.",
            url=url,
        )

    def ending(self, url: str, op_timeout: float) -> Plan[None]:
        """End every orphan before an operation: signal its backend, then look until it is gone
        (at most half the operation's time). A plan, carried out on the operation's
        connection by either backend."""
        for ident in self.pending():
            try:
                yield Step(SIGNAL_BACKEND, ident)
            except psycopg.errors.InsufficientPrivilege:
                _cannot_end(url, ident)
                self.ended(ident)
                continue
            deadline = time.monotonic() + op_timeout / 2
            while not (yield Step(BACKEND_GONE, ident)).rows[0][0]:
                if time.monotonic() > deadline:
                    raise self.still_open(ident, url)
                yield Step(PAUSE, (ORPHAN_POLL_S,))
            self.ended(ident)


def gone(conn: Conn | AsyncConn | None) -> bool:
    """The connection is broken or closed: its server backend may be left with an open
    transaction. (A client-side error on a sound connection leaves none: it is rolled back.)"""
    return conn is not None and (conn.broken or conn.closed)


def first(row: tuple[Any, ...] | None) -> Any:
    return None if row is None else row[0]


def _cannot_end(url: str, ident: tuple[int, Any]) -> None:
    _log.warning(
        "toolledger: %s: not allowed to end the server backend %d of a connection cut "
        "mid-write (grant pg_signal_backend to the store's role); a commit of its may still "
        "land after it was read back",
        url,
        ident[0],
    )


class ServerClock:
    """The server's clock, as this process can know it: a reading of ``clock_timestamp()``
    carried forward on this machine's monotonic clock. Readings are taken on every new
    connection and whenever the last is older than ``RESYNC_S``; a reading is placed at the
    middle of its round trip, so it is off by at most half of one (well under a millisecond on a
    LAN) plus the monotonic clock's drift since. This machine's wall clock — however wrong — is
    never used."""

    RESYNC_S = 300.0
    FRESH_S = 1.0
    """How old a reading ``Backend.fresh_now`` takes: a judgement that an attempt is over acts on
    it (``StoreCore.judge``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._base: tuple[float, float] | None = None  # (server epoch, monotonic then)

    def observe(self, server_epoch: float, sent: float, received: float) -> None:
        with self._lock:
            self._base = (server_epoch, (sent + received) / 2)

    def forget(self) -> None:
        """The server's clock disagreed with the reading (``ClockMovedError``): the next
        ``estimate`` is ``None``, so the next use reads it again."""
        with self._lock:
            self._base = None

    def estimate(self, within: float = RESYNC_S) -> float | None:
        """The server's time now, from a reading taken at most ``within`` seconds ago; else
        ``None``: read it."""
        with self._lock:
            base = self._base
        if base is None:
            return None
        elapsed = time.monotonic() - base[1]
        return None if elapsed > within else base[0] + elapsed

    def reading(self) -> Plan[float]:
        """A reading, placed at the middle of its round trip; the server's time now."""
        sent = time.monotonic()
        found = (yield Step(SERVER_TIME)).rows
        received = time.monotonic()
        server = float(found[0][0])
        self.observe(server, sent, received)
        return server + (time.monotonic() - (sent + received) / 2)
