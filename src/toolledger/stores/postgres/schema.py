"""PostgreSQL's schema: migrating it (once, whoever starts first), waiting out the commits that
were in flight, and checking it. The migrations themselves are in ``_sql.schema``."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from ...errors import StoreUnavailableError
from .._sql.plans import Plan, Step
from .._sql.schema import POSTGRES_MIGRATIONS, TABLES, VERSION, too_new
from .connect import configure
from .errors import translate
from .guards import Conn
from .settings import Settings

IN_FLIGHT_WAIT_S = 2.0

VERSION_TABLE = (
    "CREATE TABLE IF NOT EXISTS toolledger_schema ("
    "version INTEGER NOT NULL PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
)
SELECT_VERSION = "SELECT coalesce(max(version), 0) FROM toolledger_schema"
INSERT_VERSION = "INSERT INTO toolledger_schema (version) VALUES (%s)"
# Advisory-lock key of a schema's migrations: ("tl", hash of the schema name). Workers starting
# together queue on it; other schemas migrate undisturbed (bar a rare hash collision).
# A migration's wait for a lock, for its transaction only (``_step``).
SET_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', %s, true)"
LOCK_MIGRATIONS = (
    "SELECT pg_advisory_xact_lock(29804, hashtext(coalesce(%s, current_schema(), '')))"
)


def create_schema(schema: str) -> sql.Composed:
    return sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema))


# Transactions (other than ours) holding a write lock on a toolledger table, and which of them
# are still running: every transaction holds the lock on its own virtual xid until it ends.
WRITERS_IN_FLIGHT = (
    "SELECT DISTINCT virtualtransaction FROM pg_locks "
    "WHERE locktype = 'relation' AND mode = 'RowExclusiveLock' AND pid <> pg_backend_pid() "
    "AND relation IN (SELECT to_regclass(t) FROM unnest(%s::text[]) AS t)"
)
STILL_RUNNING = (
    "SELECT virtualxid FROM pg_locks WHERE locktype = 'virtualxid' AND virtualxid = ANY(%s)"
)


def integrity() -> Plan[list[str]]:
    """What is wrong with the schema or the data; empty when sound."""
    problems: list[str] = []
    done = yield Step(
        "SELECT (SELECT coalesce(max(version), 0) FROM toolledger_schema), "
        "to_regclass('effects_in_doubt') IS NOT NULL, current_setting('synchronous_commit')"
    )
    version, index, sync_commit = done.rows[0]
    if version != VERSION:
        problems.append(f"schema version is {version}, this toolledger expects {VERSION}")
    for table in TABLES:
        done = yield Step("SELECT to_regclass(?) IS NOT NULL", (table,))
        if not done.rows[0][0]:
            problems.append(f"table {table} is missing")
    if not index:
        problems.append("index effects_in_doubt is missing: listing in-doubt calls scans")
    if sync_commit == "off":
        problems.append(
            "synchronous_commit is off: a server crash can lose committed records; turn it on"
        )
    if not problems:
        done = yield Step(
            "SELECT session_id, count(*), max(seq) FROM messages GROUP BY session_id "
            "HAVING max(seq) + 1 <> count(*) OR min(seq) <> 0 ORDER BY session_id LIMIT 20"
        )
        problems.extend(
            f"transcript of session {sid!r} has gaps: {n} messages, last seq {last}"
            for sid, n, last in done.rows
        )
    return problems


def migrate(settings: Settings, *, create: bool = True, read_only: bool = False) -> tuple[int, str]:
    """Bring the schema up to date on a connection of its own, then wait out the writes that
    were in flight; return the schema version, and the store's place (``place``).

    Each migration commits in its own transaction together with its ``toolledger_schema`` row,
    under a transaction-level advisory lock, so workers starting together queue instead of
    racing, and a crash mid-way leaves a whole number of migrations. Raises
    ``SchemaVersionError`` when the schema is newer than this code. ``read_only``: never
    migrate — an older schema raises ``StoreUnavailableError`` saying how to migrate it.
    """
    url = settings.display
    try:
        conn = psycopg.connect(settings.conninfo, autocommit=True, **settings.connect_kwargs)
    except psycopg.Error as exc:
        raise translate(exc, url=url, action="connecting") from exc
    try:
        with conn:
            configure(conn, schema=settings.schema)
            version = _upgrade(conn, settings, create=create, read_only=read_only)
            _await_writes_in_flight(conn)
            return version, place(conn, settings)
    except psycopg.Error as exc:
        raise translate(exc, url=url, action="preparing the schema") from exc


def place(conn: Conn, settings: Settings) -> str:
    """The store as ``StoreCore.place`` names it, whatever the spelling of its URL (a host's
    other name, a socket or TCP, another option): the server's cluster, the database and the
    schema in use. The cluster is its system identifier; where the server will not tell it
    (``pg_control_system`` not granted), the moment this store's schema was first made (its
    first migration), which a server's restart does not change either — the same however it
    is reached, in any time zone. Never fails the open: with neither, the URL's own server and
    database."""
    for query in _PLACES:
        try:
            with conn.transaction():
                row = conn.execute(query).fetchone()
        except psycopg.Error:
            continue
        if row is not None:
            return f"postgresql:{row[0]}:{row[1]}:{row[2]}"
    return f"postgresql:{settings.display}"


# The cluster, the database, the schema in use: by the cluster's identifier, else by the moment
# the store was made (``place``).
_PLACES = (
    "SELECT system_identifier::text, current_database(), current_schema() FROM pg_control_system()",
    "SELECT 'made ' || extract(epoch FROM min(applied_at))::text, current_database(), "
    "current_schema() FROM toolledger_schema",
)


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
    found = conn.execute(WRITERS_IN_FLIGHT, (list(TABLES),)).fetchall()
    pending = [row[0] for row in found]
    deadline = time.monotonic() + IN_FLIGHT_WAIT_S
    while pending and time.monotonic() < deadline:
        time.sleep(0.002)
        pending = [row[0] for row in conn.execute(STILL_RUNNING, (pending,)).fetchall()]


def _upgrade(
    conn: Conn, settings: Settings, *, create: bool = True, read_only: bool = False
) -> int:
    target = VERSION
    try:
        # The common case takes no lock and needs no DDL rights: already up to date.
        version = _scalar(conn, SELECT_VERSION)
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
        error = too_new(version, settings.display)
        if error is not None:
            raise error
        if version == target:
            return version
        if read_only:
            raise StoreUnavailableError(
                f"{settings.display} has schema version {version}, written by an earlier "
                f"toolledger; this release reads version {target}. A command that only looks "
                "does not migrate a store: start a worker of this release (opening the store "
                "with write access migrates it, in one transaction per step), then look again.",
                url=settings.display,
            )
        try:
            version = _step(conn, settings, target)
        except _Queued as exc:
            raise StoreUnavailableError(
                f"{settings.display}: migrating its schema from version {version} to {target} "
                f"waited {settings.op_timeout * QUEUED:g}s ({QUEUED} x op_timeout) for another "
                "process migrating it, which holds its migration lock (pg_stat_activity names "
                f"it: a process paused or stuck). The schema is whole at version {version}. "
                "Retry once that process has ended or gone on.",
                url=settings.display,
            ) from exc.__cause__
        except psycopg.errors.LockNotAvailable as exc:
            raise StoreUnavailableError(
                f"{settings.display}: migrating its schema from version {version} to {target} "
                f"waited {settings.op_timeout:g}s (op_timeout) for a lock on a toolledger table "
                "and gave up: a transaction holds it (a pg_dump, a report left open; "
                "pg_stat_activity names it). That step wrote nothing: the schema is whole at "
                f"version {version}, and nobody waits behind this process. Retry once that "
                "transaction has ended.",
                url=settings.display,
            ) from exc


QUEUED = 10
"""How many ``op_timeout``s an opener waits behind others migrating the schema."""


class _Queued(Exception):
    """The migration lock was not had within ``QUEUED`` x ``op_timeout``."""


def _ms(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def _step(conn: Conn, settings: Settings, target: int) -> int:
    """One migration, in its own transaction with its ``toolledger_schema`` row; the version
    the schema is at after it. A table's lock is waited for ``op_timeout`` at most: a migration
    queued behind a long transaction on a table queues every other statement on that table
    behind itself. The migration lock, ``QUEUED`` times that: a process paused while it holds
    it would keep every other opener waiting for ever."""
    with conn.transaction():
        # Openers starting together queue on the migration lock, each holding it for one step
        # at a time: a queue of them is no fault, so it is waited for longer than a table.
        conn.execute(SET_LOCK_TIMEOUT, (_ms(settings.op_timeout * QUEUED),))
        try:
            conn.execute(LOCK_MIGRATIONS, (settings.schema,))
        except psycopg.errors.LockNotAvailable as exc:
            raise _Queued from exc
        conn.execute(SET_LOCK_TIMEOUT, (_ms(settings.op_timeout),))
        schema = settings.schema
        if schema is not None and not _scalar(
            conn, "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)
        ):
            conn.execute(create_schema(schema))
        conn.execute(VERSION_TABLE)
        # Re-read under the lock: another worker may have migrated meanwhile.
        version = _scalar(conn, SELECT_VERSION)
        if version < target:
            conn.execute(POSTGRES_MIGRATIONS[version])
            conn.execute(INSERT_VERSION, (version + 1,))
            version += 1
    return version


def _scalar(conn: Conn, query: str, params: Sequence[Any] = ()) -> int:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return int(row[0])
