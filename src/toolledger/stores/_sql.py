"""SQL shared by the SQLite and PostgreSQL backends: statements, row mapping, migrations.

Statements are written once with ``?`` placeholders; the PostgreSQL backend rewrites them to
``%s``. Only our own constants ever reach SQL text; every value travels as a parameter.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..ops import InsertEffect, PutApproval, PutSession, TakeLease, UpdateEffect
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

EFFECT_COLUMNS = (
    "session_id, tool_use_id, tool, input_hash, status, attempt, result, error, "
    "created_at, updated_at, approved_by, worker, holder, lease_token, deadline, history"
)

INSERT_EFFECT = (
    f"INSERT INTO effects ({EFFECT_COLUMNS}) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (session_id, tool_use_id) DO NOTHING"
)

# Compare-and-set: the WHERE clause is the whole concurrency story. A writer that lost the race
# (or a stale one) matches no row and learns it from the row count.
UPDATE_EFFECT = (
    "UPDATE effects SET tool = ?, input_hash = ?, status = ?, attempt = ?, result = ?, "
    "error = ?, created_at = ?, updated_at = ?, approved_by = ?, worker = ?, holder = ?, "
    "lease_token = ?, deadline = ?, history = ? "
    "WHERE session_id = ? AND tool_use_id = ? AND status = ? AND attempt = ?"
)
UPDATE_EFFECT_AT = UPDATE_EFFECT + " AND updated_at = ?"


def update_statement(op: UpdateEffect) -> str:
    return UPDATE_EFFECT if op.expect_at is None else UPDATE_EFFECT_AT


SELECT_EFFECTS = f"SELECT {EFFECT_COLUMNS} FROM effects WHERE session_id = ?"
SELECT_EFFECT = f"SELECT {EFFECT_COLUMNS} FROM effects WHERE session_id = ? AND tool_use_id = ?"


def _attempt_params(r: EffectRecord) -> tuple[Any, ...]:
    history = json_text(history_json(r.history)) if r.history else None
    holder = r.holder.text() if r.holder is not None else None
    return (holder, r.lease_token, r.deadline, history)


def insert_params(op: InsertEffect) -> tuple[Any, ...]:
    r = op.record
    return (
        r.session_id,
        r.tool_use_id,
        r.tool,
        r.input_hash,
        r.status.value,
        r.attempt,
        r.result,
        r.error,
        r.created_at,
        r.updated_at,
        r.approved_by,
        r.worker,
        *_attempt_params(r),
    )


def update_params(op: UpdateEffect) -> tuple[Any, ...]:
    r = op.record
    return (
        r.tool,
        r.input_hash,
        r.status.value,
        r.attempt,
        r.result,
        r.error,
        r.created_at,
        r.updated_at,
        r.approved_by,
        r.worker,
        *_attempt_params(r),
        r.session_id,
        r.tool_use_id,
        op.expect_status.value,
        op.expect_attempt,
        *(() if op.expect_at is None else (op.expect_at,)),
    )


def row_to_record(row: Sequence[Any]) -> EffectRecord:
    return EffectRecord(
        session_id=row[0],
        tool_use_id=row[1],
        tool=row[2],
        input_hash=row[3],
        status=Status(row[4]),
        attempt=int(row[5]),
        result=row[6],
        error=row[7],
        created_at=float(row[8]),
        updated_at=float(row[9]),
        approved_by=row[10],
        worker=row[11],
        holder=Holder.parse(row[12]),
        lease_token=None if row[13] is None else int(row[13]),
        deadline=None if row[14] is None else float(row[14]),
        history=history_from_json(json.loads(row[15])) if row[15] else (),
    )


# -- sessions, transcripts, approvals ------------------------------------------------------------

SESSION_COLUMNS = (
    "session_id, status, reason, version, turns, input_tokens, output_tokens, messages, "
    "created_at, updated_at"
)
INSERT_SESSION = (
    f"INSERT INTO sessions ({SESSION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (session_id) DO NOTHING"
)
UPDATE_SESSION = (
    "UPDATE sessions SET status = ?, reason = ?, version = ?, turns = ?, input_tokens = ?, "
    "output_tokens = ?, messages = ?, created_at = ?, updated_at = ? "
    "WHERE session_id = ? AND version = ?"
)
SELECT_SESSION = f"SELECT {SESSION_COLUMNS} FROM sessions WHERE session_id = ?"
SELECT_SESSIONS = f"SELECT {SESSION_COLUMNS} FROM sessions"
SELECT_ALL_SESSION_IDS = (
    "SELECT session_id FROM sessions UNION SELECT DISTINCT session_id FROM effects"
)
SELECT_IN_DOUBT = f"SELECT {EFFECT_COLUMNS} FROM effects WHERE status = 'started'"

INSERT_MESSAGE = (
    "INSERT INTO messages (session_id, seq, role, content, created_at) VALUES (?, ?, ?, ?, ?)"
)
SELECT_LAST_SEQ = "SELECT max(seq) FROM messages WHERE session_id = ?"
SELECT_MESSAGES = (
    "SELECT seq, role, content, created_at FROM messages WHERE session_id = ? AND seq >= ? "
    "ORDER BY seq"
)

APPROVAL_COLUMNS = (
    "session_id, tool_use_id, tool, input_hash, input, in_doubt, reason, status, "
    "requested_at, decided_at, decided_by, used_at, attempt"
)
INSERT_APPROVAL = (
    f"INSERT INTO approvals ({APPROVAL_COLUMNS}) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (session_id, tool_use_id) DO NOTHING"
)
UPDATE_APPROVAL = (
    "UPDATE approvals SET tool = ?, input_hash = ?, input = ?, in_doubt = ?, reason = ?, "
    "status = ?, requested_at = ?, decided_at = ?, decided_by = ?, used_at = ?, attempt = ? "
    "WHERE session_id = ? AND tool_use_id = ? AND status = ?"
)
SELECT_APPROVALS = f"SELECT {APPROVAL_COLUMNS} FROM approvals"
SELECT_SESSION_APPROVALS = f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE session_id = ?"


def session_params(s: SessionState) -> tuple[Any, ...]:
    return (
        s.session_id,
        s.status.value,
        s.reason,
        s.version,
        s.turns,
        s.input_tokens,
        s.output_tokens,
        s.messages,
        s.created_at,
        s.updated_at,
    )


def update_session_params(op: PutSession) -> tuple[Any, ...]:
    s = op.state
    return (
        s.status.value,
        s.reason,
        s.version,
        s.turns,
        s.input_tokens,
        s.output_tokens,
        s.messages,
        s.created_at,
        s.updated_at,
        s.session_id,
        op.expect_version,
    )


def row_to_session(row: Sequence[Any]) -> SessionState:
    return SessionState(
        session_id=row[0],
        status=RunStatus(row[1]),
        reason=row[2],
        version=int(row[3]),
        turns=int(row[4]),
        input_tokens=int(row[5]),
        output_tokens=int(row[6]),
        messages=int(row[7]),
        created_at=float(row[8]),
        updated_at=float(row[9]),
    )


def message_params(session_id: str, m: StoredMessage) -> tuple[Any, ...]:
    return (session_id, m.seq, m.role, json_text(m.content), m.created_at)


def row_to_message(row: Sequence[Any]) -> StoredMessage:
    return StoredMessage(
        seq=int(row[0]), role=row[1], content=json.loads(row[2]), created_at=float(row[3])
    )


def approval_params(a: ApprovalRecord) -> tuple[Any, ...]:
    return (
        a.session_id,
        a.tool_use_id,
        a.tool,
        a.input_hash,
        json_text(a.input),
        int(a.in_doubt),
        a.reason,
        a.status.value,
        a.requested_at,
        a.decided_at,
        a.decided_by,
        a.used_at,
        a.attempt,
    )


def update_approval_params(op: PutApproval) -> tuple[Any, ...]:
    a = op.record
    assert op.expect_status is not None
    return (
        a.tool,
        a.input_hash,
        json_text(a.input),
        int(a.in_doubt),
        a.reason,
        a.status.value,
        a.requested_at,
        a.decided_at,
        a.decided_by,
        a.used_at,
        a.attempt,
        a.session_id,
        a.tool_use_id,
        op.expect_status.value,
    )


def row_to_approval(row: Sequence[Any]) -> ApprovalRecord:
    return ApprovalRecord(
        session_id=row[0],
        tool_use_id=row[1],
        tool=row[2],
        input_hash=row[3],
        input=json.loads(row[4]),
        in_doubt=bool(row[5]),
        reason=row[6],
        status=ApprovalStatus(row[7]),
        requested_at=float(row[8]),
        decided_at=None if row[9] is None else float(row[9]),
        decided_by=row[10],
        used_at=None if row[11] is None else float(row[11]),
        attempt=int(row[12] or 0),
    )


def format_style(statement: str) -> str:
    """A statement written with ``?`` placeholders in psycopg's ``%s`` style (a literal ``%``
    doubled). For our own constants only: their literals hold no ``?``."""
    return statement.replace("%", "%%").replace("?", "%s")


def json_text(value: Any) -> str:
    """Transcript and approval JSON: compact; ASCII-escaped only when UTF-8 cannot hold it."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(value, ensure_ascii=True, separators=(",", ":"))
    return text


