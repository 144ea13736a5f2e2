"""PostgreSQL without I/O: the URL's settings, the schema, every read and write as a *plan*, and
how driver errors map to ours.

A plan is a generator that yields the statements to run and receives each one's outcome; it
holds every decision (which statement, whether a guard failed, how rows become records). The
sync and async backends in ``postgres.py`` are thin shells that carry plans out, so the two
cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeAlias, TypeVar
from urllib.parse import unquote, urlsplit, urlunsplit

import psycopg
import psycopg_pool
from psycopg import errors as pg_errors
from psycopg import sql

from ..errors import (
    ConfigurationError,
    SchemaVersionError,
    SessionConflictError,
    StoreError,
    StoreUnavailableError,
)
from ..ops import (
    AppendMessages,
    HoldLease,
    InsertEffect,
    Op,
    PutApproval,
    PutSession,
    TakeLease,
    UpdateEffect,
    busy,
    conflict,
    lost,
    moved,
)
from ..records import ApprovalRecord, EffectRecord, Lease, SessionState, StoredMessage
from . import _sql

# -- the URL ------------------------------------------------------------------------------------

OWN_PARAMS = ("schema", "pool_min", "pool_max", "pool_timeout", "op_timeout")
DEFAULT_OP_TIMEOUT = 10.0
MAX_IDENTIFIER_BYTES = 63  # NAMEDATALEN - 1: PostgreSQL silently truncates longer names


@dataclass(frozen=True, slots=True)
class Settings:
    """What ``postgresql://…?schema=&pool_min=&pool_max=&pool_timeout=&op_timeout=`` asks for."""

    conninfo: str
    """The URL for libpq, without toolledger's own parameters."""
    display: str
    """The URL with any password masked: for messages and ``Store.url``."""
    schema: str | None
    pool_min: int
    pool_max: int
    pool_timeout: float
    op_timeout: float
    """How long one store operation may wait for the server before its connection is cut and
    discarded: a reply lost on the network never hangs a worker (DESIGN.md rule 16)."""
    connect_kwargs: dict[str, Any]
    """Connection defaults the URL did not set (``connect_timeout``, ``application_name``, TCP
    keepalives, ``tcp_user_timeout``)."""


def parse_url(url: str) -> Settings:
    """Split toolledger's parameters from libpq's. Raises ``ConfigurationError``.

    The other parameters are passed on byte for byte: libpq decodes ``%XX`` but not ``+``, so
    decoding and re-encoding them could change a password or an ``options`` value.
    """
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("postgresql", "postgres"):
        raise ConfigurationError(f"{url!r} is not a postgresql:// URL")
    own: dict[str, str] = {}
    kept: list[str] = []
    for piece in parts.query.split("&") if parts.query else []:
        key, _, value = piece.partition("=")
        if unquote(key) in OWN_PARAMS:
            own[unquote(key)] = unquote(value)
        else:
            kept.append(piece)
    conninfo = urlunsplit((parts.scheme, parts.netloc, parts.path, "&".join(kept), ""))
    defaults: dict[str, Any] = {}
    libpq_keys = {unquote(p.partition("=")[0]) for p in kept}
    if "connect_timeout" not in libpq_keys:
        defaults["connect_timeout"] = 10  # libpq waits for ever on a black-holed host
    if "application_name" not in libpq_keys:
        defaults["application_name"] = "toolledger"
    pool_min = _int_param(url, own, "pool_min", 1, low=0)
    pool_max = _int_param(url, own, "pool_max", max(10, pool_min), low=1)
    if pool_max < pool_min:
        raise ConfigurationError(f"{_mask(url)}: pool_max={pool_max} is below pool_min={pool_min}")
    pool_timeout = _seconds_param(url, own, "pool_timeout", 10.0)
    op_timeout = _seconds_param(url, own, "op_timeout", DEFAULT_OP_TIMEOUT)
    if op_timeout * 1000 >= 2**31:  # libpq's and the server's settings in ms are 32-bit
        raise ConfigurationError(f"{_mask(url)}: op_timeout must be under 24 days")
    # A peer that vanishes without a RST (a black hole, a half-open connection) is noticed by
    # the kernel: keepalive probes when idle, tcp_user_timeout when sent data goes unacknowledged.
    for option, setting in (
        ("keepalives", 1),
        ("keepalives_idle", 5),
        ("keepalives_interval", 2),
        ("keepalives_count", 3),
        ("tcp_user_timeout", int(op_timeout * 1000)),
    ):
        if option not in libpq_keys:
            defaults[option] = setting
    return Settings(
        conninfo=conninfo,
        display=_mask(url),
        schema=_schema_param(url, own.get("schema")),
        pool_min=pool_min,
        pool_max=pool_max,
        pool_timeout=pool_timeout,
        op_timeout=op_timeout,
        connect_kwargs=defaults,
    )


