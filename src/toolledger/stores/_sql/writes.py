"""What an op means in SQL, written once: a batch of ops as a plan (``apply``), a batch sent
again after a lost connection (``apply_again``), and which batches are one statement
(``one_statement``). See ``.plans`` for what a plan is."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, assert_never

from ...errors import LeaseLostError, SessionConflictError
from ...ops import (
    AbandonMessages,
    AppendMessages,
    DropLease,
    DropSession,
    HoldLease,
    InsertEffect,
    Op,
    PutApproval,
    PutSession,
    Reading,
    TakeLease,
    UpdateEffect,
    alone,
    busy,
    conflict,
    lost,
    moved,
    still_there,
)
from . import rows as r
from . import statements as q
from .plans import (
    Outcome,
    Plan,
    Step,
    approvals_query,
    effect_query,
    lease_query,
    query_plan,
    session_query,
)

__all__ = [
    "Clock",
    "apply",
    "apply_again",
    "effect_step",
    "lone_effect",
    "lone_op",
    "one_statement",
    "straight",
]


# -- writes --------------------------------------------------------------------------------------


def one_statement(ops: Sequence[Op], ride: bool = False) -> bool:
    """A batch whose plan writes with one statement, so autocommit makes it atomic on its own.
    (A guard that fails in it has written nothing: its single UPDATE or INSERT matched no row.)
    Appending messages, abandoning them (a rewind) and removing a session take several
    statements: a transaction. With ``ride``, a fence that does not renew and rides its batch's
    one write leaves it one statement."""
    if ride and len(ops) == 2 and _carrier(ops) == 1:
        return True
    return len(ops) == 1 and not isinstance(ops[0], _SEVERAL)


# Tuples: ``X | Y`` would build a union at every test.
_SEVERAL = (AppendMessages, AbandonMessages, DropSession)  # ops of several statements
_UNCOUNTED = (AbandonMessages, DropSession)  # a batch that holds one writes the session's row


Clock = Callable[[Reading], float]
"""A shared clock's check (PostgreSQL's): given the reading ``at`` a write's deadline was set on
(``UpdateEffect.at``), what the server's clock should say as the statement is sent — the reading
carried forward on this process's monotonic clock. ``None`` for a store whose clock is each
machine's own: its deadlines are judged otherwise (``toolledger._liveness``)."""


def lone_effect(ops: Sequence[Op], clock: Clock | None = None) -> Step | None:
    """The statement of a batch that is one effect write alone, with no fence and no guard —
    the common call's intent, or its outcome — built straight: what ``apply`` plans for it, and
    its flag is whether it changed a row. ``None`` for any other batch. Built as it is sent:
    with ``clock``, an intent's check reads the clock then."""
    if len(ops) != 1:
        return None
    op = ops[0]  # ``lone_op``, and ``effect_step`` without a clock, written out: every call's
    if type(op) is InsertEffect:
        if clock is None or op.at is None:
            return Step(q.INSERT_EFFECT, r.insert_params(op))
        return effect_step(op, clock)
    if type(op) is UpdateEffect and not op.guard:
        if clock is None or op.at is None:
            return Step(q.update_statement(op), r.update_params(op))
        return effect_step(op, clock)
    return None


def lone_op(ops: Sequence[Op]) -> InsertEffect | UpdateEffect | None:
    """The op of a batch that is one effect write alone, unguarded (``lone_effect``)."""
    if len(ops) != 1:
        return None
    op = ops[0]
    if type(op) is InsertEffect or (type(op) is UpdateEffect and not op.guard):
        return op
    return None


def effect_step(op: InsertEffect | UpdateEffect, clock: Clock | None) -> Step:
    """An effect's write, unfenced: with ``clock``, an intent's deadline checked against the
    shared clock as it is written (``statements.INSERT_EFFECT_CLOCKED``)."""
    if clock is not None and op.at is not None:
        expected = clock(op.at)
        if isinstance(op, InsertEffect):
            return Step(q.INSERT_EFFECT_CLOCKED, r.clocked_insert_params(op, expected))
        return Step(
            q.clocked_update_statement(op), r.clocked_update_params(op, expected), guard=op.guard
        )
    if isinstance(op, InsertEffect):
        return Step(q.INSERT_EFFECT, r.insert_params(op))
    return Step(q.update_statement(op), r.update_params(op), guard=op.guard)


