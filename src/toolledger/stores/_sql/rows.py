"""Records to statement parameters and rows back to records, for both SQL backends.

A record's values are listed once, in its table's column order (``*_values``); an update's
parameters are the same values with the key moved behind the SET list, then what the
compare-and-set expects.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from ..._lineage import Branch, lineage_from_json, lineage_json
from ...codec import json_text_with
from ...errors import CorruptLedgerError
from ...ops import InsertEffect, PutApproval, PutSession, TakeLease, UpdateEffect
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

sql_json = json_text_with(separators=(",", ":"), allow_nan=True)
"""Transcript, history and approval JSON as the SQL stores keep it: compact (``json_text``)."""


# -- effects -------------------------------------------------------------------------------------


def effect_values(r: EffectRecord) -> tuple[Any, ...]:
    """The record in ``EFFECT_COLUMNS`` order (the key is the first two)."""
    return (
        r.session_id,
        r.tool_use_id,
        r.tool,
        r.input_hash,
        r.status._value_,  # the member's text, read without the enum's descriptor
        r.attempt,
        r.result,
        r.error,
        r.created_at,
        r.updated_at,
        r.approved_by,
        r.worker,
        r.holder.text() if r.holder is not None else None,
        r.lease_token,
        r.deadline,
        sql_json(history_json(r.history)) if r.history else None,
        r.boot_deadline,
        r.made_in,
        r.origin,
    )


def insert_params(op: InsertEffect) -> tuple[Any, ...]:
    return effect_values(op.record)


def update_params(op: UpdateEffect) -> tuple[Any, ...]:
    v = effect_values(op.record)
    expect = (op.expect_status._value_, op.expect_attempt)
    if op.expect_at is None:
        return (*v[2:], *v[:2], *expect)
    if op.expect_worker is None:
        return (*v[2:], *v[:2], *expect, op.expect_at)
    holder = op.expect_holder.text() if op.expect_holder is not None else ""
    return (*v[2:], *v[:2], *expect, op.expect_at, op.expect_worker, holder)


def clocked_insert_params(op: InsertEffect, expected: float) -> tuple[Any, ...]:
    """``insert_params`` for ``INSERT_EFFECT_CLOCKED``: ``expected``, the server's clock as
    this process reckons it now, follows the deadline."""
    v = effect_values(op.record)
    return (*v[:15], expected, *v[15:])


def clocked_update_params(op: UpdateEffect, expected: float) -> tuple[Any, ...]:
    """``update_params`` for ``UPDATE_EFFECT_CLOCKED`` (``clocked_insert_params``)."""
    v = update_params(op)
    return (*v[:13], expected, *v[13:])


def damaged(what: str, session_id: Any, name: Any, exc: BaseException) -> CorruptLedgerError:
    """The error for a stored row a value of which this code cannot read (a status no release
    writes, a number that is text, JSON cut short): a damaged store, named by the backend —
    never a traceback, never a row read as something else."""
    where = "" if session_id is None else f" of session {session_id!r}"
    which = "" if name is None else f" {name!r}"
    return CorruptLedgerError(
        f"the stored {what}{which}{where} is damaged ({exc!r}). Restore the store from a "
        "backup, or run `toolledger verify` to see what is readable.",
        session_id=session_id if isinstance(session_id, str) else None,
    )


def row_to_record(row: Sequence[Any]) -> EffectRecord:
    try:
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
            boot_deadline=row[16],
            made_in=row[17],
            origin=row[18],
        )
    except (ValueError, TypeError, KeyError, IndexError, RecursionError) as exc:
        raise damaged("ledger record", row[0], row[1], exc) from exc


# -- sessions, transcripts, approvals ------------------------------------------------------------


def session_values(s: SessionState) -> tuple[Any, ...]:
    """The state in ``SESSION_COLUMNS`` order (the key first)."""
    return (
        s.session_id,
        s.status._value_,
        s.reason,
        s.version,
        s.turns,
        s.input_tokens,
        s.output_tokens,
        s.messages,
        s.created_at,
        s.updated_at,
        lineage_json(s.lineage),
    )


def update_session_params(op: PutSession) -> tuple[Any, ...]:
    v = session_values(op.state)
    return (*v[1:], v[0], op.expect_version)


def row_to_session(row: Sequence[Any]) -> SessionState:
    try:
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
            lineage=_lineage(row[0], row[10]),
        )
    except (ValueError, TypeError, KeyError, IndexError, RecursionError) as exc:
        raise damaged("session", row[0], None, exc) from exc


def _lineage(session_id: str, text: Any) -> tuple[Branch, ...]:
    """A session's stored lineage; damaged text is a damaged store (the backend names it in
    ``url``), never a lineage read as empty — its effects would no longer be told."""
    try:
        return lineage_from_json(text)
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise CorruptLedgerError(
            f"the stored lineage of session {session_id!r} is damaged ({exc!r}). It is not "
            "read as empty: the effects it lists would no longer be told. Restore the store "
            "from a backup, or run `toolledger verify` to see what is readable.",
            session_id=session_id,
        ) from exc


def message_params(session_id: str, m: StoredMessage) -> tuple[Any, ...]:
    return (session_id, m.seq, m.role, sql_json(m.content), m.created_at)


def counted_message_params(session_id: str, m: StoredMessage, op: PutSession) -> tuple[Any, ...]:
    """``INSERT_COUNTED_MESSAGE``'s: the message carrying ``op``'s counters (SQLite)."""
    st = op.state
    return (
        session_id,
        m.seq,
        m.role,
        sql_json(m.content),
        m.created_at,
        st.version,
        st.turns,
        st.input_tokens,
        st.output_tokens,
        session_id,
        m.seq,
        op.expect_version,
        m.seq,
        st.version,
        st.status._value_,
        st.reason,
        st.created_at,
        lineage_json(st.lineage),
    )


# The decoder's C scanner (one value from a position); typeshed does not list the attribute.
_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def stored_json(text: Any) -> Any:
    """The value of one stored JSON text, as ``json.loads`` reads it. A transcript read is one
    decode per message: the scanner is called directly (no whitespace passes, no wrappers), and
    anything it does not read whole — whitespace around, bytes, a damaged text — goes to
    ``json.loads``, which reads it or raises as it always did."""
    if type(text) is str:
        try:
            value, end = _scan(text, 0)
        except StopIteration:
            pass
        else:
            if end == len(text):
                return value
    return json.loads(text)


def row_to_message(row: Sequence[Any], session_id: str | None = None) -> StoredMessage:
    """A transcript's row (``session_id``'s: named if it is damaged)."""
    try:
        return StoredMessage(
            seq=int(row[0]), role=row[1], content=stored_json(row[2]), created_at=float(row[3])
        )
    except (ValueError, TypeError, KeyError, IndexError, RecursionError) as exc:
        raise damaged("message", session_id, f"seq {row[0]!r}", exc) from exc


def approval_values(a: ApprovalRecord) -> tuple[Any, ...]:
    """The request in ``APPROVAL_COLUMNS`` order (the key is the first two)."""
    return (
        a.session_id,
        a.tool_use_id,
        a.tool,
        a.input_hash,
        sql_json(a.input),
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
    assert op.expect_status is not None
    v = approval_values(op.record)
    return (*v[2:], *v[:2], op.expect_status.value)


def row_to_approval(row: Sequence[Any]) -> ApprovalRecord:
    try:
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
    except (ValueError, TypeError, KeyError, IndexError, RecursionError) as exc:
        raise damaged("approval request", row[0], row[1], exc) from exc


# -- leases --------------------------------------------------------------------------------------


def take_lease_params(op: TakeLease) -> tuple[Any, ...]:
    lease = op.lease
    holder = lease.holder.text() if lease.holder is not None else None
    if op.expect_token == 0:
        return (lease.session_id, lease.owner, lease.token, lease.expires_at, holder, lease.ttl)
    params = (lease.owner, lease.token, lease.expires_at, holder, lease.ttl, lease.session_id)
    if op.expect_expires_at is None:
        return (*params, op.expect_token)
    return (*params, op.expect_token, op.expect_expires_at, op.expect_renewals or 0)


def clocked_take_lease_params(op: TakeLease) -> tuple[Any, ...]:
    """``take_lease_params`` for ``statements.clocked_take_lease_statement``: the expiry given
    with the time to live it was set from (``lease.ttl``, not ``None``)."""
    lease = op.lease
    at = 3 if op.expect_token == 0 else 2  # the expiry's place among the parameters
    params = take_lease_params(op)
    expiry = (lease.ttl, lease.expires_at, lease.expires_at, lease.ttl)
    return (*params[:at], *expiry, *params[at + 1 :])


def row_to_lease(row: Sequence[Any]) -> Lease:
    try:
        return Lease(
            session_id=row[0],
            owner=row[1],
            token=int(row[2]),
            expires_at=float(row[3]),
            holder=Holder.parse(row[4]),
            renewals=int(row[5] or 0),
            ttl=None if row[6] is None else float(row[6]),
        )
    except (ValueError, TypeError, KeyError, IndexError, RecursionError) as exc:
        raise damaged("lease", row[0], None, exc) from exc
