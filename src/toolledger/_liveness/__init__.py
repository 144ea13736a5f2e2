"""Is an attempt (or a lease holder) still alive? The one place toolledger decides it.

A ``started`` record is *in progress* while its attempt may still take effect, and only then is
it safe to leave alone; once its attempt is provably over it is *in doubt* and may be settled
(docs/design.md, "Concurrency"; docs/concepts/liveness.md says what is trusted where). The
answer is one of three — alive, ended, or *unknown* — and unknown is never taken for ended (rule
18). What counts as proof:

* **this process** — the attempt is registered in flight here (``Runtime.in_flight``) from before
  its intent commits until after its outcome commits: in progress exactly while registered;
* **another process of the same process table** (same host, same PID namespace, read through a
  ``/proc`` that is provably this process's own; ``toolledger._liveness._identity``) — alive while
  its entry
  shows its start time, ended when its pid is gone or names a zombie or (in the same time
  namespace) another process;
* **anything else** — another host or container, a hidden entry, a holder of unknown identity —
  by its *lease*: held while its holder keeps renewing it, and, after that, until its deadline.

Nothing compares a wall-clock time written by another process to decide that a holder has
stopped. On PostgreSQL a lease expires by the server's one clock (``Backend.shared_clock``). On
a file store (SQLite, JSON), whose clock is each machine's own, a worker calls a lease expired
only after *watching* it — its token and renewal count — stay the same for a whole time to live
on its own monotonic clock (``Watch``): a clock stepped forward or back can neither expire a
renewing worker's lease early nor keep a dead worker's lease past one TTL. A call's deadline
(the store's clock) keeps a call in progress after its lease is gone; it never puts a call whose
holder is still renewing into doubt.

A worker that knows its own attempt is over (the tool raised ``OutcomeUnknown``, an async tool
was cancelled at its deadline) *releases* it: the record stays ``started`` with no holder, and is
in doubt at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..records import EffectRecord, Holder, Lease, Status
from ._procview import HOST_ID_ENV
from ._runtime import InFlight, Runtime, Watch, flight_key, this_process

__all__ = [
    "DEFAULT_LEASE_TTL",
    "HOST_ID_ENV",
    "LEGACY_TIMEOUT",
    "InFlight",
    "Over",
    "Running",
    "Runtime",
    "Verdict",
    "Watch",
    "flight_key",
    "judge",
    "lease_state",
    "this_process",
]

LEGACY_TIMEOUT = 300.0
"""How long an intent written by toolledger 0.1 (no holder, no deadline) counts as running after
its ``updated_at``: that release's claim timeout."""

DEFAULT_LEASE_TTL = 30.0
"""``Agent(lease_ttl=)``'s default; also how long a lease that does not record its time to live
(written before leases did) must be watched unrenewed, at least."""

_LEGACY_TTL_CAP = 3600.0


@dataclass(frozen=True, slots=True)
class Running:
    """The attempt (or the lease) may still take effect: leave it alone. ``until``: the store-
    clock time after which it will be judged again (``None``: for as long as its process lives).
    ``watch``: for a lease this process can judge only by watching its renewals, how many more
    seconds of seeing no renewal would make it over (``None``: watching is not what holds it).
    ``renewed``: this process saw it renewed since it first looked — its holder is alive."""

    why: str
    until: float | None = None
    watch: float | None = None
    renewed: bool = False


@dataclass(frozen=True, slots=True)
class Over:
    """The attempt can no longer take effect (bar rule 14's paused process): it is in doubt.
    ``clocked``: the store's clock said so (a deadline or an expiry passed), and a reading of
    a shared clock that may be stale is to be read again before it is acted on
    (``StoreCore.judged``); ``False`` when no clock was read (a status, a process, a release)."""

    why: str
    clocked: bool = field(default=True, compare=False)


Verdict = Running | Over


# -- this process ---------------------------------------------------------------------------------


def _where(holder: Holder) -> str:
    return f"pid {holder.pid} on this host"


