"""The operating system as liveness reads it: a few files under ``/proc``, a symlink or two, and
``kill(pid, 0)``. ``RealProc`` is this machine's; the deterministic simulator gives each
simulated process a view of its own simulated machine, so that the code that *interprets* these
readings (``toolledger._liveness``) is the same code in both.
"""

from __future__ import annotations

import os
import time
from typing import Protocol

__all__ = ["HOST_ID_ENV", "ProcView", "RealProc", "parse_stat"]

HOST_ID_ENV = "TOOLLEDGER_HOST_ID"


class ProcView(Protocol):
    """What a process can learn about itself and its process table."""

    def getpid(self) -> int:
        """This process's pid, in its own PID namespace."""
        ...

    def read(self, path: str) -> str | None:
        """A file's text, stripped; ``None`` when it cannot be read (absent, hidden, denied)."""
        ...

    def readlink(self, path: str) -> str | None:
        """A symlink's target; ``None`` when it cannot be read."""
        ...

    def signal0(self, pid: int) -> bool | None:
        """``kill(pid, 0)`` in this process's PID namespace: ``False`` when no process has
        ``pid`` (ESRCH), ``True`` when one does (even one this process may not signal),
        ``None`` when it cannot be told."""
        ...

    def host_id(self) -> str | None:
        """``TOOLLEDGER_HOST_ID``, when set."""
        ...

    def boottime(self) -> float | None:
        """Seconds since the kernel booted, as this process's time namespace shows them
        (``CLOCK_BOOTTIME``: no wall-clock step moves it); ``None`` where there is none."""
        ...


class RealProc:
    """This machine."""

    def getpid(self) -> int:
        return os.getpid()

    def read(self, path: str) -> str | None:
        try:
            with open(path) as fh:
                return fh.read().strip()
        except OSError:
            return None

    def readlink(self, path: str) -> str | None:
        try:
            return os.readlink(path)
        except OSError:
            return None

    def signal0(self, pid: int) -> bool | None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        except OSError:
            return None
        return True

    def host_id(self) -> str | None:
        return os.environ.get(HOST_ID_ENV) or None

    def boottime(self) -> float | None:
        clock = getattr(time, "CLOCK_BOOTTIME", None)  # Linux only
        if clock is None:
            return None
        try:
            return time.clock_gettime(clock)
        except OSError:
            return None


def parse_stat(text: str | None) -> tuple[str, int] | None:
    """``(state, start time in clock ticks since boot)`` from the text of ``/proc/PID/stat``."""
    if text is None:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ")".
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None
