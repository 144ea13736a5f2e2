"""What the agent loop keeps of one session between its steps: the ``Run`` and ``Usage`` a run
returns, the loop's view of a session, how a step advances the session's state, and the two store
steps every turn takes (commit or raise; make sure the lease is still this run's)."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field, replace
from typing import Any

from .._lineage import ForkedEffect
from ..engine._drivers import Failure, ReadLease, Request
from ..engine._reconcile import commit
from ..errors import LedgerWriteError
from ..ops import Op, lost
from ..records import Lease, RunStatus, SessionState, StoredMessage, ToolCall
from ._transcripts import Wire

__all__ = ["Run", "Session", "Usage", "advance", "commit_or_raise", "still_ours"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """Where a session stands after ``Agent.run``.

    ``status`` says whether it finished (``completed``), needs a person (``needs_attention``,
    ``awaiting_approval``) or stopped (``max_turns``); ``reason`` says why in words.
    ``messages`` is the whole transcript in the API's own message shape; ``alerts`` the ledger
    alerts raised during this run. ``effects_after_fork`` lists, for a session made by a fork
    or a rewind, every call the world saw on the paths it left behind that took effect or may
    have (``toolledger.branches._branching``): they are not undone, and unless the branch was made
    with
    ``effects_after_fork="ignore"`` the model was told of them.
    """

    session_id: str
    status: RunStatus
    reason: str | None
    turns: int
    usage: Usage
    messages: list[dict[str, Any]]
    final_text: str = ""
    alerts: tuple[LedgerWriteError, ...] = field(default=())
    effects_after_fork: tuple[ForkedEffect, ...] = field(default=())


@dataclass(slots=True)
class Session:
    """The loop's view of one session: its state and transcript, as last committed, the
    calls its last message asks for when they are already known (read once per turn), and the
    request's messages built for the transcript so far (extended, not rebuilt, by the next
    request: ``toolledger.agent._transcripts``)."""

    state: SessionState
    messages: list[StoredMessage]
    calls: list[ToolCall] | None = None
    wire: Wire | None = None


def advance(
    state: SessionState,
    now: float,
    *,
    status: RunStatus,
    reason: str | None,
    messages: int = 0,
    turns: int = 0,
    input_tokens: int = 0,
    output_tokens: int = 0,
) -> SessionState:
    """The next version of ``state``: counters added, ``updated_at`` at ``now``."""
    return replace(
        state,
        status=status,
        reason=reason,
        version=state.version + 1,
        messages=state.messages + messages,
        turns=state.turns + turns,
        input_tokens=state.input_tokens + input_tokens,
        output_tokens=state.output_tokens + output_tokens,
        updated_at=now,
    )


def still_ours(sid: str, lease: Lease) -> Generator[Request, Any, None]:
    """The session's state and its ledger are read one after the other, not as one
    snapshot: a take-over between the two reads makes them disagree. That is this worker's
    lease lost, not a damaged store."""
    current: Lease | None = yield ReadLease()
    if current is None or current.token != lease.token:
        raise lost(sid, lease.token)


def commit_or_raise(ops: list[Op]) -> Generator[Request, Any, list[bool]]:
    answer = yield from commit(ops)
    if isinstance(answer, Failure):
        raise answer.exc
    applied: list[bool] = answer
    return applied
