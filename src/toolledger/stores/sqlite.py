"""``sqlite:///path.db`` — the default store: one file, WAL, ``synchronous=FULL``.

Every state change is one transaction whose statements are conditional (insert-if-absent,
compare-and-set), so a ``kill -9`` at any instant leaves either the old row or the new one, and
two processes on one file cannot both win the same transition. Commit cost is one WAL append and
one fsync.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from ..errors import CorruptLedgerError, SessionConflictError, StoreError, StoreUnavailableError
from ..ops import Op
from ..records import ApprovalRecord, EffectRecord, Lease, SessionState, StoredMessage
from ._sql import plans
from ._sql.plans import Outcome, Step
from ._sql.schema import SQLITE_MIGRATIONS as MIGRATIONS
from ._sql.schema import too_new
from .contract import Pending

__all__ = ["SQLiteBackend"]

T = TypeVar("T")

BUSY_TIMEOUT_MS = 10_000
WAL_AUTOCHECKPOINT_PAGES = 100


def translate(exc: sqlite3.Error, url: str, action: str) -> StoreError:
    """Map a driver error to our tree, saying what happened and what to do."""
    text = str(exc)
    low = text.lower()
    if "malformed" in low or "not a database" in low or "corrupt" in low:
        return CorruptLedgerError(
            f"{url} is damaged ({text}) while {action}. It is not read as empty: that would "
            "re-run every recorded effect. Restore it from a backup, or run "
            "`toolledger verify` to see what is readable.",
            url=url,
        )
    if "locked" in low or "busy" in low:
        return StoreUnavailableError(
            f"{url} stayed locked for {BUSY_TIMEOUT_MS // 1000}s while {action} ({text}): "
            "another process holds a long write transaction",
            url=url,
        )
    if "readonly" in low or "unable to open" in low or "disk i/o" in low or "no such" in low:
        return StoreUnavailableError(
            f"{url} cannot be used while {action}: {text}. Check that the file and its "
            "directory exist and are writable by this user.",
            url=url,
        )
    if "full" in low:
        return StoreUnavailableError(
            f"{url}: the disk is full while {action} ({text}); free space and retry", url=url
        )
    return StoreError(f"{url}: {action} failed: {text}", url=url)


class SQLiteBackend:
    durable = True

    def __init__(
        self, path: str, *, url: str, create: bool = True, read_only: bool = False
    ) -> None:
        self.url = url
        self.path = path
        self.read_only = read_only and path != ":memory:"
        if (not create or self.read_only) and path != ":memory:" and not Path(path).is_file():
            raise StoreUnavailableError(
                f"no store at {url}: {Path(path).resolve()} does not exist. Check the URL "
                "(--store or $TOOLLEDGER_STORE; sqlite:///relative.db, sqlite:////absolute.db).",
                url=url,
            )
        self._lock = threading.Lock()
        # The queue's lock is taken directly (no Condition method call per commit); only a
        # caller that must wait for a commit under way uses the condition, and only then is it
        # notified.
        self._queue_lock = threading.Lock()
        self._queue_cv = threading.Condition(self._queue_lock)
        self._queue: list[Pending] = []
        self._leading = False
        self._waiting = 0
        self.commits = 0  # physical commits (transactions), for tests and benchmarks
        if self.read_only:
            self._conn = _open_read_only(path, url)
            self._identity = None
            return
        if path != ":memory:":
            _create_owner_only(Path(path))
        try:
            self._conn = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000
            )
        except sqlite3.Error as exc:
            raise translate(exc, url, "opening") from exc
        try:
            self._identity = _identity(path, url)
            self._configure()
            self._migrate()
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
                    c.execute(f"PRAGMA user_version = {version}")
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

    def _apply_batch(self, session_id: str, ops: Sequence[Op]) -> list[bool]:
        """One batch's plan, inside whatever transaction or savepoint the caller opened. A fence
        that only checks rides one of the batch's writes (``plans.apply``): the write lock this
        connection holds from the transaction's first statement (or the autocommit statement)
        to its commit keeps a take-over out in between."""
        return plans.drive(plans.apply(session_id, ops, ride=True), self._execute)

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
            exc.url = exc.url or self.url
            raise

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

    def apply(self, session_id: str, ops: Sequence[Op]) -> list[bool]:
        """Group commit: concurrent callers (threads sharing this store, and the asyncio tasks
        of ``InlineAsync``) share one transaction and one fsync (``apply_group``)."""
        if not ops:
            return []
        me = Pending(session_id, list(ops))
        self.apply_group([me])
        if me.error is not None:
            raise me.error
        assert me.flags is not None
        return me.flags

    def apply_group(self, group: list[Pending]) -> None:
        """Commit the batches of ``group`` in one transaction, with whatever other callers are
        committing at the time (``GroupCommit``).

        A caller queues its batches. If no commit is in progress it leads: it takes every queued
        batch and applies them in one ``BEGIN IMMEDIATE`` transaction, each inside its own
        savepoint — a failed guard rolls that batch alone back and is its error — then commits
        once. Batches queued meanwhile wait for that commit, and one of their callers leads the
        next group. There is no timer: a group is what arrived during the previous fsync, so a
        lone caller pays nothing extra. Every op is still one conditional statement, evaluated
        in the queue's serial order; a batch is all or nothing; nobody is answered before the
        COMMIT that holds its batch has returned. If the COMMIT itself fails, every batch of
        the group gets the error — none of them was committed.
        """
        if not group:
            return
        first = group[0]  # a caller's batches are queued, and taken, together
        with self._queue_lock:
            self._queue.extend(group)
            while self._leading and not first.done:
                self._waiting += 1
                try:
                    self._queue_cv.wait()
                finally:
                    self._waiting -= 1
            lead = not first.done
            if lead:
                self._leading = True
                taken, self._queue = self._queue, []
        if lead:
            try:
                self._commit_group(taken)
            finally:
                with self._queue_lock:
                    self._leading = False
                    if self._waiting:
                        self._queue_cv.notify_all()

    def _commit_group(self, group: list[Pending]) -> None:
        try:
            with self._lock:
                c = self._conn
                self._check_identity()
                if len(group) == 1 and plans.one_statement(group[0].ops, ride=True):
                    # One conditional statement is a transaction of its own (autocommit): one
                    # call into SQLite instead of BEGIN, statement, COMMIT. A guard that fails
                    # in it has written nothing (its statement matched no row).
                    p = group[0]
                    try:
                        p.flags = self._apply_batch(p.session_id, p.ops)
                    except SessionConflictError as exc:
                        p.flags, p.error = None, exc
                    self.commits += 1
                    return
                try:
                    c.execute("BEGIN IMMEDIATE")
                    for p in group:
                        if len(group) > 1:
                            c.execute("SAVEPOINT batch")
                        try:
                            p.flags = self._apply_batch(p.session_id, p.ops)
                        except SessionConflictError as exc:
                            if len(group) == 1:
                                raise
                            c.execute("ROLLBACK TO batch")
                            p.flags, p.error = None, exc
                        if len(group) > 1:
                            c.execute("RELEASE batch")
                    c.execute("COMMIT")
                    self.commits += 1
                except BaseException:
                    if c.in_transaction:
                        c.execute("ROLLBACK")
                    raise
        except sqlite3.Error as exc:
            error = translate(exc, self.url, "writing the ledger")
            error.__cause__ = exc
            for p in group:
                p.flags, p.error = None, error
        except BaseException as exc:
            for p in group:
                p.flags, p.error = None, exc
            if not isinstance(exc, Exception):
                raise
        finally:
            for p in group:
                p.done = True

    def _check_identity(self) -> None:
        """The file we opened must still be the one at our path. SQLite writes on into a
        deleted (or replaced) database as if nothing happened — every commit "succeeding" into
        an inode nobody will ever open again."""
        if self._identity is None:
            return
        now = _identity(self.path, self.url)  # refuses a second name made meanwhile, too
        if now != self._identity:
            what = "was deleted" if now is None else "was replaced by another file"
            raise StoreUnavailableError(
                f"{self.url}: the database file {what} while this store had it open; nothing "
                "more is written to it. Restore it (and its -wal file) from where it went, or "
                "open the store again knowing that what the old file held is lost.",
                url=self.url,
            )

    def read_session(self, session_id: str) -> SessionState | None:
        return self._ask("reading a session", plans.session_query(session_id))

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
        return self._ask("listing", plans.sessions_query())

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
            self._conn.close()


def _open_read_only(path: str, url: str) -> sqlite3.Connection:
    """A connection that cannot write, for the commands that only look (a store on read-only
    media, a bind mount, a copy owned by someone else).

    ``mode=ro`` first: it reads the write-ahead log, so it sees every commit, but SQLite needs
    the ``-shm`` file (or a directory it may create it in). Where that fails and there is no WAL
    to read — a checkpointed file — ``immutable=1`` reads the file alone, with no locks; with a
    WAL holding commits it would miss them, so then it is an error that says why. The schema
    is never migrated: a store older than this release is copied into memory and the copy
    migrated; a newer one is refused (``SchemaVersionError``).
    """
    target = quote(os.path.abspath(path))
    wal = Path(f"{path}-wal")
    try:
        conn = sqlite3.connect(
            f"file:{target}?mode=ro", uri=True, isolation_level=None, check_same_thread=False,
            timeout=BUSY_TIMEOUT_MS / 1000,
        )  # fmt: skip
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    except sqlite3.Error as exc:
        if wal.exists() and wal.stat().st_size > 0:
            raise StoreUnavailableError(
                f"{url} cannot be read without write access ({exc}): its write-ahead log "
                f"{wal} holds commits not yet in the database file, and SQLite reads them "
                "only with a -shm file it can create. Open it once as a user who may write "
                "there (any command that writes checkpoints it), or copy the files somewhere "
                "writable.",
                url=url,
            ) from exc
        try:
            conn = sqlite3.connect(
                f"file:{target}?immutable=1", uri=True, isolation_level=None,
                check_same_thread=False,
            )  # fmt: skip
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        except sqlite3.Error as exc2:
            raise translate(exc2, url, "opening read-only") from exc2
    error = too_new(version, url)
    if error is not None:
        conn.close()
        raise error
    if version < len(MIGRATIONS):
        # Written by an earlier release: read a migrated copy in memory, never touch the file.
        copy = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        try:
            conn.backup(copy)
            for migration in MIGRATIONS[version:]:
                copy.executescript(migration)
            copy.execute(f"PRAGMA user_version = {len(MIGRATIONS)}")
        except sqlite3.Error as exc:
            copy.close()
            raise translate(exc, url, "reading an older store") from exc
        finally:
            conn.close()
        return copy
    return conn


def _identity(path: str, url: str) -> tuple[int, int] | None:
    """(device, inode) of the database file; ``None`` for ``:memory:`` or a missing file.

    A file that has another name (a hard link) is refused: SQLite keeps its WAL and lock files
    beside the name it was opened by, so two names are two ledgers that do not see each other's
    last commits — and a call recorded under one runs again under the other.
    """
    if path == ":memory:":
        return None
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    if st.st_nlink > 1:
        raise StoreUnavailableError(
            f"{url}: the database file has {st.st_nlink} names (hard links). SQLite keeps its "
            "write-ahead log beside the name it was opened by, so processes opening it by "
            "different names would not see each other's latest records. Remove the extra "
            "link and use one path (a symbolic link is fine).",
            url=url,
        )
    return (st.st_dev, st.st_ino)


def _create_owner_only(path: Path) -> None:
    """Create the database file 0600 (and a missing directory 0700) before SQLite does, so the
    ledger — which holds tool inputs and results — is never readable by other users. SQLite
    gives its -wal and -shm files the database file's permissions."""
    if path.exists():
        return
    parent = path.parent
    if not parent.exists():
        parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return
    except OSError as exc:
        raise StoreUnavailableError(f"cannot create {path}: {exc}", url=str(path)) from exc
    os.close(fd)
