"""The write operations every store applies: what a state change is, independent of storage.

A backend's ``apply`` takes a list of them and commits them durably in one transaction. Each is a
single conditional write — insert-if-absent, or compare-and-set on ``(status, attempt)`` (and the
version's ``updated_at``), a session's version, a lease's token — so a crash or a racing worker
can never leave half a state change, and a re-sent write is harmless (docs/style.md, rule 3). Guards
(``PutSession``, ``AppendMessages``, ``HoldLease``, ``TakeLease``, a guarded ``UpdateEffect``)
roll the whole batch back when their condition fails, with the error made here.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ._constructors import install, slot_setters
from .errors import ConfigurationError, LeaseLostError, SessionBusyError, SessionConflictError
from .records import (
    ApprovalRecord,
    ApprovalStatus,
    EffectRecord,
    Holder,
    Lease,
    RunStatus,
    SessionState,
    Status,
    StoredMessage,
)

__all__ = [
    "PRUNABLE",
    "AbandonMessages",
    "AppendMessages",
    "DropLease",
    "DropSession",
    "HoldLease",
    "InsertEffect",
    "Op",
    "PutApproval",
    "PutSession",
    "Reading",
    "TakeLease",
    "UpdateEffect",
    "alone",
    "approval_applies",
    "busy",
    "conflict",
    "droppable",
    "effect_applies",
    "lost",
    "moved",
    "still_there",
]


Reading = tuple[float, float]
"""A reading of the store's clock: its time, and this process's ``time.monotonic()`` then."""


@dataclass(frozen=True, slots=True)
class InsertEffect:
    """Insert ``record`` unless its ``(session, tool_use_id)`` exists. Applied → ``True``.
    ``at``: see ``UpdateEffect``."""

    record: EffectRecord
    at: Reading | None = None


@dataclass(frozen=True, slots=True)
class UpdateEffect:
    """Replace the record if it is still ``(expect_status, expect_attempt)`` — and, with
    ``expect_at``, the very version written at that ``updated_at``: compare-and-set. Applied →
    ``True``; someone else moved it first → ``False``."""

    record: EffectRecord
    expect_status: Status
    expect_attempt: int
    expect_at: float | None = None
    guard: bool = False
    """A guard, like ``PutSession``: if the record moved on, the whole batch rolls back and
    ``SessionConflictError`` (with ``tool_use_id``) is raised — a checkpoint that reports an
    outcome never lands without it."""
    at: Reading | None = None
    """The reading of the store's clock the record's ``deadline`` was set on (an intent's): a
    store whose clock every worker shares refuses the write if its clock, as the write is sent,
    says otherwise than that reading carried forward on this process's monotonic clock
    (``errors.ClockMovedError``) — a deadline written on a stale reading of it would let a
    worker elsewhere judge a running attempt over. ``None``: the record sets no time another
    worker judges by."""
    expect_worker: str | None = None
    """With ``expect_at``: and written by that worker (``EffectRecord.worker``). A clean-up of
    an intent whose commit was never confirmed names its own worker: two workers racing on a
    call build intents of the same attempt, which a coarse clock can give one ``updated_at`` —
    the intent that landed may be the other's, whose tool is running."""
    expect_holder: Holder | None = None
    """With ``expect_worker``: and run by that process (``EffectRecord.holder``; ``None``: a
    record naming none). A worker id is only a name, which processes may share
    (``open_store(worker_id=)``): two processes given one, racing on a call, build intents
    that differ only by their holder."""


@dataclass(frozen=True, slots=True)
class PutSession:
    """Write a session's state: create it (``expect_version=None``) or compare-and-set on its
    version. A *guard*: if the condition fails the whole batch is rolled back and
    ``SessionConflictError`` raised — a checkpoint is all or nothing."""

    state: SessionState
    expect_version: int | None
    """``None``: create it. Otherwise the version it must be at; ``state.version`` is past it (a
    session's version only grows, ``SessionState``: a store may rely on that)."""
    counters_only: bool = False
    """Only the counters move: ``state`` is the session's as it was, with its version, turns,
    tokens and ``updated_at`` moved on and the one message the batch appends — created at
    ``state.updated_at`` — counted. A store may then keep the new counters in that message's
    row instead of rewriting the session's (SQLite: ``toolledger.stores._sql.writes``, which
    checks, in the insert, that the session's row agrees, and writes the row otherwise); reads
    give the same state either way. The agent's checkpoints A and B of a turn that goes on."""


@dataclass(frozen=True, slots=True)
class AppendMessages:
    """Append messages at the end of a transcript (their ``seq`` continues it). A guard, like
    ``PutSession``: a seq already taken means another writer got there first."""

    messages: tuple[StoredMessage, ...]


@dataclass(frozen=True, slots=True)
class AbandonMessages:
    """Take the transcript's messages from seq ``from_seq`` on out of it and keep them, with
    their seqs, as the session's abandoned branch number ``branch`` (a rewind,
    ``toolledger.branches._branching``); the transcript then continues at ``from_seq``. Nothing is
    deleted: ``Backend.read_abandoned`` returns them, and a session's removal removes them
    with it. A guard: a ``from_seq`` past the transcript's end, or a ``branch`` number already
    taken, rolls the batch back (``SessionConflictError``). Pair it with a ``PutSession``
    compare-and-set: the session must not have moved since the rewind read it."""

    from_seq: int
    branch: int


@dataclass(frozen=True, slots=True)
class PutApproval:
    """Create an approval request (``expect_status=None``) or move one on (compare-and-set on
    its status). Applied → ``True``."""

    record: ApprovalRecord
    expect_status: ApprovalStatus | None


@dataclass(frozen=True, slots=True)
class TakeLease:
    """Take the session's lease: insert it (``expect_token=0``: there is none) or replace the
    one with ``expect_token``, ``expect_expires_at`` and ``expect_renewals`` (given back,
    unrenewed, or held by a dead worker — the caller judged it,
    ``toolledger._liveness.lease_state``). Comparing the expiry and the renewal count too means a
    renewal that lands between the judgement and the take-over makes it fail. A guard: if the
    lease moved on, the batch rolls back and ``SessionBusyError`` is raised. The new lease starts
    at ``renewals=0``."""

    lease: Lease
    expect_token: int
    expect_expires_at: float | None = None
    expect_renewals: int | None = None


@dataclass(frozen=True, slots=True)
class HoldLease:
    """The fence: the session's lease must still carry ``token`` (and not have been given
    back); it is renewed to ``expires_at``, counting one more renewal (``None``: only checked,
    its expiry and count left as they are). A guard: a taken-over lease rolls the batch back
    (``LeaseLostError``)."""

    session_id: str
    token: int
    expires_at: float | None


@dataclass(frozen=True, slots=True)
class DropLease:
    """Give the lease up (it expires now) if it still carries ``token`` — and, when ``owner``
    is given, is still held by that owner: a take that may not have landed is given back
    without touching another's, taken from the same reading with the same token. Applied →
    ``True``."""

    session_id: str
    token: int
    owner: str | None = None


@dataclass(frozen=True, slots=True)
class DropSession:
    """Remove a session whole: its state, transcript (with its abandoned branches), records,
    approvals and lease (retention, ``Store.prune``). A guard, checked in the same transaction
    as the removal: the session is still at ``expect_version`` (``None``: it has no state, only
    records) and ended (completed, ready, max_turns or failed); no call of it is ``started`` (in
    progress, or in doubt); no approval is pending; its lease is not held at ``now``; and, with
    ``last_activity`` and ``records`` (what the remover read), nothing of it was written since:
    no record or approval stamped later, and as many records as it had. Otherwise the batch
    rolls back (``SessionConflictError``). A record or request that lands while it runs is never
    removed: the removal skips ``started`` records, pending approvals and anything stamped after
    ``last_activity`` by its own condition."""

    session_id: str
    expect_version: int | None
    now: float
    last_activity: float | None = None
    """The latest stamp the remover read of the session (its state, records and approvals):
    a record written, or an approval asked or decided, after it keeps the session. A call that
    ran and settled between the remover's read and the removal leaves no ``started`` record and
    need not move the session's version (``run_tool_uses`` writes no state): this tells it."""
    records: int | None = None
    """How many records the remover read: one written since with an earlier stamp (its
    writer's clock behind) is told by the count."""


# -- constructors written out (``toolledger._constructors``): every call and turn builds these --

_INSERT_SETTERS = slot_setters(InsertEffect)


def _insert_effect_init(
    self: InsertEffect, record: EffectRecord, at: Reading | None = None
) -> None:
    s = _INSERT_SETTERS  # in field order
    s[0](self, record)
    s[1](self, at)


_UPDATE_SETTERS = slot_setters(UpdateEffect)


def _update_effect_init(  # noqa: PLR0917 (the dataclass's own signature)
    self: UpdateEffect,
    record: EffectRecord,
    expect_status: Status,
    expect_attempt: int,
    expect_at: float | None = None,
    guard: bool = False,
    at: Reading | None = None,
    expect_worker: str | None = None,
    expect_holder: Holder | None = None,
) -> None:
    s = _UPDATE_SETTERS  # in field order
    s[0](self, record)
    s[1](self, expect_status)
    s[2](self, expect_attempt)
    s[3](self, expect_at)
    s[4](self, guard)
    s[5](self, at)
    s[6](self, expect_worker)
    s[7](self, expect_holder)


_PUT_SETTERS = slot_setters(PutSession)


def _put_session_init(
    self: PutSession,
    state: SessionState,
    expect_version: int | None,
    counters_only: bool = False,
) -> None:
    s = _PUT_SETTERS  # in field order
    s[0](self, state)
    s[1](self, expect_version)
    s[2](self, counters_only)


_HOLD_SETTERS = slot_setters(HoldLease)


def _hold_lease_init(
    self: HoldLease, session_id: str, token: int, expires_at: float | None
) -> None:
    s = _HOLD_SETTERS  # in field order
    s[0](self, session_id)
    s[1](self, token)
    s[2](self, expires_at)


install(InsertEffect, _insert_effect_init)
install(UpdateEffect, _update_effect_init)
install(PutSession, _put_session_init)
install(HoldLease, _hold_lease_init)


PRUNABLE = frozenset({RunStatus.COMPLETED, RunStatus.MAX_TURNS, RunStatus.FAILED, RunStatus.READY})
"""The statuses of sessions that may be removed: nothing of them is pending (a failed one failed
at the model call, with every tool_use answered; a ready one was forked or rewound and not run
since — removed only when asked for by its status, ``toolledger.stores.retention``).
``needs_attention``, ``awaiting_approval`` and ``running`` sessions are never removed."""


def still_there(session_id: str) -> SessionConflictError:
    """A ``DropSession`` whose guard failed."""
    return SessionConflictError(
        f"session {session_id!r} was not removed: it changed since it was read, or it has a call "
        "in progress or in doubt, a pending approval, or a held lease. Nothing was removed.",
        session_id=session_id,
    )


def alone(ops: Sequence[Op]) -> None:
    """A ``DropSession`` is a batch of its own: nothing may be written beside a removal."""
    if len(ops) != 1:
        raise ConfigurationError("a session is removed in a batch of its own (DropSession alone)")


def droppable(
    op: DropSession,
    state: SessionState | None,
    effects: Iterable[EffectRecord],
    approvals: Iterable[ApprovalRecord],
    lease: Lease | None,
) -> bool:
    """The guard of ``DropSession``, for backends that evaluate it in Python."""
    if op.expect_version is None:
        if state is not None:
            return False
    elif state is None or state.version != op.expect_version or state.status not in PRUNABLE:
        return False
    effects = list(effects)
    approvals = list(approvals)
    if op.records is not None and len(effects) != op.records:
        return False
    last = op.last_activity
    if last is not None and (
        any(r.updated_at > last for r in effects)
        or any((a.decided_at or a.requested_at) > last for a in approvals)
    ):
        return False
    return (
        all(r.status is not Status.STARTED for r in effects)
        and all(a.status is not ApprovalStatus.PENDING for a in approvals)
        and (lease is None or lease.expires_at <= op.now)
    )


Op = (
    InsertEffect
    | UpdateEffect
    | PutSession
    | AppendMessages
    | AbandonMessages
    | PutApproval
    | TakeLease
    | HoldLease
    | DropLease
    | DropSession
)


def busy(session_id: str, current: Lease | None, why: str | None = None) -> SessionBusyError:
    owner = current.owner if current is not None else "another worker"
    expires = current.expires_at if current is not None else 0.0
    held = why or (f"its lease runs until {time.strftime('%H:%M:%S', time.localtime(expires))}")
    return SessionBusyError(
        f"session {session_id!r} is being run by {owner} ({held}): two workers never run one "
        "session at once. Try again later, or let `toolledger resume-all` pick it up.",
        session_id=session_id,
        owner=owner,
        expires_at=expires,
    )


def lost(session_id: str, token: int) -> LeaseLostError:
    return LeaseLostError(
        f"this worker's lease on session {session_id!r} (token {token}) was taken over by "
        "another worker: the write was refused and nothing of it landed. This run stops here.",
        session_id=session_id,
    )


def effect_applies(op: InsertEffect | UpdateEffect, current: EffectRecord | None) -> bool:
    """The condition of an effect operation, for backends that evaluate it in Python."""
    if isinstance(op, InsertEffect):
        return current is None
    return (
        current is not None
        and current.status is op.expect_status
        and current.attempt == op.expect_attempt
        and (op.expect_at is None or current.updated_at == op.expect_at)
        and (
            op.expect_worker is None
            or (current.worker == op.expect_worker and current.holder == op.expect_holder)
        )
    )


def approval_applies(op: PutApproval, current: ApprovalRecord | None) -> bool:
    if op.expect_status is None:
        return current is None
    return current is not None and current.status is op.expect_status


def moved(session_id: str, tool_use_id: str) -> SessionConflictError:
    """A guarded outcome found its record moved on (another attempt, a person)."""
    return SessionConflictError(
        f"the record of {tool_use_id!r} in session {session_id!r} moved on while this worker "
        "ran the call (another attempt replaced it, or a person settled it): nothing of this "
        "checkpoint was written. Run the session again: it answers from the ledger.",
        session_id=session_id,
        tool_use_id=tool_use_id,
    )


def conflict(session_id: str, why: str) -> SessionConflictError:
    return SessionConflictError(
        f"session {session_id!r} changed since it was read ({why}): another worker is running "
        "it or ran it meanwhile. Nothing of this checkpoint was written; reload and go on.",
        session_id=session_id,
    )
