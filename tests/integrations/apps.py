"""Running an integration's app in a process of its own, as the kill tests do: armed to
``SIGKILL`` itself at a crash point (``TOOLLEDGER_CRASH_AT``), or run to its end and read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import toolledger as tl
from toolledger.records import EffectRecord, Status

__all__ = ["ChargeInDoubtOnce", "finished", "killed", "run_app"]

WORLD = "world.txt"


def run_app(app: str, *args: str, crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    """``python app *args``, armed to ``SIGKILL`` itself at ``crash_at`` (none: not armed, even if
    this process is)."""
    env = {k: v for k, v in os.environ.items() if k != "TOOLLEDGER_CRASH_AT"}
    if crash_at is not None:
        env["TOOLLEDGER_CRASH_AT"] = crash_at
    argv = [sys.executable, app, *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)


def killed(done: subprocess.CompletedProcess[str], tmp_path: Path) -> None:
    """The app was killed at its crash point, after the tool's one effect."""
    assert done.returncode == -9, done.stdout + done.stderr
    assert (tmp_path / WORLD).read_text() == "checkout is down\n"


def finished(done: subprocess.CompletedProcess[str], tmp_path: Path) -> Any:
    """The app ran to its end, the world still holding one effect; what it printed last (JSON)."""
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / WORLD).read_text() == "checkout is down\n", "exactly one effect"
    return json.loads(done.stdout.strip().splitlines()[-1])


class ChargeInDoubtOnce:
    """A charge whose first attempt cannot tell whether it took effect (in doubt), and a sync
    approver that re-runs it: ``runs``, the orders charged; ``on_loop``, whether each question
    was asked on the main thread (an integration's event loop)."""

    def __init__(self) -> None:
        self.runs: list[str] = []
        self.on_loop: list[bool] = []

    def charge(self, order: str) -> str:
        self.runs.append(order)
        if len(self.runs) == 1:
            raise tl.OutcomeUnknown("the connection dropped after the request was sent")
        return f"charged {order}"

    def rerun_it(self, request: tl.ApprovalRequest) -> tl.Decision:
        self.on_loop.append(threading.current_thread() is threading.main_thread())
        return tl.Decision(approved=True, rerun=True)

    def rerun_once(self, record: EffectRecord | None) -> None:
        """Two runs of the call: in doubt, then re-run once on the approver's answer, recorded
        under its name and asked off the loop."""
        assert self.runs == ["A", "A"], "in doubt, then re-run once on the approver's answer"
        assert record is not None and record.status is Status.SUCCEEDED
        assert record.approved_by == type(self).rerun_it.__qualname__, "the approver's name"
        assert self.on_loop == [False], "a sync approver is asked in a worker thread"
