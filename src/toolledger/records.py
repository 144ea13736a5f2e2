"""Typed records: what a call is, what the ledger knows about it.

Everything here is an immutable value; the stores persist these and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = [
    "ApprovalRecord",
    "ApprovalStatus",
    "EffectClass",
    "EffectRecord",
    "Lease",
    "RunStatus",
    "SessionState",
    "Status",
    "StoredMessage",
    "ToolCall",
]


class EffectClass(StrEnum):
    """What running a tool twice does to the world."""

    READ_ONLY = "read_only"
    """No side effect: re-run freely."""
    IDEMPOTENT = "idempotent"
    """Overwrite / ensure-exists: N runs leave the same world as one."""
    NON_IDEMPOTENT = "non_idempotent"
    """Append / send / create: every run adds something. The default."""


class Status(StrEnum):
    """Where a call stands in the ledger.

    ``started`` is the intent: written just before a tool whose re-run is unsafe runs. A record
    still ``started`` when nobody is running it is *in doubt*. ``not_happened`` is set by a person
    resolving an in-doubt call ("it did not take effect"); the call may then run again.
    """

    STARTED = "started"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DENIED = "denied"
    NOT_HAPPENED = "not_happened"

    @property
    def terminal(self) -> bool:
        """A terminal record answers the call for ever: the tool never runs again for that id."""
        return self in (Status.SUCCEEDED, Status.FAILED, Status.DENIED)


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """One tool call, read from model output.

    ``problem`` says why the call cannot run as given (arguments that are not a JSON object, for
    APIs that send them as a string); such a call is answered with an error, nothing runs and
    nothing is recorded.
    """

    tool_use_id: str
    name: str
    input: dict[str, Any]
    input_hash: str
    problem: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EffectRecord:
    """The ledger's record of one ``(session_id, tool_use_id)``.

    ``result`` is the JSON text of what the tool returned (``succeeded``); ``error`` the message a
    ``failed`` or ``denied`` call answered with, why a ``started`` one is in doubt, or — on a
    ``succeeded`` one — how it was settled (its check found it; a person resolved it).
    ``attempt`` counts executions begun (0: recorded without an intent, as safe calls are).
    ``approved_by`` names who approved a high-impact call.
    """

    session_id: str
    tool_use_id: str
    tool: str
    input_hash: str
    status: Status
    attempt: int = 0
    result: str | None = None
    error: str | None = None
    created_at: float
    updated_at: float
    approved_by: str | None = None
    worker: str | None = None

    @property
    def in_doubt(self) -> bool:
        """Started and never finished: nobody knows whether the effect happened."""
        return self.status is Status.STARTED


class RunStatus(StrEnum):
    """Where an agent session stands."""

    RUNNING = "running"
    """Started or resumed, not finished: a crash leaves this; the next run resumes it."""
    COMPLETED = "completed"
    """The model finished (its last answer asked for no tool)."""
    NEEDS_ATTENTION = "needs_attention"
    """A call is in doubt, or an effect could not be recorded: a person must look."""
    AWAITING_APPROVAL = "awaiting_approval"
    """A high-impact call waits in the approval queue."""
    MAX_TURNS = "max_turns"
    """The turn budget ran out; a new prompt continues the conversation."""
    FAILED = "failed"
    """The model API failed (reason stored); running again retries."""

    @property
    def finished(self) -> bool:
        """Finished sessions take a new prompt; unfinished ones resume."""
        return self in (RunStatus.COMPLETED, RunStatus.MAX_TURNS)


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionState:
    """The checkpointed state of one agent session (the transcript is stored beside it).

    ``version`` grows with every checkpoint; writes compare-and-set on it, so two workers cannot
    both advance one session. ``messages`` is the number of stored messages.
    """

    session_id: str
    status: RunStatus
    reason: str | None = None
    version: int
    turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    messages: int = 0
    created_at: float
    updated_at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredMessage:
    """One message of a transcript, in the Messages API shape (``content`` as plain JSON)."""

    seq: int
    role: str
    content: Any
    created_at: float


class ApprovalStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    USED = "used"
    """Consumed by the call it approved (or refused): never used again."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalRecord:
    """A persisted approval request and its decision, bound to (tool_use_id, tool, input hash)."""

    session_id: str
    tool_use_id: str
    tool: str
    input_hash: str
    input: dict[str, Any]
    in_doubt: bool
    reason: str
    status: ApprovalStatus
    requested_at: float
    decided_at: float | None = None
    decided_by: str | None = None
    used_at: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    """Who runs a session now. ``token`` is the fencing token: it grows with every take-over, and
    a write carrying an older one is refused. ``owner`` is ``host:pid:…`` of the holder."""

    session_id: str
    owner: str
    token: int
    expires_at: float
