"""What the store's readers make of a branch's copy of its lineage's call (``EffectRecord.origin``;
the runner's side is ``toolledger.engine._copies``).

A copy without an outcome of its own stands for its origin's record: its attempt is judged
where it runs, it is listed (in doubt, in progress) there — once for the whole lineage — and a
person settles it there, not on the branch. A copy whose origin no longer holds the call is the
branch's own, and its attempt as copied is over.
"""

from __future__ import annotations

from collections.abc import Callable

from .._liveness import Over, Verdict
from ..errors import NotInDoubtError
from ..records import EffectRecord, Lease, Status
from .contract import Backend

__all__ = ["listed_elsewhere", "origin_record", "same_call", "settle_here", "verdict_of"]


def same_call(copy: EffectRecord, there: EffectRecord | None) -> bool:
    """Whether ``there`` (the origin's record of the id) is the call ``copy`` was copied from."""
    return there is not None and there.tool == copy.tool and there.input_hash == copy.input_hash


def origin_record(backend: Backend, copy: EffectRecord) -> EffectRecord | None:
    """The origin's record of ``copy``'s call, or ``None`` when the origin no longer holds it."""
    assert copy.origin is not None
    found = backend.read_effects(copy.origin, [copy.tool_use_id]).get(copy.tool_use_id)
    return found if same_call(copy, found) else None


def verdict_of(
    backend: Backend, copy: EffectRecord, judge: Callable[[EffectRecord, Lease | None], Verdict]
) -> Verdict:
    """How a ``started`` copy's attempt stands, judged where it runs (by ``judge``, the store's
    verdict on a session's own record)."""
    there = origin_record(backend, copy)
    if there is None:
        return Over(f"session {copy.origin!r}, whose attempt it stands for, no longer holds it")
    if there.status is not Status.STARTED:
        return Over(f"it is {there.status.value} in session {copy.origin!r}, which settles it")
    return judge(there, None)


def listed_elsewhere(backend: Backend, record: EffectRecord) -> bool:
    """A started copy whose call its origin still holds: listed (and settled) there."""
    return record.copied and origin_record(backend, record) is not None


def settle_here(backend: Backend, record: EffectRecord) -> None:
    """Refuse to settle a copy on its branch while its origin holds the call
    (``NotInDoubtError``, naming where to settle it)."""
    if record.copied and not record.status.terminal and origin_record(backend, record) is not None:
        raise NotInDoubtError(
            f"call {record.tool_use_id!r} of session {record.session_id!r} is the call its "
            f"lineage holds in session {record.origin!r}, copied when the branch was made. "
            "Nothing was changed: settle it in that session (the same call id), once for every "
            "branch; this session takes that outcome at its next run",
            session_id=record.session_id,
            tool_use_id=record.tool_use_id,
        )
