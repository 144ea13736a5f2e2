"""The files of a ``json:///`` store: their names, the directory's write lock, and the two ways a
file is written — replaced whole (temporary file, fsync, rename, fsync of the directory) or
appended to (fsync) — so that a crash leaves the old bytes or the new ones, never half of them."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote

from ...errors import StoreUnavailableError
from .._url import file_url

__all__ = [
    "LOCK_FILE",
    "LOCK_TIMEOUT_S",
    "LOG_SUFFIX",
    "SUFFIX",
    "Directory",
    "file_stem",
    "legacy_stem",
]

LOCK_TIMEOUT_S = 10.0
SUFFIX = ".effects.json"
LOG_SUFFIX = ".session.jsonl"
LOCK_FILE = ".toolledger.lock"
_MAX_STEM_BYTES = 180


_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_.")


def file_stem(session_id: str) -> str:
    """A file name for any session id, and a different one for every other: lowercase letters,
    digits and ``-_.`` as they are, every other character percent-encoded (``../x`` or ``a/b``
    stay one plain name; ``A`` is ``%41``, so names differ even on a filesystem that ignores
    case), a leading ``.`` too; a name over 180 bytes is replaced by ``~`` and the id's hash
    (``~`` appears in no other name). Records carry the real id."""
    stem = "".join(
        c if c in _PLAIN else "".join(f"%{b:02X}" for b in c.encode("utf-8")) for c in session_id
    )
    if stem.startswith("."):
        stem = "%2E" + stem[1:]
    if len(stem.encode()) > _MAX_STEM_BYTES:
        stem = "~" + hashlib.sha256(session_id.encode()).hexdigest()
    return stem


def legacy_stem(session_id: str) -> str:
    """The name toolledger 0.1 gave a session's files (not injective: ``~`` and upper case were
    left as they are). Files still under it are renamed on first use."""
    stem = quote(session_id, safe="-_.")
    if stem.startswith("."):
        stem = "%2E" + stem[1:]
    if len(stem.encode()) > _MAX_STEM_BYTES:
        stem = "~" + hashlib.sha256(session_id.encode()).hexdigest()
    return stem


def _is_sqlite(path: Path) -> bool:
    """Whether ``path`` begins as a SQLite database file does (its header's first 16 bytes)."""
    try:
        with path.open("rb") as fh:
            return fh.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


class Directory:
    """The store's directory: created on open (unless ``create=False``), written by one writer
    at a time."""

    def __init__(self, directory: str, *, url: str, create: bool = True) -> None:
        self.url = url
        self.path = Path(directory)
        if self.path.exists() and not self.path.is_dir():
            where = self.path.resolve()
            if _is_sqlite(where):
                advice = f"It is a SQLite file: name it as one ({file_url('sqlite', where)})."
            else:
                made = "; a missing one is made" if create else ""
                advice = f"Name a directory (json:///relative/dir, json:////absolute/dir){made}."
            raise StoreUnavailableError(
                f"no store at {url}: {where} is a file, not a directory: a json store is a "
                f"directory of files. {advice}",
                url=url,
            )
        if not create and not self.path.is_dir():
            raise StoreUnavailableError(
                f"no store at {url}: {self.path.resolve()} does not exist. Check the URL "
                "(json:///relative/dir, json:////absolute/dir).",
                url=url,
            )
        try:
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailableError(f"cannot create {self.path}: {exc}", url=url) from exc
        self._thread_lock = threading.RLock()
        self._locking = False
        self._renamed: set[tuple[str, str]] = set()

    def named(self, session_id: str, suffix: str) -> Path:
        """The session's file; one still under its 0.1 name (and holding this session, not
        another whose old name was the same) is renamed first, under the write lock."""
        path = self.path / (file_stem(session_id) + suffix)
        if (session_id, suffix) in self._renamed:
            return path
        old = self.path / (legacy_stem(session_id) + suffix)
        if old != path and not path.exists() and old.exists():
            with self.locked():
                if not path.exists() and _session_id_inside(old) == session_id:
                    os.replace(old, path)
                    self.fsync()
        self._renamed.add((session_id, suffix))
        return path

    def session_ids(self) -> list[str]:
        """Every session with a file here, read back from the file names (or, for a hashed
        name, from the file)."""
        out: set[str] = set()
        for path in self.path.iterdir():
            name = path.name
            suffix = (
                SUFFIX
                if name.endswith(SUFFIX)
                else LOG_SUFFIX
                if name.endswith(LOG_SUFFIX)
                else None
            )
            if suffix is None or name.startswith("."):
                continue
            stem = name[: -len(suffix)]
            if stem.startswith("~"):
                found = _session_id_inside(path)
                if found is not None:
                    out.add(found)
            else:
                out.add(unquote(stem))
        return list(out)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """One writer at a time, across threads and processes (flock on ``.toolledger.lock``).
        A holder that keeps it past ``LOCK_TIMEOUT_S`` is reported, not waited on for ever."""
        with self._thread_lock:
            if self._locking:  # this thread holds it already (a rename inside a commit)
                yield
                return
            fd = os.open(self.path / LOCK_FILE, os.O_CREAT | os.O_RDWR, 0o600)
            self._locking = True
            try:
                deadline = time.monotonic() + LOCK_TIMEOUT_S
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() > deadline:
                            raise StoreUnavailableError(
                                f"{self.path / LOCK_FILE} stayed locked for "
                                f"{LOCK_TIMEOUT_S:g}s: another process holds the json store's "
                                "write lock (stuck, or stopped in a debugger)",
                                url=self.url,
                            ) from None
                        time.sleep(0.002)
                yield
            finally:
                self._locking = False
                os.close(fd)  # closing releases the flock

    def replace(self, path: Path, data: bytes) -> os.stat_result:
        """Make ``data`` the whole of ``path``, atomically and durably; returns the new file's
        stat. Call under ``locked()``."""
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self.fsync()  # make the rename itself durable
        return os.stat(path)

    def remove(self, path: Path) -> None:
        """Delete ``path`` (gone already is fine), durably. Call under ``locked()``."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self.fsync()

    def append(self, path: Path, line: bytes, *, offset: int, torn_tail: bool) -> None:
        """Write ``line`` at ``offset`` (the end of what was parsed), durably; a torn tail past
        it — a commit that never finished — is cut off first. Call under ``locked()``.

        A new file is made whole, as ``replace`` makes one: a process killed while creating it
        leaves no file at all (never an empty one, which would list a session that is not
        there).

        A line that could not be written or fsynced is taken back (``cut``): after a failed
        fsync Linux may have dropped its dirty pages and marked them clean, so a later fsync
        succeeds without them — the line is not durable, and read as a commit it would be
        built on. Sent again, it is written anew."""
        if offset == 0 and not path.exists():
            self.replace(path, line)
            return
        fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
        try:
            if torn_tail:
                os.ftruncate(fd, offset)  # drop the commit that never finished
            os.lseek(fd, offset, os.SEEK_SET)
            _write_all(fd, line)
            os.fsync(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                self.cut(path, offset)
            raise
        finally:
            os.close(fd)

    def cut(self, path: Path, offset: int) -> None:
        """Make ``path`` its first ``offset`` bytes again, durably; a file that had none is
        removed (``append`` made it whole). Call under ``locked()``.

        Written whole as a new file, not truncated in place: a reader that parsed the bytes
        being taken back knows the file by its inode, and must read it again from the start —
        past its old offset it would find the middle of a later line. On a disk too full for
        the copy it is truncated in place, which needs no space (such a reader then finds a
        line it cannot parse past its offset, and reads the file again from the start)."""
        if offset == 0:
            self.remove(path)
            return
        with open(path, "rb") as fh:
            kept = fh.read(offset)
        try:
            self.replace(path, kept)
        except OSError:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.ftruncate(fd, offset)
                os.fsync(fd)
            finally:
                os.close(fd)

    def fsync(self) -> None:
        """Make the directory's entries (a rename, a new file) durable."""
        dir_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _session_id_inside(path: Path) -> str | None:
    """The session id a hashed file name stands for, read from the file itself."""
    try:
        if path.name.endswith(LOG_SUFFIX):
            with open(path, "rb") as fh:
                found = json.loads(fh.readline())["session_id"]
        else:
            found = next(iter(json.loads(path.read_bytes()).values()))["session_id"]
    except (OSError, ValueError, StopIteration, KeyError, TypeError, AttributeError):
        return None
    return found if isinstance(found, str) else None
