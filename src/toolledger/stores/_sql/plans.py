"""Every read and write of the SQL backends as a *plan*, shared by SQLite and PostgreSQL (the
writes are ``.writes``).

A plan is a generator that yields the statements to run (``?`` style) and receives each one's
outcome; it holds every decision (which statement, whether a guard failed, how rows become
records). The backends are thin shells that carry plans out (``drive``): SQLite on its one
connection, PostgreSQL — sync and async — rewriting the placeholders to ``%s``. What an op
means is written here once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Sequence
from functools import partial
from typing import Any, Generic, NamedTuple, TypeAlias, TypeVar

from ...errors import SessionConflictError
from ...records import ApprovalRecord, EffectRecord, Lease, SessionState, StoredMessage
from . import rows as r
from . import statements as q


class Step(NamedTuple):
    """Run ``sql`` (``?`` style) once, or once per parameter tuple when ``many``. (Tuples: a
    plan makes one per statement, on the SQLite hot path.)"""

    sql: str
    params: Sequence[Any] = ()
    many: bool = False
    duplicate: Callable[[], SessionConflictError] | None = None
    """What a duplicate key in this statement means: the driver raises this conflict instead
    of its own unique-violation error. ``None``: a duplicate key is a driver error."""
    guard: bool = False
    """The plan raises (and so rolls the batch back) unless this write changes exactly one row.
    A driver that sends a whole batch before reading any answer has the server refuse the
    statement then, so that the rest of the batch cannot commit without it."""


class Outcome(NamedTuple):
    rowcount: int
    rows: list[Any]


T = TypeVar("T")
Plan: TypeAlias = Generator[Step, Outcome, T]


def drive(
    plan: Plan[T],
    execute: Callable[[Step], Outcome],
    ran: Sequence[tuple[Step, Outcome]] = (),
    error: Exception | None = None,
) -> T:
    """Carry ``plan`` out: each statement it yields is executed and its outcome sent back; a
    statement that fails raises inside the plan, which may handle it (or not: then it raises
    here).

    ``ran``: its first statements have already run (a backend's straight path ran them,
    ``.writes.straight``). Each statement the plan yields is checked against the next of them
    and answered with its outcome instead of being run again; then ``error`` is raised inside
    the plan, if the next statement failed with it. So the plan makes every decision those
    statements lead to, as if it had run them itself."""
    try:
        step = next(plan)
        for known, outcome in ran:
            _same(step, known)
            step = plan.send(outcome)
        if error is not None:
            step = plan.throw(error)
        while True:
            try:
                outcome = execute(step)
            except Exception as exc:
                step = plan.throw(exc)
            else:
                step = plan.send(outcome)
    except StopIteration as stop:
        value: T = stop.value
        return value


def _same(step: Step, known: Step) -> None:
    """A statement the plan yields is the one a straight path ran in its place."""
    same = step.sql == known.sql and step.many == known.many
    if not same or tuple(step.params) != tuple(known.params):
        raise AssertionError(
            f"a straight path ran {known.sql!r} where its plan yields {step.sql!r}: the two "
            "disagree, which is a bug in toolledger"
        )


async def adrive(plan: Plan[T], execute: Callable[[Step], Awaitable[Outcome]]) -> T:
    """``drive`` with an awaited ``execute``."""
    try:
        step = next(plan)
        while True:
            try:
                outcome = await execute(step)
            except Exception as exc:
                step = plan.throw(exc)
            else:
                step = plan.send(outcome)
    except StopIteration as stop:
        value: T = stop.value
        return value


# -- reads ---------------------------------------------------------------------------------------
#
# A read is one statement and what its rows mean: a ``Query``. PostgreSQL runs it as a one-step
# plan (``query_plan``, inside its retries); SQLite runs it directly on its connection, which
# keeps a generator out of every read on its hot path.


class Query(NamedTuple, Generic[T]):
    """``sql`` (``?`` style) with ``params``; ``finish`` turns its rows into the answer."""

    sql: str
    params: Sequence[Any]
    finish: Callable[[list[Any]], T]


def query_plan(query: Query[T]) -> Plan[T]:
    """A read as a plan: its one statement, then its answer."""
    done = yield Step(query.sql, query.params)
    return query.finish(done.rows)


def records_by_id(found: list[Any]) -> dict[str, EffectRecord]:
    return {row[1]: r.row_to_record(row) for row in found}


def _records(found: list[Any]) -> list[EffectRecord]:
    return [r.row_to_record(row) for row in found]


def _session(found: list[Any]) -> SessionState | None:
    return r.row_to_session(found[0]) if found else None


def _sessions(found: list[Any]) -> list[SessionState]:
    return [r.row_to_session(row) for row in found]


def _messages(session_id: str, found: list[Any]) -> list[StoredMessage]:
    return [r.row_to_message(row, session_id) for row in found]


def _abandoned(session_id: str, found: list[Any]) -> dict[int, list[StoredMessage]]:
    out: dict[int, list[StoredMessage]] = {}
    for row in found:
        messages = out.setdefault(int(row[0]), [])
        if row[1] is not None:  # a branch without messages has one row, its columns NULL
            messages.append(r.row_to_message(row[1:], session_id))
    return out


def _approvals(found: list[Any]) -> list[ApprovalRecord]:
    return [r.row_to_approval(row) for row in found]


def _lease(found: list[Any]) -> Lease | None:
    return r.row_to_lease(found[0]) if found else None


def _ids(found: list[Any]) -> list[str]:
    return [str(row[0]) for row in found]


def effects_query(
    session_id: str, tool_use_ids: Sequence[str] | None = None
) -> Query[dict[str, EffectRecord]]:
    """The session's records, or those of ``tool_use_ids`` (PostgreSQL: one id is looked up by
    the whole key — a plan the server can keep — several travel as one array parameter)."""
    if tool_use_ids is None:
        return Query(q.SELECT_EFFECTS, (session_id,), records_by_id)
    if len(tool_use_ids) == 1:
        return effect_query(session_id, tool_use_ids[0])
    return Query(q.SELECT_SOME_EFFECTS, (session_id, list(tool_use_ids)), records_by_id)


def effect_ids_query(session_id: str) -> Query[list[str]]:
    return Query(q.SELECT_EFFECT_IDS, (session_id,), _ids)


def effect_query(session_id: str, tool_use_id: str) -> Query[dict[str, EffectRecord]]:
    """One record (SQLite reads several ids one query each: it has no round trips to save)."""
    return Query(q.SELECT_EFFECT, (session_id, tool_use_id), records_by_id)


def session_query(session_id: str, now: bool = False) -> Query[SessionState | None]:
    """A session's state; ``now`` (SQLite): its row overlaid with the counters of the latest
    message it lags behind (``statements.SELECT_SESSION_NOW``)."""
    return Query(q.SELECT_SESSION_NOW if now else q.SELECT_SESSION, (session_id,), _session)


def messages_query(session_id: str, since: int) -> Query[list[StoredMessage]]:
    return Query(q.SELECT_MESSAGES, (session_id, since), partial(_messages, session_id))


def abandoned_query(session_id: str) -> Query[dict[int, list[StoredMessage]]]:
    return Query(q.SELECT_ABANDONED, (session_id,), partial(_abandoned, session_id))


def approvals_query(session_id: str | None) -> Query[list[ApprovalRecord]]:
    if session_id is None:
        return Query(q.SELECT_APPROVALS, (), _approvals)
    return Query(q.SELECT_SESSION_APPROVALS, (session_id,), _approvals)


def lease_query(session_id: str) -> Query[Lease | None]:
    return Query(q.SELECT_LEASE, (session_id,), _lease)


def sessions_query(now: bool = False) -> Query[list[SessionState]]:
    """Every session's state (``now``: as ``session_query``'s)."""
    return Query(q.SELECT_SESSIONS_NOW if now else q.SELECT_SESSIONS, (), _sessions)


def session_ids_query() -> Query[list[str]]:
    return Query(q.SELECT_ALL_SESSION_IDS, (), _ids)


def in_doubt_query() -> Query[list[EffectRecord]]:
    return Query(q.SELECT_IN_DOUBT, (), _records)
