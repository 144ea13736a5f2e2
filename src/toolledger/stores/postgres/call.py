"""Carrying a plan out on PostgreSQL, for the sync and the async backend alike.

A plan's statements are written with ``?``; here they are rewritten to psycopg's ``%s`` (once
per statement: the rewrite is cached). ``Call`` holds every decision about one store operation
across its tries — which plan a try runs, whether a failure is run again, which error it
becomes — so the two backends differ only in their ``await``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache, partial
from typing import Any, Generic, Protocol, TypeVar

import psycopg
from psycopg import errors as pg_errors

from ...errors import StoreError
from ...ops import Op
from .._sql import plans
from .._sql.plans import Outcome, Plan, Step
from .._sql.statements import format_style
from .errors import connection_lost, failure, timed_out
from .guards import AsyncConn, Conn, Orphans, gone, identity
from .settings import Settings

T = TypeVar("T")
_log = logging.getLogger("toolledger")


@cache
def pg(statement: str) -> str:
    return format_style(statement)


@contextmanager
def _duplicate_is_conflict(step: Step) -> Iterator[None]:
    try:
        yield
    except pg_errors.UniqueViolation as exc:
        if step.duplicate is None:
            raise
        raise step.duplicate() from exc


def execute(conn: Conn, step: Step) -> Outcome:
    with conn.cursor() as cur, _duplicate_is_conflict(step):
        if step.many:
            cur.executemany(pg(step.sql), step.params)
            return Outcome(cur.rowcount, [])
        cur.execute(pg(step.sql), step.params)
        return Outcome(cur.rowcount, cur.fetchall() if cur.description is not None else [])


async def aexecute(conn: AsyncConn, step: Step) -> Outcome:
    async with conn.cursor() as cur:
        with _duplicate_is_conflict(step):
            if step.many:
                await cur.executemany(pg(step.sql), step.params)
                return Outcome(cur.rowcount, [])
            await cur.execute(pg(step.sql), step.params)
            fetched = await cur.fetchall() if cur.description is not None else []
            return Outcome(cur.rowcount, fetched)


def drive(conn: Conn, plan: Plan[T]) -> T:
    return plans.drive(plan, lambda step: execute(conn, step))


async def adrive(conn: AsyncConn, plan: Plan[T]) -> T:
    return await plans.adrive(plan, lambda step: aexecute(conn, step))


@dataclass(slots=True)
class Call(Generic[T]):
    """One store operation, across its tries.

    A try takes a connection (``started``), ends the orphans, and runs ``next_plan()`` — in a
    transaction when ``in_transaction`` (``committing`` set once the plan is done: an error from
    then on is the COMMIT's), else in autocommit. A driver error goes to ``failed``, which says
    what it means; the backend raises that, or tries again.
    """

    action: str
    plan: Callable[[], Plan[T]]
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

    @property
    def in_transaction(self) -> bool:
        return self.write and not self.single

    def started(self, conn: Conn | AsyncConn) -> None:
        self.conn, self.ident = conn, identity.get(conn)

    def next_plan(self) -> Plan[T]:
        if self.single and self.attempt > 0 and self.again is not None:
            return self.again()
        return self.plan()

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
    return Call(action, plan, shell.url, shell.orphans, shell.settings.op_timeout)


def writing(shell: Shell, session_id: str, ops: Sequence[Op]) -> Call[list[bool]]:
    """``ops`` in one transaction, or — one statement — in autocommit, sent again after a lost
    connection as ``apply_again``."""
    return Call(
        "writing the ledger",
        partial(plans.apply, session_id, ops),
        shell.url,
        shell.orphans,
        shell.settings.op_timeout,
        write=True,
        single=plans.one_statement(ops),
        again=partial(plans.apply_again, session_id, ops),
    )
