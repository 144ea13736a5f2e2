"""Is an attempt (or a lease holder) still alive? The one place toolledger decides it.

A ``started`` record is *in progress* while its attempt may still take effect, and only then is
it safe to leave alone; once its attempt is provably over it is *in doubt* and may be settled
(docs/design.md, rules 12-13 and "Concurrency"). What counts as proof:

* **this process** — the attempt is registered in flight here (``Runtime.in_flight``) from before
  its intent commits until after its outcome commits: in progress exactly while registered;
* **another process of the same process table** (same host identity *and* PID namespace) — in
  progress while that process exists and is not a zombie, with the same start time (a reused pid
  is another process);
* **anywhere else**, or when the holder cannot be identified — in progress while the session
  lease it ran under is held, or until its deadline; both on *the store's clock*
  (``Store.now()``), never on this machine's.

A worker that knows its own attempt is over (the tool raised ``OutcomeUnknown``, an async tool
was cancelled at its deadline) *releases* it: the record stays ``started`` with no holder, and is
in doubt at once.

Host identity is ``TOOLLEDGER_HOST_ID`` when set, else the kernel's boot id; the PID namespace is
the inode of ``/proc/self/ns/pid``. Containers of one kernel share the boot id but not the PID
namespace (unless they share the host's), so a worker never judges another container's pid by
its own process table. Without ``/proc`` (not Linux) the identity is unknown and every holder is
judged by lease and deadline.
"""

from __future__ import annotations

import os
import socket
import threading
from collections import Counter
from dataclasses import dataclass

from .records import EffectRecord, Holder, Lease, Status

__all__ = [
    "LEGACY_TIMEOUT",
    "Over",
    "Running",
    "Runtime",
    "Verdict",
    "flight_key",
    "judge",
    "lease_state",
    "this_process",
]

LEGACY_TIMEOUT = 300.0
"""How long an intent written by toolledger 0.1 (no holder, no deadline) counts as running after
its ``updated_at``: that release's claim timeout."""

HOST_ID_ENV = "TOOLLEDGER_HOST_ID"


@dataclass(frozen=True, slots=True)
class Running:
    """The attempt may still take effect: leave it alone. ``until``: the store-clock time after
    which it will be judged again (``None``: for as long as its process lives)."""

    why: str
    until: float | None = None


@dataclass(frozen=True, slots=True)
class Over:
    """The attempt can no longer take effect (bar rule 14's paused process): it is in doubt."""

    why: str


Verdict = Running | Over


# -- this process ---------------------------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def _stat(pid: int) -> tuple[str, int] | None:
    """``(state, start time in ticks since boot)`` of a process, from ``/proc/PID/stat``."""
    text = _read(f"/proc/{pid}/stat")
    if text is None:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ")".
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def _pidns() -> str:
    try:
        link = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return ""
    return link.partition("[")[2].rstrip("]")


def _host_id() -> str:
    return os.environ.get(HOST_ID_ENV) or _read("/proc/sys/kernel/random/boot_id") or ""


class InFlight:
    """The attempts this process is running, by ``(store url, session_id, tool_use_id)``:
    registered before the intent commits, dropped after the outcome commits. Counted, so two
    threads racing on one call (only one of which will win its intent) can both register."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: Counter[tuple[str, str, str]] = Counter()

    def add(self, key: tuple[str, str, str]) -> None:
        with self._lock:
            self._calls[key] += 1

    def discard(self, key: tuple[str, str, str]) -> None:
        with self._lock:
            self._calls[key] -= 1
            if self._calls[key] <= 0:
                del self._calls[key]

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._calls

    def clear(self) -> None:
        with self._lock:
            self._calls.clear()


class Runtime:
    """Where toolledger runs: this process's identity, the attempts and runs it has in flight,
    and how it looks at other processes. ``this_process()`` is the real one; the deterministic
    simulator gives each simulated process its own."""

    def __init__(self) -> None:
        self.in_flight = InFlight()
        self.live_runs: set[str] = set()
        """Lease owners of this process's agent runs that are still going."""

    @property
    def holder(self) -> Holder | None:
        raise NotImplementedError

    def process_alive(self, holder: Holder) -> bool | None:
        """Whether ``holder`` (a process of this process table, not this one) still exists:
        ``None`` when it cannot be told."""
        raise NotImplementedError

    def pid_gone(self, pid: int) -> bool:
        """Whether no process of this process table has ``pid`` (for toolledger 0.1's owners,
        which named a pid only)."""
        return False

    def shares_process_table(self, holder: Holder) -> bool:
        me = self.holder
        return (
            me is not None
            and bool(me.host and me.pidns)
            and (holder.host, holder.pidns) == (me.host, me.pidns)
        )

    def is_me(self, holder: Holder) -> bool:
        me = self.holder
        return me is not None and self.shares_process_table(holder) and holder == me


