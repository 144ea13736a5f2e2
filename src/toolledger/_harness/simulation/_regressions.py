"""Fixed bugs the simulation can switch back on, to show that it finds them — each with the world
(``WORLDS``) that exposes it.

The liveness ones restore, as patches, how toolledger once read a process table and a clock:

* ``unknown-released`` — a process that cannot read its own ``/proc`` entry wrote no holder, which
  everyone read as "its worker gave the attempt up": in doubt at once (no ``/proc``: macOS);
* ``unreadable-dead`` — another process's entry that cannot be read meant it had ended (a
  ``/proc`` mounted ``hidepid=2``, workers of several uids);
* ``raw-starts`` — start times compared as ``/proc`` shows them, which a time namespace shifts:
  a live holder looked like another, ended process;
* ``foreign-proc`` — a process trusted the ``/proc`` it saw as its own table although it belonged
  to another PID namespace, naming whichever process there had its pid;
* ``wall-clock`` — a lease expired by its expiry on the reader's clock, and a deadline passed by
  it, which on a file store is each machine's own and may step.

And two of branches and people (they need ``SimConfig.branch`` and ``SimConfig.blanket_yes`` on,
as they are by default):

* ``lineage`` — a fork copied only the calls its transcript kept, as they were, and a branch
  claimed nothing in its lineage's root (before rule 19): a branch replaying its parent's id ran
  the call again;
* ``blanket`` — any yes re-ran a call in doubt (before rule 21's own yes for a re-run).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from typing import Any
from unittest import mock

from ..._liveness import Over, Running, Runtime, _identity
from ..._liveness._procview import ProcView, parse_stat
from ...branches._branching import _cut as _real_cut
from ...engine._decide import after_approval as _after_approval
from ...records import Holder
from ._config import SimConfig

__all__ = ["REGRESSIONS", "WORLDS", "regression", "world_for"]

WORLDS: dict[str, SimConfig] = {
    "no-proc": SimConfig(proc_modes=("none",)),
    "hidden-proc": SimConfig(proc_modes=("hidden",), uids=3),
    "time-namespaces": SimConfig(time_namespaces=0.5),
    "host-proc": SimConfig(proc_modes=("host",), containers=2, crash=0.004),
    "clock-steps": SimConfig(store_clock="local", clock_step=0.005, hosts=1, containers=2),
}
"""Worlds where liveness can be fooled, one per way (``SimConfig``'s last fields)."""

_WORLD_OF = {
    "unknown-released": "no-proc",
    "unreadable-dead": "hidden-proc",
    "raw-starts": "time-namespaces",
    "foreign-proc": "host-proc",
    "wall-clock": "clock-steps",
}

REGRESSIONS = ("takeover", "threads", "resolve", "lineage", "blanket", *_WORLD_OF)
"""Fixed bugs a test can switch back on, to show the simulation finds them."""


def world_for(name: str) -> SimConfig:
    """The world a regression shows in (the default one, unless it needs another)."""
    return WORLDS[_WORLD_OF[name]] if name in _WORLD_OF else SimConfig()


def _holder_or_none(self: Runtime) -> Holder | None:
    holder = self.identity.holder
    return holder if holder.known else None


def _identify_trusting(proc: ProcView) -> _identity.Identity:
    """Identity read from ``/proc/PID/stat`` by this process's own pid, whatever ``/proc`` is."""
    pid = proc.getpid()
    stat = parse_stat(proc.read(f"/proc/{pid}/stat"))
    link = proc.readlink("/proc/self/ns/pid")
    pidns = "" if link is None else link.partition("[")[2].rstrip("]")
    host = proc.host_id() or proc.read("/proc/sys/kernel/random/boot_id") or ""
    if stat is None or not host or not pidns:
        return _identity.Identity(Holder.unknown(pid))
    return _identity.Identity(Holder(host=host, pidns=pidns, pid=pid, start=stat[1]))


def _identify_raw(proc: ProcView) -> _identity.Identity:
    found = _identity.identify(proc)
    holder = found.holder
    if not holder.known:
        return found
    # The start time as shown, not normalised; no time namespace recorded.
    raw = Holder(host=holder.host, pidns=holder.pidns, pid=holder.pid, start=holder.start)
    shown = Holder(host=raw.host, pidns=raw.pidns, pid=raw.pid, start=raw.start + found.offset)
    return _identity.Identity(shown, 0, None)


def _evidence_raw(proc: ProcView, me: _identity.Identity, other: Holder) -> bool | None:
    mine = me.holder
    if not (mine.known and other.known) or (other.host, other.pidns) != (mine.host, mine.pidns):
        return None
    entry = parse_stat(proc.read(f"/proc/{other.pid}/stat"))
    if entry is None:
        return False if proc.signal0(other.pid) is False else None
    return entry[0] not in ("Z", "X") and entry[1] == other.start


def _evidence_unreadable_dead(proc: ProcView, me: _identity.Identity, other: Holder) -> bool | None:
    found = _identity.evidence(proc, me, other)
    mine = me.holder
    same_table = mine.known and (other.host, other.pidns) == (mine.host, mine.pidns)
    if found is None and same_table and proc.read(f"/proc/{other.pid}/stat") is None:
        return False  # "no such process in our table"
    return found


_CUT: list[tuple[Any, int]] = []  # the last branch point the lineage regression saw


def _cut_seen(snap: Any, sid: str, turn: int) -> int:
    cut = _real_cut(snap, sid, turn)
    _CUT[:] = [(snap, cut)]
    return cut


def _never(tool: Any) -> bool:
    return False


def _kept_calls_only(records: dict[str, Any], *_: Any, session: str, **__: Any) -> list[Any]:
    """The records a fork copied before rule 19: those of the calls its transcript keeps."""
    ((snap, cut),) = _CUT
    kept = {i for m in snap.messages[:cut] for i in snap.reader.call_ids(m)}
    return [replace(r, session_id=session) for i, r in records.items() if i in kept]


def _any_yes_reruns(call: Any, ask: Any, decision: Any) -> Any:
    yes = None if decision is None else replace(decision, rerun=decision.approved)
    return _after_approval(call, ask, yes)


def _expired_by_the_clock(lease: Any, *, now: float, **_: Any) -> Any:
    if lease.expires_at > now:
        return Running("it has not expired", lease.expires_at)
    return Over("it has expired")


@contextlib.contextmanager
def regression(name: str | None) -> Iterator[None]:
    """Switch the fixed bug ``name`` back on (``None``: none) while the block runs."""
    if name is None:
        yield
        return
    bug = Over("a regression switched on")
    patch: Any
    if name == "takeover":
        # The old agent ("exclusive"): any started record is a previous holder's, in doubt.
        patch = mock.patch("toolledger.engine._batch.Env.judge", return_value=bug)
    elif name == "threads":
        # An attempt registered in flight only after its intent committed (here: never).
        patch = mock.patch("toolledger._liveness.InFlight.add", return_value=None)
    elif name == "resolve":
        # resolve and in-doubt listings that do not ask whether the attempt still runs.
        patch = mock.patch("toolledger.stores.store.Store.judge", return_value=bug)
    elif name == "lineage":
        patch = contextlib.ExitStack()
        patch.enter_context(mock.patch("toolledger.branches._branching._cut", _cut_seen))
        patch.enter_context(
            mock.patch("toolledger.branches._branching._lineage_calls", _kept_calls_only)
        )
        # Nor did a branch claim the calls it made in its lineage's root (which now also
        # finds a call the fork did not copy there).
        patch.enter_context(mock.patch("toolledger.engine._runner.claims", _never))
        patch.enter_context(mock.patch("toolledger.engine._claims.claims", _never))
    elif name == "blanket":
        patch = mock.patch("toolledger.engine._decide.after_approval", _any_yes_reruns)
    elif name == "unknown-released":
        patch = mock.patch.object(Runtime, "holder", property(_holder_or_none))
    elif name == "unreadable-dead":
        patch = mock.patch("toolledger._liveness._runtime.evidence", _evidence_unreadable_dead)
    elif name == "raw-starts":
        patch = contextlib.ExitStack()
        patch.enter_context(mock.patch("toolledger._liveness._runtime.evidence", _evidence_raw))
        patch.enter_context(mock.patch("toolledger._liveness._runtime.identify", _identify_raw))
    elif name == "foreign-proc":
        patch = mock.patch("toolledger._liveness._runtime.identify", _identify_trusting)
    elif name == "wall-clock":
        patch = contextlib.ExitStack()
        patch.enter_context(mock.patch("toolledger._liveness._renewing", _expired_by_the_clock))
        patch.enter_context(mock.patch("toolledger._liveness._by_boot_clock", return_value=None))
        patch.enter_context(
            mock.patch(
                "toolledger._liveness._before_deadline",
                lambda record, deadline, **_: Running("its deadline has not passed", deadline),
            )
        )
    else:
        raise ValueError(f"unknown regression {name!r}; one of {', '.join(REGRESSIONS)}")
    with patch:
        yield
