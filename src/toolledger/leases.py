"""Session leases: two workers never run one session at once.

``Agent.run`` takes the session's lease before it reads anything (``take``), carries a fence in
every commit it makes (``HoldLease``: the lease must still hold its token; each commit also
renews it), keeps it alive from a background heartbeat while a tool or the model takes its time,
and gives it up at the end. A worker whose lease was taken over finds every later write refused
(``LeaseLostError``) — the fencing token, not the clock, is what keeps a stale worker out.

A lease can be taken over when it has expired, or at once when its holder is a process on this
host that no longer exists (a crashed worker is noticed without waiting for the expiry).
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable

from .records import EffectRecord, Lease
from .stores.base import HoldLease, TakeLease, busy

__all__ = [
    "DEFAULT_CLAIM_TIMEOUT",
    "claim_is_live",
    "holder_is_dead",
    "in_flight",
    "is_free",
    "take",
]

DEFAULT_CLAIM_TIMEOUT = 300.0
"""How long a ``started`` record written on *another host* counts as a call still running
(``EffectInProgressError``) rather than one in doubt. Same-host claims are checked exactly."""


class _InFlight:
    """The calls this process is running right now, by ``(session_id, tool_use_id)``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: set[tuple[str, str]] = set()

    def add(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._calls.add(key)

    def discard(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._calls.discard(key)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._calls


in_flight = _InFlight()

live_runs: set[str] = set()
"""Owners (lease holders) of this process's runs that are still going: a lease whose holder is
this process but not among them belongs to a run that ended without giving it back (its store
failed) and is free."""


def _host_pid(owner: str) -> tuple[str, int | None]:
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    return host, int(pid_text) if pid_text.isdigit() else None


def claim_is_live(record: EffectRecord, *, now: float, claim_timeout: float) -> bool:
    """Whether the worker that wrote this ``started`` record may still be running the call.

    In this process: exactly when the call is in flight here. In another process of this host:
    while that process exists. On another host (or an unknown worker): for ``claim_timeout``
    seconds after the intent was written — then it is in doubt.
    """
    worker = record.worker or ""
    host, pid = _host_pid(worker)
    if host == socket.gethostname() and pid is not None:
        if pid == os.getpid():
            return (record.session_id, record.tool_use_id) in in_flight
        return not holder_is_dead(worker)
    return now - record.updated_at < claim_timeout


def holder_is_dead(owner: str) -> bool:
    """Whether ``owner`` (``host:pid:…``) is a process of this host that has gone. Unknown
    formats and other hosts count as alive: only the expiry frees those."""
    host, pid = _host_pid(owner)
    if host != socket.gethostname() or pid is None:
        return False
    if pid == os.getpid():
        return owner not in live_runs  # a run of this process: dead once it has ended
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # exists, owned by someone else
    return False


def is_free(current: Lease | None, now: float) -> bool:
    return current is None or current.expires_at <= now or holder_is_dead(current.owner)


def take(
    current: Lease | None, *, session_id: str, owner: str, now: float, ttl: float
) -> TakeLease:
    """The operation that takes the lease from ``current``; raises ``SessionBusyError`` when it
    is held. The store applies it only if nobody moved the lease meanwhile (compare-and-set on
    the token)."""
    if not is_free(current, now):
        raise busy(session_id, current)
    token = 1 if current is None else current.token + 1
    lease = Lease(session_id=session_id, owner=owner, token=token, expires_at=now + ttl)
    return TakeLease(lease, expect_token=0 if current is None else current.token)


def fence(lease: Lease, clock: Callable[[], float], ttl: float) -> HoldLease:
    return HoldLease(lease.session_id, lease.token, clock() + ttl)