def straight(session_id: str, ops: Sequence[Op]) -> list[Step] | None:
    """The statements of a checkpoint — a fence that only checks, then messages appended, the
    session moved on and effects written (an outcome that is a guard only before the session's
    update), the common turn's A and B — built straight: what ``apply(session_id, ops,
    ride=True)`` yields for it while each write changes its one row (the fence rides the
    session's update, or — when the batch moves only the session's counters — the insert of the
    message that carries them: ``_counted``). ``None`` for any other batch. The first statement
    is never an ``executemany`` (a backend checks the schema in it: ``sqlite.CHECKED``).

    A backend runs them in order; at the first that fails or does not change exactly one row
    (``executemany`` aside) it hands the batch to ``apply``, told what ran (``.plans.drive``),
    so every other outcome — a seq taken, a version moved, the lease lost, a record already
    there — has its one meaning there. When all change their row, every op's flag is true."""
    if len(ops) < 3:
        return None
    fence = ops[0]
    if not isinstance(fence, HoldLease) or fence.expires_at is not None:
        return None
    counted = _counted(ops)
    at, put = counted if counted is not None else (0, None)  # (never 0: ops[0] is the fence)
    steps: list[Step] = []
    appended = moved = False
    for n in range(1, len(ops)):
        op = ops[n]
        if n == at:
            assert type(op) is AppendMessages and put is not None
            params = r.counted_message_params(session_id, op.messages[0], put)
            steps.append(
                Step(
                    q.INSERT_COUNTED_MESSAGE_FENCED,
                    (*params, session_id, fence.token),
                    duplicate=_seq_taken(session_id),
                    guard=True,
                )
            )
            appended = moved = True
        elif op is put:
            continue  # it rides the message's insert
        elif type(op) is AppendMessages and not appended and op.messages:
            first = op.messages[0].seq
            if len(op.messages) > 1 and any(m.seq != first + i for i, m in enumerate(op.messages)):
                return None
            values = [r.message_params(session_id, m) for m in op.messages]
            seq_taken = _seq_taken(session_id)
            steps.append(
                Step(
                    q.INSERT_NEXT_MESSAGE,
                    (*values[0], first, session_id),
                    duplicate=seq_taken,
                    guard=True,
                )
            )
            if len(values) > 1:
                steps.append(Step(q.INSERT_MESSAGE, values[1:], many=True, duplicate=seq_taken))
            appended = True
        elif type(op) is PutSession and not moved and op.expect_version is not None:
            params = (*r.update_session_params(op), session_id, fence.token)
            steps.append(Step(q.UPDATE_SESSION_NOW_FENCED, params, guard=True))
            moved = True
        elif type(op) is InsertEffect:
            steps.append(Step(q.INSERT_EFFECT, r.insert_params(op)))
        elif type(op) is UpdateEffect and not (op.guard and moved):
            # (A guard after the session's update would carry the fence instead: ``_carrier``.)
            steps.append(Step(q.update_statement(op), r.update_params(op), guard=op.guard))
        else:
            return None  # another kind of op, or one the fence would not ride as here
    return steps if moved else None


def _seq_taken(session_id: str) -> Callable[[], SessionConflictError]:
    """What a duplicate key in a message's insert means: another writer appended first."""
    return partial(conflict, session_id, "a message with that seq exists")


