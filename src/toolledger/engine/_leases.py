"""Session leases: two workers never run one session at once.

``Agent.run`` takes the session's lease before it reads anything (``take``), carries a fence in
every commit it makes (``HoldLease``: the lease must still hold its token; a commit also renews
it once a third of its life has passed since the run last renewed it), keeps it alive from a
background heartbeat while a tool or the model takes its time, and gives it up at the end. A
worker whose lease was taken over finds every later write refused (``LeaseLostError``) — the
fencing token, not the clock, is what keeps a stale worker out.

When a lease may be taken over is ``liveness.lease_state``: when it was given back; at once when
its holder is a process of this process table that has ended (or a run of this process that
has); never while such a process lives, even past the expiry (a paused worker keeps its
session); and, for a holder anywhere else or of unknown identity, once it stopped being renewed:
its expiry passed on the server's clock (PostgreSQL), or this process watched it go unrenewed
for its whole time to live (file stores, whose clocks are each machine's own).

A renewal writes a new expiry and counts one more renewal (``Lease.renewals``): that count, not
the expiry, is what a watching worker compares. Whether a run renews is decided on its own
monotonic clock, so a wall clock that steps neither stops its renewals nor rushes them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .._liveness import DEFAULT_LEASE_TTL, Over, Running, Verdict
from ..ops import HoldLease, TakeLease, busy
from ..records import Holder, Lease

if TYPE_CHECKING:
    from ..stores.store import Store

__all__ = ["decided", "fence", "take", "watching"]


def watching(state: Verdict) -> float | None:
    """How long to go on watching a lease before it may be taken: ``None`` when watching is not
    what holds it (it is free, or its holder is known to be alive, or this process saw it
    renewed) — a caller then takes it or gives up at once."""
    if isinstance(state, Running) and state.watch is not None and not state.renewed:
        return state.watch
    return None


def decided(
    store: Store,
    session_id: str,
    *,
    watch: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[Lease | None, Verdict]:
    """A session's lease and its verdict, once watching has decided it: for a holder that can
    be judged only by its renewals, this waits until a renewal shows it alive or none comes for
    a whole TTL — at most ``watch`` seconds (``None``: the lease's TTL), counted by what it
    slept, so it ends whatever the clocks do. For operations made outside a run (a rewind);
    ``Agent.run`` watches the same way through its driver."""
    current = store.lease(session_id)
    state = store.lease_state(current)
    ttl = (current.ttl if current is not None else None) or DEFAULT_LEASE_TTL
    budget = ttl if watch is None else watch
    while (left := watching(state)) is not None and budget > 0:
        pause = min(left, max(0.05, ttl / 10), budget)
        budget -= pause
        sleep(pause)
        current = store.lease(session_id)
        state = store.lease_state(current)
    return current, state


def take(
    current: Lease | None,
    state: Verdict,
    *,
    session_id: str,
    owner: str,
    holder: Holder | None,
    now: float,
    ttl: float,
) -> TakeLease:
    """The operation that takes the lease from ``current``, whose ``state`` the caller judged
    (``Store.lease_state``); raises ``SessionBusyError`` when it is held. The store applies it
    only if nobody moved the lease meanwhile (compare-and-set on the token, the expiry and the
    renewal count, which a renewal changes)."""
    if not isinstance(state, Over):
        raise busy(session_id, current, state.why)
    token = 1 if current is None else current.token + 1
    lease = Lease(
        session_id=session_id,
        owner=owner,
        token=token,
        expires_at=now + ttl,
        holder=holder,
        ttl=ttl,
    )
    if current is None:
        return TakeLease(lease, expect_token=0)
    return TakeLease(
        lease,
        expect_token=current.token,
        expect_expires_at=current.expires_at,
        expect_renewals=current.renewals,
    )


def fence(
    lease: Lease,
    now: Callable[[], float],
    ttl: float,
    renewed_at: float | None = None,
    monotonic: Callable[[], float] | None = None,
) -> HoldLease:
    """The fence every commit of a run carries (``now``: the store's clock). It renews the
    lease to ``now() + ttl`` unless the run's last renewal that landed, at ``renewed_at`` on
    ``monotonic`` (this process's clock), is less than a third of ``ttl`` old: then it only
    checks the token (``expires_at=None``), which a store can fold into a write the commit
    makes anyway.

    Either way the token is what keeps a stale worker out: a run paused past its lease and taken
    over is refused at its next commit, renewing or not. The age is read on this process's
    monotonic clock: a wall clock that steps can neither hold back the renewals a watching worker
    waits for nor make every commit renew."""
    if renewed_at is not None and monotonic is not None and monotonic() - renewed_at < ttl / 3:
        return HoldLease(lease.session_id, lease.token, None)
    return HoldLease(lease.session_id, lease.token, now() + ttl)
