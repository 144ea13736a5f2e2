"""``JSONBackend``: a session's ledger and log read (and cached) from its files, a batch of
operations evaluated by ``_document.apply_ops`` on a draft, and what changed written back under
the directory's lock, in the order that leaves a state a resume reads right if the process dies
between the two files:

* outcomes: the ledger first, then the log line (the checkpoint that reports them);
* a checkpoint with the intents of the calls it names (checkpoint A with its one call's): the
  log line first, then the ledger — and the line is cut off again if the ledger cannot be
  written; any other intent goes to the ledger first (an approval is never used without the
  intent that uses it up);
* a batch that creates the session together with records: the log line first, carrying the
  records (it is the commit point), then the ledger."""

from __future__ import annotations

import contextlib
import copy
import os
import time
from collections.abc import Sequence
from pathlib import Path

from ...errors import CorruptLedgerError, StoreError, StoreUnavailableError
from ...ops import AppendMessages, DropSession, InsertEffect, Op, PutSession, UpdateEffect
from ...records import ApprovalRecord, EffectRecord, Lease, SessionState, Status, StoredMessage
from .._document import SessionData, apply_ops
from ._codec import (
    LEDGER_DAMAGE,
    LOG_DAMAGE,
    Log,
    log_entry,
    log_line,
    read_ledger,
    read_log_line,
    record_line,
)
from ._files import LOG_SUFFIX, SUFFIX, Directory
from ._format import Format, format_file, refuse_foreign

__all__ = ["JSONBackend"]

_RESTORE_HINT = (
    "It is not read as empty: that would re-run every effect it records. Restore the file from "
    "a backup; or, knowing that every call it records may then run again, move it aside."
)