def judge(
    record: EffectRecord,
    *,
    now: float,
    lease: Lease | None,
    runtime: Runtime,
    url: str,
    shared_clock: bool = False,
) -> Verdict:
    """Whether the attempt behind a ``started`` record may still take effect.

    ``now`` is the store's clock; ``lease`` the session's current lease (``None`` if there is
    none); ``url`` the store's place (``StoreCore.place``: attempts in flight are registered, and
    leases watched, per database); ``shared_clock``
    whether that clock is one every worker reads (PostgreSQL's) rather than each machine's own.
    """
    if record.status is not Status.STARTED:
        return Over(f"it is {record.status.value}", clocked=False)
    if flight_key(url, record.session_id, record.tool_use_id) in runtime.in_flight:
        return Running("this process is running it")
    holder = record.holder
    if holder is None:
        if record.deadline is not None:
            return Over("its worker gave it up: the outcome is unknown", clocked=False)
        until = record.updated_at + LEGACY_TIMEOUT
        if now < until:
            return Running(
                "it was started by toolledger 0.1 and is not older than 5 minutes", until
            )
        return Over("it was started by toolledger 0.1 more than 5 minutes ago")
    if runtime.is_me(holder):
        return Over("this process started it and is not running it any more", clocked=False)
    alive = runtime.evidence(holder)
    if alive:
        return Running(f"its process ({_where(holder)}) is alive")
    if alive is False:
        return Over(f"its process ({_where(holder)}) has ended", clocked=False)
    deadline = record.deadline
    if (
        lease is not None
        and record.lease_token is not None
        and lease.token == record.lease_token
        and lease.expires_at > 0
    ):
        held = _renewing(lease, now=now, runtime=runtime, url=url, shared_clock=shared_clock)
        if isinstance(held, Running):
            lasts = held.until
            if deadline is not None and lasts is not None:
                lasts = max(lasts, deadline)
            return Running(
                f"its worker's session lease is held ({held.why})",
                lasts,
                held.watch,
                held.renewed,
            )
    if deadline is not None and not shared_clock:
        by_boot = _by_boot_clock(record, runtime, now)
        if by_boot is not None:
            return by_boot
        if record.lease_token is None:
            return _watched_for_its_timeout(record, deadline, now, runtime=runtime, url=url)
    if deadline is not None and now < deadline:
        return _before_deadline(record, deadline, runtime=runtime, url=url, shared=shared_clock)
    if record.lease_token is None:
        return Over("its worker held no lease and its deadline has passed")
    return Over("its worker's lease is gone and its deadline has passed")


def _by_boot_clock(record: EffectRecord, runtime: Runtime, now: float) -> Verdict | None:
    """A deadline judged on the boot clock of the machine its worker ran on, by a process of
    that machine (containers of one kernel share it; no wall-clock step moves it); ``None``
    when this process cannot (another machine, no boot clock here, none recorded)."""
    boot = runtime.boot
    if boot is None or not record.boot_deadline:
        return None
    kernel, _, at = record.boot_deadline.rpartition("/")
    booted = boot.now()
    if kernel != boot.boot or booted is None:
        return None
    try:
        ends = float(at)
    except ValueError:
        return None
    if booted < ends:
        return Running(
            "its deadline has not passed on this machine's boot clock", now + (ends - booted)
        )
    if record.lease_token is None:
        return Over("its worker held no lease and its deadline has passed")
    return Over("its worker's lease is gone and its deadline has passed")


def _watched_for_its_timeout(
    record: EffectRecord, deadline: float, now: float, *, runtime: Runtime, url: str
) -> Verdict:
    """A call run without a lease (``run_tool_uses``, the framework integrations), whose
    deadline no boot clock can judge (no ``/proc`` on one side: macOS, Windows, a masked one):
    its deadline is all there is, and it is written on a machine's wall clock, which may have
    stepped. It is in progress until this process has watched it for its whole timeout (its
    deadline less its time): by then its tool, counting down on a monotonic clock, is past it
    whatever any wall clock says."""
    timeout = deadline - record.updated_at
    if not 0 < timeout <= _LEGACY_TTL_CAP * 24:
        timeout = LEGACY_TIMEOUT
    watched, _ = runtime.watch.look(
        (url, record.session_id, record.tool_use_id), (record.attempt, record.updated_at)
    )
    if watched >= timeout:
        return Over(
            f"its worker held no lease, and it was watched for its whole timeout ({timeout:g}s) "
            "from here"
        )
    return Running(
        f"its worker holds no lease and no clock here can tell its deadline: it is in progress "
        f"until watched for its whole timeout, {timeout:g}s ({timeout - watched:.0f}s more)",
        now + (timeout - watched),
        timeout - watched,
    )


