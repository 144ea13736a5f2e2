"""The format version of a ``json:///`` store: ``.toolledger-format`` in its directory.

``{"format": N, "written_by": "toolledger X.Y.Z"}``. A directory without the file was written by
a release before 0.2 (format 1): it reads as it is, and the first store opened on it that may
write records format 2 there. A store whose format is newer than this release knows is refused
on opening — and by a worker that meets it mid-run (a newer release upgraded the directory while
it ran), on its next write or on a line it cannot read — with ``SchemaVersionError``: "written
by a newer toolledger — upgrade". Never "corrupt": moving such a file aside would re-run every
call it records.

A directory that holds files and none of toolledger's — no format file, no write lock, no
ledger or log file — is somebody else's, and is refused on opening (``refuse_foreign``) before
anything is written to it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ...errors import CorruptLedgerError, SchemaVersionError, StoreUnavailableError
from ._files import LOCK_FILE, LOG_SUFFIX, SUFFIX

__all__ = ["FORMAT", "FORMAT_FILE", "Format", "format_file", "refuse_foreign", "too_new"]

FORMAT = 2
"""The newest format this release reads, and the one it writes. 1: toolledger 0.1 (no file)."""
FORMAT_FILE = ".toolledger-format"


class Format:
    """The directory's format file, read again only when it changes (one ``stat`` a check)."""

    def __init__(self, directory: Path, url: str) -> None:
        self.path = directory / FORMAT_FILE
        self.url = url
        self._seen: tuple[int, int, int] | None = None
        self.version = 1

    def read(self) -> int:
        """The directory's format now (1 when the file is missing). A file that cannot be read,
        or read as a format, is an error: read as 1, it would be written over with this
        release's format — and a newer release's directory written by this one."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._seen, self.version = None, 1
            return 1
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key != self._seen:
            try:
                data = self.path.read_bytes()
            except FileNotFoundError:
                self._seen, self.version = None, 1
                return 1
            except OSError as exc:
                raise StoreUnavailableError(
                    f"{self.url}: cannot read its format file {self.path}: {exc}. Check that it "
                    "is readable by this user.",
                    url=self.url,
                ) from exc
            try:
                raw = json.loads(data)
                version = int(raw["format"])
            except (ValueError, KeyError, TypeError) as exc:
                raise CorruptLedgerError(
                    f"{self.url}: its format file {self.path} ({len(data)} bytes) is damaged "
                    f"({type(exc).__name__}: {exc}). It says which toolledger wrote the "
                    "directory, and is not guessed: a newer release's store written by this "
                    "one could lose what it records. Nothing was read or written. Restore it "
                    "from a backup; or, if no toolledger newer than this one has written here, "
                    "remove it: the next open writes it again.",
                    url=self.url,
                    path=str(self.path),
                ) from exc
            self._seen, self.version = key, version
        return self.version

    def check(self) -> None:
        """Raise ``SchemaVersionError`` if a newer toolledger wrote the directory."""
        version = self.read()
        if version > FORMAT:
            raise too_new(version, self.url)

    def newer(self) -> SchemaVersionError | None:
        """The error to raise instead of "corrupt" for a file this release cannot read, when the
        directory is of a newer format."""
        version = self.read()
        return too_new(version, self.url) if version > FORMAT else None

    def stamp(self) -> bool:
        """Whether the directory needs ``data`` written as its format file (it is older)."""
        return self.read() < FORMAT


def refuse_foreign(directory: Path, url: str) -> None:
    """Raise ``StoreUnavailableError`` if ``directory`` holds files of its own and none of
    toolledger's, before the first write stamps it as a store. A store of 0.1 has no format file
    but has its lock file (every write takes it) or its ledger and log files, so it passes; so
    does an empty directory, or one holding only hidden files (``.gitkeep``, ``.DS_Store``).
    Stops at the first file of ours: an old store with many sessions costs one entry or few."""
    if (directory / FORMAT_FILE).exists():
        return
    theirs: list[str] = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name == LOCK_FILE or entry.name.endswith((SUFFIX, LOG_SUFFIX)):
                return
            if not entry.name.startswith("."):
                theirs.append(entry.name)
    if not theirs:
        return
    shown = ", ".join(repr(name) for name in sorted(theirs)[:3])
    raise StoreUnavailableError(
        f"{url} is not a toolledger store: {directory.resolve()} holds files of its own "
        f"({shown}{', ...' if len(theirs) > 3 else ''}) and none of toolledger's (no "
        f"{FORMAT_FILE}). Nothing was written to it. Point the store URL (--store, "
        "$TOOLLEDGER_STORE) at the ledger's directory, or at a new or empty one for a new "
        "ledger.",
        url=url,
    )


def too_new(version: int, url: str) -> SchemaVersionError:
    return SchemaVersionError(
        f"{url} was written by a newer toolledger — upgrade: its format is {version}, and "
        f"this release reads up to {FORMAT}. Nothing was read or written. (It is not damaged: "
        "do not move its files aside, which would re-run every call they record.)",
        url=url,
    )


def format_file(release: str) -> bytes:
    return (json.dumps({"format": FORMAT, "written_by": f"toolledger {release}"}) + "\n").encode()