def _counted(ops: Sequence[Op]) -> tuple[int, PutSession] | None:
    """(SQLite: ``apply(ride=True)``) Where the batch's one ``PutSession`` moves only the
    session's counters (``counters_only``) and counts exactly the one message the batch
    appends: that ``AppendMessages``' index and the ``PutSession``. Its message's row carries the
    new counters, and its insert is the session's compare-and-set (``INSERT_COUNTED_MESSAGE``);
    the session's row is not written. ``None``: the batch writes the session's row, if any."""
    put: PutSession | None = None
    appended: AppendMessages | None = None
    at = 0
    for n, op in enumerate(ops):
        if isinstance(op, PutSession):
            if put is not None:
                return None
            put = op
        elif isinstance(op, AppendMessages):
            if appended is not None:
                return None
            appended, at = op, n
        elif isinstance(op, _UNCOUNTED):
            return None
    if put is None or appended is None or not put.counters_only or put.expect_version is None:
        return None
    messages = appended.messages
    if (
        len(messages) != 1
        or messages[0].seq + 1 != put.state.messages
        or messages[0].created_at != put.state.updated_at
    ):
        return None
    return at, put


def _carrier(ops: Sequence[Op], counted: tuple[int, PutSession] | None = None) -> int | None:
    """Where the batch's fence can ride (``apply(ride=True)``): the index of a write that can
    carry the lease check, preferring one that is a guard (its refusal rolls the batch back
    anyway) — the message that carries the session's counters (``counted``), if any — or
    ``None``: the batch does not open with a fence that only checks, or nothing in it can carry
    one."""
    if not ops or not isinstance(ops[0], HoldLease) or ops[0].expires_at is not None:
        return None
    if counted is not None:
        return counted[0]
    found: int | None = None
    for n in range(len(ops) - 1, 0, -1):
        op = ops[n]
        if isinstance(op, PutSession) and op.expect_version is not None:
            return n
        if isinstance(op, UpdateEffect) and op.guard:
            return n
        if found is None and isinstance(op, (InsertEffect, UpdateEffect)):
            found = n
    return found


def apply(
    session_id: str, ops: Sequence[Op], ride: bool = False, clock: Clock | None = None
) -> Plan[list[bool]]:
    """Every op is one conditional statement; a failed guard raises and so rolls back the
    transaction (or savepoint) the backend opened around the plan.

    ``ride`` (SQLite, whose write lock makes a check atomic with the write it rides): a fence
    that only checks (``HoldLease`` without an expiry) is not a statement of its own but a
    condition of one of the batch's writes. When that write matches no row, the lease is read
    to tell a lost lease from the op's own refusal; and a batch refused for any reason says
    the lease was lost if it was (as it would have had the fence gone first).

    With ``ride``, too, a ``PutSession`` that moves only counters rides the message it counts
    (``_counted``), and a session's version is compared as it stands (``UPDATE_SESSION_NOW``).

    ``clock``: the store's clock is shared, and an intent's deadline is checked against it."""
    counted = _counted(ops) if ride else None
    at = _carrier(ops, counted) if ride else None
    if at is None:
        return (yield from _apply(session_id, ops, None, ride, counted, clock=clock))
    fence = ops[0]
    assert isinstance(fence, HoldLease)
    try:
        return (yield from _apply(session_id, ops, (at, fence.token), ride, counted, clock=clock))
    except SessionConflictError as exc:
        if isinstance(exc, LeaseLostError) or (yield from _lease_held(session_id, fence.token)):
            raise
        raise lost(session_id, fence.token) from None


def _lease_held(session_id: str, token: int) -> Plan[bool]:
    lease = yield from query_plan(lease_query(session_id))
    return lease is not None and lease.token == token and lease.expires_at > 0


def _refused(session_id: str, token: int | None) -> Plan[None]:
    """A write that carried the fence matched no row: if the lease is gone, that is why."""
    if token is not None and not (yield from _lease_held(session_id, token)):
        raise lost(session_id, token)


