"""The native async PostgreSQL backend (``Store.async_backend``): the same plans and the same
``Call`` decisions as the sync backend, awaited, over a pool that lives in the running loop."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import psycopg
import psycopg_pool
from psycopg_pool import AsyncConnectionPool

from ...errors import ClockMovedError, CorruptLedgerError, StoreError, StoreUnavailableError
from ...ops import Op
from ...records import ApprovalRecord, EffectRecord, Lease, SessionState, StoredMessage
from .._sql import plans
from .._sql.plans import Plan
from ..contract import op_deadline
from .backend import PostgresBackend
from .call import Call, asking, reading, writing
from .connect import aconfigure
from .errors import connection_lost, translate
from .guards import AsyncConn, Orphans, ServerClock, cut_noting, idle_ms
from .settings import parse_url
from .wire import AsyncLedgerConnection

T = TypeVar("T")


@dataclass
class _LoopPool:
    """An async pool and the event loop it lives in (its tasks and locks belong to that loop),
    with every connection it made (``conns``)."""

    pool: AsyncConnectionPool[AsyncConn]
    loop: asyncio.AbstractEventLoop
    conns: weakref.WeakSet[AsyncConn] = field(default_factory=weakref.WeakSet)
    opening: asyncio.Task[None] | None = None
    guard: asyncio.Task[None] | None = None
    ended: bool = False  # closed as its loop ended: that loop gets no other
    released: bool = False  # let go by the store: a call holding a connection closes it


class AsyncPostgresBackend:
    """The native async backend. A pool needs a running event loop and belongs to it, so each
    loop that uses the store gets its own pool on first use: loops in several threads at once
    each keep theirs, and ``asyncio.run`` again opens a fresh one. A loop's pool is closed as the
    loop ends (``_close_at_shutdown``); when another loop makes its pool, the store lets go of
    the pools of loops not running (``_open_pool``, ``_release``: each is closed in its own loop
    if that loop runs again); every pool left is released when the store closes. It expects a
    migrated schema: ``open_store`` migrates."""

    durable = True
    shared_clock = True  # one clock for every worker: the server's (Backend.shared_clock)
    checks_clock = True  # an intent's deadline is checked against it (UpdateEffect.at)

    def __init__(
        self, url: str, *, clock: ServerClock | None = None, orphans: Orphans | None = None
    ) -> None:
        self.settings = parse_url(url)
        self.url = self.settings.display
        self.server_clock = clock or ServerClock()
        self.orphans = orphans or Orphans()  # shared with the sync twin: one server
        self._twin: PostgresBackend | None = None
        self._pools: dict[asyncio.AbstractEventLoop, _LoopPool] = {}
        self._pools_lock = threading.Lock()  # loops in other threads add and drop theirs
        self._closed = False
        self._closing: set[asyncio.Future[None]] = set()

    async def _pool(self, deadline: float) -> _LoopPool:
        """This loop's pool, open. ``deadline`` (on the loop's clock) bounds the goes round a
        call makes when the pool it waited for was let go (loops taking turns in steps shorter
        than a pool takes to open would otherwise hand the store back and forth for ever)."""
        loop = asyncio.get_running_loop()
        again = False
        while True:
            if again and loop.time() > deadline:
                raise self._no_pool()
            again = True
            if self._closed:
                raise StoreError(f"{self.url}: the store is closed; open it again", url=self.url)
            current = self._pools.get(loop)
            if current is None:
                current = self._open_pool(loop)
            elif current.ended:
                raise StoreError(
                    f"{self.url}: this event loop is ending, and the store's connections in it "
                    "are closed; nothing was sent. Use the store from a loop that is running.",
                    url=self.url,
                )
            opening = current.opening
            assert opening is not None
            try:
                await asyncio.shield(opening)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if current.released and opening.cancelled() and task and not task.cancelling():
                    continue  # its opening was given up as it was let go: a new one
                raise
            except psycopg.Error as exc:
                if current.released:
                    continue  # let go while it opened (another loop's first call): a new one
                # open(wait=True) closed the pool on failure: the next call starts a fresh one.
                self._forget(current)
                if current.guard is not None:
                    current.guard.cancel()
                raise translate(exc, url=self.url, action="connecting") from exc
            if not current.released:
                return current

    def _no_pool(self) -> StoreUnavailableError:
        return StoreUnavailableError(
            f"{self.url}: no PostgreSQL connection became free or could be opened in time: this "
            "loop's pool was let go again and again while it waited (other event loops using "
            "the store between its steps). Nothing was sent; retry.",
            url=self.url,
        )

    def _open_pool(self, loop: asyncio.AbstractEventLoop) -> _LoopPool:
        """This loop's pool, made and opening. On the way, the store lets go of the pools of
        loops that are not running (``_release``): one closed without its shutdown (so without
        ``_close_at_shutdown``), or run step by step (``run_until_complete``) and left — the
        store keeps no loop alive, and a loop that runs again closes its old pool itself and
        makes a new one."""
        with self._pools_lock:
            if self._closed:
                raise StoreError(f"{self.url}: the store is closed; open it again", url=self.url)
            idle = [p for p in self._pools.values() if p.loop is not loop and not _live(p.loop)]
            for each in idle:
                del self._pools[each.loop]
            current = self._pools.get(loop)
            if current is None:
                current = self._pools[loop] = self._new_pool(loop)
        for each in idle:
            self._release(each)
        if current.opening is None:  # made just now, in this loop's thread
            current.guard = loop.create_task(_close_at_shutdown(current))
            # Wait for the first connections before serving: a request that finds the pool
            # empty makes it grow, and a connection still being made when the loop ends is
            # only closed by the garbage collector. Racing first callers share this one wait.
            current.opening = loop.create_task(
                current.pool.open(
                    wait=True,
                    timeout=min(self.settings.pool_timeout, op_deadline(self.settings.op_timeout)),
                )
            )
        return current

    def _forget(self, current: _LoopPool) -> None:
        """``current`` failed to open: the next call of its loop makes a new pool."""
        with self._pools_lock:
            if self._pools.get(current.loop) is current:
                del self._pools[current.loop]

    def _new_pool(self, loop: asyncio.AbstractEventLoop) -> _LoopPool:
        s = self.settings
        conns: weakref.WeakSet[AsyncConn] = weakref.WeakSet()

        async def configure(conn: AsyncConn) -> None:
            conns.add(conn)
            await aconfigure(
                conn, schema=s.schema, clock=self.server_clock, idle_ms=idle_ms(s.op_timeout)
            )

        pool: AsyncConnectionPool[AsyncConn] = AsyncConnectionPool(
            s.conninfo,
            connection_class=AsyncLedgerConnection,
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
        """Close a pool without awaiting it, from whatever thread or loop we are in — in its
        own loop whenever that loop can still run, so no socket its loop may be watching is
        closed from another thread (its number could be reused under that loop's watch)."""
        current.released = True
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        try:
            if current.loop is running:
                self._close_in_loop(current)
            elif not current.loop.is_closed():
                # Running in another thread, it closes the pool at its next turn — a call
                # waiting for the pool to open goes on at once (``_close_in_loop``); stopped, it
                # does so first thing when it runs again. One never run again goes, with its
                # pool, when the program lets go of it.
                current.loop.call_soon_threadsafe(self._close_in_loop, current)
            else:
                _finish(current.conns)  # its loop is closed: nothing watches these sockets
        except RuntimeError:  # the loop closed meanwhile
            _finish(current.conns)

    def _close_in_loop(self, current: _LoopPool) -> None:
        """(In ``current``'s loop.) Close its pool there: the connections waiting in it at once
        — none is watched by the loop, and a task could be cancelled before it starts (a
        program that ends its loop cancels every task) — then the rest, in a task kept until it
        is done."""
        _finish(_queued(current.pool))
        if current.guard is not None:  # its work is done here; pending, it would be collected
            current.guard.cancel()
        if current.opening is not None and not current.opening.done():
            current.opening.cancel()  # a call waiting for it goes on with a new pool (``_pool``)
        task = current.loop.create_task(current.pool.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _take_all(self) -> list[_LoopPool]:
        """Mark the store closed and take every loop's pool out of it."""
        with self._pools_lock:
            self._closed = True
            pools = list(self._pools.values())
            self._pools.clear()
        return pools

    def release(self) -> None:
        """Close without awaiting (what the sync ``Store.close()`` can do)."""
        for current in self._take_all():
            self._release(current)

    async def _run(self, call: Call[T]) -> T:
        op_timeout = op_deadline(self.settings.op_timeout)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(self.settings.pool_timeout, op_timeout)
        while True:
            current = await self._pool(deadline)
            pool = current.pool
            fired: list[bool] = []
            try:
                wait_s = min(self.settings.pool_timeout, op_timeout)
                conn = await pool.getconn(timeout=wait_s)
                try:
                    call.started(conn)
                    timer = asyncio.get_running_loop().call_later(
                        op_timeout, cut_noting, conn, fired
                    )
                    try:
                        return await conn.wait(call.carry(conn))
                    finally:
                        timer.cancel()
                finally:
                    if current.released:  # the store let this pool go while the call ran
                        await conn.close()
                    else:
                        await pool.putconn(conn)  # rolled back, or discarded, if it must be
            except (psycopg.Error, UnicodeEncodeError) as exc:
                if current.released and isinstance(exc, psycopg_pool.PoolClosed):
                    if loop.time() > deadline:
                        raise self._no_pool() from exc
                    continue  # let go while this call waited for a connection: nothing was sent
                call.cut = bool(fired)
                error = call.failed(exc)
                if isinstance(error, ClockMovedError):
                    self.server_clock.forget()
                if error is not None:
                    raise error from exc
                if connection_lost(exc):
                    with contextlib.suppress(psycopg_pool.PoolClosed):  # (let go meanwhile)
                        await pool.check()

    async def _read(self, action: str, plan: Callable[[], Plan[T]]) -> T:
        return await self._run(reading(self, action, plan))

    async def _ask(self, action: str, query: plans.Query[T]) -> T:
        try:
            return await self._run(asking(self, action, query))
        except CorruptLedgerError as exc:  # a damaged value in a sound row: name the store
            exc.url = exc.url or self.url
            raise

    async def read_effects(
        self, session_id: str, tool_use_ids: Sequence[str] | None = None
    ) -> dict[str, EffectRecord]:
        plan = plans.effects_query(session_id, tool_use_ids)
        return await self._ask("reading the ledger", plan)

    async def read_effect_ids(self, session_id: str) -> list[str]:
        return await self._ask("reading the ledger", plans.effect_ids_query(session_id))

    async def apply(self, session_id: str, ops: Sequence[Op]) -> list[bool]:
        return await self._run(writing(self, session_id, ops)) if ops else []

    async def read_session(self, session_id: str) -> SessionState | None:
        return await self._ask("reading a session", plans.session_query(session_id))

    async def read_messages(self, session_id: str, since: int = 0) -> list[StoredMessage]:
        plan = plans.messages_query(session_id, since)
        return await self._ask("reading a transcript", plan)

    async def read_abandoned(self, session_id: str) -> dict[int, list[StoredMessage]]:
        return await self._ask("reading abandoned branches", plans.abandoned_query(session_id))

    async def read_approvals(self, session_id: str | None = None) -> list[ApprovalRecord]:
        return await self._ask("reading approvals", plans.approvals_query(session_id))

    async def read_lease(self, session_id: str) -> Lease | None:
        return await self._ask("reading a lease", plans.lease_query(session_id))

    async def close(self) -> None:
        """Close every loop's pool — this loop's awaited, the others' released — and the sync
        twin's (idempotent)."""
        running = asyncio.get_running_loop()
        for current in self._take_all():
            if current.loop is running:
                await current.pool.close()
                if current.guard is not None:
                    current.guard.cancel()
            else:
                self._release(current)
        twin, self._twin = self._twin, None
        if twin is not None:
            await asyncio.to_thread(twin.close)


def _live(loop: asyncio.AbstractEventLoop) -> bool:
    """``loop`` is running (in some thread) and may still use its pool."""
    return loop.is_running() and not loop.is_closed()


def _queued(pool: AsyncConnectionPool[AsyncConn]) -> list[AsyncConn]:
    """The connections waiting in ``pool`` for a call (none of them watched by its loop): read
    before ``close`` takes them out, should it stop before closing them (``_close_at_shutdown``).
    psycopg_pool keeps them in its ``_pool``; laid out otherwise, none are known."""
    return list(getattr(pool, "_pool", ()))


def _finish(conns: Iterable[AsyncConn]) -> None:
    """Close connections' sockets directly: their loop can run nothing for them any more."""
    for conn in list(conns):
        conn.pgconn.finish()


async def _close_at_shutdown(current: _LoopPool) -> None:
    """Wait for the end of the event loop, then close its pool in it.

    ``asyncio.run`` ends by cancelling every task left. psycopg_pool's workers swallow a
    cancellation that lands while they run a job (to keep the pool consistent), and then wait
    for the next job for ever — so a loop that ends with the pool open can hang in its shutdown.
    Closing the pool sends each worker its stop message, which also ends the ones that
    swallowed the cancellation. The close stops there when a worker it waits for was cancelled
    too, before it closes the idle connections it took out of the pool: those (read before it
    began, ``_queued``) are closed directly. One a call still holds is closed as the call gives
    it back to the closed pool. The pool stays the loop's, closed (``ended``): a call made in
    the rest of the shutdown is told so, and no new pool is made that nothing would close.
    """
    try:
        await asyncio.get_running_loop().create_future()  # never set: cancelled at shutdown
    finally:
        current.ended = True
        if not current.released:  # (let go by the store: its close is on its way)
            idle = _queued(current.pool)
            try:
                await current.pool.close()
            finally:
                _finish(idle)
