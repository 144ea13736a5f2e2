"""Running an integration's app in a process of its own, as the kill tests do: armed to
``SIGKILL`` itself at a crash point (``TOOLLEDGER_CRASH_AT``), or run to its end and read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["finished", "killed", "run_app"]

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