class JSONBackend:
    durable = True
    shared_clock = False  # each machine's own clock: leases are judged by watching them

    def __init__(
        self, directory: str, *, url: str, create: bool = True, read_only: bool = False
    ) -> None:
        self.url = url
        self.read_only = read_only
        self._files = Directory(directory, url=url, create=create)
        self.dir = self._files.path
        found = self.dir.stat()  # the directory, whatever path reaches it (``StoreCore.place``)
        self.place = f"json:{found.st_dev}:{found.st_ino}"
        refuse_foreign(self.dir, url)  # before the format file is written below
        self._format = Format(self.dir, url)
        self._format.check()
        if create and self._format.stamp():
            from ..._version import __version__

            try:
                with self._files.locked():
                    if self._format.stamp():
                        self._files.replace(self._format.path, format_file(__version__))
            except OSError as exc:
                if isinstance(exc, StoreError):
                    raise
                raise StoreUnavailableError(
                    f"cannot write {self._format.path}: {exc}. Free space, or check that the "
                    "directory is writable by this user, and open the store again.",
                    url=url,
                ) from exc
        # Parsed ledgers by path, valid while (inode, mtime, size) is unchanged, with the
        # session they were parsed for (a file is only ever read as that session's).
        self._cache: dict[Path, tuple[tuple[int, int, int], str, dict[str, EffectRecord]]] = {}
        self._logs: dict[Path, Log] = {}
        # Encoded lines of the last write, by path: (record, its line).
        self._lines: dict[Path, dict[str, tuple[EffectRecord, bytes]]] = {}

    def path_of(self, session_id: str) -> Path:
        return self._files.named(session_id, SUFFIX)

    def log_path_of(self, session_id: str) -> Path:
        return self._files.named(session_id, LOG_SUFFIX)

    # -- reading the ledger ----------------------------------------------------------------------

    def _load(self, session_id: str) -> dict[str, EffectRecord]:
        path = self.path_of(session_id)
        try:
            with open(path, "rb") as fh:
                st = os.fstat(fh.fileno())
                key = (st.st_ino, st.st_mtime_ns, st.st_size)
                cached = self._cache.get(path)
                if cached is not None and cached[0] == key and cached[1] == session_id:
                    return cached[2]
                data = fh.read()
        except FileNotFoundError:
            # A missing ledger is an empty one (docs/design.md, rule 5) — unless the line creating
            # the session carried its records, and the process died before it wrote the file.
            inline = self._load_log(session_id).records
            return {} if inline is None else inline
        except OSError as exc:
            raise StoreUnavailableError(f"cannot read {path}: {exc}", url=self.url) from exc
        try:
            records = read_ledger(data, session_id)
        except LEDGER_DAMAGE as exc:
            raise self._corrupt(path, len(data), session_id, exc) from exc
        self._cache[path] = (key, session_id, records)
        return records

    def _corrupt(self, path: Path, size: int, session_id: str, exc: BaseException) -> StoreError:
        newer = self._format.newer()  # a newer release's file, not a damaged one
        if newer is not None:
            return newer
        return CorruptLedgerError(
            f"ledger file {path} ({size} bytes) is corrupt or truncated: {exc}. " + _RESTORE_HINT,
            url=self.url,
            path=str(path),
            session_id=session_id,
        )

    def read_effects(
        self, session_id: str, tool_use_ids: Sequence[str] | None = None
    ) -> dict[str, EffectRecord]:
        records = self._load(session_id)
        if tool_use_ids is None:
            return dict(records)
        return {i: records[i] for i in tool_use_ids if i in records}

    def read_effect_ids(self, session_id: str) -> list[str]:
        return list(self._load(session_id))

    # -- reading the session log -----------------------------------------------------------------

    def _load_log(self, session_id: str) -> Log:
        """The session log, parsed incrementally: an append-only file is only read past the
        point already parsed."""
        path = self.log_path_of(session_id)
        try:
            fh = open(path, "rb")  # noqa: SIM115 - closed below, after an fstat on it
        except FileNotFoundError:
            return Log(ino=0, offset=0, torn_tail=False)
        except OSError as exc:
            raise StoreUnavailableError(f"cannot read {path}: {exc}", url=self.url) from exc
        with fh:
            st = os.fstat(fh.fileno())
            log = self._logs.get(path)
            if log is None or log.ino != st.st_ino or st.st_size < log.offset:
                log = Log(ino=st.st_ino, offset=0, torn_tail=False)
            if st.st_size == log.offset and not log.torn_tail:
                return log
            fh.seek(log.offset)
            data = fh.read()
        lines = data.split(b"\n")
        tail = lines.pop()  # after the last newline: empty, or a commit that never finished
        log = copy.copy(log)
        log.messages = list(log.messages)
        log.approvals = dict(log.approvals)
        log.abandoned = dict(log.abandoned)
        for number, line in enumerate(lines):
            try:
                read_log_line(log, line, session_id)
            except LOG_DAMAGE as exc:
                if log.offset > 0 and number == 0 and path in self._logs:
                    # Read from where an earlier read stopped: the line there may have been
                    # taken back in place (``Directory.cut`` on a full disk) and a later one
                    # written over it. Read the whole file again before calling it damaged.
                    del self._logs[path]
                    return self._load_log(session_id)
                newer = self._format.newer()  # a newer release's line, not a damaged one
                if newer is not None:
                    raise newer from exc
                raise CorruptLedgerError(
                    f"session log {path} is corrupt at line {number + 1} past byte "
                    f"{log.offset}: {exc}. " + _RESTORE_HINT,
                    url=self.url,
                    path=str(path),
                    session_id=session_id,
                ) from exc
            log.offset += len(line) + 1
        log.torn_tail = bool(tail)
        self._logs[path] = log
        return log

    def read_session(self, session_id: str) -> SessionState | None:
        return self._load_log(session_id).state

    def read_messages(self, session_id: str, since: int = 0) -> list[StoredMessage]:
        return copy.deepcopy(self._load_log(session_id).messages[since:])

    def read_abandoned(self, session_id: str) -> dict[int, list[StoredMessage]]:
        branches = self._load_log(session_id).abandoned
        return copy.deepcopy({n: list(ms) for n, ms in sorted(branches.items())})

    def read_lease(self, session_id: str) -> Lease | None:
        return self._load_log(session_id).lease

    def now(self) -> float:
        """This machine's clock: every process that opens the directory shares it."""
        return time.time()

    def read_approvals(self, session_id: str | None = None) -> list[ApprovalRecord]:
        ids = [session_id] if session_id is not None else self.session_ids()
        return [a for sid in ids for a in self._load_log(sid).approvals.values()]

    def list_sessions(self) -> list[SessionState]:
        states = (self._load_log(sid).state for sid in self.session_ids())
        return [s for s in states if s is not None]

    def session_ids(self) -> list[str]:
        return self._files.session_ids()

    def in_doubt(self) -> list[EffectRecord]:
        return [
            r
            for sid in self.session_ids()
            for r in self._load(sid).values()
            if r.status is Status.STARTED
        ]

    # -- writing ---------------------------------------------------------------------------------

    def apply(self, session_id: str, ops: Sequence[Op]) -> list[bool]:
        if not ops:
            return []
        if self.read_only:
            raise StoreUnavailableError(
                f"{self.url} was opened read-only: nothing is written to it. Open it without "
                "read_only to write.",
                url=self.url,
            )
        try:
            with self._files.locked():
                self._format.check()  # a newer release may have upgraded it meanwhile
                effects = self._load(session_id)
                log = self._load_log(session_id)
                stored = SessionData(
                    effects, log.state, log.messages, log.approvals, log.lease, log.abandoned
                )
                draft = stored.draft()
                out = apply_ops(session_id, draft, ops)  # raises on a failed guard: nothing written
                if any(isinstance(op, DropSession) for op in ops):
                    self._drop(session_id)
                    return out
                records = any(ok for op, ok in zip(ops, out, strict=True) if _is_effect(op))
                if records and self._creates(session_id, log.state, ops):
                    # The log line is the commit point: it carries the records, then the file
                    # is written from them (a crash between the two reads them from the line).
                    # The file failing (a full disk) does not undo the commit: the records are
                    # read from the line until the next write makes the file.
                    self._log(session_id, log, ops, out, draft, records=draft.effects)
                    with contextlib.suppress(OSError):
                        self._write(session_id, draft.effects)
                    return out
                if records and _intents(ops, out):
                    # Intents, and the checkpoint that names their calls (a turn's one call
                    # rides in checkpoint A): the log line first. Killed between the two, the
                    # calls are in the transcript with no record — they never ran, and run on
                    # resume — never records of calls the transcript does not hold.
                    if self._log(session_id, log, ops, out, draft):
                        self._write_after(session_id, log, draft.effects, before=effects)
                    else:
                        self._write(session_id, draft.effects)
                    return out
                if records:
                    # Outcomes first, then the checkpoint that reports them: killed between
                    # the two, the records answer the calls on resume.
                    self._write(session_id, draft.effects)
                self._log(session_id, log, ops, out, draft)
        except OSError as exc:
            if isinstance(exc, StoreError):
                raise
            raise StoreUnavailableError(
                f"cannot write the ledger of {session_id!r} in {self.dir}: {exc}", url=self.url
            ) from exc
        return out

    def _creates(self, session_id: str, state: SessionState | None, ops: Sequence[Op]) -> bool:
        """Whether the batch creates the session (it had no state) while no ledger file exists:
        then writing the ledger first could leave records of a session that never was."""
        return (
            state is None
            and any(isinstance(op, PutSession) and op.expect_version is None for op in ops)
            and not self.path_of(session_id).exists()
        )

    def _log(
        self,
        session_id: str,
        log: Log,
        ops: Sequence[Op],
        out: list[bool],
        draft: SessionData,
        *,
        records: dict[str, EffectRecord] | None = None,
    ) -> bool:
        """Append the batch's log line, if it changed anything the log holds (``True``)."""
        entry = log_entry(
            session_id,
            ops,
            out,
            draft,
            state_changed=draft.state is not log.state,
            lease_changed=draft.lease is not log.lease,
            records=records,
        )
        if entry is not None:
            path = self.log_path_of(session_id)
            line = log_line(entry)
            self._files.append(path, line, offset=log.offset, torn_tail=log.torn_tail)
            self._load_log(session_id)  # advance the parsed view past our own line
            return True
        return False

    def _write_after(
        self,
        session_id: str,
        log: Log,
        records: dict[str, EffectRecord],
        *,
        before: dict[str, EffectRecord],
    ) -> None:
        """Write the ledger after the log line just appended past ``log``; if it cannot be
        written, take the line back: a commit lands whole or not at all. The ledger may have
        been renamed into place before the failure (its directory's fsync failed): then it is
        put back to ``before`` first — else the line taken back would leave records of calls
        the transcript does not hold, and the session would be refused as behind its ledger.
        (If even that fails, the line stays: calls in the transcript with no record, which
        never ran — or, with the new ledger in place, intents of calls that did not run, which
        a later run finds in doubt and never runs silently.)"""
        path = self.path_of(session_id)
        was = _inode(path)
        try:
            self._write(session_id, records)
        except BaseException:
            log_path = self.log_path_of(session_id)
            self._logs.pop(log_path, None)
            with contextlib.suppress(OSError):
                if _inode(path) != was:
                    self._put_back(session_id, before, existed=was is not None)
                self._files.cut(log_path, log.offset)
            raise

    def _put_back(
        self, session_id: str, records: dict[str, EffectRecord], *, existed: bool
    ) -> None:
        """Make the ledger hold ``records`` again (no file, if there was none)."""
        path = self.path_of(session_id)
        self._cache.pop(path, None)
        self._lines.pop(path, None)
        if existed:
            self._write(session_id, records)
        else:
            self._files.remove(path)

    def _drop(self, session_id: str) -> None:
        """Remove a session's two files: the log first, so that a crash between the two leaves
        the ledger — a session of records alone, which a later prune removes — and never a
        transcript whose calls have lost their records."""
        for path in (self.log_path_of(session_id), self.path_of(session_id)):
            self._files.remove(path)
            self._cache.pop(path, None)
            self._logs.pop(path, None)
            self._lines.pop(path, None)

    def _write(self, session_id: str, records: dict[str, EffectRecord]) -> None:
        path = self.path_of(session_id)
        # One record per line, each encoded once: a record that did not change since the last
        # write is the same object, and its line is reused. The whole file is still rewritten
        # (the brief's design), but not re-encoded.
        old = self._lines.get(path, {})
        lines = {
            tid: cached[1]
            if (cached := old.get(tid)) is not None and cached[0] is r
            else record_line(tid, r)
            for tid, r in records.items()
        }
        data = b"{\n" + b",\n".join(line for line in lines.values()) + b"\n}\n"
        st = self._files.replace(path, data)
        self._cache[path] = ((st.st_ino, st.st_mtime_ns, st.st_size), session_id, records)
        self._lines[path] = {tid: (records[tid], line) for tid, line in lines.items()}

    def close(self) -> None:
        self._cache.clear()
        self._logs.clear()
        self._lines.clear()


def _inode(path: Path) -> int | None:
    """The file's inode (a file replaced whole gets a new one), or ``None`` if there is none."""
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _is_effect(op: Op) -> bool:
    return isinstance(op, (InsertEffect, UpdateEffect))


def _intents(ops: Sequence[Op], out: list[bool]) -> bool:
    """Whether the batch is a checkpoint with the intents of calls it names: it appends
    messages, and every record it wrote is a new intent (``started``), no outcome. (An intent
    without messages keeps the ledger first: the approval it uses up, say, is never used without
    it.)"""
    return any(isinstance(op, AppendMessages) for op in ops) and all(
        isinstance(op, InsertEffect) and op.record.status is Status.STARTED
        for op, ok in zip(ops, out, strict=True)
        if ok and _is_effect(op)
    )
