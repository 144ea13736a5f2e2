"""Records, states, messages and approvals as a worker writes them, for tests: the conformance
suite's, and a backend author's own."""

from __future__ import annotations

from typing import Any

from ..codec import encode_result, input_hash
from ..records import (
    ApprovalRecord,
    ApprovalStatus,
    EffectRecord,
    Holder,
    RunStatus,
    SessionState,
    Status,
    StoredMessage,
)

__all__ = ["WEIRD_SESSION_IDS", "make_approval", "make_message", "make_record", "make_state"]

WEIRD_SESSION_IDS = [
    "../../etc/passwd",
    "a/b\\c",
    "Robert'); DROP TABLE effects;--",
    'quote " and %s and ? and $1',
    "ünïcødé 会话 🚀",
    ".hidden",
    "x" * 256,
]


def make_record(
    session_id: str = "s",
    tool_use_id: str = "toolu_1",
    *,
    status: Status = Status.STARTED,
    attempt: int = 1,
    result: Any = None,
    error: str | None = None,
    at: float = 1_700_000_000.0,
    holder: Holder | None = None,
    deadline: float | None = None,
) -> EffectRecord:
    """A record as a worker writes it. A ``started`` one is, unless ``holder`` or ``deadline``
    say otherwise, an attempt its worker gave up (no holder, a deadline): in doubt at once."""
    if status is Status.STARTED and holder is None and deadline is None:
        deadline = at
    return EffectRecord(
        session_id=session_id,
        tool_use_id=tool_use_id,
        tool="create_ticket",
        input_hash=input_hash({"title": "t"}),
        status=status,
        attempt=attempt,
        result=None if result is None else encode_result(result).stored,
        error=error,
        created_at=at,
        updated_at=at,
        approved_by=None,
        worker="w1",
        holder=holder,
        deadline=deadline,
    )


def make_state(
    session_id: str = "s",
    *,
    version: int = 1,
    messages: int = 0,
    status: RunStatus = RunStatus.RUNNING,
) -> SessionState:
    return SessionState(
        session_id=session_id,
        status=status,
        reason=None,
        version=version,
        turns=version - 1,
        input_tokens=10 * version,
        output_tokens=version,
        messages=messages,
        created_at=1_700_000_000.0,
        updated_at=1_700_000_000.0 + version,
    )


def make_message(seq: int, role: str = "user", content: Any = None) -> StoredMessage:
    return StoredMessage(
        seq=seq,
        role=role,
        content=content if content is not None else f"message {seq}",
        created_at=1_700_000_000.0 + seq,
    )


def make_approval(
    session_id: str = "s",
    tool_use_id: str = "toolu_1",
    *,
    status: ApprovalStatus = ApprovalStatus.PENDING,
    by: str | None = None,
) -> ApprovalRecord:
    return ApprovalRecord(
        session_id=session_id,
        tool_use_id=tool_use_id,
        tool="send_email",
        input_hash=input_hash({"to": "a@b"}),
        input={"to": "a@b"},
        in_doubt=False,
        reason="'send_email' is high-impact",
        status=status,
        requested_at=1_700_000_000.0,
        decided_at=None if by is None else 1_700_000_100.0,
        decided_by=by,
    )
