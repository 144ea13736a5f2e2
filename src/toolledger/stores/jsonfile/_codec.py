"""What a ``json:///`` store writes, and how it is read back: ledger records (one line each in
``<session>.effects.json``) and session log entries (one line each in ``<session>.session.jsonl``:
state, appended messages, approvals, lease). Every record and entry carries a digest of its
fields; one that does not check out is ``Damaged``. The format is fixed: files written by
earlier releases must read, and a record without a newer field reads as it was written.

Fields added since 0.1, each written only when it holds something (so a line without it reads
as before): a state's ``lineage`` (``toolledger._lineage``, as a list of objects); an entry's
``abandoned`` — the rewinds of its batch, each ``{"branch", "from_seq", "after"}``, ``after``
counting the entry's ``messages`` appended before it — and ``records``, the whole ledger as
the batch left it, carried by the line that creates a session together with records (the
package docstring says why)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..._lineage import Branch
from ...codec import canonical_json, json_text
from ...ops import AbandonMessages, AppendMessages, Op, PutApproval
from ...records import (
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
from .._document import SessionData

__all__ = [
    "LEDGER_DAMAGE",
    "LOG_DAMAGE",
    "Damaged",
    "Log",
    "log_entry",
    "log_line",
    "read_ledger",
    "read_log_line",
    "record_line",
]


class Damaged(Exception):
    pass


# What reading a damaged ledger file, or a damaged log line, raises.
LEDGER_DAMAGE = (UnicodeDecodeError, json.JSONDecodeError, Damaged, RecursionError)
LOG_DAMAGE = (*LEDGER_DAMAGE, KeyError, ValueError, TypeError)


def _digest(fields: dict[str, Any]) -> str:
    body = {k: v for k, v in fields.items() if k != "digest"}
    return hashlib.sha256(canonical_json(body).encode("ascii")).hexdigest()[:32]


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="microseconds")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise Damaged(f"key {key!r} appears twice")
        out[key] = value
    return out


def _strict_loads(data: bytes) -> Any:
    return json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicates)


# -- ledger records ------------------------------------------------------------------------------


class _KeysCollide(Exception):
    """A result's JSON text names one key twice (``{1: "a", "1": "b"}``, written as text)."""


def _each_key_once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _KeysCollide
    return out


def _result_fields(text: str | None) -> dict[str, Any]:
    """A result as the file holds it: its JSON value, or — when its text names a key twice,
    which a value would keep only once — the text itself (``result_text``), so a replay after
    a reopen sends what the first answer did."""
    if text is None:
        return {"result": None}
    try:
        return {"result": json.loads(text, object_pairs_hook=_each_key_once)}
    except _KeysCollide:
        return {"result": None, "result_text": text}


def _record_json(record: EffectRecord) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": record.tool,
        **_result_fields(record.result),
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
    if record.boot_deadline is not None:
        out["boot_deadline"] = record.boot_deadline
    if record.made_in is not None:
        out["made_in"] = record.made_in
    if record.origin is not None:
        out["origin"] = record.origin
    out["digest"] = _digest({**out, "tool_use_id": record.tool_use_id})
    return out


def record_line(tool_use_id: str, record: EffectRecord) -> bytes:
    """``"tool_use_id": {record}`` on one line, UTF-8 (ASCII-escaped only if it must be)."""
    # The one-entry object's text without its braces: key and record are escaped together.
    return json_text({tool_use_id: _record_json(record)})[1:-1].encode("utf-8")


