"""Typed records: what a call is, what the ledger knows about it.

Everything here is an immutable value; the stores persist these and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from ._constructors import install, slot_setters
from ._holder import Holder
from ._lineage import Branch

__all__ = [
    "SAFE_RERUN",
    "ApprovalRecord",
    "ApprovalStatus",
    "EffectClass",
    "EffectRecord",
    "Holder",
    "Lease",
    "PastAttempt",
    "RunStatus",
    "SessionState",
    "Status",
    "StoredMessage",
    "ToolCall",
    "history_from_json",
    "history_json",
    "same_write",
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
    ``denied`` answers a call that never runs under its id: not approved, or its intent could
    not be recorded (its ``error`` is the answer).
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


SAFE_RERUN = "the tool is safe to run again"
"""How ``PastAttempt.settled`` begins for an attempt replaced because a re-run is harmless."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PastAttempt:
    """An earlier attempt of a call, kept in its record once a later attempt replaced it.

    ``at`` is when its record was last written (its intent, or the word that settled it).
    ``settled`` says how the attempt was judged over before the next one began (a person said it
    did not happen, its check found nothing, the tool is safe to run again, an approver allowed
    a re-run, a person forced it). ``late`` is what the attempt itself reported *after* it had
    been replaced — ``succeeded`` or ``failed: …`` — and ``late_result`` its result: then both
    attempts may have taken effect, and ``toolledger verify`` says so.
    """

    attempt: int
    worker: str | None
    holder: Holder | None
    at: float
    deadline: float | None
    settled: str
    late: str | None = None
    late_result: str | None = None

    @property
    def took_effect_late(self) -> bool:
        """It reported success after it was replaced, and nothing vouches that its effect and
        the next attempt's are one (a tool safe to run again would)."""
        return self.late == "succeeded" and not self.settled.startswith(SAFE_RERUN)

    def as_json(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "worker": self.worker,
            "holder": None if self.holder is None else self.holder.text(),
            "at": self.at,
            "deadline": self.deadline,
            "settled": self.settled,
            "late": self.late,
            "late_result": self.late_result,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> PastAttempt:
        """Raises ``KeyError``/``TypeError``/``ValueError`` for a damaged entry."""
        deadline = raw["deadline"]
        return cls(
            attempt=int(raw["attempt"]),
            worker=raw["worker"],
            holder=Holder.parse(raw["holder"]),
            at=float(raw["at"]),
            deadline=None if deadline is None else float(deadline),
            settled=str(raw["settled"]),
            late=raw.get("late"),
            late_result=raw.get("late_result"),
        )


def history_json(history: tuple[PastAttempt, ...]) -> list[dict[str, Any]]:
    return [a.as_json() for a in history]


def history_from_json(raw: Any) -> tuple[PastAttempt, ...]:
    if not raw:
        return ()
    if not isinstance(raw, list):
        raise ValueError("an attempt history must be a list")
    return tuple(PastAttempt.from_json(a) for a in raw)


@dataclass(frozen=True, slots=True, kw_only=True)
class EffectRecord:
    """The ledger's record of one ``(session_id, tool_use_id)``.

    ``result`` is the JSON text of what the tool returned (``succeeded``); ``error`` the message a
    ``failed`` or ``denied`` call answered with, why a ``started`` one is in doubt, or — on a
    ``succeeded`` one — how it was settled (its check found it; a person resolved it).
    ``attempt`` counts executions begun (0: recorded without an intent, as safe calls are).
    ``approved_by`` names who approved a high-impact call.

    An intent (``started``) names its attempt's owner: ``worker`` (``host:pid:…``, for people),
    ``holder`` (the process, for liveness), ``lease_token`` (the session lease it ran under, if
    any) and ``deadline`` (on the store's clock: its start plus the tool's ``timeout``). A
    ``started`` record whose ``holder`` is ``None`` but which has a deadline was *released* by its
    worker (it knows the attempt is over, outcome unknown); with neither it was written by
    toolledger 0.1, before attempts had an identity, and counts as running until ``updated_at``
    plus the default timeout. ``history`` keeps the attempts a later one replaced.

    Branches (docs/design.md, rule 19: one lineage, one call per id;
    ``toolledger.branches._branching``). A
    fork copies every call of its lineage into its ledger: the same call, not a new one.
    ``made_in`` is the session the call was made in: its idempotency key is made from that
    session's id (``key_session``), the same on every branch — or, for a key-forwarding call a
    branch made first, its lineage's first session, whose key every session of the lineage
    that makes the call forwards. ``origin`` is set while the
    record is a copy standing for another session's record of the call — it takes that
    record's outcome, and never runs on the branch while that record is there
    (``toolledger.engine._copies``); an attempt the branch runs itself clears it. ``None`` for both:
    a call made in this session — as every record written before lineages shared their calls.
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
    holder: Holder | None = None
    lease_token: int | None = None
    deadline: float | None = None
    history: tuple[PastAttempt, ...] = ()
    boot_deadline: str | None = None
    """The same deadline on its machine's boot clock, ``"<boot id>/<seconds since boot>"``,
    where its worker could read one (Linux): a worker of that machine judges the deadline by it,
    whatever the wall clock did since (``toolledger._liveness``). ``None`` elsewhere, and in
    records written before it was kept."""
    made_in: str | None = None
    origin: str | None = None

    @property
    def key_session(self) -> str:
        """The session the call was made in, whose id makes its idempotency key: one key for
        the call on every branch of its lineage."""
        return self.made_in if self.made_in is not None else self.session_id

    @property
    def copied(self) -> bool:
        """A branch's copy of a call its lineage made elsewhere."""
        return self.origin is not None and self.origin != self.session_id

    @property
    def in_doubt(self) -> bool:
        """Started and never finished. Whether its attempt may still be running is a separate
        question (``toolledger._liveness.judge``): only a finished attempt is truly in doubt."""
        return self.status is Status.STARTED

    @property
    def released(self) -> bool:
        """Its worker declared the attempt over, outcome unknown."""
        return self.status is Status.STARTED and self.holder is None and self.deadline is not None

    @property
    def late_effects(self) -> list[PastAttempt]:
        """Replaced attempts that reported success afterwards: their effect happened too."""
        return [a for a in self.history if a.took_effect_late]


# -- constructors written out (``toolledger._constructors``) -------------------------------------

_CALL_SETTERS = slot_setters(ToolCall)


def _tool_call_init(
    self: ToolCall,
    *,
    tool_use_id: str,
    name: str,
    input: dict[str, Any],
    input_hash: str,
    problem: str | None = None,
) -> None:
    s = _CALL_SETTERS  # in field order
    s[0](self, tool_use_id)
    s[1](self, name)
    s[2](self, input)
    s[3](self, input_hash)
    s[4](self, problem)


install(ToolCall, _tool_call_init)

_EFFECT_SETTERS = slot_setters(EffectRecord)


def _effect_record_init(
    self: EffectRecord,
    *,
    session_id: str,
    tool_use_id: str,
    tool: str,
    input_hash: str,
    status: Status,
    attempt: int = 0,
    result: str | None = None,
    error: str | None = None,
    created_at: float,
    updated_at: float,
    approved_by: str | None = None,
    worker: str | None = None,
    holder: Holder | None = None,
    lease_token: int | None = None,
    deadline: float | None = None,
    history: tuple[PastAttempt, ...] = (),
    boot_deadline: str | None = None,
    made_in: str | None = None,
    origin: str | None = None,
) -> None:
    s = _EFFECT_SETTERS  # in field order
    s[0](self, session_id)
    s[1](self, tool_use_id)
    s[2](self, tool)
    s[3](self, input_hash)
    s[4](self, status)
    s[5](self, attempt)
    s[6](self, result)
    s[7](self, error)
    s[8](self, created_at)
    s[9](self, updated_at)
    s[10](self, approved_by)
    s[11](self, worker)
    s[12](self, holder)
    s[13](self, lease_token)
    s[14](self, deadline)
    s[15](self, history)
    s[16](self, boot_deadline)
    s[17](self, made_in)
    s[18](self, origin)


install(EffectRecord, _effect_record_init)


def same_write(stored: EffectRecord | None, ours: EffectRecord) -> bool:
    """Whether ``stored`` is the very record ``ours`` wrote — its status, attempt, owner and
    timestamp — whatever a ``redact`` hook did to its text."""
    return stored is not None and (
        stored.status,
        stored.attempt,
        stored.updated_at,
        stored.worker,
        stored.holder,
    ) == (ours.status, ours.attempt, ours.updated_at, ours.worker, ours.holder)


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
    READY = "ready"
    """Made by a fork or a rewind (``toolledger.branches._branching``): every call of its last turn
    is
    answered and nothing is pending. Running it with no prompt asks the model to go on; a new
    prompt is appended first."""

    @property
    def finished(self) -> bool:
        """Finished sessions take a new prompt; unfinished ones resume."""
        return self in (RunStatus.COMPLETED, RunStatus.MAX_TURNS, RunStatus.READY)


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
    lineage: tuple[Branch, ...] = ()
    """The forks and rewinds that made this transcript, oldest first (``toolledger._lineage``);
    empty for a session that was never branched."""

    def abandoned_calls(self) -> set[str]:
        """The call ids of this session's own abandoned branches: their records stay in its
        ledger although its transcript no longer holds them."""
        return {
            i
            for b in self.lineage
            if b.branch is not None and b.source == self.session_id
            for i in b.abandoned_calls
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredMessage:
    """One message of a transcript, in the Messages API shape (``content`` as plain JSON)."""

    seq: int
    role: str
    content: Any
    created_at: float


_SESSION_SETTERS = slot_setters(SessionState)


def _session_state_init(
    self: SessionState,
    *,
    session_id: str,
    status: RunStatus,
    reason: str | None = None,
    version: int,
    turns: int = 0,
    input_tokens: int = 0,
    output_tokens: int = 0,
    messages: int = 0,
    created_at: float,
    updated_at: float,
    lineage: tuple[Branch, ...] = (),
) -> None:
    s = _SESSION_SETTERS  # in field order
    s[0](self, session_id)
    s[1](self, status)
    s[2](self, reason)
    s[3](self, version)
    s[4](self, turns)
    s[5](self, input_tokens)
    s[6](self, output_tokens)
    s[7](self, messages)
    s[8](self, created_at)
    s[9](self, updated_at)
    s[10](self, lineage)


install(SessionState, _session_state_init)

_MESSAGE_SETTERS = slot_setters(StoredMessage)


def _stored_message_init(
    self: StoredMessage, *, seq: int, role: str, content: Any, created_at: float
) -> None:
    s = _MESSAGE_SETTERS  # in field order
    s[0](self, seq)
    s[1](self, role)
    s[2](self, content)
    s[3](self, created_at)


install(StoredMessage, _stored_message_init)


class ApprovalStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    USED = "used"
    """An approval used up by the attempt it allowed (in the same commit as its intent): never
    used again. A denial is not used up: it stands."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalRecord:
    """A persisted approval request and its decision, bound to (tool_use_id, tool, input hash,
    in doubt or not, attempt)."""

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
    attempt: int = 0
    """The attempt the question is about: the call's ``attempt`` when it was asked (0 for a
    call never started; an in-doubt re-run asks about the attempt in doubt). A later attempt is
    another question. Requests written by toolledger 0.1 read as 0."""

    def consumed(self, *, at: float) -> ApprovalRecord:
        """This decision, used up by the call it decided (at ``at``)."""
        return replace(self, status=ApprovalStatus.USED, used_at=at)


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    """Who runs a session now. ``token`` is the fencing token: it grows with every take-over, and
    a write carrying an older one is refused. ``owner`` is ``host:pid:…/run`` of the holder (for
    people), ``holder`` its process (for liveness; ``None`` in leases written by toolledger 0.1).
    ``expires_at`` is on the store's clock; ``0`` means given back.

    ``renewals`` counts the renewals of this token: a worker that watches it stay the same for a
    whole ``ttl`` (on its own monotonic clock) knows the holder stopped renewing, whatever any
    wall clock says (``toolledger._liveness``). Leases written before renewals were counted
    (toolledger 0.1.0's among them) read ``renewals=0`` and ``ttl=None``."""

    session_id: str
    owner: str
    token: int
    expires_at: float
    holder: Holder | None = None
    renewals: int = 0
    ttl: float | None = None
