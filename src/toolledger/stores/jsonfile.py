"""``json:///dir`` — the brief's ``effects.json``: one human-readable file per session.

Each file maps ``tool_use_id`` to a record (``{name, result, at, status, …}``) and is rewritten
*whole* for every state change: written to a temporary file, fsynced, renamed over the old one,
and the directory fsynced. A crash leaves the old file or the new one, never half of one.

The cost grows with the session: a rewrite per record is fine for tens or hundreds of calls and
for reading by eye, not for long sessions (use ``sqlite:///``). Every record carries a digest of
its fields, so truncation, a flipped byte or a hand edit is detected and raised as
``CorruptLedgerError`` — never read as an empty ledger, which would re-run every effect.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import threading
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from ..codec import canonical_json
from ..errors import CorruptLedgerError, StoreError, StoreUnavailableError
from ..records import EffectRecord, Status
from .base import InsertEffect, Op

__all__ = ["JSONBackend"]

SUFFIX = ".effects.json"
_MAX_STEM_BYTES = 180

_RESTORE_HINT = (
    "It is not read as empty: that would re-run every effect it records. Restore the file from "
    "a backup; or, knowing that every call it records may then run again, move it aside."
)


def file_stem(session_id: str) -> str:
    """A file name for any session id: percent-encoded (so ``../x`` or ``a/b`` stay one plain
    name), with long names replaced by a hash. Records carry the real id."""
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


class JSONBackend:
    durable = True

    def __init__(self, directory: str, *, url: str) -> None:
        self.url = url
        self.dir = Path(directory)
        try:
            self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailableError(f"cannot create {self.dir}: {exc}", url=url) from exc
        self._thread_lock = threading.Lock()
        # Parsed files by path, valid while (inode, mtime, size) is unchanged.
        self._cache: dict[Path, tuple[tuple[int, int, int], dict[str, EffectRecord]]] = {}

    def path_of(self, session_id: str) -> Path:
        return self.dir / (file_stem(session_id) + SUFFIX)

    # -- reading ---------------------------------------------------------------------------------

    def _load(self, session_id: str) -> dict[str, EffectRecord]:
        path = self.path_of(session_id)
        try:
            with open(path, "rb") as fh:
                st = os.fstat(fh.fileno())
                key = (st.st_ino, st.st_mtime_ns, st.st_size)
                cached = self._cache.get(path)
                if cached is not None and cached[0] == key:
                    return cached[1]
                data = fh.read()
        except FileNotFoundError:
            return {}  # a missing ledger is an empty one (DESIGN.md rule 5)
        except OSError as exc:
            raise StoreUnavailableError(f"cannot read {path}: {exc}", url=self.url) from exc
        records = self._parse(path, data, session_id)
        self._cache[path] = (key, records)
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
            size = len(data)
            raise CorruptLedgerError(
                f"ledger file {path} ({size} bytes) is corrupt or truncated: {exc}. "
                + _RESTORE_HINT,
                url=self.url,
                path=str(path),
                session_id=session_id,
            ) from exc
        return records

    def read_effects(
        self, session_id: str, tool_use_ids: Sequence[str] | None = None
    ) -> dict[str, EffectRecord]:
        records = self._load(session_id)
        if tool_use_ids is None:
            return dict(records)
        return {i: records[i] for i in tool_use_ids if i in records}

    def session_ids(self) -> list[str]:
        out = []
        for path in self.dir.glob("*" + SUFFIX):
            stem = path.name[: -len(SUFFIX)]
            if stem.startswith("~"):
                # A hashed name: the real id is inside. Read the file raw, without its session.
                try:
                    raw = json.loads(path.read_bytes())
                    out.append(next(iter(raw.values()))["session_id"])
                except (OSError, ValueError, StopIteration, KeyError, TypeError, AttributeError):
                    continue
            else:
                out.append(unquote(stem))
        return out

    # -- writing ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One writer at a time, across threads and processes (flock on ``.toolledger.lock``)."""
        with self._thread_lock:
            fd = os.open(self.dir / ".toolledger.lock", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # closing releases the flock

    def apply(self, session_id: str, ops: Sequence[Op]) -> list[bool]:
        if not ops:
            return []
        try:
            with self._locked():
                records = dict(self._load(session_id))
                out = []
                for op in ops:
                    current = records.get(op.record.tool_use_id)
                    if isinstance(op, InsertEffect):
                        applied = current is None
                    else:
                        applied = (
                            current is not None
                            and current.status is op.expect_status
                            and current.attempt == op.expect_attempt
                        )
                    if applied:
                        records[op.record.tool_use_id] = op.record
                    out.append(applied)
                if any(out):
                    self._write(session_id, records)
        except OSError as exc:
            if isinstance(exc, StoreError):
                raise
            raise StoreUnavailableError(
                f"cannot write the ledger of {session_id!r} in {self.dir}: {exc}", url=self.url
            ) from exc
        return out

    def _write(self, session_id: str, records: dict[str, EffectRecord]) -> None:
        path = self.path_of(session_id)
        body = {tid: _to_json(r) for tid, r in records.items()}
        data = _dumps_file(body)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            try:
                view = memoryview(data)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        dir_fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)  # make the rename itself durable
        finally:
            os.close(dir_fd)
        st = os.stat(path)
        self._cache[path] = ((st.st_ino, st.st_mtime_ns, st.st_size), records)

    def close(self) -> None:
        self._cache.clear()


def _dumps_file(body: dict[str, Any]) -> bytes:
    text = json.dumps(body, ensure_ascii=False, allow_nan=False, indent=2) + "\n"
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return (json.dumps(body, ensure_ascii=True, allow_nan=False, indent=2) + "\n").encode()
