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
session); and, for a holder anywhere else, once it has expired on the store's clock.
"""

from __future__ import annotations

from collections.abc import Callable

from .liveness import Over, Runtime, lease_state
from .ops import HoldLease, TakeLease, busy
from .records import Holder, Lease

__all__ = ["fence", "is_free", "take"]


def is_free(current: Lease | None, now: float, runtime: Runtime) -> bool:
    """Whether the lease may be taken now (``now`` on the store's clock)."""
    return isinstance(lease_state(current, now=now, runtime=runtime), Over)


def take(
    current: Lease | None,
    *,
    session_id: str,
    owner: str,
    holder: Holder | None,
    now: float,
    ttl: float,
    runtime: Runtime,
) -> TakeLease:
    """The operation that takes the lease from ``current``; raises ``SessionBusyError`` when it
    is held. The store applies it only if nobody moved the lease meanwhile (compare-and-set on
    the token and the expiry, which a renewal changes)."""
    state = lease_state(current, now=now, runtime=runtime)
    if not isinstance(state, Over):
        raise busy(session_id, current, state.why)
    token = 1 if current is None else current.token + 1
    lease = Lease(
        session_id=session_id, owner=owner, token=token, expires_at=now + ttl, holder=holder
    )
    if current is None:
        return TakeLease(lease, expect_token=0)
    return TakeLease(lease, expect_token=current.token, expect_expires_at=current.expires_at)


def fence(
    lease: Lease, now: Callable[[], float], ttl: float, held_until: float | None = None
) -> HoldLease:
    """The fence every commit of a run carries (``now``: the store's clock). It renews the
    lease to ``now() + ttl`` unless the run's last renewal, which left it ``held_until``, is
    less than a third of ``ttl`` old: then it only checks the token (``expires_at=None``), which
    a store can fold into a write the commit makes anyway.

    Either way the token is what keeps a stale worker out: a run paused past its lease and taken
    over is refused at its next commit, renewing or not. The age is read on the store's clock,
    the clock the expiry is judged by (a worker whose own clock is off does not count on it);
    a clock that stepped back only delays a renewal the heartbeat makes anyway."""
    at = now()
    if held_until is not None and held_until - at > ttl * 2 / 3:
        return HoldLease(lease.session_id, lease.token, None)
    return HoldLease(lease.session_id, lease.token, at + ttl)
