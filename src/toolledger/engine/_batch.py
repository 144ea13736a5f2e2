"""What one batch of calls has done so far: each call's outcome, the writes that wait for a
commit, and what the batch runs against. ``toolledger.engine._outcomes`` commits the writes."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .._constructors import install, slot_setters
from .._liveness import Verdict, flight_key
from ..adapters import ResultShape
from ..codec import valid_unicode
from ..errors import LedgerWriteError, ToolLedgerError
from ..ops import InsertEffect, Op, Reading, UpdateEffect
from ..records import EffectRecord, Holder, Lease, PastAttempt, Status, ToolCall
from ..stores.store import Ledger
from ..tools import ToolSet

__all__ = [
    "Batch",
    "Buffer",
    "Buffered",
    "CallOutcome",
    "Disposition",
    "Env",
    "Flushed",
    "release",
    "write",
]


class Disposition(StrEnum):
    """What happened to one call in a batch."""

    EXECUTED = "executed"  # the tool ran and returned
    REPLAYED = "replayed"  # answered from the ledger; nothing ran
    FAILED = "failed"  # the tool raised
    DECLINED = "declined"  # the approver said no, or there is no approver
    REJECTED = "rejected"  # unknown tool or bad input; nothing ran
    IN_DOUBT = "in_doubt"  # may have happened; a person must resolve it
    NOT_EXECUTED = "not_executed"  # the ledger could not record the intent; nothing ran
    AWAITING_APPROVAL = "awaiting_approval"  # queued for a person; nothing ran yet


@dataclass(slots=True)
class CallOutcome:
    """The result of one call, plus what the agent needs to know about it."""

    call: ToolCall
    disposition: Disposition
    content: str
    is_error: bool
    alert: LedgerWriteError | None = None
    settle_in: str | None = None  # in doubt, and settled in this session (a branch's copy)
    not_run_in: bool = (
        False  # ``settle_in`` has not run the call yet: it runs it, nothing to settle
    )
    in_doubt: bool = False  # awaiting a person's word on a call in doubt
    replayed: Status | None = None  # a replay: the status of the record that answers it
    attempt: int | None = None  # in doubt: the attempt nobody knows the end of

    def __post_init__(self) -> None:
        # An error message can carry text UTF-8 cannot hold (an exception's repr); the model
        # APIs would refuse the whole request for it. A result's content needs no check (and a
        # 1 MiB one should not pay a scan): ``codec.content_of`` never yields a lone surrogate.
        if self.is_error:
            self.content = valid_unicode(self.content)


@dataclass(slots=True)
class Batch:
    outcomes: list[CallOutcome]
    commit_error: ToolLedgerError | None = None  # the final commit (with ``tail``) failed

    def results(self, shape: ResultShape) -> list[dict[str, Any]]:
        return [shape(o.call.tool_use_id, o.content, is_error=o.is_error) for o in self.outcomes]

    @property
    def alerts(self) -> list[LedgerWriteError]:
        return [o.alert for o in self.outcomes if o.alert is not None]


@dataclass(frozen=True, slots=True, kw_only=True)
class Env:
    """What a batch runs against."""

    tools: ToolSet
    ledger: Ledger
    can_ask: bool
    wait: float = 0.0  # how long to wait for a call another attempt is running
    lease_token: int | None = None  # the agent's session lease, recorded in intents
    # Fixed for the batch's life, read on every write: kept rather than looked up each time
    # (read off the ledger's store by the constructor, ``_env_init``).
    session_id: str = field(init=False)
    worker: str = field(init=False)
    url: str = field(init=False)
    clock: Callable[[], float] = field(init=False)
    """This worker's clock (``Store.clock``): the timestamps people read."""
    now: Callable[[], float] = field(init=False)
    """The store's clock (``Store.now``): deadlines and leases are on it."""
    keyed: dict[str, str] = field(init=False)
    """The session whose id keys a call this branch is about to make, by tool_use_id, where
    that is not what its record says: a key-forwarding call its lineage's first session holds
    no record of (``toolledger.engine._claims.look_up``) forwards that session's key, the
    lineage's — fresh, or a fork's copy of it that its origin handed back."""

    @property
    def holder(self) -> Holder | None:
        return self.ledger.store.runtime.holder

    def flight(self, call: ToolCall) -> tuple[str, str, str]:
        return flight_key(self.ledger.store.place, self.session_id, call.tool_use_id)

    def key_session(self, call: ToolCall, record: EffectRecord | None) -> str:
        """The session whose id makes ``call``'s idempotency key: the lineage's when this
        branch makes it first (``keyed``), else where its ``record`` says it was made
        (``EffectRecord.key_session``), else this one."""
        made = self.keyed.get(call.tool_use_id) if self.keyed else None
        if made is not None:
            return made
        return record.key_session if record is not None else self.session_id

    def judge(self, record: EffectRecord, lease: Lease | None) -> Verdict:
        """Whether ``record``'s attempt may still take effect, as the store judges it
        (``Store.judge``), with ``lease`` read by the caller's driver."""
        return self.ledger.store.judge_with(record, lease)

    def lease_state(self, lease: Lease | None) -> Verdict:
        """Whether a session's ``lease`` is held by a run that may still write
        (``Store.lease_state``)."""
        return self.ledger.store.lease_state(lease)

    def record(
        self,
        call: ToolCall,
        *,
        status: Status,
        attempt: int,
        created_at: float | None,
        result: str | None = None,
        error: str | None = None,
        approved_by: str | None = None,
        deadline: float | None = None,
        history: tuple[PastAttempt, ...] = (),
        holder: Holder | None = None,
        boot_deadline: str | None = None,
        replaces: EffectRecord | None = None,
    ) -> EffectRecord:
        """A record of ``call`` written by this worker, of an attempt this session runs (or
        decides) itself. It keeps where the call was made (``replaces``: the call's record it
        is the next version of), so its key stays the lineage's (``EffectRecord.made_in``);
        it stands for no other session's record any more (``origin``)."""
        now = self.clock()
        made_in = replaces.made_in if replaces is not None else None
        if self.keyed:  # a branch's call it makes first under its lineage's key
            made_in = self.keyed.get(call.tool_use_id, made_in)
        return EffectRecord(
            session_id=self.session_id,
            tool_use_id=call.tool_use_id,
            tool=call.name,
            input_hash=call.input_hash,
            status=status,
            attempt=attempt,
            result=result,
            # An exception's text may hold what no store can encode.
            error=None if error is None else valid_unicode(error),
            created_at=created_at if created_at is not None else now,
            updated_at=now,
            approved_by=approved_by,
            worker=self.worker,
            holder=holder if holder is not None else self.holder,
            lease_token=self.lease_token,
            deadline=deadline,
            history=history,
            boot_deadline=boot_deadline,
            made_in=made_in,
        )

    def boot_deadline(self, timeout: float) -> str | None:
        """``timeout`` from now on this machine's boot clock (``EffectRecord.boot_deadline``),
        where it can be read. Kept to the millisecond, rounded up: a settler that judges by it
        never finds it passed before the attempt's own time is up (rounded to the nearest, it
        could, by up to half a millisecond)."""
        boot = self.ledger.store.runtime.boot
        now = None if boot is None else boot.now()
        if boot is None or now is None:
            return None
        return f"{boot.boot}/{math.ceil((now + timeout) * 1000) / 1000:.3f}"


