"""What one step of the general path answers or asks, built from what it found: the replayed
answer, the in-doubt call whose check found its effect, the denial recorded, the approval asked
for and the write that uses it up (``toolledger.engine._runner._steps``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..codec import content_of
from ..ops import Op, PutApproval
from ..records import ApprovalStatus, EffectRecord, Status, ToolCall
from . import _decide as decide
from ._attempt import attempt_of, created_of, encode
from ._gate import ApprovalRequest, Decision
from ._outcomes import Buffer, Buffered, CallOutcome, Disposition, Env, write

__all__ = ["consume", "denied", "found", "replayed", "request"]


def request(
    call: ToolCall, record: EffectRecord | None, ask: decide.Ask, env: Env
) -> ApprovalRequest:
    return ApprovalRequest(
        session_id=env.session_id,
        tool_use_id=call.tool_use_id,
        tool=call.name,
        input=call.input,
        in_doubt=ask.in_doubt,
        reason=ask.reason,
        input_hash=call.input_hash,
        attempt=attempt_of(record),
        ledger=env.ledger,
    )


def found(call: ToolCall, answer: Any, record: EffectRecord, env: Env, buf: Buffer) -> CallOutcome:
    """The in-doubt call's check found its effect: it succeeded, with the check's answer."""
    encoded = encode(answer, env, call)
    done = replace(
        record,
        status=Status.SUCCEEDED,
        result=encoded.stored,
        error="in doubt; its check found the effect",
        updated_at=env.clock(),
    )
    outcome = CallOutcome(call, Disposition.EXECUTED, encoded.content, is_error=False)
    buf.items.append(Buffered(write(done, record), urgent=False, outcome=outcome, must_land=True))
    return outcome


def consume(env: Env, decision: Decision) -> Op | None:
    """The write that uses up a persisted approval: it rides in the commit that records what the
    decision allowed (the intent), so an approval is never used without it, nor twice."""
    approval = decision.approval
    if approval is None or approval.status is not ApprovalStatus.APPROVED:
        return None  # a denial is not used up: it stands (and is recorded with the call)
    used = approval.consumed(at=env.clock())
    return PutApproval(used, expect_status=approval.status)


def denied(env: Env, call: ToolCall, record: EffectRecord | None, message: str) -> EffectRecord:
    return env.record(
        call,
        status=Status.DENIED,
        attempt=attempt_of(record),
        created_at=created_of(record),
        error=message,
        history=record.history if record is not None else (),
        replaces=record,
    )


def replayed(call: ToolCall, record: EffectRecord) -> CallOutcome:
    if record.status is Status.SUCCEEDED and record.result is not None:
        return CallOutcome(
            call,
            Disposition.REPLAYED,
            content_of(record.result),
            is_error=False,
            replayed=record.status,
        )
    return CallOutcome(
        call,
        Disposition.REPLAYED,
        record.error or f"{record.status.value}",
        is_error=True,
        replayed=record.status,
    )
