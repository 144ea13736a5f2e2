"""``postgresql://`` — PostgreSQL through psycopg 3: a thread-safe sync backend and a native async
twin (``Store.async_backend``), each over its own connection pool.

``postgresql://user:password@host:5432/db?schema=NAME&pool_min=1&pool_max=10&pool_timeout=10``
takes any libpq parameter besides toolledger's own (``sslmode=``, ``connect_timeout=`` …).
``schema`` puts every table in that schema, created if absent, so tenants or test runs can share
one database.

Every state change is one short transaction of conditional statements (insert-if-absent,
compare-and-set): two workers cannot both win a transition, and a crash leaves either the old
rows or the new ones. A commit is as durable as the server makes it: keep ``synchronous_commit``
on (``integrity_check()`` says when it is off).

A dropped connection is retried on a fresh one only when nothing can have been committed; one
lost *during* COMMIT raises ``StoreUnavailableError`` saying the outcome is unknown, because a
conditional write sent twice would report "someone else got there first" about our own row.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from ..errors import ConfigurationError, StoreError, StoreUnavailableError

try:
    import psycopg
    from psycopg_pool import AsyncConnectionPool, ConnectionPool
except ImportError as exc:  # the optional driver is missing or broken
    raise ConfigurationError(
        f"the postgresql:// store needs psycopg 3 and psycopg-pool ({exc}): "
        "pip install 'toolledger[postgres]'"
    ) from exc

from ..ops import Op
from ..records import ApprovalRecord, EffectRecord, Lease, SessionState, StoredMessage
from . import _postgres as plans

__all__ = ["AsyncPostgresBackend", "PostgresBackend", "open_backends"]

T = TypeVar("T")
IN_FLIGHT_WAIT_S = 2.0
_log = logging.getLogger("toolledger")
Conn = psycopg.Connection[tuple[Any, ...]]
AsyncConn = psycopg.AsyncConnection[tuple[Any, ...]]


def open_backends(url: str, *, create: bool = True) -> tuple[PostgresBackend, AsyncPostgresBackend]:
    """The two faces of one store: closing either one (``Store.close()`` or ``aclose()``)
    releases both pools. ``create=False``: a schema without toolledger's tables is an error."""
    backend = PostgresBackend(url, create=create)
    twin = AsyncPostgresBackend(url, clock=backend.server_clock, orphans=backend.orphans)
    backend._twin, twin._twin = twin, backend
    return backend, twin


SERVER_TIME = "SELECT extract(epoch from clock_timestamp())::float8"


_OUR_POOLS = ("toolledger", "toolledger-async")
_our_conns: weakref.WeakSet[Any] = weakref.WeakSet()


