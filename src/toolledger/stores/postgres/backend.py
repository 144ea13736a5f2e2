"""The sync PostgreSQL backend: a thin shell carrying the shared plans out over a thread-safe
connection pool (``Call`` decides everything about each operation's tries)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Protocol, TypeVar

import psycopg
from psycopg_pool import ConnectionPool

from ...errors import ClockMovedError, CorruptLedgerError
from ...ops import Op
from ...records import ApprovalRecord, EffectRecord, Lease, SessionState, StoredMessage
from .._sql import plans
from .._sql.plans import Plan
from ..contract import op_deadline
from .call import Call, asking, drive, reading, writing
from .connect import configure
from .errors import connection_lost, translate
from .guards import Conn, Orphans, ServerClock, idle_ms, watchdog
from .schema import integrity, migrate
from .settings import parse_url
from .wire import LedgerConnection

T = TypeVar("T")


class _Twin(Protocol):
    def release(self) -> None: ...


class PostgresBackend:
    """The sync backend. Opening it migrates the schema; its pool makes it safe to share
    between threads."""

    durable = True
    shared_clock = True  # one clock for every worker: the server's (Backend.shared_clock)
    checks_clock = True  # an intent's deadline is checked against it (UpdateEffect.at)

    def __init__(self, url: str, *, create: bool = True, read_only: bool = False) -> None:
        self.settings = parse_url(url)
        self.url = self.settings.display
        self._twin: _Twin | None = None
        self.server_clock = ServerClock()
        self.orphans = Orphans()
        self.schema_version, self.place = migrate(self.settings, create=create, read_only=read_only)
        s = self.settings
        self._pool: ConnectionPool[Conn] = ConnectionPool(
            s.conninfo,
            connection_class=LedgerConnection,
            kwargs={"autocommit": True, **s.connect_kwargs},
            min_size=s.pool_min,
            max_size=s.pool_max,
            timeout=s.pool_timeout,
            configure=partial(
                configure, schema=s.schema, clock=self.server_clock, idle_ms=idle_ms(s.op_timeout)
            ),
            name="toolledger",
            open=True,
        )

    def _run(self, call: Call[T]) -> T:
        op_timeout = op_deadline(self.settings.op_timeout)
        while True:
            try:
                # op_timeout bounds the wait for a connection too (a pool that cannot make one
                # would otherwise wait pool_timeout), and then the operation itself.
                conn = self._pool.getconn(timeout=self._wait_s)
                try:
                    call.started(conn)
                    token = watchdog.arm(conn, op_timeout)
                    try:
                        return conn.wait(call.carry(conn))
                    finally:
                        call.cut = watchdog.disarm(token)
                finally:
                    self._pool.putconn(conn)  # rolled back, or discarded, if it must be
            except (psycopg.Error, UnicodeEncodeError) as exc:
                error = call.failed(exc)
                if isinstance(error, ClockMovedError):
                    self.server_clock.forget()
                if error is not None:
                    raise error from exc
                if connection_lost(exc):
                    self._pool.check()  # a server restart killed its idle siblings too

    @property
    def _wait_s(self) -> float:
        return min(self.settings.pool_timeout, op_deadline(self.settings.op_timeout))

    def _read(self, action: str, plan: Callable[[], Plan[T]]) -> T:
        return self._run(reading(self, action, plan))

    def _ask(self, action: str, query: plans.Query[T]) -> T:
        try:
            return self._run(asking(self, action, query))
        except CorruptLedgerError as exc:  # a damaged value in a sound row: name the store
            exc.url = exc.url or self.url
            raise

    def read_effects(
        self, session_id: str, tool_use_ids: Sequence[str] | None = None
    ) -> dict[str, EffectRecord]:
        plan = plans.effects_query(session_id, tool_use_ids)
        return self._ask("reading the ledger", plan)

    def read_effect_ids(self, session_id: str) -> list[str]:
        return self._ask("reading the ledger", plans.effect_ids_query(session_id))

    def apply(self, session_id: str, ops: Sequence[Op]) -> list[bool]:
        return self._run(writing(self, session_id, ops)) if ops else []

    def read_session(self, session_id: str) -> SessionState | None:
        return self._ask("reading a session", plans.session_query(session_id))

    def read_messages(self, session_id: str, since: int = 0) -> list[StoredMessage]:
        plan = plans.messages_query(session_id, since)
        return self._ask("reading a transcript", plan)

    def read_abandoned(self, session_id: str) -> dict[int, list[StoredMessage]]:
        return self._ask("reading abandoned branches", plans.abandoned_query(session_id))

    def read_approvals(self, session_id: str | None = None) -> list[ApprovalRecord]:
        return self._ask("reading approvals", plans.approvals_query(session_id))

    def read_lease(self, session_id: str) -> Lease | None:
        return self._ask("reading a lease", plans.lease_query(session_id))

    def now(self) -> float:
        """The server's clock (``ServerClock``): no round trip unless the last reading is old."""
        return self._now(ServerClock.RESYNC_S)

    def fresh_now(self) -> float:
        """``now`` from a reading at most ``ServerClock.FRESH_S`` old (``Backend.fresh_now``):
        the server's clock may have stepped since an older one."""
        return self._now(ServerClock.FRESH_S)

    def _now(self, within: float) -> float:
        estimate = self.server_clock.estimate(within)
        if estimate is not None:
            return estimate
        try:
            with self._pool.connection(timeout=self._wait_s) as conn:
                return drive(conn, self.server_clock.reading())
        except psycopg.Error as exc:
            raise translate(exc, url=self.url, action="reading the server's clock") from exc

    def list_sessions(self) -> list[SessionState]:
        return self._ask("listing sessions", plans.sessions_query())

    def session_ids(self) -> list[str]:
        return self._ask("listing sessions", plans.session_ids_query())

    def in_doubt(self) -> list[EffectRecord]:
        return self._ask("listing in-doubt calls", plans.in_doubt_query())

    def integrity_check(self) -> list[str]:
        """Schema version, tables, the in-doubt index, ``synchronous_commit`` and gap-free
        transcripts: an empty list when all is sound."""
        return self._read("checking integrity", integrity)

    def close(self) -> None:
        """Close the pool (idempotent), and the async twin's."""
        self._pool.close()
        twin, self._twin = self._twin, None
        if twin is not None:
            twin.release()
