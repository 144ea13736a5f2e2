"""Retention: remove old sessions whole — state, transcript, records, approvals, lease — one
transaction per session (``Store.prune``, ``toolledger prune``).

Only a session that ended is removed: ``completed``, ``max_turns`` or ``failed`` (a model API
error, with every tool_use answered), or a session of records alone (``run_tool_uses`` without
an agent) — and never one with a call in progress or in doubt, a pending approval, or a lease
held. A ``ready`` session (forked or rewound, to be run: ``fork`` and ``rewind`` say so) goes
only when it is asked for by name, ``status="ready"``: a branch waiting to be run is not one
that ended. Those conditions are checked when the session is read and again, by the store, in the
transaction that removes it (``DropSession``): a run that starts meanwhile keeps its session. So
does a call that ran and settled between the read and the removal: the removal carries what was
read (the latest stamp, the number of records), and anything of the session written since
refuses it.

Removing a session forgets its calls: a ``tool_use_id`` of it, met again, runs as a new call.
Remove only what no agent will resume; ``toolledger export SESSION`` keeps a copy first. A
branch's calls made for its lineage are handed to their claims in the lineage's first session
before it goes (``_hand_over``), so the rest of the lineage still answers them; and the
lineage's first session stays while a branch of it remains that holds no copy of one of its calls
(a claim, a call made after the fork): that branch would claim the id there, find nothing, and
run the call again.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..errors import ConfigurationError, SessionConflictError
from ..ops import PRUNABLE, DropSession, UpdateEffect
from ..records import ApprovalRecord, ApprovalStatus, EffectRecord, Lease, RunStatus, Status
from ._copies import same_call
from ._core import StoreCore

__all__ = ["Kept", "PruneReport", "Pruned", "prune"]


@dataclass(frozen=True, slots=True)
class Pruned:
    """A session removed (or, in a dry run, that would be)."""

    session_id: str
    status: RunStatus | None  # None: records alone, no agent state
    last_activity: float
    messages: int
    records: int
    approvals: int


@dataclass(frozen=True, slots=True)
class Kept:
    """A session old enough to go, kept: ``why`` says what holds it."""

    session_id: str
    why: str


@dataclass(frozen=True, slots=True)
class PruneReport:
    removed: list[Pruned] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)
    dry_run: bool = False


def prune(
    store: StoreCore,
    *,
    older_than: float,
    status: RunStatus | str | None = None,
    dry_run: bool = False,
) -> PruneReport:
    """Remove every ended session whose last activity (its state, records and approvals) is
    more than ``older_than`` seconds old on the store's clock; only those in ``status`` when
    given (then sessions of records alone are left). A ``ready`` session — a fork or a rewind
    not run since — goes only with ``status="ready"``. ``dry_run``: remove nothing, report what
    would go."""
    if isinstance(older_than, bool) or not isinstance(older_than, int | float) or older_than < 0:
        raise ConfigurationError(f"older_than must be a number of seconds >= 0, not {older_than!r}")
    wanted = _status(status)
    now = store.fresh_now()  # a lease expiry is judged on it: never a reading from before a step
    report = PruneReport(dry_run=dry_run)
    branches = _branches_by_root(store)
    gone: set[str] = set()
    # A lineage's first session goes after its branches: its ledger holds their claims.
    for sid in sorted(store.sessions(), key=lambda s: (s in branches, s)):
        state = store.session(sid)
        if wanted is not None and (state is None or state.status is not wanted):
            continue
        found = store.backend.read_effects(sid)
        records = sorted(found.values(), key=lambda r: (r.created_at, r.tool_use_id))
        approvals = store.approvals(sid)
        stamps = [r.updated_at for r in records]
        stamps += [a.decided_at or a.requested_at for a in approvals]
        if state is not None:
            stamps.append(state.updated_at)
        last = max(stamps, default=0.0)
        if now - last <= older_than:
            continue
        lease = store.lease(sid)
        why = _held(state.status if state else None, records, approvals, lease, now, wanted=wanted)
        if why is None:
            why = _relied_on(store, found, [b for b in branches.get(sid, ()) if b not in gone])
        if why is not None:
            report.kept.append(Kept(sid, why))
            continue
        pruned = Pruned(
            session_id=sid,
            status=state.status if state else None,
            last_activity=last,
            messages=state.messages if state else 0,
            records=len(records),
            approvals=len(approvals),
        )
        if not dry_run:
            _hand_over(store, sid, records)
            version = state.version if state else None
            op = DropSession(sid, version, now, last_activity=last, records=len(records))
            try:
                store.apply(sid, [op])
            except SessionConflictError:
                report.kept.append(Kept(sid, "it changed while it was being removed"))
                continue
        gone.add(sid)
        report.removed.append(pruned)
    return report


def _branches_by_root(store: StoreCore) -> dict[str, set[str]]:
    """The sessions a fork made, by their lineage's first session (``Store.lineage_root``)."""
    out: dict[str, set[str]] = {}
    for state in store.session_states():
        if not state.lineage:
            continue
        store.note_lineage(state.session_id, state.lineage)
        root = store.lineage_root(state.session_id)
        if root is not None and root != state.session_id:
            out.setdefault(root, set()).add(state.session_id)
    return out


