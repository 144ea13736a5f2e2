"""Every read and write of the SQL backends as a *plan*, shared by SQLite and PostgreSQL.

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
from ...ops import (
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


def drive(plan: Plan[T], execute: Callable[[Step], Outcome]) -> T:
    """Carry ``plan`` out: each statement it yields is executed and its outcome sent back; a
    statement that fails raises inside the plan, which may handle it (or not: then it raises
    here)."""
    try:
        step = next(plan)
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


# -- writes --------------------------------------------------------------------------------------


def one_statement(ops: Sequence[Op]) -> bool:
    """A batch whose plan writes with one statement, so autocommit makes it atomic on its own.
    (A guard that fails in it has written nothing: its single UPDATE or INSERT matched no row.)
    Appending messages reads the last seq first: that takes a transaction."""
    return len(ops) == 1 and not isinstance(ops[0], AppendMessages)


def apply(session_id: str, ops: Sequence[Op]) -> Plan[list[bool]]:
    """Every op is one conditional statement; a failed guard raises and so rolls back the
    transaction (or savepoint) the backend opened around the plan."""
    out: list[bool] = []
    for op in ops:
        if isinstance(op, InsertEffect):
            done = yield Step(q.INSERT_EFFECT, r.insert_params(op))
        elif isinstance(op, UpdateEffect):
            done = yield Step(q.update_statement(op), r.update_params(op), guard=op.guard)
            if op.guard and done.rowcount != 1:
                raise moved(session_id, op.record.tool_use_id)
        elif isinstance(op, PutSession):
            if op.expect_version is None:
                done = yield Step(q.INSERT_SESSION, r.session_values(op.state), guard=True)
                if done.rowcount != 1:
                    raise conflict(session_id, "it already exists")
            else:
                done = yield Step(q.UPDATE_SESSION, r.update_session_params(op), guard=True)
                if done.rowcount != 1:
                    raise conflict(session_id, f"it is not at version {op.expect_version}")
        elif isinstance(op, AppendMessages):
            yield from _append(session_id, op)
            done = Outcome(rowcount=1, rows=[])
        elif isinstance(op, PutApproval):
            if op.expect_status is None:
                done = yield Step(q.INSERT_APPROVAL, r.approval_values(op.record))
            else:
                done = yield Step(q.UPDATE_APPROVAL, r.update_approval_params(op))
        elif isinstance(op, TakeLease):
            done = yield Step(q.take_lease_statement(op), r.take_lease_params(op), guard=True)
            if done.rowcount != 1:
                raise busy(session_id, (yield from query_plan(lease_query(session_id))))
        elif isinstance(op, HoldLease):
            # An UPDATE, so the lease row stays locked until this transaction ends: a take-over
            # waits for our commit and then finds the token it expected — our writes land
            # before the new holder reads anything.
            done = yield Step(q.HOLD_LEASE, (op.expires_at, session_id, op.token), guard=True)
            if done.rowcount != 1:
                raise lost(session_id, op.token)
        else:
            done = yield Step(q.DROP_LEASE, (session_id, op.token))
        out.append(done.rowcount == 1)
    return out


def _append(session_id: str, op: AppendMessages) -> Plan[None]:
    """The first message goes in only if its seq is the transcript's next (a guard); the rest
    follow it. A racing writer that found the same next seq meets the primary key: the other
    inserts are ON CONFLICT DO NOTHING, so only these can find a duplicate key."""
    if not op.messages:
        return
    first = op.messages[0].seq
    values = [r.message_params(session_id, m) for m in op.messages]
    seq_taken = partial(conflict, session_id, "a message with that seq exists")
    if all(m.seq == first + i for i, m in enumerate(op.messages)):
        done = yield Step(
            q.INSERT_NEXT_MESSAGE, (*values[0], first, session_id), duplicate=seq_taken, guard=True
        )
        if done.rowcount == 1:
            if values[1:]:
                yield Step(q.INSERT_MESSAGE, values[1:], many=True, duplicate=seq_taken)
            return
    last = (yield Step(q.SELECT_LAST_SEQ, (session_id,))).rows[0][0]
    raise conflict(session_id, f"the next message is {0 if last is None else int(last) + 1}")


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
        found = yield from query_plan(effect_query(session_id, op.record.tool_use_id))
        return found == {op.record.tool_use_id: op.record}
    if isinstance(op, PutApproval):
        approvals = yield from query_plan(approvals_query(session_id))
        return op.record in approvals
    if isinstance(op, PutSession):
        return (yield from query_plan(session_query(session_id))) == op.state
    if isinstance(op, TakeLease):
        return (yield from query_plan(lease_query(session_id))) == op.lease
    lease = yield from query_plan(lease_query(session_id))
    if isinstance(op, HoldLease):
        return lease is not None and (lease.token, lease.expires_at) == (op.token, op.expires_at)
    return False  # DropLease reports its own outcome again: it is idempotent


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


def _messages(found: list[Any]) -> list[StoredMessage]:
    return [r.row_to_message(row) for row in found]


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


def session_query(session_id: str) -> Query[SessionState | None]:
    return Query(q.SELECT_SESSION, (session_id,), _session)


def messages_query(session_id: str, since: int) -> Query[list[StoredMessage]]:
    return Query(q.SELECT_MESSAGES, (session_id, since), _messages)


def approvals_query(session_id: str | None) -> Query[list[ApprovalRecord]]:
    if session_id is None:
        return Query(q.SELECT_APPROVALS, (), _approvals)
    return Query(q.SELECT_SESSION_APPROVALS, (session_id,), _approvals)


def lease_query(session_id: str) -> Query[Lease | None]:
    return Query(q.SELECT_LEASE, (session_id,), _lease)


def sessions_query() -> Query[list[SessionState]]:
    return Query(q.SELECT_SESSIONS, (), _sessions)


def session_ids_query() -> Query[list[str]]:
    return Query(q.SELECT_ALL_SESSION_IDS, (), _ids)


def in_doubt_query() -> Query[list[EffectRecord]]:
    return Query(q.SELECT_IN_DOUBT, (), _records)