_ENV_SETTERS = slot_setters(Env)


def _env_init(
    self: Env,
    *,
    tools: ToolSet,
    ledger: Ledger,
    can_ask: bool,
    wait: float = 0.0,
    lease_token: int | None = None,
) -> None:
    """Written out (``toolledger._constructors``): every batch builds one. The fields fixed
    for the batch's life are read off its ledger's store."""
    s = _ENV_SETTERS  # in field order
    store = ledger.store
    s[0](self, tools)
    s[1](self, ledger)
    s[2](self, can_ask)
    s[3](self, wait)
    s[4](self, lease_token)
    s[5](self, ledger.session_id)
    s[6](self, store.worker_id)
    s[7](self, store.url)
    s[8](self, store.clock)
    s[9](self, store.now)
    s[10](self, {})


install(Env, _env_init)


@dataclass(slots=True)
class Buffered:
    op: Op
    urgent: bool  # must be durable before anything else happens
    outcome: CallOutcome | None  # whose effect the op records (for alerts)
    closes: tuple[str, str, str] | None = None  # the attempt in flight this op ends
    safe: bool = False  # the tool is safe to run again: a late success duplicates nothing
    must_land: bool = False  # an outcome others cannot recompute (a check's finding): kept


@dataclass(slots=True)
class Buffer:
    items: list[Buffered] = field(default_factory=list)
    flights: list[tuple[str, str, str]] = field(default_factory=list)  # registered by us
    intents: dict[tuple[str, str, str], EffectRecord] = field(default_factory=dict)  # theirs
    # Attempts whose intent was sent and whose tool was not called yet, replacing no attempt
    # that may have taken effect: ended here, they did not happen (``given_up``).
    unrun: set[tuple[str, str, str]] = field(default_factory=set)
    # When each attempt's time is up, on this process's monotonic clock (its start plus its
    # tool's timeout): what a hold on it counts to, whatever the wall clock did meanwhile.
    ends: dict[tuple[str, str, str], float] = field(default_factory=dict)
    kept: set[str] = field(default_factory=set)  # calls whose outcomes the background writer keeps
    # The calls' spans, ended once their outcomes are written (``telemetry.tool_done``).
    spans: list[tuple[Any, int]] | None = None

    @property
    def urgent(self) -> bool:
        return any(i.urgent for i in self.items)


@dataclass(frozen=True, slots=True)
class Flushed:
    error: ToolLedgerError | None  # the commit failed: nothing in it landed
    extra_applied: list[bool]  # per op of ``extra``: did its condition hold


def write(new: EffectRecord, old: EffectRecord | None, at: Reading | None = None) -> Op:
    """Insert-if-absent for a first record; otherwise compare-and-set against the very version
    we read (status, attempt *and* ``updated_at``), so a note written into it meanwhile — a late
    attempt's outcome in its history — is never overwritten unseen. ``at``: the reading of the
    store's clock the record's deadline was set on (an intent's: ``UpdateEffect.at``)."""
    if old is None:
        return InsertEffect(new, at)
    return UpdateEffect(
        new, expect_status=old.status, expect_attempt=old.attempt, expect_at=old.updated_at, at=at
    )


def release(env: Env, key: tuple[str, str, str], buf: Buffer) -> None:
    buf.unrun.discard(key)
    if key in buf.flights:
        buf.flights.remove(key)
        env.ledger.store.runtime.in_flight.discard(key)