def _seconds_param(url: str, own: dict[str, str], key: str, default: float) -> float:
    try:
        value = float(own.get(key, default))
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise ConfigurationError(f"{_mask(url)}: {key} must be a positive number of seconds")
    return value


def _int_param(url: str, own: dict[str, str], key: str, default: int, *, low: int) -> int:
    raw = own.get(key)
    if raw is None:
        return default
    if not raw.isdigit() or int(raw) < low:
        raise ConfigurationError(f"{_mask(url)}: {key} must be an integer >= {low}, not {raw!r}")
    return int(raw)


def _schema_param(url: str, schema: str | None) -> str | None:
    if schema is None:
        return None
    size = len(schema.encode("utf-8", "surrogatepass"))
    if not schema or size > MAX_IDENTIFIER_BYTES or "\x00" in schema:
        raise ConfigurationError(
            f"{_mask(url)}: schema must be 1-{MAX_IDENTIFIER_BYTES} bytes without NUL "
            "(PostgreSQL would silently shorten a longer name)"
        )
    return schema


def _mask(url: str) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        userinfo, _, host = netloc.rpartition("@")
        netloc = f"{userinfo.partition(':')[0]}:***@{host}"
    query = "&".join(
        f"{p.partition('=')[0]}=***" if unquote(p.partition("=")[0]) == "password" else p
        for p in (parts.query.split("&") if parts.query else [])
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


# -- the schema -----------------------------------------------------------------------------------

# Append-only: MIGRATIONS[i] brings the schema from version i to i + 1, and the versions match
# the SQLite store's. Never edit a shipped entry; add a new one. Each runs in its own transaction
# together with its row in toolledger_schema.
#
# Ids are COLLATE "C": byte order never changes, whereas an index under a libc collation can be
# silently corrupted by an OS upgrade that changes the collation — and a corrupt primary key could
# let a second "insert-if-absent" through, which is a side effect run twice.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE effects (
        session_id  TEXT COLLATE "C" NOT NULL,
        tool_use_id TEXT COLLATE "C" NOT NULL,
        tool        TEXT             NOT NULL,
        input_hash  TEXT             NOT NULL,
        status      TEXT             NOT NULL,
        attempt     BIGINT           NOT NULL,
        result      TEXT,
        error       TEXT,
        created_at  DOUBLE PRECISION NOT NULL,
        updated_at  DOUBLE PRECISION NOT NULL,
        approved_by TEXT,
        worker      TEXT,
        PRIMARY KEY (session_id, tool_use_id)
    )
    """,
    """
    CREATE TABLE sessions (
        session_id    TEXT COLLATE "C" NOT NULL PRIMARY KEY,
        status        TEXT             NOT NULL,
        reason        TEXT,
        version       BIGINT           NOT NULL,
        turns         BIGINT           NOT NULL,
        input_tokens  BIGINT           NOT NULL,
        output_tokens BIGINT           NOT NULL,
        messages      BIGINT           NOT NULL,
        created_at    DOUBLE PRECISION NOT NULL,
        updated_at    DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE messages (
        session_id TEXT COLLATE "C" NOT NULL,
        seq        BIGINT           NOT NULL,
        role       TEXT             NOT NULL,
        content    TEXT             NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (session_id, seq)
    );
    CREATE TABLE approvals (
        session_id   TEXT COLLATE "C" NOT NULL,
        tool_use_id  TEXT COLLATE "C" NOT NULL,
        tool         TEXT             NOT NULL,
        input_hash   TEXT             NOT NULL,
        input        TEXT             NOT NULL,
        in_doubt     INTEGER          NOT NULL,
        reason       TEXT             NOT NULL,
        status       TEXT             NOT NULL,
        requested_at DOUBLE PRECISION NOT NULL,
        decided_at   DOUBLE PRECISION,
        decided_by   TEXT,
        used_at      DOUBLE PRECISION,
        PRIMARY KEY (session_id, tool_use_id)
    );
    -- Only in-doubt records are indexed: the CLI lists them across every session.
    CREATE INDEX effects_in_doubt ON effects (session_id) WHERE status = 'started';
    """,
    """
    CREATE TABLE leases (
        session_id TEXT COLLATE "C" NOT NULL PRIMARY KEY,
        owner      TEXT             NOT NULL,
        token      BIGINT           NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL
    )
    """,
    # 4: an attempt's owner and end (DESIGN.md rule 12) and the attempts it replaced; the
    # lease holder's process. Rows written before have NULLs: see EffectRecord and Lease.
    """
    ALTER TABLE effects ADD COLUMN holder TEXT;
    ALTER TABLE effects ADD COLUMN lease_token BIGINT;
    ALTER TABLE effects ADD COLUMN deadline DOUBLE PRECISION;
    ALTER TABLE effects ADD COLUMN history TEXT;
    ALTER TABLE leases ADD COLUMN holder TEXT;
    ALTER TABLE approvals ADD COLUMN attempt BIGINT NOT NULL DEFAULT 0
    """,
]

TABLES = ("effects", "sessions", "messages", "approvals", "leases")
VERSION_TABLE = (
    "CREATE TABLE IF NOT EXISTS toolledger_schema ("
    "version INTEGER NOT NULL PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
)
SELECT_VERSION = "SELECT coalesce(max(version), 0) FROM toolledger_schema"
INSERT_VERSION = "INSERT INTO toolledger_schema (version) VALUES (%s)"
# Advisory-lock key of a schema's migrations: ("tl", hash of the schema name). Workers starting
# together queue on it; other schemas migrate undisturbed (bar a rare hash collision).
LOCK_MIGRATIONS = (
    "SELECT pg_advisory_xact_lock(29804, hashtext(coalesce(%s, current_schema(), '')))"
)


def search_path(schema: str) -> sql.Composed:
    """Unqualified names in the shared statements then resolve in ``schema`` (the name is quoted
    by psycopg, never pasted)."""
    return sql.SQL("SET search_path TO {}").format(sql.Identifier(schema))


def create_schema(schema: str) -> sql.Composed:
    return sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema))


def too_new(version: int, url: str) -> SchemaVersionError | None:
    if version <= len(MIGRATIONS):
        return None
    return SchemaVersionError(
        f"{url} has schema version {version}; this toolledger knows up to {len(MIGRATIONS)}. "
        "Upgrade toolledger to use this store.",
        url=url,
    )


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


# -- plans ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Step:
    """Run ``sql`` (``%s`` style) once, or once per parameter tuple when ``many``."""

    sql: str
    params: Sequence[Any] = ()
    many: bool = False


@dataclass(frozen=True, slots=True)
class Outcome:
    rowcount: int
    rows: list[tuple[Any, ...]]


T = TypeVar("T")
Plan: TypeAlias = Generator[Step, Outcome, T]


@cache
def pg(statement: str) -> str:
    return _sql.format_style(statement)


SELECT_SOME_EFFECTS = _sql.SELECT_EFFECTS + " AND tool_use_id = ANY(?)"


def read_effects(
    session_id: str, tool_use_ids: Sequence[str] | None
) -> Plan[dict[str, EffectRecord]]:
    if tool_use_ids is None:
        done = yield Step(pg(_sql.SELECT_EFFECTS), (session_id,))
    else:
        done = yield Step(pg(SELECT_SOME_EFFECTS), (session_id, list(tool_use_ids)))
    return {row[1]: _sql.row_to_record(row) for row in done.rows}


def one_statement(ops: Sequence[Op]) -> bool:
    """A batch whose plan writes with one statement, so autocommit makes it atomic on its own.
    (A guard that fails in it has written nothing: its single UPDATE or INSERT matched no row.)
    Appending messages reads the last seq first: that takes a transaction."""
    return len(ops) == 1 and not isinstance(ops[0], AppendMessages)


def apply_again(session_id: str, ops: Sequence[Op]) -> Plan[list[bool]]:
    """A one-statement batch sent again after its connection was lost with the outcome unknown.

    Every statement is conditional, so sending it twice cannot do it twice. But if the first
    send landed, this one finds its condition gone ("not applied", or a guard's conflict): then
    the row is read back, and if it holds exactly what this batch wrote — worker id, timestamps
    and all — the first send landed, and the batch is reported applied.
    """
    (op,) = ops
    try:
        done: list[bool] | None = yield from apply(session_id, ops)
    except SessionConflictError as exc:
        refused: SessionConflictError | None = exc
        done = None
    else:
        refused = None
    if done == [True]:
        return done
    if (yield from _holds(session_id, op)):
        return [True]
    if refused is not None:
        raise refused
    assert done is not None
    return done


def _holds(session_id: str, op: Op) -> Plan[bool]:
    """Whether the store holds exactly what ``op`` writes."""
    if isinstance(op, (InsertEffect, UpdateEffect)):
        found = yield from rows(
            _sql.SELECT_EFFECT, (session_id, op.record.tool_use_id), _sql.row_to_record
        )
        return found == [op.record]
    if isinstance(op, PutApproval):
        approvals = yield from read_approvals(session_id)
        return op.record in approvals
    if isinstance(op, PutSession):
        return (yield from read_session(session_id)) == [op.state]
    if isinstance(op, TakeLease):
        return (yield from read_lease(session_id)) == [op.lease]
    leases = yield from read_lease(session_id)
    if isinstance(op, HoldLease):
        return [(x.token, x.expires_at) for x in leases] == [(op.token, op.expires_at)]
    return False  # DropLease reports its own outcome again: it is idempotent


def apply(session_id: str, ops: Sequence[Op]) -> Plan[list[bool]]:
    """Every op is one conditional statement; a failed guard raises and so rolls back the
    transaction the shell opened around the plan."""
    out: list[bool] = []
    for op in ops:
        if isinstance(op, InsertEffect):
            done = yield Step(pg(_sql.INSERT_EFFECT), _sql.insert_params(op))
        elif isinstance(op, UpdateEffect):
            done = yield Step(pg(_sql.update_statement(op)), _sql.update_params(op))
            if op.guard and done.rowcount != 1:
                raise moved(session_id, op.record.tool_use_id)
        elif isinstance(op, PutSession):
            if op.expect_version is None:
                done = yield Step(pg(_sql.INSERT_SESSION), _sql.session_params(op.state))
                if done.rowcount != 1:
                    raise conflict(session_id, "it already exists")
            else:
                done = yield Step(pg(_sql.UPDATE_SESSION), _sql.update_session_params(op))
                if done.rowcount != 1:
                    raise conflict(session_id, f"it is not at version {op.expect_version}")
        elif isinstance(op, AppendMessages):
            done = yield Step(pg(_sql.SELECT_LAST_SEQ), (session_id,))
            last = done.rows[0][0]
            expected = 0 if last is None else int(last) + 1
            if any(m.seq != expected + i for i, m in enumerate(op.messages)):
                raise conflict(session_id, f"the next message is {expected}")
            # A racing writer that read the same last seq meets the primary key: the shell turns
            # that UniqueViolation into the same conflict.
            values = [_sql.message_params(session_id, m) for m in op.messages]
            if values:
                yield Step(pg(_sql.INSERT_MESSAGE), values, many=True)
            done = Outcome(rowcount=1, rows=[])
        elif isinstance(op, PutApproval):
            if op.expect_status is None:
                done = yield Step(pg(_sql.INSERT_APPROVAL), _sql.approval_params(op.record))
            else:
                done = yield Step(pg(_sql.UPDATE_APPROVAL), _sql.update_approval_params(op))
        elif isinstance(op, TakeLease):
            statement = _sql.take_lease_statement(op)
            done = yield Step(pg(statement), _sql.take_lease_params(op))
            if done.rowcount != 1:
                found = yield Step(pg(_sql.SELECT_LEASE), (session_id,))
                raise busy(session_id, _sql.row_to_lease(found.rows[0]) if found.rows else None)
        elif isinstance(op, HoldLease):
            # An UPDATE, so the lease row stays locked until this transaction ends: a take-over
            # waits for our commit and then finds the token it expected — our writes land
            # before the new holder reads anything.
            done = yield Step(pg(_sql.HOLD_LEASE), (op.expires_at, session_id, op.token))
            if done.rowcount != 1:
                raise lost(session_id, op.token)
        else:
            done = yield Step(pg(_sql.DROP_LEASE), (session_id, op.token))
        out.append(done.rowcount == 1)
    return out


def rows(statement: str, params: Sequence[Any], convert: Callable[[Any], T]) -> Plan[list[T]]:
    """One query (a ``?``-style statement), each row converted."""
    done = yield Step(pg(statement), params)
    return [convert(row) for row in done.rows]


def read_session(session_id: str) -> Plan[list[SessionState]]:
    return rows(_sql.SELECT_SESSION, (session_id,), _sql.row_to_session)


def read_messages(session_id: str, since: int) -> Plan[list[StoredMessage]]:
    return rows(_sql.SELECT_MESSAGES, (session_id, since), _sql.row_to_message)


def read_approvals(session_id: str | None) -> Plan[list[ApprovalRecord]]:
    if session_id is None:
        return rows(_sql.SELECT_APPROVALS, (), _sql.row_to_approval)
    return rows(_sql.SELECT_SESSION_APPROVALS, (session_id,), _sql.row_to_approval)


def read_lease(session_id: str) -> Plan[list[Lease]]:
    return rows(_sql.SELECT_LEASE, (session_id,), _sql.row_to_lease)


def list_sessions() -> Plan[list[SessionState]]:
    return rows(_sql.SELECT_SESSIONS, (), _sql.row_to_session)


def session_ids() -> Plan[list[str]]:
    return rows(_sql.SELECT_ALL_SESSION_IDS, (), lambda row: str(row[0]))


def in_doubt() -> Plan[list[EffectRecord]]:
    return rows(_sql.SELECT_IN_DOUBT, (), _sql.row_to_record)


def integrity() -> Plan[list[str]]:
    """What is wrong with the schema or the data; empty when sound."""
    problems: list[str] = []
    done = yield Step(
        "SELECT (SELECT coalesce(max(version), 0) FROM toolledger_schema), "
        "to_regclass('effects_in_doubt') IS NOT NULL, current_setting('synchronous_commit')"
    )
    version, index, sync_commit = done.rows[0]
    if version != len(MIGRATIONS):
        problems.append(f"schema version is {version}, this toolledger expects {len(MIGRATIONS)}")
    for table in TABLES:
        done = yield Step("SELECT to_regclass(%s) IS NOT NULL", (table,))
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


# -- errors ---------------------------------------------------------------------------------------

# 57P01 admin_shutdown (pg_terminate_backend too), 57P02 crash_shutdown, 57P03
# cannot_connect_now, 57P05 idle_session_timeout, 25P03 idle_in_transaction_session_timeout
# (the server ended a transaction whose client had gone quiet: a paused worker's); class 08.
_LOST_STATES = ("57P01", "57P02", "57P03", "57P05", "25P03")
# The server rolled the transaction back to break a tie; running it again is the remedy.
_RETRY_STATES = ("40001", "40P01")
RETRIES = 2


def connection_lost(exc: BaseException) -> bool:
    if isinstance(exc, psycopg_pool.PoolTimeout | psycopg_pool.PoolClosed):
        return False
    state = getattr(exc, "sqlstate", None)
    if state in _LOST_STATES:
        return True
    if not isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return False
    return state is None or state.startswith("08")


def failure(
    exc: psycopg.Error | UnicodeEncodeError,
    *,
    url: str,
    action: str,
    attempt: int,
    committing: bool = False,
    single: bool = False,
    session_id: str | None = None,
) -> StoreError | SessionConflictError | None:
    """What a driver error means for a plan: ``None`` to run it again, else the error to raise.

    Running again is safe only when nothing can have been committed: the error came before the
    COMMIT was sent (and every statement is conditional anyway). A connection lost *during* the
    COMMIT leaves the outcome unknown, so that is never retried blindly. ``single``: a write of
    one autocommit statement, whose sending is its commit — it is sent again (the resend checks
    whether the first landed), but a loss that ends the retries leaves its outcome unknown.
    """
    if isinstance(exc, UnicodeEncodeError):
        return StoreError(
            f"{url}: {action} failed: a text value holds a lone surrogate, which PostgreSQL "
            f"cannot store ({exc}); nothing was written",
            url=url,
        )
    if (
        attempt < RETRIES
        and not committing
        and (connection_lost(exc) or exc.sqlstate in _RETRY_STATES)
    ):
        return None
    if isinstance(exc, pg_errors.UniqueViolation) and session_id is not None:
        # Only the transcript's primary key can be violated: the other inserts are ON CONFLICT
        # DO NOTHING. A racing writer appended the same seq first.
        return conflict(session_id, "a message with that seq exists")
    return translate(exc, url=url, action=action, committing=committing or single)


def translate(exc: psycopg.Error, *, url: str, action: str, committing: bool = False) -> StoreError:
    """A driver error in our tree, saying what happened and what to do."""
    lost = connection_lost(exc)
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return StoreUnavailableError(
            f"{url}: no PostgreSQL connection became free or could be opened while {action} "
            f"({exc}). Check that the server is up and reachable; if it is merely busy, raise "
            "?pool_max= or ?pool_timeout= in the store URL.",
            url=url,
        )
    if isinstance(exc, psycopg_pool.PoolClosed):
        return StoreError(f"{url}: the store is closed ({action}); open it again", url=url)
    if lost and committing:
        return StoreUnavailableError(
            f"{url}: the connection to PostgreSQL was lost during COMMIT while {action} ({exc}). "
            "The write may or may not have been committed: read the ledger before going on.",
            url=url,
            outcome_unknown=True,
        )
    if lost:
        return StoreUnavailableError(
            f"{url}: cannot reach PostgreSQL while {action}: {str(exc).strip()}. Nothing was "
            "written. Check that the server is up and the URL (host, port, user, password, "
            "database) is right, then retry.",
            url=url,
        )
    if isinstance(exc, pg_errors.UndefinedTable):
        return StoreError(
            f"{url}: the toolledger tables are missing while {action} ({exc}). Was the schema "
            "dropped? open_store() creates them.",
            url=url,
        )
    if isinstance(exc, pg_errors.InsufficientPrivilege):
        return StoreError(
            f"{url}: permission denied while {action} ({exc}). Grant this user SELECT, INSERT "
            "and UPDATE on the toolledger tables (and CREATE on the schema to migrate it).",
            url=url,
        )
    return StoreError(f"{url}: {action} failed: {exc}", url=url)
