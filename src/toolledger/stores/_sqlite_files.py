"""The SQLite store's file: created owner-only, known by its identity (device, inode), and
opened for the commands that only look — without writing, without migrating."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

from ..errors import CorruptLedgerError, StoreError, StoreUnavailableError
from ._sql.schema import SQLITE_MIGRATIONS as MIGRATIONS
from ._sql.schema import sqlite_versioned, too_new

__all__ = [
    "BUSY_TIMEOUT_S",
    "CommitWatch",
    "connect_read_only",
    "create_owner_only",
    "identity",
    "open_read_only",
    "refuse_foreign",
    "translate",
]

BUSY_TIMEOUT_S = 10

OUR_FIRST_TABLE = "effects"
"""The table schema 1 creates: every toolledger store from then on holds it."""

# One statement, so the version and the tables come from one snapshot: read in two, a store
# another process is creating could show schema 0 and then its freshly committed tables.
_CONTENTS = (
    "SELECT (SELECT user_version FROM pragma_user_version), name FROM sqlite_master "
    "WHERE type IN ('table', 'view') ORDER BY name"
)


def translate(exc: sqlite3.Error, url: str, action: str) -> StoreError:
    """Map a driver error to our tree, saying what happened and what to do."""
    text = str(exc)
    low = text.lower()
    if "not a database" in low:  # its first bytes are not SQLite's: a ledger's, or no ledger
        return CorruptLedgerError(
            f"{url} is damaged, or names a file that is no toolledger store ({text}), while "
            f"{action}. It is not read as empty: that would re-run every recorded effect. If the "
            "URL names another file, point --store or $TOOLLEDGER_STORE at the ledger's file; if "
            "it is the ledger, restore it from a backup, or run `toolledger verify` to see what "
            "is readable.",
            url=url,
        )
    if "malformed" in low or "corrupt" in low:
        return CorruptLedgerError(
            f"{url} is damaged ({text}) while {action}. It is not read as empty: that would "
            "re-run every recorded effect. Restore it from a backup, or run "
            "`toolledger verify` to see what is readable.",
            url=url,
        )
    if "locked" in low or "busy" in low:
        return StoreUnavailableError(
            f"{url} stayed locked for {BUSY_TIMEOUT_S}s while {action} ({text}): "
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


def refuse_foreign(conn: sqlite3.Connection, path: str, url: str) -> None:
    """Raise ``StoreUnavailableError`` if the file is some other application's database: it
    holds tables or views, and no toolledger schema (version 0, or no ``effects`` table). A
    toolledger store is never at version 0 with tables — each migration commits with its
    version — so this refuses no store of ours, of any release. Called before anything is
    written (switching to WAL rewrites the file's header) and before the version is judged (a
    foreign ``user_version`` would read as a newer toolledger). An empty or new file passes: it
    becomes a store."""
    rows = conn.execute(_CONTENTS).fetchall()
    names = [str(name) for _, name in rows]
    if not rows or (int(rows[0][0]) > 0 and OUR_FIRST_TABLE in names):
        return
    shown = ", ".join(repr(name) for name in names[:3]) + (", ..." if len(names) > 3 else "")
    raise StoreUnavailableError(
        f"{url} is not a toolledger store: {Path(path).resolve()} is an SQLite database that "
        f"holds tables of its own ({shown}) and none of toolledger's. Nothing was written to "
        "it. Point the store URL (--store, $TOOLLEDGER_STORE) at the ledger's file, or at a "
        "new path for a new ledger.",
        url=url,
    )


def connect_read_only(path: str, *, busy_timeout_ms: int) -> sqlite3.Connection:
    """The file at ``path``, ``mode=ro``: a connection that reads every commit, its write-ahead
    log's too, and cannot write."""
    conn = sqlite3.connect(
        f"file:{quote(os.path.abspath(path))}?mode=ro", uri=True, isolation_level=None,
        check_same_thread=False, timeout=busy_timeout_ms / 1000,
    )  # fmt: skip
    conn.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
    return conn


class CommitWatch:
    """Whether anything was committed to the SQLite file at ``path`` since an earlier look:
    ``PRAGMA data_version`` on a read-only connection of its own moves with every commit
    another connection makes — whatever the file system's clock, wherever the write-ahead log
    is (beside the file a link names) — and the file's identity tells one replaced (renamed
    over) from the one that connection reads. (The console keeps a migrated copy of an earlier
    release's store while it says nothing changed.)"""

    def __init__(self, path: str, *, busy_timeout_ms: int) -> None:
        self.path = os.path.realpath(path)
        self.conn = connect_read_only(self.path, busy_timeout_ms=busy_timeout_ms)

    def now(self) -> tuple[int, int, int] | None:
        """The file's identity and data version; ``None`` when either cannot be read."""
        try:
            st = os.stat(self.path)
            (version,) = self.conn.execute("PRAGMA data_version").fetchone()
        except (OSError, sqlite3.Error):
            return None
        return (st.st_dev, st.st_ino, int(version))

    def close(self) -> None:
        self.conn.close()


def open_read_only(path: str, url: str, *, busy_timeout_ms: int) -> sqlite3.Connection:
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
        conn = connect_read_only(path, busy_timeout_ms=busy_timeout_ms)
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
    try:
        refuse_foreign(conn, path, url)
    except sqlite3.Error as exc:
        conn.close()
        raise translate(exc, url, "opening read-only") from exc
    except BaseException:
        conn.close()
        raise
    error = too_new(version, url)
    if error is not None:
        conn.close()
        raise error
    if version < len(MIGRATIONS):
        # Written by an earlier release: read a migrated copy in memory, never touch the file.
        copy = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        try:
            conn.backup(copy)
            for done, migration in enumerate(MIGRATIONS[version:], start=version + 1):
                copy.executescript(migration)
                for statement in sqlite_versioned(done):
                    copy.execute(statement)
            # Read-only as the file is: a write the copy took would be lost when it is closed.
            copy.execute("PRAGMA query_only = ON")
        except sqlite3.Error as exc:
            copy.close()
            raise translate(exc, url, "reading an older store") from exc
        finally:
            conn.close()
        return copy
    return conn


def identity(path: str, url: str) -> tuple[int, int] | None:
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


def create_owner_only(path: Path) -> None:
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