def _apply(
    session_id: str,
    ops: Sequence[Op],
    rider: tuple[int, int] | None,
    ride: bool = False,
    counted: tuple[int, PutSession] | None = None,
    *,
    clock: Clock | None = None,
) -> Plan[list[bool]]:
    """``apply``'s ops, the fence riding the write at ``rider``'s index (with its token), the
    session's counters the message at ``counted``'s."""
    out: list[bool] = []
    for n, op in enumerate(ops):
        fence = rider[1] if rider is not None and rider[0] == n else None
        match op:
            case InsertEffect() | UpdateEffect():
                done = yield from _effect(session_id, op, fence, clock)
            case PutSession():
                if counted is not None and op is counted[1]:
                    done = Outcome(rowcount=1, rows=[])  # it rode its message's insert
                else:
                    done = yield from _put_session(session_id, op, fence, ride)
            case AppendMessages():
                if counted is not None and n == counted[0]:
                    yield from _append_counted(session_id, op, counted[1], fence)
                else:
                    yield from _append(session_id, op)
                done = Outcome(rowcount=1, rows=[])
            case AbandonMessages():
                if ride:  # the tail it takes out may hold the session's counters
                    yield Step(q.FOLD_SESSION, (session_id,))
                yield from _abandon(session_id, op)
                done = Outcome(rowcount=1, rows=[])
            case DropSession():
                alone(ops)
                yield from _drop(session_id, op, ride)
                done = Outcome(rowcount=1, rows=[])
            case PutApproval():
                if op.expect_status is None:
                    done = yield Step(q.INSERT_APPROVAL, r.approval_values(op.record))
                else:
                    done = yield Step(q.UPDATE_APPROVAL, r.update_approval_params(op))
            case TakeLease() | HoldLease() | DropLease():
                if n == 0 and rider is not None:
                    done = Outcome(rowcount=1, rows=[])  # it rides a write of this batch
                else:
                    done = yield from _lease_op(session_id, op, clocked=clock is not None)
            case _:
                assert_never(op)
        out.append(done.rowcount == 1)
    return out


def _effect(
    session_id: str, op: InsertEffect | UpdateEffect, fence: int | None, clock: Clock | None
) -> Plan[Outcome]:
    """A record inserted if absent, or moved on by compare-and-set; with ``fence`` (a token),
    only if the lease still carries it (a fence rides a write on SQLite only, whose clock is
    never ``clock``-checked)."""
    if isinstance(op, InsertEffect):
        if fence is None:
            return (yield effect_step(op, clock))
        done = yield Step(q.INSERT_EFFECT_FENCED, (*r.insert_params(op), session_id, fence))
        if done.rowcount != 1:
            yield from _refused(session_id, fence)
        return done
    if fence is None:
        done = yield effect_step(op, clock)
    else:
        params = (*r.update_params(op), session_id, fence)
        done = yield Step(q.fenced_update_statement(op), params, guard=op.guard)
    if done.rowcount != 1:
        yield from _refused(session_id, fence)
        if op.guard:
            raise moved(session_id, op.record.tool_use_id)
    return done


def _put_session(
    session_id: str, op: PutSession, fence: int | None, ride: bool = False
) -> Plan[Outcome]:
    """A session created, or moved on by compare-and-set on its version — on SQLite (``ride``)
    the version as it stands, which the row may lag behind (``_counted``); with ``fence``, only
    if the lease still carries it."""
    if op.expect_version is None:
        done = yield Step(q.INSERT_SESSION, r.session_values(op.state), guard=True)
        if done.rowcount != 1:
            raise conflict(session_id, "it already exists")
        return done
    if fence is not None:
        params = (*r.update_session_params(op), session_id, fence)
        done = yield Step(q.UPDATE_SESSION_NOW_FENCED, params, guard=True)
    else:
        update = q.UPDATE_SESSION_NOW if ride else q.UPDATE_SESSION
        done = yield Step(update, r.update_session_params(op), guard=True)
    if done.rowcount != 1:
        yield from _refused(session_id, fence)
        raise conflict(session_id, f"it is not at version {op.expect_version}")
    return done