def _record_from_json(tool_use_id: str, raw: Any) -> EffectRecord:
    if not isinstance(raw, dict):
        raise Damaged(f"record {tool_use_id!r} is not an object")
    if raw.get("digest") != _digest({**raw, "tool_use_id": tool_use_id}):
        raise Damaged(f"record {tool_use_id!r} does not match its digest")
    try:
        result = raw["result"]
        text = raw.get("result_text")
        return EffectRecord(
            session_id=raw["session_id"],
            tool_use_id=tool_use_id,
            tool=raw["name"],
            input_hash=raw["input_hash"],
            status=Status(raw["status"]),
            attempt=int(raw["attempt"]),
            # The same encoding codec.encode_result used, so the text (and the model's content)
            # matches.
            result=(
                str(text) if text is not None else None if result is None else json_text(result)
            ),
            error=raw["error"],
            created_at=float(raw["created_at"]),
            updated_at=float(raw["updated_at"]),
            approved_by=raw["approved_by"],
            worker=raw["worker"],
            holder=Holder.parse(raw.get("holder")),
            lease_token=None if raw.get("lease_token") is None else int(raw["lease_token"]),
            deadline=None if raw.get("deadline") is None else float(raw["deadline"]),
            history=history_from_json(raw.get("history")),
            boot_deadline=raw.get("boot_deadline"),
            made_in=None if raw.get("made_in") is None else str(raw["made_in"]),
            origin=None if raw.get("origin") is None else str(raw["origin"]),
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise Damaged(f"record {tool_use_id!r} is incomplete ({exc!r})") from exc


def read_ledger(data: bytes, session_id: str) -> dict[str, EffectRecord]:
    """The records of a ledger file's bytes; raises one of ``LEDGER_DAMAGE`` if any does not
    check out, or if it holds another session's records."""
    raw = _strict_loads(data)
    if not isinstance(raw, dict):
        raise Damaged("the top level is not an object")
    records = {tid: _record_from_json(tid, value) for tid, value in raw.items()}
    for record in records.values():
        if record.session_id != session_id:
            raise Damaged(f"it holds records of session {record.session_id!r}, not {session_id!r}")
    return records


# -- the session log -----------------------------------------------------------------------------


@dataclass
class Log:
    """What a session log holds, parsed up to ``offset`` bytes of file ``ino``."""

    ino: int
    offset: int
    torn_tail: bool
    state: SessionState | None = None
    messages: list[StoredMessage] = field(default_factory=list)
    approvals: dict[str, ApprovalRecord] = field(default_factory=dict)
    lease: Lease | None = None
    abandoned: dict[int, list[StoredMessage]] = field(default_factory=dict)
    records: dict[str, EffectRecord] | None = None
    """The ledger carried by the line that created the session with records (``None``: no such
    line): what the ledger holds while its file is missing."""


def log_entry(
    session_id: str,
    ops: Sequence[Op],
    applied: list[bool],
    draft: SessionData,
    *,
    state_changed: bool,
    lease_changed: bool,
    records: dict[str, EffectRecord] | None = None,
) -> dict[str, Any] | None:
    """The log line a batch adds (``None`` when it changed nothing the log holds), with
    ``records`` (the whole ledger) inline when given."""
    messages: list[StoredMessage] = []
    abandoned: list[dict[str, int]] = []
    for op in ops:  # in the batch's order: a rewind, then the transcript going on from it
        if isinstance(op, AppendMessages):
            messages += op.messages
        elif isinstance(op, AbandonMessages):  # applied: a refused one refuses the batch
            abandoned.append({"branch": op.branch, "from_seq": op.from_seq, "after": len(messages)})
    approvals = [
        op.record for op, ok in zip(ops, applied, strict=True) if isinstance(op, PutApproval) and ok
    ]
    if not (messages or abandoned or approvals or state_changed or lease_changed):
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
        if lease.renewals:
            entry["lease"]["renewals"] = lease.renewals
        if lease.ttl is not None:
            entry["lease"]["ttl"] = lease.ttl
    if abandoned:
        entry["abandoned"] = abandoned
    if records is not None:
        entry["records"] = {tid: _record_json(r) for tid, r in records.items()}
    entry["digest"] = _digest(entry)
    return entry


def log_line(entry: dict[str, Any]) -> bytes:
    return (json_text(entry) + "\n").encode("utf-8")


def _state_json(s: SessionState) -> dict[str, Any]:
    out: dict[str, Any] = {
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
    if s.lineage:
        out["lineage"] = [b.as_json() for b in s.lineage]
    return out


def _lineage(raw: Any) -> tuple[Branch, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise Damaged("a session's lineage is not a list")
    return tuple(Branch.from_json(b) for b in raw)


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


def read_log_line(log: Log, line: bytes, session_id: str) -> None:
    """Apply one log line (without its newline) to ``log``; raises one of ``LOG_DAMAGE`` if it
    does not check out."""
    entry = _strict_loads(line)
    if not isinstance(entry, dict) or entry.get("digest") != _digest(entry):
        raise Damaged("a line does not match its digest")
    if entry["session_id"] != session_id:
        raise Damaged(f"it holds session {entry['session_id']!r}, not {session_id!r}")
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
            lineage=_lineage(state.get("lineage")),
        )
    rewinds = iter(entry.get("abandoned", ()))
    rewind = next(rewinds, None)
    for n, m in enumerate(entry["messages"]):
        while rewind is not None and rewind["after"] == n:
            _abandon(log, rewind)
            rewind = next(rewinds, None)
        if m["seq"] != len(log.messages):
            raise Damaged(f"message {m['seq']} out of order")
        log.messages.append(
            StoredMessage(
                seq=int(m["seq"]),
                role=m["role"],
                content=m["content"],
                created_at=float(m["created_at"]),
            )
        )
    while rewind is not None:
        if rewind["after"] != len(entry["messages"]):
            raise Damaged(f"a rewind after message {rewind['after']} of the line")
        _abandon(log, rewind)
        rewind = next(rewinds, None)
    inline = entry.get("records")
    if inline is not None:
        if not isinstance(inline, dict):
            raise Damaged("the records a line carries are not an object")
        records = {tid: _record_from_json(tid, raw) for tid, raw in inline.items()}
        if any(r.session_id != session_id for r in records.values()):
            raise Damaged(f"it carries records of another session than {session_id!r}")
        log.records = records
    lease = entry.get("lease")
    if lease is not None:
        log.lease = Lease(
            session_id=session_id,
            owner=lease["owner"],
            token=int(lease["token"]),
            expires_at=float(lease["expires_at"]),
            holder=Holder.parse(lease.get("holder")),
            renewals=int(lease.get("renewals", 0)),
            ttl=None if lease.get("ttl") is None else float(lease["ttl"]),
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


def _abandon(log: Log, rewind: Any) -> None:
    """A rewind of a line: the transcript's messages from ``from_seq`` on become the branch."""
    from_seq, branch = int(rewind["from_seq"]), int(rewind["branch"])
    if not 0 <= from_seq <= len(log.messages) or branch in log.abandoned:
        raise Damaged(f"a rewind from message {from_seq} as branch {branch} cannot apply")
    log.abandoned[branch] = log.messages[from_seq:]
    del log.messages[from_seq:]