def _before_deadline(
    record: EffectRecord, deadline: float, *, runtime: Runtime, url: str, shared: bool
) -> Verdict:
    """A call whose deadline has not passed on the store's clock. On a server's clock that is
    the end of it. On a machine's own clock, which may have stepped back since the intent was
    written, the deadline is believed no longer than the attempt's timeout (its deadline less
    its time, as its worker wrote them) after this process first saw it: its worker's tool
    counts its time down on a monotonic clock (``ToolContext.remaining``), so it is over by
    then whatever any wall clock says."""
    timeout = deadline - record.updated_at
    if shared or not 0 < timeout <= _LEGACY_TTL_CAP * 24:
        return Running("its deadline has not passed", deadline)
    watched, _ = runtime.watch.look(
        (url, record.session_id, record.tool_use_id), (record.attempt, record.updated_at)
    )
    if watched >= timeout:
        return Over(
            f"its deadline is still ahead on this machine's clock, but it was watched for its "
            f"whole timeout ({timeout:g}s) from here: the clock stepped back since it began"
        )
    return Running("its deadline has not passed", deadline, timeout - watched)


def _renewing(
    lease: Lease, *, now: float, runtime: Runtime, url: str, shared_clock: bool
) -> Verdict:
    """Whether a lease not given back, whose holder no process table can judge, is still being
    renewed: by the server's clock where there is one, else by watching it."""
    if shared_clock:
        if lease.expires_at > now:
            return Running("it has not expired on the store's clock", lease.expires_at)
        return Over("it expired on the store's clock")
    # A lease written before leases recorded their time to live: at least the default's.
    ttl = lease.ttl or max(DEFAULT_LEASE_TTL, min(lease.expires_at - now, _LEGACY_TTL_CAP))
    quiet, renewed = runtime.watch.look(
        (url, lease.session_id), (lease.token, lease.renewals, lease.expires_at, lease.owner)
    )
    if quiet >= ttl:
        return Over(f"it was not renewed for {quiet:.1f}s, its whole time to live ({ttl:g}s)")
    left = ttl - quiet
    if renewed:
        why = f"this process saw it renewed; not renewed for {quiet:.1f}s of its {ttl:g}s since"
    elif quiet > 0:
        why = f"not renewed for {quiet:.1f}s of its {ttl:g}s time to live, as watched from here"
    else:
        why = f"its holder renews it every {ttl / 3:g}s; it is free once {ttl:g}s pass without one"
    return Running(why, now + left, left, renewed)


def lease_state(
    lease: Lease | None,
    *,
    now: float,
    runtime: Runtime,
    url: str = "",
    shared_clock: bool = False,
) -> Verdict:
    """Whether a session lease is held (``Running``) or may be taken (``Over``).

    Given back → free. A run of this process → held while that run goes on. Another process of
    this process table → held while it lives, even past the expiry (it is known alive: a paused
    worker keeps its session), free at once when it has ended. Anyone else, or a holder whose
    table cannot be read → held while it is renewed: until it expires on the server's clock
    (PostgreSQL), or until this process has watched it go unrenewed for its whole time to live
    (``Running.watch`` says how much longer; see the module's docstring).
    """
    if lease is None:
        return Over("nobody holds it", clocked=False)
    if lease.expires_at <= 0:
        return Over("it was given back", clocked=False)
    if lease.owner in runtime.live_runs:
        return Running("a run of this process holds it")
    holder = lease.holder
    # No holder (toolledger 0.1 named a ``host:pid`` only): unknown — a pid this process table
    # lacks may be a live process of another PID namespace with this hostname (a container
    # on the host's network) — so it is judged by its renewals, as any holder no table proves.
    if holder is not None and runtime.is_me(holder):
        return Over("the run of this process that held it has ended", clocked=False)
    if holder is not None:
        alive = runtime.evidence(holder)
        if alive:
            return Running(f"its process ({_where(holder)}) is alive")
        if alive is False:
            return Over(f"its process ({_where(holder)}) has ended", clocked=False)
    return _renewing(lease, now=now, runtime=runtime, url=url, shared_clock=shared_clock)
