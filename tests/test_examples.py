"""Every example in examples/ runs, as a user would run it, and succeeds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES_DIR = Path(__file__).parent.parent / "examples"
EXAMPLES = sorted(EXAMPLES_DIR.glob("*.py"))


def test_there_are_examples() -> None:
    assert {p.name for p in EXAMPLES} >= {"create_ticket_twice.py", "brief_tools.py"}


def run_example(example: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``example`` run as a user runs it, in ``tmp_path``, on the store ``tmp_path/x.db``; it
    must succeed."""
    proc = subprocess.run(
        [sys.executable, str(example)],
        cwd=tmp_path,
        env={**os.environ, "TOOLLEDGER_STORE": f"sqlite:///{tmp_path}/x.db", **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(example: Path, tmp_path: Path) -> None:
    proc = run_example(example, tmp_path, BRIEF_WORLD=str(tmp_path))
    if example.name == "create_ticket_twice.py":
        assert proc.stdout.count("create_ticket executed 1 time(s)") == 2
    if example.name == "brief_tools.py":
        assert "e-mails sent: 1, log lines: 1" in proc.stdout
    if example.name.startswith("recipe_"):
        # make test installs the frameworks: a recipe that skipped proves nothing
        assert "skipping this recipe" not in proc.stdout, proc.stdout
        assert "tickets opened: 1" in proc.stdout, proc.stdout


def test_the_quickstart_run_again_on_its_store_finds_the_ticket_opened_once(tmp_path: Path) -> None:
    """Run twice on one store (as after a kill, or simply again): the second process opens no
    ticket — the ledger holds the one the first opened — and says so, without an alarm."""
    said = [run_example(EXAMPLES_DIR / "agent_quickstart.py", tmp_path).stdout for _ in range(2)]
    assert "tickets opened by this process: 1, in the ledger: 1" in said[0], said[0]
    assert "tickets opened by this process: 0, in the ledger: 1" in said[1], said[1]
