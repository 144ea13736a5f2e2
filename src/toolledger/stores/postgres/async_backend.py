"""The native async PostgreSQL backend (``Store.async_backend``): the same plans and the same
``Call`` decisions as the sync backend, awaited, over a pool that lives in the running loop."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool

from ...errors import CorruptLedgerError, StoreError
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
    shared_clock = True  # one clock for every worker: the server's (Backend.shared_clock)

    def __init__(
        self, url: str, *, clock: ServerClock | None = None, orphans: Orphans | None = None
    ) -> None:
        self.settings = parse_url(url)
        self.url = self.settings.display
        self.server_clock = clock or ServerClock()
        self.orphans = orphans or Orphans()  # shared with the sync twin: one server
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
                    wait=True,
                    timeout=min(self.settings.pool_timeout, op_deadline(self.settings.op_timeout)),
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
            raise translate(exc, url=self.url, action="connecting") from exc
        return current.pool

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

    async def _run(self, call: Call[T]) -> T:
        op_timeout = op_deadline(self.settings.op_timeout)
        while True:
            pool = await self._pool()
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
                    await pool.putconn(conn)  # rolled back, or discarded, if it must be
            except (psycopg.Error, UnicodeEncodeError) as exc:
                call.cut = bool(fired)
                error = call.failed(exc)
                if error is not None:
                    raise error from exc
                if connection_lost(exc):
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
