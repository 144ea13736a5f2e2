"""Who this process is, and what its process table can prove about another holder.

A process names itself fully (``Holder`` with host, boot, PID and time namespaces, pid and start
time) only where its process table is provably its own: ``/proc/self`` is this pid (so ``/proc``
belongs to this PID namespace), its own entry, its namespaces and its boot id can be read, and its
time namespace's boot-time offset is known (start times are normalised by it, so they read the
same from every time namespace). Anything less is an *unknown identity* (``Holder.unknown``): on
macOS and Windows, under a masked ``/proc``, in a PID namespace that sees the host's ``/proc``.

Evidence about another holder comes only from that same process table (same host, same PID
namespace), read through ``toolledger._liveness._procview``:

* **alive** — its pid's entry has its start time (it is that very process, not a zombie);
* **ended** — no process has its pid (``kill(pid, 0)`` says so, in this PID namespace), or the
  entry is a zombie of it, or — within one time namespace, where start times are comparable —
  another process now has its pid;
* **unknown** — anything else: an entry that cannot be read (another uid under ``hidepid``), a
  start time that cannot be compared, another table. Unknown is never taken for ended
  (docs/design.md, rule 18): such a holder is judged by its lease and deadline.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..records import Holder
from ._procview import ProcView, parse_stat

__all__ = ["BootClock", "Identity", "boot_clock", "evidence", "identify"]


def _ticks() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (AttributeError, ValueError, OSError):
        return 100


TICKS = _ticks()
"""Clock ticks per second, the unit of start times in ``/proc/PID/stat``."""


@dataclass(frozen=True, slots=True)
class Identity:
    """What this process could learn of itself: its ``holder`` (possibly an unknown identity,
    ``why`` saying why) and the boot-time offset of its time namespace in clock ticks, which
    normalises the start times it reads."""

    holder: Holder
    offset: int = 0
    why: str | None = None


def _inode(link: str | None) -> str | None:
    """``"4026531836"`` from ``"pid:[4026531836]"``."""
    if link is None or "[" not in link:
        return None
    return link.partition("[")[2].rstrip("]") or None


def _time_namespace(proc: ProcView) -> tuple[str, int] | None:
    """This process's time namespace and its boot-time offset (clock ticks); ``("", 0)`` on a
    kernel without time namespaces; ``None`` when it cannot be known."""
    link = proc.readlink("/proc/self/ns/time")
    if link is None:
        # Its PID namespace link could be read (the caller checked): no time namespaces here.
        return ("", 0)
    children = proc.readlink("/proc/self/ns/time_for_children")
    if children is not None and children != link:
        return None  # it unshared a time namespace for its children: the offsets are theirs
    text = proc.read("/proc/self/timens_offsets")
    if text is None:
        return None
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[0] in ("boottime", "7"):  # CLOCK_BOOTTIME is 7
            try:
                secs, nsecs = int(fields[1]), int(fields[2])
            except ValueError:
                return None
            inode = _inode(link)
            if inode is None:
                return None
            return (inode, secs * TICKS + nsecs * TICKS // 1_000_000_000)
    return None


def identify(proc: ProcView) -> Identity:
    """This process as ``proc`` shows it: a full identity where its process table is provably its
    own, else an unknown one, with the reason."""
    pid = proc.getpid()

    def unknown(why: str) -> Identity:
        return Identity(Holder.unknown(pid), 0, why)

    link = proc.readlink("/proc/self")
    if link is None:
        return unknown("no /proc can be read here")
    if link != str(pid):
        return unknown(
            f"the /proc mounted here is another PID namespace's (/proc/self is {link}, this "
            f"process is pid {pid})"
        )
    stat = parse_stat(proc.read("/proc/self/stat"))
    if stat is None:
        return unknown("this process's own /proc entry cannot be read")
    pidns = _inode(proc.readlink("/proc/self/ns/pid"))
    if pidns is None:
        return unknown("this process's PID namespace cannot be read")
    boot = proc.read("/proc/sys/kernel/random/boot_id")
    if not boot:
        return unknown("the kernel's boot id cannot be read")
    timens = _time_namespace(proc)
    if timens is None:
        return unknown("this process's time namespace offsets cannot be read")
    host = proc.host_id() or boot
    holder = Holder(
        host=host,
        pidns=pidns,
        pid=pid,
        start=stat[1] - timens[1],
        boot=boot,
        timens=timens[0],
    )
    return Identity(holder, timens[1], None)


@dataclass(frozen=True, slots=True)
class BootClock:
    """The kernel's boot clock as this process reads it: its boot id and its time namespace's
    boot-time offset, so that ``now()`` reads the same in every process of that kernel — a
    clock no wall-clock step moves, shared by the containers of one machine."""

    proc: ProcView
    boot: str
    offset: float

    def now(self) -> float | None:
        shown = self.proc.boottime()
        return None if shown is None else shown - self.offset


def boot_clock(proc: ProcView) -> BootClock | None:
    """This kernel's boot clock, where its boot id and this process's time namespace can be
    read (Linux); ``None`` elsewhere."""
    if proc.boottime() is None:
        return None
    boot = proc.read("/proc/sys/kernel/random/boot_id")
    if not boot or proc.readlink("/proc/self/ns/pid") is None:
        return None
    timens = _time_namespace(proc)
    if timens is None:
        return None
    return BootClock(proc, boot, timens[1] / TICKS)


def evidence(proc: ProcView, me: Identity, other: Holder) -> bool | None:
    """What this process's table proves about ``other`` (not this process): ``True`` alive,
    ``False`` ended, ``None`` nothing."""
    mine = me.holder
    if not (mine.known and other.known):
        return None
    if (other.host, other.pidns) != (mine.host, mine.pidns):
        return None  # another host, container or PID namespace: its pid names nothing here
    if other.boot is not None and other.boot != mine.boot:
        return None  # another boot of a host named by TOOLLEDGER_HOST_ID: not this table
    entry = parse_stat(proc.read(f"/proc/{other.pid}/stat"))
    if entry is None:
        # Hidden (another uid under hidepid) or gone: only kill(pid, 0) can tell which.
        return False if proc.signal0(other.pid) is False else None
    state, shown = entry
    if other.timens is None:
        # Written before start times were normalised: comparable only as shown here.
        same, comparable = shown == other.start, False
    else:
        same, comparable = shown - me.offset == other.start, other.timens == mine.timens
    if same:
        return state not in ("Z", "X")  # a zombie: killed, only its exit status left
    return False if comparable else None  # another process has its pid now: it has ended
