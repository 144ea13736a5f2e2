"""Session leases: two workers never run one session at once.

``Agent.run`` takes the session's lease before it reads anything (``take``), carries a fence in
every commit it makes (``HoldLease``: the lease must still hold its token; each commit also
renews it), keeps it alive from a background heartbeat while a tool or the model takes its time,
and gives it up at the end. A worker whose lease was taken over finds every later write refused
(``LeaseLostError``) — the fencing token, not the clock, is what keeps a stale worker out.

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


def fence(lease: Lease, now: Callable[[], float], ttl: float) -> HoldLease:
    """The fence every commit of a run carries, renewing the lease to ``now() + ttl`` (``now``:
    the store's clock)."""
    return HoldLease(lease.session_id, lease.token, now() + ttl)
