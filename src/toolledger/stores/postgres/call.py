"""Carrying a plan out on PostgreSQL, for the sync and the async backend alike.

A plan runs as a generator psycopg waits on (``conn.wait``; awaited by the async backend), so
both backends carry out the very same code. Each statement is one round trip (``wire.one``),
except a write batch of several statements: its plan is run ahead on the guess that every
statement changes its one row, the statements it yields go out in one transaction in one round
trip (``wire.ahead``), and the plan is then given the real answers — when they differ from the
guess — to say what the batch did or raise why it failed. A plan that cannot run on the guess
(it reads something first) is carried out statement by statement in a transaction instead.
``Call`` holds every decision about one store operation across its tries — which plan a try
runs, whether a failure is run again, which error it becomes.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, Protocol, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg import pq
from psycopg.abc import PQGen

from ...errors import StoreError
from ...ops import Op
from .._sql import plans, writes
from .._sql.plans import Outcome, Plan, Step
from ..contract import op_deadline
from . import wire
from .errors import connection_lost, failure, timed_out
from .guards import AsyncConn, Conn, Orphans, gone, identity
from .settings import Settings

T = TypeVar("T")
_log = logging.getLogger("toolledger")
GUESS = Outcome(1, [])  # what a write batch is sent ahead on: each statement changed its row
_OPEN = (pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR)


def _raised(step: Step, exc: Exception) -> Exception:
    """What a failed statement raises into its plan: a duplicate key the plan gave a meaning
    to becomes that conflict."""
    if isinstance(exc, pg_errors.UniqueViolation) and step.duplicate is not None:
        conflict = step.duplicate()
        conflict.__cause__ = exc
        return conflict
    return exc


def each(line: wire.Link, plan: Plan[T]) -> PQGen[T]:
    """Carry ``plan`` out one statement (one round trip) at a time: a statement that fails
    raises inside the plan, which may handle it (or not: then it raises here)."""
    try:
        return (yield from _onward(line, plan, next(plan)))
    except StopIteration as stop:
        value: T = stop.value
        return value


def _onward(line: wire.Link, plan: Plan[T], step: Step) -> PQGen[T]:
    try:
        while True:
            try:
                outcome = yield from wire.one(line, step.sql, step.params, step.many)
            except Exception as exc:
                step = plan.throw(_raised(step, exc))
            else:
                step = plan.send(outcome)
    except StopIteration as stop:
        value: T = stop.value
        return value


def _guessed(plan: Plan[T], steps: list[Step]) -> T:
    """Run ``plan`` on the guess, collecting the statements it yields."""
    try:
        step = next(plan)
        while True:
            steps.append(step)
            step = plan.send(GUESS)
    except StopIteration as stop:
        value: T = stop.value
        return value


def _replayed(
    line: wire.Link, plan: Plan[T], steps: Sequence[Step], answer: wire.Ahead
) -> PQGen[T]:
    """Give ``plan`` — run afresh — the answers of the batch it sent ahead. After the statement
    the server refused, the transaction is over: what else the plan asks (to say why) runs on
    its own."""
    failed_at, error = answer.failure if answer.failure is not None else (len(steps), None)
    try:
        step = next(plan)
        for i, sent in enumerate(steps):
            if step.sql != sent.sql or step.params != sent.params:
                raise StoreError(f"a plan asked for {step.sql!r} where it had sent {sent.sql!r}")
            outcome = answer.outcomes[i]
            if i < failed_at and outcome is not None:
                step = plan.send(outcome)
                continue
            if error is None:
                raise StoreError(f"no answer came for {sent.sql!r}")
            if sent.guard and error.sqlstate == wire.REFUSED:
                step = plan.send(Outcome(0, []))
            else:
                step = plan.throw(_raised(sent, error))
            break
        else:
            raise StoreError(f"a plan asked for {step.sql!r} after its batch had committed")
    except StopIteration as stop:
        if answer.committed:
            value: T = stop.value
            return value
        raise StoreError(_SILENT) from error
    yield from _onward(line, plan, step)
    raise StoreError(_SILENT) from error


_SILENT = "the server refused a statement of a batch, yet its plan raised nothing"


def drive(conn: Conn, plan: Plan[T]) -> T:
    """``plan`` carried out on ``conn``, one statement at a time."""
    return conn.wait(each(wire.link(conn), plan))


async def adrive(conn: AsyncConn, plan: Plan[T]) -> T:
    return await conn.wait(each(wire.link(conn), plan))


@dataclass(slots=True)
class Call(Generic[T]):
    """One store operation, across its tries.

    A try takes a connection (``started``) and ``carry``-s itself out: the orphans ended, then
    ``next_plan()`` — in a transaction when ``in_transaction`` (``committing`` set once the
    COMMIT is on its way: an error from then on may be the COMMIT's), else in autocommit. A
    driver error goes to ``failed``, which says what it means; the backend raises that, or
    tries again.
    """

    action: str
    plan: Callable[[], Plan[T]] | None
    """What a try runs (``None`` for a read that is a ``query``)."""
    url: str
    orphans: Orphans
    op_timeout: float
    write: bool = False
    single: bool = False
    """A write of one statement in autocommit: its execution is its commit, in one round trip
    instead of BEGIN, statement, COMMIT."""
    again: Callable[[], Plan[T]] | None = None
    """What a ``single`` write sends on a later try: it checks whether the first send landed."""
    attempt: int = 0
    committing: bool = False
    cut: bool = False
    """The deadline passed and the connection was cut (the watchdog, or the async timer)."""
    conn: Conn | AsyncConn | None = None
    ident: tuple[int, Any] | None = None
    query: plans.Query[T] | None = None
    """A read of one statement, run as it is (no plan around it: every read takes this path)."""
    clock: Carried | None = None
    """A write's clock check (``writing``), carried afresh for each try."""
    straight: tuple[Callable[[], Step], Callable[[Outcome], T]] | None = None
    """A write of one effect alone — the common call's intent, or its outcome — as its plan
    would send it, built straight as it is sent (``writes.lone_effect``), and what its answer
    means. Its first try runs it with no plan around it; a later one sends ``again``."""

    @property
    def in_transaction(self) -> bool:
        return self.write and not self.single

    def started(self, conn: Conn | AsyncConn) -> None:
        self.conn, self.ident = conn, identity.get(conn)

    def next_plan(self) -> Plan[T]:
        if self.single and self.attempt > 0 and self.again is not None:
            return self.again()
        assert self.plan is not None
        return self.plan()

    def carry(self, conn: Conn | AsyncConn) -> PQGen[T]:
        """This try on ``conn``: the orphans ended, then the plan (``psycopg``'s ``wait``
        carries the generator out)."""
        line = wire.link(conn)
        if self.orphans.pending():
            yield from each(line, self.orphans.ending(self.url, self.op_timeout))
        if self.clock is not None:
            self.clock.fresh()
        query = self.query
        if query is not None:
            done = yield from wire.one(line, query.sql, query.params)
            return query.finish(done.rows)
        if not self.in_transaction:
            if self.straight is not None and self.attempt == 0:
                build, meaning = self.straight
                step = build()
                return meaning((yield from wire.one(line, step.sql, step.params)))
            return (yield from each(line, self.next_plan()))
        assert self.plan is not None
        steps: list[Step] = []
        try:
            guess = _guessed(self.plan(), steps)
        except Exception:  # the plan needs an answer it cannot guess: one at a time
            return (yield from self._step_by_step(line))
        answer = yield from wire.ahead(line, steps, self._committing)
        if answer.committed and all(o == GUESS for o in answer.outcomes):
            return guess
        if not answer.committed:
            self.committing = False  # the server refused a statement: nothing landed
        return (yield from _replayed(line, self.plan(), steps, answer))

    def _committing(self) -> None:
        self.committing = True

    def _step_by_step(self, line: wire.Link) -> PQGen[T]:
        """The plan in a transaction, one statement (one round trip) at a time."""
        yield from wire.command(line, b"BEGIN")
        try:
            value = yield from each(line, self.next_plan())
        except Exception:
            if line.pgconn.transaction_status in _OPEN:
                with contextlib.suppress(psycopg.Error):  # else the pool rolls back, or discards
                    yield from wire.command(line, b"ROLLBACK")
            raise
        self.committing = True  # an error from here on is the COMMIT's
        yield from wire.command(line, b"COMMIT")
        return value

    def failed(self, exc: psycopg.Error | UnicodeEncodeError) -> StoreError | None:
        """The error to raise for ``exc``, or ``None``: try again (on a fresh connection)."""
        lost = connection_lost(exc)
        if self.write and (self.cut or (lost and gone(self.conn))):
            self.orphans.add(self.ident)  # its transaction may still be open on the server
        if self.cut:
            unknown = self.write and (self.single or self.committing)
            return timed_out(self.url, self.action, self.op_timeout, unknown=unknown)
        error = failure(
            exc,
            url=self.url,
            action=self.action,
            attempt=self.attempt,
            committing=self.committing,
            single=self.write and self.single,
        )
        if error is not None:
            return error
        if lost:
            _log.warning(
                "toolledger: lost the connection to PostgreSQL while %s (%s); "
                "retrying on a fresh one",
                self.action,
                str(exc).strip() or type(exc).__name__,
            )
        self.attempt += 1
        self.committing = self.cut = False
        self.conn = self.ident = None
        return None


class Shell(Protocol):
    """What a call needs of the backend that runs it."""

    url: str
    orphans: Orphans
    settings: Settings


def reading(shell: Shell, action: str, plan: Callable[[], Plan[T]]) -> Call[T]:
    return Call(action, plan, shell.url, shell.orphans, op_deadline(shell.settings.op_timeout))


def asking(shell: Shell, action: str, query: plans.Query[T]) -> Call[T]:
    return Call(
        action, None, shell.url, shell.orphans, op_deadline(shell.settings.op_timeout), query=query
    )


def writing(shell: Shell, session_id: str, ops: Sequence[Op]) -> Call[list[bool]]:
    """``ops`` in one transaction, or — one statement — in autocommit, sent again after a lost
    connection as ``apply_again``. An intent's deadline is checked against the server's clock
    (``writes.Clock``): its reading carried forward to the statement's sending (``Carried``)."""
    clock = Carried()
    lone = writes.lone_op(ops)  # its statement built as it is sent
    return Call(
        "writing the ledger",
        partial(writes.apply, session_id, ops, clock=clock),
        shell.url,
        shell.orphans,
        op_deadline(shell.settings.op_timeout),
        write=True,
        single=lone is not None or writes.one_statement(ops),
        again=partial(writes.apply_again, session_id, ops, clock),
        straight=None if lone is None else (partial(writes.effect_step, lone, clock), _changed),
        clock=clock,
    )


class Carried:
    """``writes.Clock``: a reading carried forward on this process's monotonic clock to the
    start of the try that sends it (``fresh``, as the try begins on its connection), which the
    server compares with its clock at the start of the transaction. One value for the whole try
    (a batch sent ahead is run again on its answers: the same statements, the same parameters);
    a resend after a lost connection is a try of its own, checked as it is sent."""

    __slots__ = ("_began",)

    def __init__(self) -> None:
        self._began = time.monotonic()

    def __call__(self, at: tuple[float, float]) -> float:
        return at[0] + (self._began - at[1])

    def fresh(self) -> None:
        self._began = time.monotonic()


def _changed(done: Outcome) -> list[bool]:
    """A lone effect write's flag: whether it changed its row (``writes.lone_effect``)."""
    return [done.rowcount == 1]