def _lease_op(
    session_id: str, op: TakeLease | HoldLease | DropLease, *, clocked: bool = False
) -> Plan[Outcome]:
    """A lease taken, held or given back; ``clocked``: on a shared clock, its expiry written as
    that clock says (``statements.HOLD_LEASE_CLOCKED``)."""
    match op:
        case TakeLease():
            if clocked and op.lease.ttl is not None:
                statement = q.clocked_take_lease_statement(op)
                params = r.clocked_take_lease_params(op)
            else:
                statement, params = q.take_lease_statement(op), r.take_lease_params(op)
            done = yield Step(statement, params, guard=True)
            if done.rowcount != 1:
                raise busy(session_id, (yield from query_plan(lease_query(session_id))))
            return done
        case HoldLease():
            # An UPDATE, so the lease row stays locked until this transaction ends: a take-over
            # waits for our commit and then finds the token it expected — our writes land
            # before the new holder reads anything.
            if op.expires_at is None:
                done = yield Step(q.CHECK_LEASE, (session_id, op.token), guard=True)
            else:
                hold, params = (
                    (q.HOLD_LEASE_CLOCKED, (op.expires_at, op.expires_at, session_id, op.token))
                    if clocked
                    else (q.HOLD_LEASE, (op.expires_at, session_id, op.token))
                )
                done = yield Step(hold, params, guard=True)
            if done.rowcount != 1:
                raise lost(session_id, op.token)
            return done
        case DropLease(owner=None):
            return (yield Step(q.DROP_LEASE, (session_id, op.token)))
        case DropLease():
            return (yield Step(q.DROP_LEASE_OF, (session_id, op.token, op.owner)))
        case _:
            assert_never(op)


def _append(session_id: str, op: AppendMessages) -> Plan[None]:
    """The first message goes in only if its seq is the transcript's next (a guard); the rest
    follow it. A racing writer that found the same next seq meets the primary key: the other
    inserts are ON CONFLICT DO NOTHING, so only these can find a duplicate key."""
    if not op.messages:
        return
    first = op.messages[0].seq
    values = [r.message_params(session_id, m) for m in op.messages]
    seq_taken = _seq_taken(session_id)
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


def _append_counted(
    session_id: str, op: AppendMessages, put: PutSession, fence: int | None
) -> Plan[None]:
    """The one message of ``op`` with the session's counters (``_counted``): in only if its seq
    is the transcript's next, the session is at ``put``'s expected version, the row would lag
    behind the message, only the counters move, and (with ``fence``) the lease still carries
    it. Otherwise — the lease lost, the seq taken — the error ``_append`` would have raised; or
    the message and ``put`` are written the other way, the session's row with them (``put``'s
    own compare-and-set says whether the version moved)."""
    params = r.counted_message_params(session_id, op.messages[0], put)
    seq_taken = _seq_taken(session_id)
    if fence is None:
        step = Step(q.INSERT_COUNTED_MESSAGE, params, duplicate=seq_taken, guard=True)
    else:
        sql, params = q.INSERT_COUNTED_MESSAGE_FENCED, (*params, session_id, fence)
        step = Step(sql, params, duplicate=seq_taken, guard=True)
    done = yield step
    if done.rowcount == 1:
        return
    yield from _refused(session_id, fence)
    yield from _append(session_id, op)
    yield from _put_session(session_id, put, fence, ride=True)


def _abandon(session_id: str, op: AbandonMessages) -> Plan[None]:
    """The branch's row first, inserted only if its number is free and the transcript reaches
    ``from_seq`` (the guard); then the tail copied to the branch and taken out of the
    transcript. An ``AppendMessages`` after it in the batch finds ``from_seq`` next."""
    guard = (session_id, op.branch, op.from_seq, op.from_seq, session_id)
    done = yield Step(q.ABANDON_BRANCH, guard, guard=True)
    if done.rowcount != 1:
        last = (yield Step(q.SELECT_LAST_SEQ, (session_id,))).rows[0][0]
        count = 0 if last is None else int(last) + 1
        raise conflict(
            session_id,
            f"cannot abandon from message {op.from_seq} of {count} as branch {op.branch}",
        )
    yield Step(q.ABANDON_MESSAGES, (op.branch, session_id, op.from_seq))
    yield Step(q.DELETE_MESSAGES_FROM, (session_id, op.from_seq))


