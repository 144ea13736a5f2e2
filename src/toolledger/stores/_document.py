"""What an operation means, evaluated in Python over a session held in memory: shared by the
``memory://`` backend and the ``json://`` files (which rewrite a session whole). The SQL backends
say the same in their write plans (``_sql/plans.py``); the conformance suite holds all to one
meaning."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import assert_never

from ..ops import (
    AbandonMessages,
    AppendMessages,
    DropLease,
    DropSession,
    HoldLease,
    InsertEffect,
    Op,
    PutApproval,
    PutSession,
    TakeLease,
    UpdateEffect,
    alone,
    approval_applies,
    busy,
    conflict,
    droppable,
    effect_applies,
    lost,
    moved,
    still_there,
)
from ..records import ApprovalRecord, EffectRecord, Lease, SessionState, StoredMessage

__all__ = ["SessionData", "apply_ops"]


@dataclass
class SessionData:
    effects: dict[str, EffectRecord] = field(default_factory=dict)
    state: SessionState | None = None
    messages: list[StoredMessage] = field(default_factory=list)
    approvals: dict[str, ApprovalRecord] = field(default_factory=dict)
    lease: Lease | None = None
    abandoned: dict[int, list[StoredMessage]] = field(default_factory=dict)

    def draft(self) -> SessionData:
        """A copy to apply a batch to: swapped in (or written) only if every guard held."""
        return SessionData(
            effects=dict(self.effects),
            state=self.state,
            messages=list(self.messages),
            approvals=dict(self.approvals),
            lease=self.lease,
            abandoned=dict(self.abandoned),
        )


def apply_ops(session_id: str, data: SessionData, ops: Sequence[Op]) -> list[bool]:
    """Apply ``ops`` to ``data`` in place; a failed guard raises (the caller drops the draft, so
    nothing of the batch is kept)."""
    out: list[bool] = []
    for op in ops:
        match op:
            case InsertEffect() | UpdateEffect():
                applied = effect_applies(op, data.effects.get(op.record.tool_use_id))
                if applied:
                    data.effects[op.record.tool_use_id] = op.record
                elif isinstance(op, UpdateEffect) and op.guard:
                    raise moved(session_id, op.record.tool_use_id)
            case PutSession():
                applied = _put_session(session_id, data, op)
            case AppendMessages():
                applied = _append(session_id, data, op)
            case AbandonMessages():
                applied = _abandon(session_id, data, op)
            case PutApproval():
                applied = approval_applies(op, data.approvals.get(op.record.tool_use_id))
                if applied:
                    data.approvals[op.record.tool_use_id] = op.record
            case TakeLease():
                applied = _take(session_id, data, op)
            case HoldLease():
                applied = _hold(session_id, data, op)
            case DropLease():
                applied = (
                    data.lease is not None
                    and data.lease.token == op.token
                    and op.owner in (None, data.lease.owner)
                )
                if applied and data.lease is not None:
                    data.lease = replace(data.lease, expires_at=0.0)
            case DropSession():
                alone(ops)
                applied = _drop(session_id, data, op)
            case _:
                assert_never(op)
        out.append(applied)
    return out


def _put_session(session_id: str, data: SessionData, op: PutSession) -> bool:
    current = data.state
    if op.expect_version is None and current is not None:
        raise conflict(session_id, "it already exists")
    if op.expect_version is not None and (current is None or current.version != op.expect_version):
        found = "missing" if current is None else f"version {current.version}"
        raise conflict(session_id, f"expected version {op.expect_version}, {found}")
    data.state = op.state
    return True


def _append(session_id: str, data: SessionData, op: AppendMessages) -> bool:
    for message in op.messages:
        if message.seq != len(data.messages):
            raise conflict(session_id, f"message {message.seq} is not next ({len(data.messages)})")
        data.messages.append(message)
    return True


def _take(session_id: str, data: SessionData, op: TakeLease) -> bool:
    lease = data.lease
    current_token = lease.token if lease is not None else 0
    renewed = (
        op.expect_expires_at is not None
        and lease is not None
        and (
            lease.expires_at != op.expect_expires_at
            or (op.expect_renewals is not None and lease.renewals != op.expect_renewals)
        )
    )
    if current_token != op.expect_token or renewed:
        raise busy(session_id, lease)
    data.lease = op.lease
    return True


def _hold(session_id: str, data: SessionData, op: HoldLease) -> bool:
    lease = data.lease
    if lease is None or lease.token != op.token or lease.expires_at <= 0:
        raise lost(session_id, op.token)
    if op.expires_at is not None:
        data.lease = replace(lease, expires_at=op.expires_at, renewals=lease.renewals + 1)
    return True


def _abandon(session_id: str, data: SessionData, op: AbandonMessages) -> bool:
    if op.from_seq > len(data.messages) or op.from_seq < 0 or op.branch in data.abandoned:
        raise conflict(
            session_id,
            f"cannot abandon from message {op.from_seq} of {len(data.messages)} as "
            f"branch {op.branch}",
        )
    data.abandoned[op.branch] = data.messages[op.from_seq :]
    del data.messages[op.from_seq :]
    return True


def _drop(session_id: str, data: SessionData, op: DropSession) -> bool:
    if not droppable(op, data.state, data.effects.values(), data.approvals.values(), data.lease):
        raise still_there(session_id)
    data.state, data.lease = None, None
    data.effects.clear()
    data.messages.clear()
    data.approvals.clear()
    data.abandoned.clear()
    return True
