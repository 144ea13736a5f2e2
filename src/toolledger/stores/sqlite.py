"""``sqlite:///path.db`` — the default store: one file, WAL, ``synchronous=FULL``.

Every state change is one transaction whose statements are conditional (insert-if-absent,
compare-and-set), so a ``kill -9`` at any instant leaves either the old row or the new one, and
two processes on one file cannot both win the same transition. Commit cost is one WAL append and
one fsync.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

from .. import _switches as switches
from ..errors import (
    CorruptLedgerError,
    SchemaVersionError,
    SessionConflictError,
    StoreError,
    StoreUnavailableError,
)
from ..ops import Op
from ..records import ApprovalRecord, EffectRecord, Lease, SessionState, StoredMessage
from ._group_commit import GroupQueue
from ._sql import plans, writes
from ._sql import statements as q
from ._sql.plans import Outcome, Step
from ._sql.schema import SQLITE_MIGRATIONS as MIGRATIONS
from ._sql.schema import sqlite_versioned, too_new
from ._sqlite_files import (
    BUSY_TIMEOUT_S,
    create_owner_only,
    identity,
    open_read_only,
    refuse_foreign,
    translate,
)
from ._url import file_url
from .contract import Pending, interrupted
from .jsonfile._format import FORMAT_FILE

__all__ = ["SQLiteBackend", "translate"]

T = TypeVar("T")

BUSY_TIMEOUT_MS = BUSY_TIMEOUT_S * 1000
WAL_AUTOCHECKPOINT_PAGES = 100


def _bind_none_directly() -> None:
    """Bind ``None`` without the adapter search. ``sqlite3`` looks every parameter that is not
    exactly an ``int``, ``float``, ``str`` or ``bytearray`` up in its adapter registry, and when
    none is registered asks the value's type and the protocol for adapter methods, each a failed
    attribute lookup that builds an exception: about 0.7 µs for every NULL bound, and a ledger
    row binds a dozen. Registered for ``None``, the adapter is one dictionary lookup and a call
    that gives ``None`` back (``{}.get``, in C): the same NULL, bound. Process-wide, as the
    registry is — so only where nobody registered one for ``None`` already (theirs would apply
    to our NULLs today, and still does)."""
    registry = getattr(sqlite3, "adapters", None)  # not documented: kept where it can be read
    if registry is not None and (type(None), sqlite3.PrepareProtocol) not in registry:
        sqlite3.register_adapter(type(None), cast("Callable[[None], None]", {}.get))


_bind_none_directly()


def _checked(version: int) -> dict[str, str]:
    """The statements a straight commit can open with (``writes.lone_effect``,
    ``writes.straight``), each changing its row only while the file's schema is still
    ``version``: the check rides the write, under the write lock it takes, so no migration can
    land between the two. It reads the ``schema_version`` row (schema 8), which costs about
    0.3 µs — ``pragma_user_version`` would run a statement of its own each time. (SQLite only.)"""
    ours = f"(SELECT version FROM schema_version) = {version}"
    marks = ", ".join("?" * len(q.EFFECT_COLUMNS.split(",")))
    return {
        q.INSERT_EFFECT: (
            f"INSERT INTO effects ({q.EFFECT_COLUMNS}) SELECT {marks} WHERE {ours} "
            "ON CONFLICT (session_id, tool_use_id) DO NOTHING"
        ),
        q.UPDATE_EFFECT: f"{q.UPDATE_EFFECT} AND {ours}",
        q.UPDATE_EFFECT_AT: f"{q.UPDATE_EFFECT_AT} AND {ours}",
        q.UPDATE_EFFECT_BY: f"{q.UPDATE_EFFECT_BY} AND {ours}",
        q.INSERT_NEXT_MESSAGE: f"{q.INSERT_NEXT_MESSAGE} AND {ours}",
        q.INSERT_COUNTED_MESSAGE_FENCED: f"{q.INSERT_COUNTED_MESSAGE_FENCED} AND {ours}",
        q.UPDATE_SESSION_NOW_FENCED: f"{q.UPDATE_SESSION_NOW_FENCED} AND {ours}",
    }


CHECKED = _checked(len(MIGRATIONS))


class SQLiteBackend(GroupQueue):
    durable = True
    shared_clock = False  # each machine's own clock: leases are judged by watching them

    def __init__(
        self, path: str, *, url: str, create: bool = True, read_only: bool = False
    ) -> None:
        self.url = url
        self.path = path
        self.read_only = read_only and path != ":memory:"
        if path != ":memory:" and Path(path).is_dir():
            # Said before SQLite tries it: it would say only "unable to open database file".
            where = Path(path).resolve()
            if (where / FORMAT_FILE).is_file():  # a json:/// store's directory
                advice = f"It is a json:/// store: name it as one ({file_url('json', where)})."
            else:
                advice = (
                    "Name a file in it (--store or $TOOLLEDGER_STORE; e.g. "
                    f"{file_url('sqlite', where / 'toolledger.db')})."
                )
            raise StoreUnavailableError(
                f"no store at {url}: {where} is a directory, not a database file. {advice}",
                url=url,
            )
        if (not create or self.read_only) and path != ":memory:" and not Path(path).is_file():
            raise StoreUnavailableError(
                f"no store at {url}: {Path(path).resolve()} does not exist. Check the URL "
                "(--store or $TOOLLEDGER_STORE; sqlite:///relative.db, sqlite:////absolute.db).",
                url=url,
            )
        self._lock = threading.Lock()
        self._init_queue()
        self.commits = 0  # physical commits (transactions), for tests and benchmarks
        self._probe: sqlite3.Connection | None = None  # reads the schema version (_check_schema)
        self._wal_path = ""  # the write-ahead log, and its identity once open (_check_identity)
        self._wal: tuple[int, int] | None = None
        self.place = _place(path, url)
        self.copied = False  # read through a migrated copy in memory (an earlier release's)
        if self.read_only:
            self._conn = open_read_only(path, url, busy_timeout_ms=BUSY_TIMEOUT_MS)
            self._identity = None
            self.copied = self._conn.execute("PRAGMA database_list").fetchone()[2] == ""
            return
        if path != ":memory:":
            create_owner_only(Path(path))
        try:
            self._conn = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000
            )
        except sqlite3.Error as exc:
            raise translate(exc, url, "opening") from exc
        try:
            self._identity = identity(path, url)
            if self._identity is not None:
                self.place = "sqlite:{}:{}".format(*self._identity)
            refuse_foreign(self._conn, path, url)  # before _configure: WAL rewrites the header
            self._configure()
            self._migrate()
            if self._identity is not None:  # beside the file a symbolic link names
                self._wal_path = f"{os.path.realpath(path)}-wal"
                self._wal = _file_id(self._wal_path)
        except sqlite3.Error as exc:
            self._conn.close()
            raise translate(exc, url, "opening") from exc
        except BaseException:
            self._conn.close()
            raise

    def _configure(self) -> None:
        c = self._conn
        c.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        mode = c.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if self.path != ":memory:" and str(mode).lower() != "wal":
            raise StoreUnavailableError(
                f"{self.url}: could not switch to WAL journaling (got {mode!r})", url=self.url
            )
        # FULL: the WAL is fsynced at every commit, so a committed record survives power loss.
        c.execute("PRAGMA synchronous = FULL")
        # Checkpoint every ~100 pages instead of 1000. After a checkpoint SQLite rewrites the WAL
        # from its start, in place: a commit then costs a data-only fdatasync instead of a file
        # growth plus a metadata journal commit. Measured on ext4 (bench/): 144 µs vs 274 µs per
        # commit over the first 500 commits of a fresh WAL, mean cost 166 vs 196 µs including
        # the more frequent (smaller) checkpoints.
        c.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}")

    def _migrate(self) -> None:
        c = self._conn
        version = int(c.execute("PRAGMA user_version").fetchone()[0])
        error = too_new(version, self.url)
        if error is not None:
            raise error
        while version < len(MIGRATIONS):
            c.execute("BEGIN IMMEDIATE")
            try:
                # Re-read inside the write lock: another process may have migrated meanwhile.
                version = int(c.execute("PRAGMA user_version").fetchone()[0])
                if version < len(MIGRATIONS):
                    for statement in MIGRATIONS[version].split(";"):
                        if statement.strip():
                            c.execute(statement)
                    version += 1
                    for statement in sqlite_versioned(version):
                        c.execute(statement)
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise

    def _execute(self, step: Step) -> Outcome:
        """One statement of a plan, on the connection (the caller holds ``_lock``)."""
        c = self._conn
        try:
            if step.many:
                return Outcome(c.executemany(step.sql, step.params).rowcount, [])
            cur = c.execute(step.sql, step.params)
        except sqlite3.IntegrityError:
            if step.duplicate is None:
                raise
            raise step.duplicate() from None
        return Outcome(cur.rowcount, cur.fetchall() if cur.description is not None else [])

    def _form(self, session_id: str, ops: Sequence[Op]) -> Step | list[Step] | None:
        """How a batch is carried out: the one statement of an effect write alone
        (``writes.lone_effect``), a common checkpoint's statements (``writes.straight``) —
        both built straight, their first statement checking the schema as it writes
        (``CHECKED``) — or ``None``: its plan, whose statements do not check the schema, so it
        is checked here first."""
        if switches.STRAIGHT:
            form = writes.lone_effect(ops) or writes.straight(session_id, ops)
            if form is not None:
                return form
        self._check_schema()  # a plan's statements do not check it themselves
        return None

    def _apply_batch(
        self, session_id: str, ops: Sequence[Op], form: Step | list[Step] | None
    ) -> list[bool]:
        """One batch, inside whatever transaction or savepoint the caller opened, as ``form``
        says (``_form``). A fence that only checks rides one of the batch's writes
        (``writes.apply``): the write lock this connection holds from the transaction's first
        statement (or the autocommit statement) to its commit keeps a take-over out in
        between."""
        if form is None:
            return plans.drive(writes.apply(session_id, ops, ride=True), self._execute)
        if isinstance(form, list):
            return self._straight(session_id, ops, form)
        changed = self._conn.execute(CHECKED[form.sql], form.params).rowcount
        if changed != 1:
            self._check_schema()  # the record moved on, or the schema did: say which
        return [changed == 1]

    def _straight(self, session_id: str, ops: Sequence[Op], steps: list[Step]) -> list[bool]:
        """A checkpoint's statements, built straight (``writes.straight``), run in order on the
        connection (as ``_execute`` would, without an ``Outcome`` each; the first checks the
        schema as it writes). The first that fails or changes no row hands the batch to its
        plan, told what ran (``_replay``)."""
        c = self._conn
        for n, step in enumerate(steps):
            try:
                if step.many:
                    c.executemany(step.sql, step.params)
                    continue
                changed = c.execute(CHECKED[step.sql] if n == 0 else step.sql, step.params).rowcount
            except Exception as exc:
                error: Exception = exc
                if isinstance(exc, sqlite3.IntegrityError) and step.duplicate is not None:
                    error = step.duplicate()
                return self._replay(session_id, ops, steps[:n], error=error)
            if changed != 1:
                if n == 0:
                    self._check_schema()  # its row was not there, or the schema moved on
                return self._replay(session_id, ops, steps[: n + 1], last=changed)
        return [True] * len(ops)

    def _replay(
        self,
        session_id: str,
        ops: Sequence[Op],
        ran: list[Step],
        *,
        last: int | None = None,
        error: Exception | None = None,
    ) -> list[bool]:
        """``_straight`` met something other than the common case: the batch's plan decides
        (``plans.drive``), told that the statements of ``ran`` each changed their row (an
        ``executemany`` one row a set) — the last of them ``last`` rows instead, if given —
        and then that the next one failed with ``error``, if given."""
        outcomes = [Outcome(len(s.params) if s.many else 1, []) for s in ran]
        if last is not None:
            outcomes[-1] = Outcome(last, [])
        plan = writes.apply(session_id, ops, ride=True)
        return plans.drive(plan, self._execute, list(zip(ran, outcomes, strict=True)), error)

    def _ask(self, action: str, query: plans.Query[T]) -> T:
        """A read's statement on the connection, its rows turned into its answer."""
        try:
            with self._lock:
                found = self._conn.execute(query.sql, query.params).fetchall()
        except sqlite3.Error as exc:
            raise translate(exc, self.url, action) from exc
        try:
            return query.finish(found)
        except CorruptLedgerError as exc:  # a damaged value in a sound row: name the store
            newer = self._newer()  # or a row a newer release wrote, in a schema it migrated
            if newer is not None:
                raise newer from exc
            exc.url = exc.url or self.url
            raise

    def _newer(self) -> StoreError | None:
        """``SchemaVersionError`` if a newer toolledger has migrated the file since it was
        opened (a long-lived worker meeting an upgrade), else ``None``."""
        try:
            with self._lock:
                self._check_schema()
        except SchemaVersionError as exc:
            return exc
        except sqlite3.Error:
            return None
        return None

    def read_effects(
        self, session_id: str, tool_use_ids: Sequence[str] | None = None
    ) -> dict[str, EffectRecord]:
        if tool_use_ids is None:
            return self._ask("reading the ledger", plans.effects_query(session_id))
        # One query per id (SQLite has no round trips to save), under one hold of the lock.
        found: list[Any] = []
        try:
            with self._lock:
                for tool_use_id in tool_use_ids:
                    query = plans.effect_query(session_id, tool_use_id)
                    found += self._conn.execute(query.sql, query.params).fetchall()
        except sqlite3.Error as exc:
            raise translate(exc, self.url, "reading the ledger") from exc
        return plans.records_by_id(found)

    def read_effect_ids(self, session_id: str) -> list[str]:
        return self._ask("reading the ledger", plans.effect_ids_query(session_id))

    def _commit_group(self, group: list[Pending]) -> None:
        if len(group) == 1:
            self._commit_alone(group[0])
            return
        undone = True  # nothing of the group is written until its COMMIT returns
        # Each batch's answer, given it only once the COMMIT has returned: an interrupt that
        # rolls the transaction back — and a second one as the callers are told so — must leave
        # no caller holding the flags of a batch that was never written.
        answers: list[tuple[list[bool] | None, BaseException | None]] = []
        try:
            with self._lock:
                c = self._conn
                self._check_identity()
                forms = [self._form(p.session_id, p.ops) for p in group]
                try:
                    c.execute("BEGIN IMMEDIATE")
                    undone = False
                    for p, form in zip(group, forms, strict=True):
                        c.execute("SAVEPOINT batch")
                        try:
                            answers.append((self._apply_batch(p.session_id, p.ops, form), None))
                        except SessionConflictError as exc:
                            c.execute("ROLLBACK TO batch")
                            answers.append((None, exc))
                        c.execute("RELEASE batch")
                    c.execute("COMMIT")
                    self.commits += 1
                except BaseException:
                    undone = undone or c.in_transaction
                    if c.in_transaction:
                        c.execute("ROLLBACK")
                    raise
            for p, (flags, error) in zip(group, answers, strict=True):
                p.flags, p.error = flags, error
        except sqlite3.Error as exc:
            error = self._write_error(exc)
            error.__cause__ = exc
            for p in group:
                p.flags, p.error = None, error
        except BaseException as exc:
            # An interrupt (a ``KeyboardInterrupt``) is the leader's alone: each other caller is
            # told what became of its batch — nothing of it written, unless the COMMIT had
            # returned, when each keeps its answer.
            if isinstance(exc, Exception):
                for p in group:
                    p.flags, p.error = None, exc
            elif undone:
                for p in group:
                    p.flags, p.error = None, interrupted(self.url, exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            for p in group:
                p.done = True

    def _commit_alone(self, p: Pending) -> None:
        """A group of one batch: committed as ``apply`` commits it alone."""
        try:
            p.flags = self._commit_one(p.session_id, p.ops)
        except BaseException as exc:
            p.flags, p.error = None, exc
            if not isinstance(exc, Exception):
                raise
        finally:
            p.done = True

    def _commit_one(self, session_id: str, ops: Sequence[Op]) -> list[bool]:
        """One batch, the whole of its group: its flags, or what ``apply`` raises."""
        try:
            with self._lock:
                self._check_identity()
                form = self._form(session_id, ops)
                if type(form) is Step or writes.one_statement(ops, ride=True):
                    # One conditional statement is a transaction of its own (autocommit): one
                    # call into SQLite instead of BEGIN, statement, COMMIT. A guard that fails
                    # in it has written nothing (its statement matched no row).
                    try:
                        flags = self._apply_batch(session_id, ops, form)
                    except SessionConflictError:
                        self.commits += 1
                        raise
                    self.commits += 1
                    return flags
                c = self._conn
                try:
                    c.execute("BEGIN IMMEDIATE")
                    flags = self._apply_batch(session_id, ops, form)
                    c.execute("COMMIT")
                except BaseException:
                    if c.in_transaction:
                        c.execute("ROLLBACK")
                    raise
                self.commits += 1
                return flags
        except sqlite3.Error as exc:
            raise self._write_error(exc) from exc

    def _write_error(self, exc: sqlite3.Error) -> StoreError:
        """What a failed write raises: a statement that checks the schema as it writes meets a
        newer one's tables first."""
        return self._newer() or translate(exc, self.url, "writing the ledger")

    def _check_schema(self) -> None:
        """A newer release may have migrated the file since it was opened (a long-lived worker
        meeting an upgrade): stop, typed, before writing rows of a schema this code does not
        know. Read on a connection of its own (about 2 µs: page 1 is cached), so the write
        connection's transaction stays the plan's statements alone — before a plan, whose
        statements do not check it, and after a straight commit's first statement, which does
        (``CHECKED``), changed no row, to tell why. A migration committed between this read
        and a plan's write is met by the next write; a straight commit leaves no such gap."""
        if self.path == ":memory:":
            return
        if self.read_only:  # no write to keep apart; and a read-write probe could write: its
            probe = self._conn  # close, the last on the file, checkpoints the WAL into it
        else:
            if self._probe is None:
                self._probe = sqlite3.connect(
                    self.path, isolation_level=None, check_same_thread=False
                )
            probe = self._probe
        version = int(probe.execute("PRAGMA user_version").fetchone()[0])
        error = too_new(version, self.url)
        if error is not None:
            raise error

    def _check_identity(self) -> None:
        """The file we opened must still be the one at our path, and so must its write-ahead
        log. SQLite writes on into a deleted (or replaced) database as if nothing happened —
        every commit "succeeding" into an inode nobody will ever open again — and into a deleted
        write-ahead log too: its commits are then in no file a next open reads, and a process
        killed before it checkpoints them loses them (a call it recorded runs again)."""
        if self._identity is None:
            return
        now = identity(self.path, self.url)  # refuses a second name made meanwhile, too
        if now != self._identity:
            what = "was deleted" if now is None else "was replaced by another file"
            raise StoreUnavailableError(
                f"{self.url}: the database file {what} while this store had it open; nothing "
                "more is written to it. Restore it (and its -wal file) from where it went, or "
                "open the store again knowing that what the old file held is lost.",
                url=self.url,
            )
        wal = _file_id(self._wal_path)
        if wal != self._wal:
            what = "was deleted" if wal is None else "was replaced by another file"
            raise StoreUnavailableError(
                f"{self.url}: its write-ahead log {self._wal_path} {what} while this store had "
                "it open; nothing more is written to it. The commits it held that are not yet "
                "in the database file are in no file another process reads, and are lost if "
                "this process is killed: close the store rather than kill the process (when it is "
                "the file's last connection, SQLite copies them into the database file as it "
                "closes), then open it again and check `toolledger in-doubt` before a run goes "
                "on.",
                url=self.url,
            )

    def read_session(self, session_id: str) -> SessionState | None:
        return self._ask("reading a session", plans.session_query(session_id, now=True))

    def read_messages(self, session_id: str, since: int = 0) -> list[StoredMessage]:
        return self._ask("reading a transcript", plans.messages_query(session_id, since))

    def read_abandoned(self, session_id: str) -> dict[int, list[StoredMessage]]:
        return self._ask("reading abandoned branches", plans.abandoned_query(session_id))

    def read_approvals(self, session_id: str | None = None) -> list[ApprovalRecord]:
        return self._ask("reading approvals", plans.approvals_query(session_id))

    def read_lease(self, session_id: str) -> Lease | None:
        return self._ask("reading a lease", plans.lease_query(session_id))

    def now(self) -> float:
        """This machine's clock: every process that opens the file shares it."""
        return time.time()

    def list_sessions(self) -> list[SessionState]:
        return self._ask("listing", plans.sessions_query(now=True))

    def in_doubt(self) -> list[EffectRecord]:
        return self._ask("listing in-doubt calls", plans.in_doubt_query())

    def integrity_check(self) -> list[str]:
        """``PRAGMA integrity_check``: an empty list when the file is sound."""
        check = plans.Query(
            "PRAGMA integrity_check", (), lambda found: [str(row[0]) for row in found]
        )
        return [v for v in self._ask("checking integrity", check) if v != "ok"]

    def session_ids(self) -> list[str]:
        return self._ask("listing sessions", plans.session_ids_query())

    def close(self) -> None:
        with self._lock:
            # Closed, a write meets the closed connection first: its files' identity says
            # nothing more (the last connection's close removes the write-ahead log).
            self._identity = None
            self._conn.close()
            if self._probe is not None:
                self._probe.close()


def _file_id(path: str) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``; ``None`` when there is none."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


def _place(path: str, url: str) -> str:
    """The database file as ``StoreCore.place`` names it: its device and inode, whatever path
    reaches it (``identity``: a second name is refused); for an in-memory database, or a file
    not made yet, a number of its own."""
    if path != ":memory:":
        try:
            st = os.stat(path)
        except OSError:
            pass
        else:
            return f"sqlite:{st.st_dev}:{st.st_ino}"
    return f"sqlite:{url}:{next(_PLACES)}"


_PLACES = itertools.count(1)
"""Numbers for an in-memory database's ``place``: each its own, never one reused."""