def _relied_on(
    store: StoreCore, records: dict[str, EffectRecord], branches: list[str]
) -> str | None:
    """Why a lineage's first session must stay for the ``branches`` of it that remain, or
    ``None``: it holds a call one of them holds no copy of — a claim another branch made, or a
    call it made after the fork. A branch meeting that id claims it there, and finds it; with
    the session gone, it would find nothing and run the call again. (The calls a fork copied
    answer on the fork alone.)"""
    relying = sorted(b for b in branches if set(records) - set(store.backend.read_effect_ids(b)))
    if not relying:
        return None
    shown = ", ".join(repr(b) for b in relying[:3])
    more = f" and {len(relying) - 3} more" if len(relying) > 3 else ""
    return (
        f"it is the first session of the lineage of {shown}{more}: its ledger holds calls of "
        "the lineage they hold no copy of, and answers them there (remove them first)"
    )


def _hand_over(store: StoreCore, sid: str, records: list[EffectRecord]) -> None:
    """Before a branch goes, the outcomes of the calls it made for its lineage are written into
    their claims in the lineage's first session (``toolledger.engine._claims``), so a session of
    the lineage that meets one of those ids later takes the outcome instead of running the call
    again. Each is a compare-and-set on the claim; written first, so a prune stopped between the
    two leaves the branch, whose next prune hands nothing over twice."""
    root = store.lineage_root(sid)
    made = {r.tool_use_id: r for r in records if r.status.terminal and not r.copied}
    if root is None or not made:
        return
    claims = store.backend.read_effects(root, sorted(made))
    ops = [
        UpdateEffect(
            replace(made[tid], session_id=root, origin=sid, made_in=made[tid].key_session),
            claim.status,
            claim.attempt,
            expect_at=claim.updated_at,
        )
        for tid, claim in claims.items()
        if claim.origin == sid and not claim.status.terminal and same_call(claim, made[tid])
    ]
    if ops:
        store.apply(root, ops)


def _status(status: RunStatus | str | None) -> RunStatus | None:
    if status is None:
        return None
    try:
        chosen = RunStatus(status)
    except ValueError:
        chosen = None
    if chosen not in PRUNABLE:
        names = ", ".join(sorted(s.value for s in PRUNABLE))
        raise ConfigurationError(
            f"status {status!r} cannot be pruned; sessions that ended are: {names}"
        )
    return chosen


def _held(
    status: RunStatus | None,
    records: list[EffectRecord],
    approvals: list[ApprovalRecord],
    lease: Lease | None,
    now: float,
    *,
    wanted: RunStatus | None,
) -> str | None:
    """Why a session must stay, or ``None``. ``wanted``: the status asked for, if any."""
    if status is not None and status not in PRUNABLE:
        return f"it is {status.value}"
    if status is RunStatus.READY and wanted is not RunStatus.READY:
        return "it is ready: forked or rewound, to be run (--status ready removes it)"
    started = [r.tool_use_id for r in records if r.status is Status.STARTED]
    if started:
        return f"a call is in progress or in doubt ({', '.join(started)})"
    waiting = [a.tool_use_id for a in approvals if a.status is ApprovalStatus.PENDING]
    if waiting:
        return f"an approval is pending ({', '.join(waiting)})"
    if lease is not None and lease.expires_at > now:
        return "a worker holds its lease"
    return None