class _ThisProcess(Runtime):
    def __init__(self) -> None:
        super().__init__()
        self._pid = -1
        self._holder: Holder | None = None
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        # A forked child runs none of its parent's attempts or runs, and is another holder.
        self.in_flight = InFlight()
        self.live_runs = set()
        self._pid = -1

    @property
    def holder(self) -> Holder | None:
        if self._pid != -1:
            return self._holder  # known until a fork (``_forked``): no getpid() per write
        pid = os.getpid()
        if pid != self._pid:  # first use, or a forked child
            stat = _stat(pid)
            host, pidns = _host_id(), _pidns()
            self._holder = (
                Holder(host=host, pidns=pidns, pid=pid, start=stat[1])
                if stat is not None and host
                else None
            )
            self._pid = pid
        return self._holder

    def pid_gone(self, pid: int) -> bool:
        if pid == os.getpid():
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        stat = _stat(pid)
        return stat is not None and stat[0] in ("Z", "X")

    def process_alive(self, holder: Holder) -> bool | None:
        stat = _stat(holder.pid)
        if stat is None:
            if os.path.isdir("/proc/self"):
                return False  # no such process in our table
            return None
        state, start = stat
        if state in ("Z", "X"):
            return False  # killed; only its exit status is left for a parent to collect
        return start == holder.start


_THIS_PROCESS = _ThisProcess()


def this_process() -> Runtime:
    return _THIS_PROCESS


# -- the judgements -------------------------------------------------------------------------------


def judge(
    record: EffectRecord, *, now: float, lease: Lease | None, runtime: Runtime, url: str
) -> Verdict:
    """Whether the attempt behind a ``started`` record may still take effect.

    ``now`` is the store's clock; ``lease`` the session's current lease (``None`` if there is
    none); ``url`` the store's (attempts in flight are registered per store).
    """
    if record.status is not Status.STARTED:
        return Over(f"it is {record.status.value}")
    holder = record.holder
    if holder is None:
        if record.deadline is not None:
            return Over("its worker gave it up: the outcome is unknown")
        until = record.updated_at + LEGACY_TIMEOUT
        if now < until:
            return Running(
                "it was started by toolledger 0.1 and is not older than 5 minutes", until
            )
        return Over("it was started by toolledger 0.1 more than 5 minutes ago")
    if runtime.shares_process_table(holder):
        if runtime.is_me(holder):
            if flight_key(url, record.session_id, record.tool_use_id) in runtime.in_flight:
                return Running("this process is running it")
            return Over("this process started it and is not running it any more")
        alive = runtime.process_alive(holder)
        if alive:
            return Running(f"its process (pid {holder.pid} on this host) is alive")
        if alive is False:
            return Over(f"its process (pid {holder.pid} on this host) has ended")
    held = (
        lease is not None
        and record.lease_token is not None
        and lease.token == record.lease_token
        and lease.expires_at > now
    )
    deadline = record.deadline
    if held and lease is not None:
        until = lease.expires_at if deadline is None else max(lease.expires_at, deadline)
        return Running("its worker's session lease is held", until)
    if deadline is not None and now < deadline:
        return Running("its deadline has not passed", deadline)
    return Over("its worker's lease is gone and its deadline has passed")


def _legacy(worker: str | None, until: float, now: float, runtime: Runtime) -> Verdict:
    """An attempt or a lease written by toolledger 0.1, which named its owner ``host:pid:…``
    only: judged as 0.1 judged it — over at once when it names a process of this hostname that
    no longer exists — except that a live pid no longer holds it past ``until`` (an intent's
    ``updated_at`` plus ``LEGACY_TIMEOUT``, a lease's expiry): that pid may be another process
    by now."""
    host, _, rest = (worker or "").partition(":")
    pid = rest.partition(":")[0]
    if host == socket.gethostname() and pid.isdigit() and runtime.pid_gone(int(pid)):
        return Over(f"written by toolledger 0.1 from pid {pid} of this host, which has ended")
    if now < until:
        return Running("written by toolledger 0.1, whose owner cannot be checked", until)
    return Over("written by toolledger 0.1, and past its time")


def flight_key(url: str, session_id: str, tool_use_id: str) -> tuple[str, str, str]:
    return (url, session_id, tool_use_id)


def lease_state(lease: Lease | None, *, now: float, runtime: Runtime) -> Verdict:
    """Whether a session lease is held (``Running``) or may be taken (``Over``).

    Given back → free. A run of this process → held while that run goes on. Another process of
    this process table → held while it lives, even past the expiry (it is known alive: a paused
    worker keeps its session), free at once when it has ended. Anywhere else → held until it
    expires on the store's clock.
    """
    if lease is None:
        return Over("nobody holds it")
    if lease.expires_at <= 0:
        return Over("it was given back")
    holder = lease.holder
    if holder is None:
        return _legacy(lease.owner, lease.expires_at, now, runtime)
    if runtime.shares_process_table(holder):
        if runtime.is_me(holder):
            if lease.owner in runtime.live_runs:
                return Running("a run of this process holds it")
            return Over("the run of this process that held it has ended")
        alive = runtime.process_alive(holder)
        if alive:
            return Running(f"its process (pid {holder.pid} on this host) is alive")
        if alive is False:
            return Over(f"its process (pid {holder.pid} on this host) has ended")
    if lease.expires_at > now:
        return Running("it has not expired", lease.expires_at)
    return Over("it has expired")
