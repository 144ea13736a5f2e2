"""A function run in a forked child that the parent ``SIGKILL``s at an instant of its choosing.

Forking from a parent that has already imported everything (the ``anthropic`` SDK, pydantic,
toolledger) makes a kill cheap: no interpreter start-up, no imports. The child reports its
JSON-able return value through a pipe; a killed child reports nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

KILLED = -signal.SIGKILL
HUNG = -1000  # our own code for a child that did not finish in time (then killed)


@dataclass(frozen=True)
class Attempt:
    exit_code: int  # 0, KILLED, HUNG, or what the child exited with
    result: Any  # the child's return value; None unless it exited normally
    seconds: float


def spawn(fn: Callable[[], Any], *, kill_after: float | None, timeout: float) -> Attempt:
    """Run ``fn()`` in a forked child; ``SIGKILL`` it after ``kill_after`` seconds if it is still
    running, or after ``timeout`` seconds in any case (``HUNG``)."""
    read_fd, write_fd = os.pipe()
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            os.close(read_fd)
            os.write(write_fd, json.dumps(fn()).encode())
        except BaseException:
            code = 70
        finally:
            os._exit(code)
    os.close(write_fd)
    try:
        hung = False
        if not _exited_within(pid, timeout if kill_after is None else min(kill_after, timeout)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            hung = kill_after is None or kill_after >= timeout
        status = os.waitpid(pid, 0)[1]
        data = b""
        while chunk := os.read(read_fd, 65536):
            data += chunk
    finally:
        os.close(read_fd)
    code = HUNG if hung else os.waitstatus_to_exitcode(status)
    result = json.loads(data) if code == 0 and data else None
    return Attempt(code, result, time.perf_counter() - started)


def _exited_within(pid: int, seconds: float) -> bool:
    """Whether ``pid`` exits within ``seconds`` (it is left to be reaped)."""
    if hasattr(os, "pidfd_open"):
        fd = os.pidfd_open(pid)
        try:
            ready, _, _ = select.select([fd], [], [], max(seconds, 0.0))
            return bool(ready)
        finally:
            os.close(fd)
    deadline = time.perf_counter() + seconds  # pragma: no cover - systems without pidfd
    while time.perf_counter() < deadline:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        time.sleep(0.0005)
    return False