def _drop(session_id: str, op: DropSession, ride: bool = False) -> Plan[None]:
    """The guard first (the session's own DELETE, or a count for a session without state),
    then everything else of the session that is not in progress or pending. On SQLite
    (``ride``) the version compared is the session's as it stands (``_counted``)."""
    params: tuple[Any, ...] = (session_id, session_id, session_id, op.now)
    unchanged = ""
    if op.records is not None:
        unchanged += f" AND {q.SAME_RECORDS}"
        params += (session_id, op.records)
    if op.last_activity is not None:
        unchanged += f" AND {q.NOTHING_SINCE}"
        params += (session_id, op.last_activity, session_id, op.last_activity)
    if op.expect_version is not None:
        drop = q.DROP_SESSION_NOW if ride else q.DROP_SESSION
        done = yield Step(drop + unchanged, (session_id, op.expect_version, *params), guard=True)
        if done.rowcount != 1:
            raise still_there(session_id)
    else:
        found = yield Step(q.LEDGER_ONLY_DROPPABLE + unchanged, (session_id, *params))
        if found.rows[0][0] != 1:
            raise still_there(session_id)
    if op.last_activity is None:
        yield Step(q.DELETE_SETTLED_EFFECTS, (session_id,))
    else:  # a record that lands after the guard's snapshot (PostgreSQL) is not taken either
        yield Step(q.DELETE_SETTLED_EFFECTS + q.SEEN_EFFECT, (session_id, op.last_activity))
    yield Step(q.DELETE_MESSAGES, (session_id,))
    yield Step(q.DELETE_ABANDONED_MESSAGES, (session_id,))
    yield Step(q.DELETE_ABANDONED_BRANCHES, (session_id,))
    if op.last_activity is None:
        yield Step(q.DELETE_DECIDED_APPROVALS, (session_id,))
    else:
        yield Step(q.DELETE_DECIDED_APPROVALS + q.SEEN_APPROVAL, (session_id, op.last_activity))
    yield Step(q.DELETE_FREE_LEASE, (session_id, op.now))


def apply_again(session_id: str, ops: Sequence[Op], clock: Clock | None = None) -> Plan[list[bool]]:
    """A one-statement batch sent again after its connection was lost with the outcome unknown.

    Every statement is conditional, so sending it twice cannot do it twice. But if the first
    send landed, this one finds its condition gone ("not applied", or a guard's conflict): then
    the row is read back, and if it holds exactly what this batch wrote — worker id, timestamps
    and all — the first send landed, and the batch is reported applied.
    """
    (op,) = ops
    try:
        done: list[bool] | None = yield from apply(session_id, ops, clock=clock)
    except SessionConflictError as exc:
        refused: BaseException | None = exc
        done = None
    except Exception as exc:
        # A resent intent whose deadline the shared clock refuses (``statements.CLOCK_REFUSED``:
        # a reconnect that took long, a clock that stepped): the first send may have landed,
        # and its row be ours. Only if it is not is the refusal raised.
        if getattr(exc, "sqlstate", None) != q.CLOCK_REFUSED:
            raise
        refused, done = exc, None
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
    match op:
        case InsertEffect() | UpdateEffect():
            found = yield from query_plan(effect_query(session_id, op.record.tool_use_id))
            return found == {op.record.tool_use_id: op.record}
        case PutApproval():
            approvals = yield from query_plan(approvals_query(session_id))
            return op.record in approvals
        case PutSession():
            return (yield from query_plan(session_query(session_id))) == op.state
        case TakeLease():
            # Its expiry may be the one a shared clock wrote (``HOLD_LEASE_CLOCKED``): the lease
            # is told by all else — token, owner, holder, time to live, no renewal yet.
            lease = yield from query_plan(lease_query(session_id))
            return lease is not None and replace(lease, expires_at=op.lease.expires_at) == op.lease
        case HoldLease():
            lease = yield from query_plan(lease_query(session_id))
            if lease is None or lease.token != op.token or lease.expires_at <= 0:
                return False
            # A renewal is told by its expiry (its count moves with every other renewal too).
            return op.expires_at is None or lease.expires_at == op.expires_at
        case DropLease():
            return False  # it reports its own outcome again: it is idempotent
        case AppendMessages() | AbandonMessages() | DropSession():
            return False  # never sent again: more than one statement (``one_statement``)
        case _:
            assert_never(op)
