"""``json:///dir`` — the brief's ``effects.json``: one human-readable file per session.

Each file maps ``tool_use_id`` to a record (``{name, result, at, status, …}``) and is rewritten
*whole* for every state change: written to a temporary file, fsynced, renamed over the old one,
and the directory fsynced. A crash leaves the old file or the new one, never half of one.

The cost grows with the session: a rewrite per record is fine for tens or hundreds of calls and
for reading by eye, not for long sessions (use ``sqlite:///``). Every record carries a digest of
its fields, so truncation, a flipped byte or a hand edit is detected and raised as
``CorruptLedgerError`` — never read as an empty ledger, which would re-run every effect.

An agent session adds ``<session>.session.jsonl``: its checkpoints, one line per commit (state,
appended messages, approvals), append-only, each line with a digest. Appending keeps a
checkpoint's cost flat however long the conversation; a last line without its newline is a commit
that never finished (its fsync never returned) and is ignored, and anything else that does not
check out is ``CorruptLedgerError``. A commit that touches both files writes the ledger first, so
a crash between the two leaves a recorded effect whose checkpoint is missing — which a resume
answers from the ledger — never the reverse.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import hashlib
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from ..codec import canonical_json
from ..errors import CorruptLedgerError, StoreError, StoreUnavailableError
from ..ops import AppendMessages, InsertEffect, Op, PutApproval, UpdateEffect
from ..records import (
    ApprovalRecord,
    ApprovalStatus,
    EffectRecord,
    Holder,
    Lease,
    RunStatus,
    SessionState,
    Status,
    StoredMessage,
    history_from_json,
    history_json,
)
from ._document import SessionData, apply_ops

__all__ = ["JSONBackend"]

LOCK_TIMEOUT_S = 10.0
SUFFIX = ".effects.json"
LOG_SUFFIX = ".session.jsonl"
_MAX_STEM_BYTES = 180

_RESTORE_HINT = (
    "It is not read as empty: that would re-run every effect it records. Restore the file from "
    "a backup; or, knowing that every call it records may then run again, move it aside."
)


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


def _digest(fields: dict[str, Any]) -> str:
    body = {k: v for k, v in fields.items() if k != "digest"}
    return hashlib.sha256(canonical_json(body).encode("ascii")).hexdigest()[:32]


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="microseconds")


def _to_json(record: EffectRecord) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": record.tool,
        "result": None if record.result is None else json.loads(record.result),
        "at": _iso(record.updated_at),
        "status": record.status.value,
        "session_id": record.session_id,
        "input_hash": record.input_hash,
        "attempt": record.attempt,
        "error": record.error,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "approved_by": record.approved_by,
        "worker": record.worker,
    }
    # Written only when set, so a record without them reads exactly as toolledger 0.1 wrote it.
    if record.holder is not None:
        out["holder"] = record.holder.text()
    if record.lease_token is not None:
        out["lease_token"] = record.lease_token
    if record.deadline is not None:
        out["deadline"] = record.deadline
    if record.history:
        out["history"] = history_json(record.history)
    out["digest"] = _digest({**out, "tool_use_id": record.tool_use_id})
    return out


class _Damaged(Exception):
    pass


def _from_json(tool_use_id: str, raw: Any) -> EffectRecord:
    if not isinstance(raw, dict):
        raise _Damaged(f"record {tool_use_id!r} is not an object")
    if raw.get("digest") != _digest({**raw, "tool_use_id": tool_use_id}):
        raise _Damaged(f"record {tool_use_id!r} does not match its digest")
    try:
        result = raw["result"]
        return EffectRecord(
            session_id=raw["session_id"],
            tool_use_id=tool_use_id,
            tool=raw["name"],
            input_hash=raw["input_hash"],
            status=Status(raw["status"]),
            attempt=int(raw["attempt"]),
            result=None if result is None else _dumps(result),
            error=raw["error"],
            created_at=float(raw["created_at"]),
            updated_at=float(raw["updated_at"]),
            approved_by=raw["approved_by"],
            worker=raw["worker"],
            holder=Holder.parse(raw.get("holder")),
            lease_token=None if raw.get("lease_token") is None else int(raw["lease_token"]),
            deadline=None if raw.get("deadline") is None else float(raw["deadline"]),
            history=history_from_json(raw.get("history")),
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise _Damaged(f"record {tool_use_id!r} is incomplete ({exc!r})") from exc


def _dumps(value: Any) -> str:
    # The same encoding codec.encode_result used, so the text (and the model's content) matches.
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(value, ensure_ascii=True, allow_nan=False)
    return text


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Damaged(f"key {key!r} appears twice")
        out[key] = value
    return out


@dataclass
class _Log:
    """What a session log holds, parsed up to ``offset`` bytes of file ``ino``."""

    ino: int
    offset: int
    torn_tail: bool
    state: SessionState | None = None
    messages: list[StoredMessage] = field(default_factory=list)
    approvals: dict[str, ApprovalRecord] = field(default_factory=dict)
    lease: Lease | None = None


class JSONBackend:
    durable = True

    def __init__(self, directory: str, *, url: str, create: bool = True) -> None:
        self.url = url
        self.dir = Path(directory)
        if not create and not self.dir.is_dir():
            raise StoreUnavailableError(
                f"no store at {url}: {self.dir.resolve()} does not exist. Check the URL "
                "(json:///relative/dir, json:////absolute/dir).",
                url=url,
            )
        try:
            self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailableError(f"cannot create {self.dir}: {exc}", url=url) from exc
        self._thread_lock = threading.RLock()
        self._locking = False
        # Parsed ledgers by path, valid while (inode, mtime, size) is unchanged, with the
        # session they were parsed for (a file is only ever read as that session's).
        self._cache: dict[Path, tuple[tuple[int, int, int], str, dict[str, EffectRecord]]] = {}
        self._renamed: set[tuple[str, str]] = set()
        self._logs: dict[Path, _Log] = {}
        # Encoded lines of the last write, by path: (record, its line).
        self._lines: dict[Path, dict[str, tuple[EffectRecord, bytes]]] = {}

    def path_of(self, session_id: str) -> Path:
        return self._named(session_id, SUFFIX)

    def log_path_of(self, session_id: str) -> Path:
        return self._named(session_id, LOG_SUFFIX)

    def _named(self, session_id: str, suffix: str) -> Path:
        """The session's file; one still under its 0.1 name (and holding this session, not
        another whose old name was the same) is renamed first, under the write lock."""
        path = self.dir / (file_stem(session_id) + suffix)
        if (session_id, suffix) in self._renamed:
            return path
        old = self.dir / (legacy_stem(session_id) + suffix)
        if old != path and not path.exists() and old.exists():
            with self._locked():
                if not path.exists() and _session_id_inside(old) == session_id:
                    os.replace(old, path)
                    self._fsync_dir()
        self._renamed.add((session_id, suffix))
        return path

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
            return {}  # a missing ledger is an empty one (DESIGN.md rule 5)
        except OSError as exc:
            raise StoreUnavailableError(f"cannot read {path}: {exc}", url=self.url) from exc
        records = self._parse(path, data, session_id)
        self._cache[path] = (key, session_id, records)
        return records

    def _parse(self, path: Path, data: bytes, session_id: str) -> dict[str, EffectRecord]:
        try:
            raw = json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicates)
            if not isinstance(raw, dict):
                raise _Damaged("the top level is not an object")
            records = {tid: _from_json(tid, value) for tid, value in raw.items()}
            for record in records.values():
                if record.session_id != session_id:
                    raise _Damaged(
                        f"it holds records of session {record.session_id!r}, not {session_id!r}"
                    )
        except (UnicodeDecodeError, json.JSONDecodeError, _Damaged, RecursionError) as exc:
            raise self._corrupt(path, len(data), session_id, exc) from exc
        return records

    def _corrupt(
        self, path: Path, size: int, session_id: str, exc: BaseException
    ) -> CorruptLedgerError:
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

    # -- reading the session log -----------------------------------------------------------------

    def _load_log(self, session_id: str) -> _Log:
        """The session log, parsed incrementally: an append-only file is only read past the
        point already parsed."""
        path = self.log_path_of(session_id)
        try:
            fh = open(path, "rb")  # noqa: SIM115 - closed below, after an fstat on it
        except FileNotFoundError:
            return _Log(ino=0, offset=0, torn_tail=False)
        except OSError as exc:
            raise StoreUnavailableError(f"cannot read {path}: {exc}", url=self.url) from exc
        with fh:
            st = os.fstat(fh.fileno())
            log = self._logs.get(path)
            if log is None or log.ino != st.st_ino or st.st_size < log.offset:
                log = _Log(ino=st.st_ino, offset=0, torn_tail=False)
            if st.st_size == log.offset and not log.torn_tail:
                return log
            fh.seek(log.offset)
            data = fh.read()
        lines = data.split(b"\n")
        tail = lines.pop()  # after the last newline: empty, or a commit that never finished
        log = copy.copy(log)
        log.messages = list(log.messages)
        log.approvals = dict(log.approvals)
        for number, line in enumerate(lines):
            try:
                entry = json.loads(line.decode("utf-8"), object_pairs_hook=_no_duplicates)
                _apply_log_entry(log, entry, session_id)
            except (
                UnicodeDecodeError,
                json.JSONDecodeError,
                _Damaged,
                KeyError,
                ValueError,
                TypeError,
                RecursionError,
            ) as exc:
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
        out: set[str] = set()
        for path in self.dir.iterdir():
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

    def in_doubt(self) -> list[EffectRecord]:
        return [
            r
            for sid in self.session_ids()
            for r in self._load(sid).values()
            if r.status is Status.STARTED
        ]

    # -- writing ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One writer at a time, across threads and processes (flock on ``.toolledger.lock``).
        A holder that keeps it past ``LOCK_TIMEOUT_S`` is reported, not waited on for ever."""
        with self._thread_lock:
            if self._locking:  # this thread holds it already (a rename inside a commit)
                yield
                return
            fd = os.open(self.dir / ".toolledger.lock", os.O_CREAT | os.O_RDWR, 0o600)
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
                                f"{self.dir / '.toolledger.lock'} stayed locked for "
                                f"{LOCK_TIMEOUT_S:g}s: another process holds the json store's "
                                "write lock (stuck, or stopped in a debugger)",
                                url=self.url,
                            ) from None
                        time.sleep(0.002)
                yield
            finally:
                self._locking = False
                os.close(fd)  # closing releases the flock

    def apply(self, session_id: str, ops: Sequence[Op]) -> list[bool]:
        if not ops:
            return []
        try:
            with self._locked():
                effects = self._load(session_id)
                log = self._load_log(session_id)
                stored = SessionData(effects, log.state, log.messages, log.approvals, log.lease)
                draft = stored.draft()
                out = apply_ops(session_id, draft, ops)  # raises on a failed guard: nothing written
                if any(ok for op, ok in zip(ops, out, strict=True) if _is_effect(op)):
                    self._write(session_id, draft.effects)
                entry = _log_entry(
                    session_id,
                    ops,
                    out,
                    draft,
                    state_changed=draft.state is not log.state,
                    lease_changed=draft.lease is not log.lease,
                )
                if entry is not None:
                    self._append_log(session_id, log, entry)
        except OSError as exc:
            if isinstance(exc, StoreError):
                raise
            raise StoreUnavailableError(
                f"cannot write the ledger of {session_id!r} in {self.dir}: {exc}", url=self.url
            ) from exc
        return out

    def _write(self, session_id: str, records: dict[str, EffectRecord]) -> None:
        path = self.path_of(session_id)
        # One record per line, each encoded once: a record that did not change since the last
        # write is the same object, and its line is reused. The whole file is still rewritten
        # (the brief's design), but not re-encoded.
        old = self._lines.get(path, {})
        lines = {
            tid: cached[1]
            if (cached := old.get(tid)) is not None and cached[0] is r
            else _record_line(tid, r)
            for tid, r in records.items()
        }
        data = b"{\n" + b",\n".join(line for line in lines.values()) + b"\n}\n"
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
        self._fsync_dir()  # make the rename itself durable
        st = os.stat(path)
        self._cache[path] = ((st.st_ino, st.st_mtime_ns, st.st_size), session_id, records)
        self._lines[path] = {tid: (records[tid], line) for tid, line in lines.items()}

    def _append_log(self, session_id: str, log: _Log, entry: dict[str, Any]) -> None:
        path = self.log_path_of(session_id)
        line = (_dumps(entry) + "\n").encode("utf-8")
        new = not path.exists()
        fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
        try:
            if log.torn_tail:
                os.ftruncate(fd, log.offset)  # drop the commit that never finished
            os.lseek(fd, log.offset, os.SEEK_SET)
            _write_all(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        if new:
            self._fsync_dir()
        self._load_log(session_id)  # advance the parsed view past our own line

    def _fsync_dir(self) -> None:
        dir_fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def close(self) -> None:
        self._cache.clear()
        self._logs.clear()
        self._lines.clear()


def _is_effect(op: Op) -> bool:
    return isinstance(op, (InsertEffect, UpdateEffect))


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


def _log_entry(
    session_id: str,
    ops: Sequence[Op],
    applied: list[bool],
    draft: SessionData,
    *,
    state_changed: bool,
    lease_changed: bool,
) -> dict[str, Any] | None:
    messages = [m for op in ops if isinstance(op, AppendMessages) for m in op.messages]
    approvals = [
        op.record for op, ok in zip(ops, applied, strict=True) if isinstance(op, PutApproval) and ok
    ]
    if not (messages or approvals or state_changed or lease_changed):
        return None
    entry: dict[str, Any] = {
        "session_id": session_id,
        "state": _state_json(draft.state) if state_changed and draft.state else None,
        "messages": [
            {"seq": m.seq, "role": m.role, "content": m.content, "created_at": m.created_at}
            for m in messages
        ],
        "approvals": [_approval_json(a) for a in approvals],
    }
    if lease_changed and draft.lease is not None:
        lease = draft.lease
        entry["lease"] = {
            "owner": lease.owner,
            "token": lease.token,
            "expires_at": lease.expires_at,
        }
        if lease.holder is not None:
            entry["lease"]["holder"] = lease.holder.text()
    entry["digest"] = _digest(entry)
    return entry


def _state_json(s: SessionState) -> dict[str, Any]:
    return {
        "status": s.status.value,
        "reason": s.reason,
        "version": s.version,
        "turns": s.turns,
        "input_tokens": s.input_tokens,
        "output_tokens": s.output_tokens,
        "messages": s.messages,
        "created_at": s.created_at,
        "updated_at": s.updated_at,
    }


def _approval_json(a: ApprovalRecord) -> dict[str, Any]:
    return {
        "tool_use_id": a.tool_use_id,
        "tool": a.tool,
        "input_hash": a.input_hash,
        "input": a.input,
        "in_doubt": a.in_doubt,
        "reason": a.reason,
        "status": a.status.value,
        "requested_at": a.requested_at,
        "decided_at": a.decided_at,
        "decided_by": a.decided_by,
        "used_at": a.used_at,
        "attempt": a.attempt,
    }


def _apply_log_entry(log: _Log, entry: Any, session_id: str) -> None:
    if not isinstance(entry, dict) or entry.get("digest") != _digest(entry):
        raise _Damaged("a line does not match its digest")
    if entry["session_id"] != session_id:
        raise _Damaged(f"it holds session {entry['session_id']!r}, not {session_id!r}")
    state = entry["state"]
    if state is not None:
        log.state = SessionState(
            session_id=session_id,
            status=RunStatus(state["status"]),
            reason=state["reason"],
            version=int(state["version"]),
            turns=int(state["turns"]),
            input_tokens=int(state["input_tokens"]),
            output_tokens=int(state["output_tokens"]),
            messages=int(state["messages"]),
            created_at=float(state["created_at"]),
            updated_at=float(state["updated_at"]),
        )
    for m in entry["messages"]:
        if m["seq"] != len(log.messages):
            raise _Damaged(f"message {m['seq']} out of order")
        log.messages.append(
            StoredMessage(
                seq=int(m["seq"]),
                role=m["role"],
                content=m["content"],
                created_at=float(m["created_at"]),
            )
        )
    lease = entry.get("lease")
    if lease is not None:
        log.lease = Lease(
            session_id=session_id,
            owner=lease["owner"],
            token=int(lease["token"]),
            expires_at=float(lease["expires_at"]),
            holder=Holder.parse(lease.get("holder")),
        )
    for a in entry["approvals"]:
        log.approvals[a["tool_use_id"]] = ApprovalRecord(
            session_id=session_id,
            tool_use_id=a["tool_use_id"],
            tool=a["tool"],
            input_hash=a["input_hash"],
            input=a["input"],
            in_doubt=bool(a["in_doubt"]),
            reason=a["reason"],
            status=ApprovalStatus(a["status"]),
            requested_at=float(a["requested_at"]),
            decided_at=a["decided_at"],
            decided_by=a["decided_by"],
            used_at=a["used_at"],
            attempt=int(a.get("attempt", 0)),
        )


def _record_line(tool_use_id: str, record: EffectRecord) -> bytes:
    """``"tool_use_id": {record}`` on one line, UTF-8 (ASCII-escaped only if it must be)."""
    pair = (tool_use_id, _to_json(record))
    try:
        text = f"{json.dumps(pair[0], ensure_ascii=False)}: " + json.dumps(
            pair[1], ensure_ascii=False, allow_nan=False
        )
        return text.encode("utf-8")
    except UnicodeEncodeError:
        text = f"{json.dumps(pair[0])}: " + json.dumps(pair[1], allow_nan=False)
        return text.encode("ascii")
