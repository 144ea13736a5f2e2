"""What one store operation sends to PostgreSQL, and what comes back: one round trip.

Each statement is prepared once per connection (per set of parameter types psycopg's dumpers
give it), so the server parses and plans it once — all but one with an array parameter
(``worth_preparing``); rows are decoded by psycopg's loaders. A prepared statement's execution
is sent, and its result read, as they are. When more goes out at once — a statement's first
use here (its ``Parse`` rides with its execution), several executions, a transaction — it goes
through libpq's pipeline mode: one write, and the answers in one read.

Two shapes of request:

* ``one``: one statement (once per parameter tuple when ``many``): a read, a one-statement
  write in autocommit (its execution is its commit), or one statement of a transaction carried
  out statement by statement;
* ``ahead``: a whole transaction sent ahead of its answers — ``BEGIN`` and the statements, a
  ``Sync``, then ``COMMIT`` and a ``Sync``. A guard cannot wait for its row count here, so it is
  sent as a statement the server refuses (``refusing``) unless it changed exactly one row; the
  server then skips the rest, and the ``COMMIT`` of the failed transaction rolls it back. The
  ``COMMIT`` is a request of its own on the wire (after its ``Sync``), as when it is sent alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from itertools import count
from typing import Any

import psycopg
from psycopg import pq
from psycopg.abc import Buffer, PQGen
from psycopg.adapt import PyFormat, Transformer
from psycopg.errors import error_from_result
from psycopg.generators import execute, fetch_many, send

from .._sql.plans import Outcome, Step

COMMAND_OK = pq.ExecStatus.COMMAND_OK
TUPLES_OK = pq.ExecStatus.TUPLES_OK
FATAL_ERROR = pq.ExecStatus.FATAL_ERROR
PIPELINE_SYNC = pq.ExecStatus.PIPELINE_SYNC
PIPELINE_ABORTED = pq.ExecStatus.PIPELINE_ABORTED
PIPELINE_OFF = pq.PipelineStatus.OFF
BAD = pq.ConnStatus.BAD
SQLSTATE = pq.DiagnosticField.SQLSTATE
REFUSED = "22012"  # division_by_zero: what a refusing guard raises (nothing else of ours divides)

# What a request waits for, in order: tuples whose first item is one of these.
_BEGIN = 0  # (_BEGIN,)
_PREPARED = 1  # (_PREPARED, statement index, key, name)
_ROWS = 2  # (_ROWS, statement index)
_SYNC = 3  # (_SYNC,)
_COMMIT = 4  # (_COMMIT,)
_SYNCED = (_SYNC,)


@cache
def numbered(statement: str) -> bytes:
    """A statement written with ``?`` placeholders (our own constants: their literals hold
    none) with ``$1``, ``$2`` … instead."""
    pieces = statement.split("?")
    return "".join([pieces[0], *(f"${i}{p}" for i, p in enumerate(pieces[1:], 1))]).encode()


@cache
def refusing(statement: str) -> bytes:
    """A guard (an INSERT or UPDATE that must change exactly one row) as a statement the server
    refuses otherwise, with ``division by zero``: sent ahead of its answer, a failed guard stops
    the transaction on the server itself."""
    return (
        b"WITH changed AS (" + numbered(statement) + b" RETURNING 1) "
        b"SELECT 1 / (count(*) = 1)::int FROM changed"
    )


@cache
def _auto(n: int) -> list[PyFormat]:
    return [PyFormat.AUTO] * n


class Link:
    """What a connection keeps between operations: its statements prepared on the server, and
    psycopg's adapters (dumpers and loaders are looked up once per type, not per value)."""

    __slots__ = ("encoding", "names", "pgconn", "prepared", "tx")

    def __init__(self, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
        self.pgconn = conn.pgconn
        self.tx = Transformer(conn)
        self.encoding = conn.info.encoding
        self.prepared: dict[tuple[bytes, tuple[int, ...] | None], bytes] = {}
        self.names = count()


class LedgerConnection(psycopg.Connection[tuple[Any, ...]]):
    """A connection of our pools: it keeps its ``Link``."""

    link: Link | None = None


class AsyncLedgerConnection(psycopg.AsyncConnection[tuple[Any, ...]]):
    """``LedgerConnection`` for the async pool."""

    link: Link | None = None


def link(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> Link:
    """The connection's ``Link`` (a connection made elsewhere gets one for this use only)."""
    if isinstance(conn, LedgerConnection | AsyncLedgerConnection):
        if conn.link is None:
            conn.link = Link(conn)
        return conn.link
    return Link(conn)


# One execution, its parameters dumped: (statement, values, types, formats, parameters). Every
# value is dumped before anything is sent: one that cannot be fails the operation with nothing
# on the wire.
_Bound = tuple[
    bytes,
    Sequence[Buffer | None] | None,
    tuple[int, ...] | None,
    Sequence[pq.Format] | None,
    Sequence[Any],
]
EACH_TIME = b""
"""In ``Link.prepared``: a statement planned afresh at each execution (``worth_preparing``)."""


def worth_preparing(params: Sequence[Any]) -> bool:
    """Whether a statement is prepared (planned once, the plan kept): not one with an array
    parameter. A plan kept cannot know how many items an array holds, and one made while the
    table was small filters the rows of a session instead of looking each id up — a read that
    then grows with the session."""
    return not any(isinstance(p, list) for p in params)


def _bind(link: Link, sql: bytes, params: Sequence[Any]) -> _Bound:
    if not params:
        return (sql, None, None, None, params)
    tx = link.tx
    values = tx.dump_sequence(params, _auto(len(params)))
    return (sql, values, tx.types, tx.formats, params)


def _bound(link: Link, sql: bytes, params: Sequence[Any], many: bool) -> list[_Bound]:
    return [_bind(link, sql, p) for p in params] if many else [_bind(link, sql, params)]


def _queue(link: Link, bound: _Bound, pending: dict[Any, bytes]) -> tuple[Any, bytes] | None:
    """Queue one execution, preparing its statement first if this connection has not (then
    return what the prepare's answer confirms)."""
    pgconn = link.pgconn
    sql, values, types, formats, params = bound
    key = (sql, types)
    name = link.prepared.get(key)
    if name is None:
        name = pending.get(key)
    prepared = None
    if name is None and not worth_preparing(params):
        name = link.prepared[key] = EACH_TIME
    if name is None:
        name = pending[key] = b"_tl_%d" % next(link.names)
        pgconn.send_prepare(name, sql, types)
        prepared = (key, name)
    if name is EACH_TIME:
        pgconn.send_query_params(sql, values, types, formats)
    else:
        pgconn.send_query_prepared(name, values, formats)
    return prepared


def _failed(res: pq.abc.PGresult | None, encoding: str) -> psycopg.Error:
    """The error a failed result stands for: the server's own (it has a SQLSTATE), or the
    connection lost (libpq's, without one)."""
    if res is None or res.error_field(SQLSTATE) is None:
        message = res.get_error_message(encoding).strip() if res is not None else ""
        return psycopg.OperationalError(message or "the connection to the server was lost")
    return error_from_result(res, encoding=encoding)


def _outcome(link: Link, res: pq.abc.PGresult) -> Outcome:
    if res.status == TUPLES_OK:
        link.tx.set_pgresult(res)
        return Outcome(res.ntuples, link.tx.load_rows(0, res.ntuples, tuple))
    found = res.command_tuples
    return Outcome(-1 if found is None else found, [])


def _leave(pgconn: pq.abc.PGconn) -> None:
    """Out of pipeline mode; a connection that cannot leave it (answers left unread: the
    request was abandoned half-way) is closed, so its pool discards it."""
    if pgconn.status == BAD or pgconn.pipeline_status == PIPELINE_OFF:
        return
    try:
        pgconn.exit_pipeline_mode()
    except psycopg.OperationalError:
        pgconn.finish()


def one(link: Link, sql: str, params: Sequence[Any], many: bool = False) -> PQGen[Outcome]:
    """Run ``sql`` (once per parameter tuple when ``many``: the row counts are added up) in one
    round trip. A failure raises the server's error, or else the connection's."""
    text = numbered(sql)
    if many:
        return (yield from _pipelined(link, [_bind(link, text, p) for p in params], many))
    bound = _bind(link, text, params)
    name = link.prepared.get((text, bound[2]))
    if name is None:  # its first use here: prepared in the same round trip
        return (yield from _pipelined(link, [bound], many))
    pgconn = link.pgconn
    if name is EACH_TIME:
        pgconn.send_query_params(text, bound[1], bound[2], bound[3])
    else:
        pgconn.send_query_prepared(name, bound[1], bound[3])
    res = _first((yield from execute(pgconn)))
    if res is None or res.status == FATAL_ERROR:
        raise _failed(res, link.encoding)
    if res.status == TUPLES_OK:
        link.tx.set_pgresult(res)
        return Outcome(res.ntuples, link.tx.load_rows(0, res.ntuples, tuple))
    return Outcome(res.command_tuples or 0, [])


def _pipelined(link: Link, bound: list[_Bound], many: bool) -> PQGen[Outcome]:
    """Executions (and the prepares they need) in one pipeline, then its Sync."""
    pgconn = link.pgconn
    pending: dict[Any, bytes] = {}
    pgconn.enter_pipeline_mode()
    try:
        prepares = [_queue(link, b, pending) for b in bound]
        pgconn.pipeline_sync()
        yield from send(pgconn)
        failed: psycopg.Error | None = None
        rowcount = 0
        rows: list[Any] = []
        try:
            for prepared in prepares:
                if prepared is not None:
                    res = _first((yield from fetch_many(pgconn)))
                    if res is not None and res.status == COMMAND_OK:
                        link.prepared[prepared[0]] = prepared[1]
                    elif res is None or res.status == FATAL_ERROR:
                        failed = failed or _failed(res, link.encoding)
                res = _first((yield from fetch_many(pgconn)))
                if res is None or res.status == FATAL_ERROR:
                    failed = failed or _failed(res, link.encoding)
                elif res.status == TUPLES_OK:
                    link.tx.set_pgresult(res)
                    rowcount += res.ntuples
                    rows = link.tx.load_rows(0, res.ntuples, tuple)
                elif res.status == COMMAND_OK:
                    rowcount += res.command_tuples or 0
                if failed is not None and failed.sqlstate is None:
                    raise failed
            yield from fetch_many(pgconn)  # the Sync
        except psycopg.Error:
            if failed is None:
                raise
        if failed is not None:
            raise failed  # the server's: what it said before it went, if it went
        return Outcome(rowcount, [] if many else rows)
    finally:
        _leave(pgconn)


def _first(results: list[pq.abc.PGresult]) -> pq.abc.PGresult | None:
    return results[0] if results else None


def command(link: Link, sql: bytes) -> PQGen[None]:
    """``BEGIN``, ``COMMIT`` or ``ROLLBACK`` on its own (never prepared)."""
    pgconn = link.pgconn
    pgconn.enter_pipeline_mode()
    try:
        pgconn.send_query_params(sql, None)
        pgconn.pipeline_sync()
        yield from send(pgconn)
        results = yield from fetch_many(pgconn)
        res = results[0] if results else None
        if res is None or res.status == FATAL_ERROR:
            failed = _failed(res, link.encoding)
            if failed.sqlstate is not None and pgconn.status != BAD:
                yield from fetch_many(pgconn)  # the Sync
            raise failed
        yield from fetch_many(pgconn)  # the Sync
    finally:
        _leave(pgconn)


@dataclass(frozen=True, slots=True)
class Ahead:
    """The answers to a transaction sent ahead: one per statement (``None``: not run), whether
    it committed, and — when it did not — the first statement the server refused (its index
    and the server's error). ``committed`` is false only when the server said so."""

    outcomes: list[Outcome | None]
    committed: bool
    failure: tuple[int, psycopg.Error] | None = None


def ahead(link: Link, steps: Sequence[Step], committing: Callable[[], None]) -> PQGen[Ahead]:
    """``BEGIN``, ``steps``, ``COMMIT`` in one round trip, each guard (``Step.guard``) refused
    by the server when it fails. ``committing`` is called once the ``COMMIT`` is queued: a
    connection lost from then on leaves the outcome unknown (it raises) — unless the server had
    refused one of the statements before it went (it answers in order: that answer came
    before any of the COMMIT): then nothing was committed."""
    bound = [
        _bound(link, refusing(s.sql) if s.guard else numbered(s.sql), s.params, s.many)
        for s in steps
    ]
    pgconn = link.pgconn
    waits: list[tuple[Any, ...]] = [(_BEGIN,)]
    pending: dict[Any, bytes] = {}
    pgconn.enter_pipeline_mode()
    try:
        pgconn.send_query_params(b"BEGIN", None)
        for i, executions in enumerate(bound):
            for b in executions:
                prepared = _queue(link, b, pending)
                if prepared is not None:
                    waits.append((_PREPARED, i, *prepared))
                waits.append((_ROWS, i))
        pgconn.pipeline_sync()
        committing()
        pgconn.send_query_params(b"COMMIT", None)
        pgconn.pipeline_sync()
        waits += [_SYNCED, (_COMMIT,), _SYNCED]
        yield from send(pgconn)
        return (yield from _answers(link, steps, waits))
    finally:
        _leave(pgconn)


def _answers(link: Link, steps: Sequence[Step], waits: list[tuple[Any, ...]]) -> PQGen[Ahead]:
    pgconn = link.pgconn
    outcomes: list[Outcome | None] = [None] * len(steps)
    failure: tuple[int, psycopg.Error] | None = None
    ended: Ahead | None = None
    try:
        for wait in waits:
            results = yield from fetch_many(pgconn)
            kind = wait[0]
            if kind == _SYNC:
                continue
            res = results[0] if results else None
            if kind == _COMMIT:
                said = b"COMMIT" if failure is None else b"ROLLBACK"
                if res is not None and res.status == COMMAND_OK and res.command_status == said:
                    ended = Ahead(outcomes, failure is None, failure)
                    continue
                if res is None or res.status == FATAL_ERROR:
                    raise _failed(res, link.encoding)  # the COMMIT's own failure, or a loss
                raise psycopg.InternalError(
                    f"the transaction ended with {res.command_status!r} after "
                    + ("a failure" if failure else "no failure")
                )
            if res is None or res.status == FATAL_ERROR:
                error = _failed(res, link.encoding)
                if error.sqlstate is None:
                    raise error
                failure = failure or (wait[1] if kind != _BEGIN else 0, error)
            elif res.status == PIPELINE_ABORTED:
                continue
            elif kind == _ROWS:
                i = wait[1]
                step = steps[i]
                if step.guard:
                    outcomes[i] = Outcome(1, [])  # let through: it changed its one row
                elif step.many:
                    done, before = _outcome(link, res), outcomes[i]
                    outcomes[i] = Outcome(done.rowcount + (before.rowcount if before else 0), [])
                else:
                    outcomes[i] = _outcome(link, res)
            elif kind == _PREPARED:
                link.prepared[wait[2]] = wait[3]
    except psycopg.Error:
        if ended is None and failure is None:
            raise
        # The COMMIT had answered; or the server had refused a statement before it: nothing
        # was committed.
    if ended is not None:
        return ended
    if failure is None:
        raise _failed(None, link.encoding)
    return Ahead(outcomes, False, failure)