class _QuietAboutOurPools(logging.Filter):
    """psycopg_pool logs a stack of warnings per network fault ("discarding broken
    connection", "error connecting in …"). For our pools toolledger says it once, with the
    session and what happens next; theirs are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not any((isinstance(a, str) and a in _OUR_POOLS) or _is_ours(a) for a in args)


def _is_ours(value: object) -> bool:
    try:
        return value in _our_conns
    except TypeError:
        return False


logging.getLogger("psycopg.pool").addFilter(_QuietAboutOurPools())


def _cut(conn: Conn | AsyncConn) -> None:
    """Shut the connection's socket down, from any thread: a call blocked on it returns with an
    error at once, and the pool discards the connection."""
    with contextlib.suppress(OSError, psycopg.Error):
        sock = socket.socket(fileno=os.dup(conn.pgconn.socket))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()


def _cut_noting(conn: AsyncConn, fired: list[bool]) -> None:
    fired.append(True)
    _cut(conn)


class _Watchdog:
    """One thread per process cutting the connections of sync store operations that outlive
    their deadline (``?op_timeout=``). Arming and disarming cost a lock and a dict entry."""

    def __init__(self) -> None:
        self._cv = threading.Condition(threading.Lock())
        self._armed: dict[int, tuple[float, Conn]] = {}
        self._fired: set[int] = set()
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, conn: Conn, seconds: float) -> int:
        token = next(self._tokens)
        with self._cv:
            self._armed[token] = (time.monotonic() + seconds, conn)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, daemon=True, name="toolledger-pg-deadlines"
                )
                self._thread.start()
            self._cv.notify()
        return token

    def disarm(self, token: int) -> bool:
        """Whether the deadline had passed and the connection was cut."""
        with self._cv:
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
                wait = min((at for at, _ in self._armed.values()), default=now + 3600) - now
                if not late:
                    self._cv.wait(timeout=max(wait, 0.001))
                    continue
            for _, conn in late:
                _cut(conn)


_watchdog = _Watchdog()

# What each of our connections is on the server: (backend pid, backend start), read when it is
# made. The start tells that backend from a later one given the same pid.
_identity: weakref.WeakKeyDictionary[Any, tuple[int, Any]] = weakref.WeakKeyDictionary()

IDENTIFY = (
    "SELECT pid, backend_start, set_config('idle_in_transaction_session_timeout', %s, false) "
    "FROM pg_stat_activity WHERE pid = pg_backend_pid()"
)
# Signal the backend (the one-argument form: every server version), then watch it go.
SIGNAL_BACKEND = (
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = %s AND backend_start = %s"
)
BACKEND_GONE = (
    "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = %s AND backend_start = %s)"
)
ORPHAN_POLL_S = 0.01


def _idle_ms(op_timeout: float) -> str:
    """``idle_in_transaction_session_timeout`` for our connections: a transaction of ours is
    never idle longer than one operation's deadline unless its client is gone (cut off, paused,
    killed), so the server ends it then, with its row locks — the lease row among them."""
    return str(max(1, int(op_timeout * 1000)))


class _Orphans:
    """Server backends of connections cut or lost in the middle of a write: their transaction
    may still be open on the server, its COMMIT perhaps still on the network. Before the next
    operation of the store reads or writes anything, each is ended (``pg_terminate_backend``,
    then watched until it has exited, within half the operation's deadline) — so the read-back
    of a commit whose answer was lost is conclusive: the commit has landed, or it never will
    (DESIGN.md rule 16). One that will not end fails the operation (``StoreUnavailableError``)
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

    def end(self, conn: Conn, url: str, op_timeout: float) -> None:
        for ident in self.pending():
            try:
                conn.execute(SIGNAL_BACKEND, ident)
            except psycopg.errors.InsufficientPrivilege:
                _cannot_end(url, ident)
                self.ended(ident)
                continue
            deadline = time.monotonic() + op_timeout / 2
            while not _first(conn.execute(BACKEND_GONE, ident).fetchone()):
                if time.monotonic() > deadline:
                    raise self.still_open(ident, url)
                time.sleep(ORPHAN_POLL_S)
            self.ended(ident)

    async def aend(self, conn: AsyncConn, url: str, op_timeout: float) -> None:
        for ident in self.pending():
            try:
                await conn.execute(SIGNAL_BACKEND, ident)
            except psycopg.errors.InsufficientPrivilege:
                _cannot_end(url, ident)
                self.ended(ident)
                continue
            deadline = time.monotonic() + op_timeout / 2
            while not _first(await (await conn.execute(BACKEND_GONE, ident)).fetchone()):
                if time.monotonic() > deadline:
                    raise self.still_open(ident, url)
                await asyncio.sleep(ORPHAN_POLL_S)
            self.ended(ident)


def _gone(conn: Conn | AsyncConn | None) -> bool:
    """The connection is broken or closed: its server backend may be left with an open
    transaction. (A client-side error on a sound connection leaves none: it is rolled back.)"""
    return conn is not None and (conn.broken or conn.closed)


def _first(row: tuple[Any, ...] | None) -> Any:
    return None if row is None else row[0]


def _cannot_end(url: str, ident: tuple[int, Any]) -> None:
    _log.warning(
        "toolledger: %s: not allowed to end the server backend %d of a connection cut "
        "mid-write (grant pg_signal_backend to the store's role); a commit of its may still "
        "land after it was read back",
        url,
        ident[0],
    )


def _timed_out(url: str, action: str, seconds: float, *, unknown: bool) -> StoreError:
    more = (
        " The write may or may not have landed: it is read back before the run goes on."
        if unknown
        else " Nothing was written."
    )
    return StoreUnavailableError(
        f"{url}: PostgreSQL did not answer within {seconds:g}s while {action} (op_timeout); the "
        f"connection was cut and discarded.{more}",
        url=url,
        outcome_unknown=unknown,
    )


class ServerClock:
    """The server's clock, as this process can know it: a reading of ``clock_timestamp()``
    carried forward on this machine's monotonic clock. Readings are taken on every new
    connection and whenever the last is older than ``RESYNC_S``; a reading is placed at the
    middle of its round trip, so it is off by at most half of one (well under a millisecond on a
    LAN) plus the monotonic clock's drift since. This machine's wall clock — however wrong — is
    never used."""

    RESYNC_S = 300.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._base: tuple[float, float] | None = None  # (server epoch, monotonic then)

    def observe(self, server_epoch: float, sent: float, received: float) -> None:
        with self._lock:
            self._base = (server_epoch, (sent + received) / 2)

    def estimate(self) -> float | None:
        with self._lock:
            base = self._base
        if base is None:
            return None
        elapsed = time.monotonic() - base[1]
        return None if elapsed > self.RESYNC_S else base[0] + elapsed

    def read(self, conn: Conn) -> float:
        sent = time.monotonic()
        row = conn.execute(SERVER_TIME).fetchone()
        received = time.monotonic()
        assert row is not None
        self.observe(float(row[0]), sent, received)
        return float(row[0]) + (time.monotonic() - (sent + received) / 2)

    async def aread(self, conn: AsyncConn) -> None:
        sent = time.monotonic()
        cur = await conn.execute(SERVER_TIME)
        row = await cur.fetchone()
        received = time.monotonic()
        assert row is not None
        self.observe(float(row[0]), sent, received)


class PostgresBackend:
    """The sync backend. Opening it migrates the schema; its pool makes it safe to share
    between threads."""

    durable = True

    def __init__(self, url: str, *, create: bool = True) -> None:
        self.settings = plans.parse_url(url)
        self.url = self.settings.display
        self._twin: AsyncPostgresBackend | None = None
        self.server_clock = ServerClock()
        self.orphans = _Orphans()
        self.schema_version = migrate(self.settings, create=create)
        s = self.settings
        self._pool: ConnectionPool[Conn] = ConnectionPool(
            s.conninfo,
            kwargs={"autocommit": True, **s.connect_kwargs},
            min_size=s.pool_min,
            max_size=s.pool_max,
            timeout=s.pool_timeout,
            configure=partial(
                _configure, schema=s.schema, clock=self.server_clock, idle_ms=_idle_ms(s.op_timeout)
            ),
            name="toolledger",
            open=True,
        )

    def _run(
        self,
        action: str,
        plan: Callable[[], plans.Plan[T]],
        *,
        write: bool = False,
        single: bool = False,
        again: Callable[[], plans.Plan[T]] | None = None,
        session_id: str | None = None,
    ) -> T:
        again = again or plan
        attempt = 0
        while True:
            committing = False
            cut = False
            ident, used = None, None
            try:
                # op_timeout bounds the wait for a connection too (a pool that cannot make one
                # would otherwise wait pool_timeout), and then the operation itself.
                with self._pool.connection(timeout=self._wait_s) as conn:
                    ident, used = _identity.get(conn), conn
                    token = _watchdog.arm(conn, self.settings.op_timeout)
                    try:
                        self.orphans.end(conn, self.url, self.settings.op_timeout)
                        if not write:
                            return _drive(conn, plan())
                        if single:
                            # One statement in autocommit: its execution is its commit, in one
                            # round trip instead of BEGIN, statement, COMMIT. Sent again after
                            # a lost connection, it checks whether the first send landed.
                            return _drive(conn, plan() if attempt == 0 else again())
                        with conn.transaction():
                            value = _drive(conn, plan())
                            committing = True  # an error from here on is the COMMIT's
                        return value
                    finally:
                        cut = _watchdog.disarm(token)
            except (psycopg.Error, UnicodeEncodeError) as exc:
                if write and (cut or (plans.connection_lost(exc) and _gone(used))):
                    self.orphans.add(ident)  # its transaction may still be open on the server
                if cut:
                    unknown = write and (single or committing)
                    raise _timed_out(
                        self.url, action, self.settings.op_timeout, unknown=unknown
                    ) from exc
                error = plans.failure(
                    exc,
                    url=self.url,
                    action=action,
                    attempt=attempt,
                    committing=committing,
                    single=write and single,
                    session_id=session_id,
                )
                if error is not None:
                    raise error from exc
                if plans.connection_lost(exc):
                    _log.warning(
                        "toolledger: lost the connection to PostgreSQL while %s (%s); "
                        "retrying on a fresh one",
                        action,
                        str(exc).strip() or type(exc).__name__,
                    )
                    self._pool.check()  # a server restart killed its idle siblings too
            attempt += 1

    @property
    def _wait_s(self) -> float:
        return min(self.settings.pool_timeout, self.settings.op_timeout)

    def read_effects(
        self, session_id: str, tool_use_ids: Sequence[str] | None = None
    ) -> dict[str, EffectRecord]:
        return self._run(
            "reading the ledger", partial(plans.read_effects, session_id, tool_use_ids)
        )

    def apply(self, session_id: str, ops: Sequence[Op]) -> list[bool]:
        if not ops:
            return []
        plan = partial(plans.apply, session_id, ops)
        return self._run(
            "writing the ledger",
            plan,
            write=True,
            single=plans.one_statement(ops),
            again=partial(plans.apply_again, session_id, ops),
            session_id=session_id,
        )

    def read_session(self, session_id: str) -> SessionState | None:
        found = self._run("reading a session", partial(plans.read_session, session_id))
        return found[0] if found else None

    def read_messages(self, session_id: str, since: int = 0) -> list[StoredMessage]:
        plan = partial(plans.read_messages, session_id, since)
        return self._run("reading a transcript", plan)

    def read_approvals(self, session_id: str | None = None) -> list[ApprovalRecord]:
        return self._run("reading approvals", partial(plans.read_approvals, session_id))

    def read_lease(self, session_id: str) -> Lease | None:
        found = self._run("reading a lease", partial(plans.read_lease, session_id))
        return found[0] if found else None

    def now(self) -> float:
        """The server's clock (``ServerClock``): no round trip unless the last reading is old."""
        estimate = self.server_clock.estimate()
        if estimate is not None:
            return estimate
        try:
            with self._pool.connection(timeout=self._wait_s) as conn:
                return self.server_clock.read(conn)
        except psycopg.Error as exc:
            raise plans.translate(exc, url=self.url, action="reading the server's clock") from exc

    def list_sessions(self) -> list[SessionState]:
        return self._run("listing sessions", plans.list_sessions)

    def session_ids(self) -> list[str]:
        return self._run("listing sessions", plans.session_ids)

    def in_doubt(self) -> list[EffectRecord]:
        return self._run("listing in-doubt calls", plans.in_doubt)

    def integrity_check(self) -> list[str]:
        """Schema version, tables, the in-doubt index, ``synchronous_commit`` and gap-free
        transcripts: an empty list when all is sound."""
        return self._run("checking integrity", plans.integrity)

    def close(self) -> None:
        """Close the pool (idempotent), and the async twin's."""
        self._pool.close()
        twin, self._twin = self._twin, None
        if twin is not None:
            twin.release()


@dataclass
class _LoopPool:
    """An async pool and the event loop it lives in (its tasks and locks belong to that loop)."""

    pool: AsyncConnectionPool[AsyncConn]
    loop: asyncio.AbstractEventLoop
    conns: weakref.WeakSet[AsyncConn] = field(default_factory=weakref.WeakSet)
    opening: asyncio.Task[None] | None = None
    guard: asyncio.Task[None] | None = None


class AsyncPostgresBackend:
    """The native async backend. Its pool needs a running event loop, so it opens on first use
    and serves that loop; a call from another loop (``asyncio.run`` again) opens a fresh pool
    and releases the old one. It expects a migrated schema: ``open_store`` migrates."""

    durable = True

    def __init__(
        self, url: str, *, clock: ServerClock | None = None, orphans: _Orphans | None = None
    ) -> None:
        self.settings = plans.parse_url(url)
        self.url = self.settings.display
        self.server_clock = clock or ServerClock()
        self.orphans = orphans or _Orphans()  # shared with the sync twin: one server
        self._twin: PostgresBackend | None = None
        self._current: _LoopPool | None = None
        self._closed = False
        self._closing: set[asyncio.Future[None]] = set()

    async def _pool(self) -> AsyncConnectionPool[AsyncConn]:
        if self._closed:
            raise StoreError(f"{self.url}: the store is closed; open it again", url=self.url)
        loop = asyncio.get_running_loop()
        current = self._current
        if current is None or current.loop is not loop:
            if current is not None:
                self._release(current)
            current = self._current = self._new_pool(loop)
            current.guard = loop.create_task(_close_at_shutdown(current.pool))
            # Wait for the first connections before serving: a request that finds the pool
            # empty makes it grow, and a connection still being made when the loop ends is
            # only closed by the garbage collector. Racing first callers share this one wait.
            current.opening = loop.create_task(
                current.pool.open(
                    wait=True, timeout=min(self.settings.pool_timeout, self.settings.op_timeout)
                )
            )
        assert current.opening is not None
        try:
            await asyncio.shield(current.opening)
        except psycopg.Error as exc:
            # open(wait=True) closed the pool on failure: the next call starts a fresh one.
            if self._current is current:
                self._current = None
            if current.guard is not None:
                current.guard.cancel()
            raise plans.translate(exc, url=self.url, action="connecting") from exc
        return current.pool

    def _new_pool(self, loop: asyncio.AbstractEventLoop) -> _LoopPool:
        s = self.settings
        conns: weakref.WeakSet[AsyncConn] = weakref.WeakSet()

        async def configure(conn: AsyncConn) -> None:
            conns.add(conn)
            _our_conns.add(conn)
            if s.schema is not None:
                await conn.execute(plans.search_path(s.schema))
            cur = await conn.execute(IDENTIFY, (_idle_ms(s.op_timeout),))
            row = await cur.fetchone()
            if row is not None:
                _identity[conn] = (row[0], row[1])
            await self.server_clock.aread(conn)

        pool: AsyncConnectionPool[AsyncConn] = AsyncConnectionPool(
            s.conninfo,
            kwargs={"autocommit": True, **s.connect_kwargs},
            min_size=s.pool_min,
            max_size=s.pool_max,
            timeout=s.pool_timeout,
            configure=configure,
            name="toolledger-async",
            open=False,
        )
        return _LoopPool(pool, loop, conns)

    def _release(self, current: _LoopPool) -> None:
        """Close a pool without awaiting it, from whatever thread or loop we are in."""
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if current.loop is running:
            task = current.loop.create_task(current.pool.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        elif current.loop.is_running():
            asyncio.run_coroutine_threadsafe(current.pool.close(), current.loop)
        else:
            # The loop is not running any more. If it ended through ``asyncio.run`` the pool was
            # closed in its shutdown already; if it was closed some other way, nothing can be
            # awaited there, so close the sockets directly.
            for conn in list(current.conns):
                conn.pgconn.finish()

    def release(self) -> None:
        """Close without awaiting (what the sync ``Store.close()`` can do)."""
        self._closed = True
        current, self._current = self._current, None
        if current is not None:
            self._release(current)

    async def _run(
        self,
        action: str,
        plan: Callable[[], plans.Plan[T]],
        *,
        write: bool = False,
        single: bool = False,
        again: Callable[[], plans.Plan[T]] | None = None,
        session_id: str | None = None,
    ) -> T:
        again = again or plan
        attempt = 0
        while True:
            pool = await self._pool()
            committing = False
            fired: list[bool] = []
            ident, aused = None, None
            try:
                wait_s = min(self.settings.pool_timeout, self.settings.op_timeout)
                async with pool.connection(timeout=wait_s) as conn:
                    ident, aused = _identity.get(conn), conn
                    timer = asyncio.get_running_loop().call_later(
                        self.settings.op_timeout, _cut_noting, conn, fired
                    )
                    try:
                        await self.orphans.aend(conn, self.url, self.settings.op_timeout)
                        if not write:
                            return await _adrive(conn, plan())
                        if single:  # one autocommit statement, as in the sync twin
                            return await _adrive(conn, plan() if attempt == 0 else again())
                        async with conn.transaction():
                            value = await _adrive(conn, plan())
                            committing = True  # an error from here on is the COMMIT's
                        return value
                    finally:
                        timer.cancel()
            except (psycopg.Error, UnicodeEncodeError) as exc:
                if write and (fired or (plans.connection_lost(exc) and _gone(aused))):
                    self.orphans.add(ident)  # its transaction may still be open on the server
                if fired:
                    unknown = write and (single or committing)
                    raise _timed_out(
                        self.url, action, self.settings.op_timeout, unknown=unknown
                    ) from exc
                error = plans.failure(
                    exc,
                    url=self.url,
                    action=action,
                    attempt=attempt,
                    committing=committing,
                    single=write and single,
                    session_id=session_id,
                )
                if error is not None:
                    raise error from exc
                if plans.connection_lost(exc):
                    _log.warning(
                        "toolledger: lost the connection to PostgreSQL while %s (%s); "
                        "retrying on a fresh one",
                        action,
                        str(exc).strip() or type(exc).__name__,
                    )
                    await pool.check()
            attempt += 1

    async def read_effects(
        self, session_id: str, tool_use_ids: Sequence[str] | None = None
    ) -> dict[str, EffectRecord]:
        plan = partial(plans.read_effects, session_id, tool_use_ids)
        return await self._run("reading the ledger", plan)

    async def apply(self, session_id: str, ops: Sequence[Op]) -> list[bool]:
        if not ops:
            return []
        plan = partial(plans.apply, session_id, ops)
        return await self._run(
            "writing the ledger",
            plan,
            write=True,
            single=plans.one_statement(ops),
            again=partial(plans.apply_again, session_id, ops),
            session_id=session_id,
        )

    async def read_session(self, session_id: str) -> SessionState | None:
        found = await self._run("reading a session", partial(plans.read_session, session_id))
        return found[0] if found else None

    async def read_messages(self, session_id: str, since: int = 0) -> list[StoredMessage]:
        plan = partial(plans.read_messages, session_id, since)
        return await self._run("reading a transcript", plan)

    async def read_approvals(self, session_id: str | None = None) -> list[ApprovalRecord]:
        return await self._run("reading approvals", partial(plans.read_approvals, session_id))

    async def read_lease(self, session_id: str) -> Lease | None:
        found = await self._run("reading a lease", partial(plans.read_lease, session_id))
        return found[0] if found else None

    async def close(self) -> None:
        """Close the pool, and the sync twin's (idempotent)."""
        self._closed = True
        current, self._current = self._current, None
        if current is not None:
            if current.loop is asyncio.get_running_loop():
                await current.pool.close()
                if current.guard is not None:
                    current.guard.cancel()
            else:
                self._release(current)
        twin, self._twin = self._twin, None
        if twin is not None:
            await asyncio.to_thread(twin.close)


async def _close_at_shutdown(pool: AsyncConnectionPool[AsyncConn]) -> None:
    """Wait for the end of the event loop, then close ``pool`` in it.

    ``asyncio.run`` ends by cancelling every task left. psycopg_pool's workers swallow a
    cancellation that lands while they run a job (to keep the pool consistent), and then wait
    for the next job for ever — so a loop that ends with the pool open can hang in its shutdown.
    Closing the pool sends each worker its stop message, which also ends the ones that
    swallowed the cancellation.
    """
    try:
        await asyncio.get_running_loop().create_future()  # never set: cancelled at shutdown
    finally:
        await pool.close()


# -- carrying plans out -------------------------------------------------------------------------


def _drive(conn: Conn, plan: plans.Plan[T]) -> T:
    try:
        step = next(plan)
        while True:
            with conn.cursor() as cur:
                if step.many:
                    cur.executemany(step.sql, step.params)
                    outcome = plans.Outcome(cur.rowcount, [])
                else:
                    cur.execute(step.sql, step.params)
                    fetched = cur.fetchall() if cur.description is not None else []
                    outcome = plans.Outcome(cur.rowcount, fetched)
            step = plan.send(outcome)
    except StopIteration as stop:
        value: T = stop.value
        return value


async def _adrive(conn: AsyncConn, plan: plans.Plan[T]) -> T:
    try:
        step = next(plan)
        while True:
            async with conn.cursor() as cur:
                if step.many:
                    await cur.executemany(step.sql, step.params)
                    outcome = plans.Outcome(cur.rowcount, [])
                else:
                    await cur.execute(step.sql, step.params)
                    fetched = await cur.fetchall() if cur.description is not None else []
                    outcome = plans.Outcome(cur.rowcount, fetched)
            step = plan.send(outcome)
    except StopIteration as stop:
        value: T = stop.value
        return value


def _configure(
    conn: Conn,
    *,
    schema: str | None,
    clock: ServerClock | None = None,
    idle_ms: str | None = None,
) -> None:
    """A new connection: its search path; for the pool's, its identity on the server, its idle
    transaction deadline (``_idle_ms``) and a reading of the server's clock."""
    _our_conns.add(conn)
    if schema is not None:
        conn.execute(plans.search_path(schema))
    if idle_ms is not None:
        row = conn.execute(IDENTIFY, (idle_ms,)).fetchone()
        if row is not None:
            _identity[conn] = (row[0], row[1])
    if clock is not None:
        clock.read(conn)


def migrate(settings: plans.Settings, *, create: bool = True) -> int:
    """Bring the schema up to date on a connection of its own, then wait out the writes that
    were in flight; return the schema version.

    Each migration commits in its own transaction together with its ``toolledger_schema`` row,
    under a transaction-level advisory lock, so workers starting together queue instead of
    racing, and a crash mid-way leaves a whole number of migrations. Raises
    ``SchemaVersionError`` when the schema is newer than this code.
    """
    url = settings.display
    try:
        conn = psycopg.connect(settings.conninfo, autocommit=True, **settings.connect_kwargs)
    except psycopg.Error as exc:
        raise plans.translate(exc, url=url, action="connecting") from exc
    try:
        with conn:
            _configure(conn, schema=settings.schema)
            version = _upgrade(conn, settings, create=create)
            _await_writes_in_flight(conn)
            return version
    except psycopg.Error as exc:
        raise plans.translate(exc, url=url, action="preparing the schema") from exc


def _await_writes_in_flight(conn: Conn) -> None:
    """Wait (briefly) until every transaction writing our tables when we opened has ended.

    A worker killed just after sending COMMIT is dead, yet its commit lands a moment later, when
    the server has flushed it. A worker restarted at once could read the state from before that
    commit and act on it: call a finished tool "in doubt", or lose a checkpoint race against a
    dead process. With SQLite a dead process writes nothing more; waiting here gives a freshly
    opened store the same footing. Our transactions are short (no tool runs inside one), so
    this returns at once unless a commit is in flight, and it gives up after
    ``IN_FLIGHT_WAIT_S``: what takes longer is not a commit on its way (a vanished client whose
    socket the server has not noticed yet, or someone else's long transaction).
    """
    found = conn.execute(plans.WRITERS_IN_FLIGHT, (list(plans.TABLES),)).fetchall()
    pending = [row[0] for row in found]
    deadline = time.monotonic() + IN_FLIGHT_WAIT_S
    while pending and time.monotonic() < deadline:
        time.sleep(0.002)
        pending = [row[0] for row in conn.execute(plans.STILL_RUNNING, (pending,)).fetchall()]


def _upgrade(conn: Conn, settings: plans.Settings, *, create: bool = True) -> int:
    target = len(plans.MIGRATIONS)
    try:
        # The common case takes no lock and needs no DDL rights: already up to date.
        version = _scalar(conn, plans.SELECT_VERSION)
    except psycopg.errors.UndefinedTable:
        version = 0
    if version == 0 and not create:
        raise StoreUnavailableError(
            f"no store at {settings.display}: "
            + (f"schema {settings.schema!r} holds" if settings.schema else "it holds")
            + " no toolledger tables. Check the URL (and ?schema=).",
            url=settings.display,
        )
    while True:
        error = plans.too_new(version, settings.display)
        if error is not None:
            raise error
        if version == target:
            return version
        with conn.transaction():
            conn.execute(plans.LOCK_MIGRATIONS, (settings.schema,))
            schema = settings.schema
            if schema is not None and not _scalar(
                conn, "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)
            ):
                conn.execute(plans.create_schema(schema))
            conn.execute(plans.VERSION_TABLE)
            # Re-read under the lock: another worker may have migrated meanwhile.
            version = _scalar(conn, plans.SELECT_VERSION)
            if version < target:
                conn.execute(plans.MIGRATIONS[version])
                conn.execute(plans.INSERT_VERSION, (version + 1,))
                version += 1


def _scalar(conn: Conn, query: str, params: Sequence[Any] = ()) -> int:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return int(row[0])
