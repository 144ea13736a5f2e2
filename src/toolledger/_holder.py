"""``Holder``: which process runs an attempt or holds a lease, as recorded on intents and
leases (``toolledger.records`` re-exports it; ``toolledger._liveness`` judges it)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Holder"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Holder:
    """Which process runs an attempt or holds a lease — precisely enough to tell, later and from
    elsewhere, whether that very process still exists; or, when it cannot name itself that
    precisely, an *unknown identity* (``Holder.unknown``), which is judged by its lease and its
    deadline alone (see ``toolledger._liveness``).

    ``host`` is the host identity (``TOOLLEDGER_HOST_ID``, else the kernel's boot id), ``boot``
    the kernel's boot id, ``pidns`` the PID namespace and ``timens`` the time namespace (inodes
    of ``/proc/self/ns/pid`` and ``/proc/self/ns/time``; ``""`` for a kernel without time
    namespaces). ``start`` is the process's start time in clock ticks since boot, normalised by
    its time namespace's boot-time offset, so a pid reused by another process is not mistaken for
    the holder, whichever time namespace reads it.

    Holders written before boot and time namespace were recorded have ``boot`` and ``timens``
    ``None``: their ``start`` is as their own time namespace showed it.
    """

    host: str
    pidns: str
    pid: int
    start: int
    boot: str | None = None
    timens: str | None = None

    @classmethod
    def unknown(cls, pid: int) -> Holder:
        """A process that could not name itself (no readable ``/proc``, a ``/proc`` that is not
        its own): ``pid`` is only for people."""
        return cls(host="", pidns="", pid=pid, start=0)

    @property
    def known(self) -> bool:
        """Whether it names one process of one process table (else: an unknown identity)."""
        return bool(self.host and self.pidns)

    def text(self) -> str:
        """The stored form: ``v2;boot;timens;host/pidns/pid/start`` (``host`` empty when it is
        the boot id); ``//pid/0`` for an unknown identity (which earlier releases read as a
        holder of no table of theirs, judged by lease and deadline); ``host/pidns/pid/start`` as
        written before boot and time namespace were recorded."""
        last = _LAST_TEXT[0]  # this process's holder, written on every intent: made once
        if last[0] is self:
            return last[1]
        if self.boot is None or self.timens is None or not self.known:
            text = f"{self.host}/{self.pidns}/{self.pid}/{self.start}"
        else:
            host = "" if self.host == self.boot else self.host  # the boot id, unless renamed
            text = f"v2;{self.boot};{self.timens};{host}/{self.pidns}/{self.pid}/{self.start}"
        _LAST_TEXT[0] = (self, text)
        return text

    @classmethod
    def parse(cls, text: str | None) -> Holder | None:
        """The holder a stored text names; ``None`` for nothing or anything unreadable."""
        if not text:
            return None
        parts = text.rsplit("/", 3)
        if len(parts) != 4 or not parts[2].isdigit() or not parts[3].isdigit():
            return None
        head, pidns, pid, start = parts[0], parts[1], int(parts[2]), int(parts[3])
        if head.startswith("v2;"):
            fields = head.split(";", 3)
            if len(fields) != 4:
                return None
            _, boot, timens, host = fields
            return cls(
                host=host or boot, pidns=pidns, pid=pid, start=start, boot=boot, timens=timens
            )
        return cls(host=head, pidns=pidns, pid=pid, start=start)


# The last holder whose text was made, and its text: a frozen holder's text never changes. One
# tuple, replaced whole, so a thread reads a holder with its own text.
_LAST_TEXT: list[tuple[Holder | None, str]] = [(None, "")]