# -- leases --------------------------------------------------------------------------------------

LEASE_COLUMNS = "session_id, owner, token, expires_at, holder"
SELECT_LEASE = f"SELECT {LEASE_COLUMNS} FROM leases WHERE session_id = ?"
INSERT_LEASE = (
    f"INSERT INTO leases ({LEASE_COLUMNS}) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (session_id) DO NOTHING"
)
# Take-over and fence are compare-and-set on the token (and, for a take-over, on the expiry the
# taker judged, which a renewal changes): the WHERE clause is the whole story.
TAKE_LEASE = (
    "UPDATE leases SET owner = ?, token = ?, expires_at = ?, holder = ? "
    "WHERE session_id = ? AND token = ? AND expires_at = ?"
)
TAKE_LEASE_ANY_EXPIRY = (
    "UPDATE leases SET owner = ?, token = ?, expires_at = ?, holder = ? "
    "WHERE session_id = ? AND token = ?"
)


def take_lease_statement(op: TakeLease) -> str:
    if op.expect_token == 0:
        return INSERT_LEASE
    return TAKE_LEASE_ANY_EXPIRY if op.expect_expires_at is None else TAKE_LEASE


# A lease given back (expires_at 0) is never renewed: a renewal that was under way when its run
# ended cannot bring it back to life.
HOLD_LEASE = (
    "UPDATE leases SET expires_at = ? WHERE session_id = ? AND token = ? AND expires_at > 0"
)
DROP_LEASE = "UPDATE leases SET expires_at = 0 WHERE session_id = ? AND token = ?"


def take_lease_params(op: TakeLease) -> tuple[Any, ...]:
    lease = op.lease
    holder = lease.holder.text() if lease.holder is not None else None
    if op.expect_token == 0:
        return (lease.session_id, lease.owner, lease.token, lease.expires_at, holder)
    params = (lease.owner, lease.token, lease.expires_at, holder, lease.session_id)
    if op.expect_expires_at is None:
        return (*params, op.expect_token)
    return (*params, op.expect_token, op.expect_expires_at)


def row_to_lease(row: Sequence[Any]) -> Lease:
    return Lease(
        session_id=row[0],
        owner=row[1],
        token=int(row[2]),
        expires_at=float(row[3]),
        holder=Holder.parse(row[4]),
    )
