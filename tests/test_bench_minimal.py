"""The bench's "what correctness alone costs" contender is itself correct: a finished call is
answered from its record, and a call whose process was killed mid-tool is in doubt and does not
run again. (Its cost is measured by ``python -m bench``, never here.)"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from bench.minimal import MinimalLedger

ROOT = Path(__file__).resolve().parents[1]


def test_a_finished_call_is_answered_from_its_record(tmp_path: Path) -> None:
    ran: list[int] = []
    ledger = MinimalLedger(tmp_path / "m.db")
    try:
        first = ledger.call("s", "toolu_1", lambda: ran.append(1) or {"id": 7})
        again = ledger.call("s", "toolu_1", lambda: ran.append(1) or {"id": 8})
    finally:
        ledger.close()
    assert (first, again, len(ran)) == ({"id": 7}, {"id": 7}, 1)


def test_a_call_killed_mid_tool_is_in_doubt_and_does_not_run_again(tmp_path: Path) -> None:
    world = tmp_path / "effects.log"
    child = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from bench.minimal import MinimalLedger

        def send() -> str:
            with open({str(world)!r}, "a") as fh:
                fh.write("sent\\n")
            os.kill(os.getpid(), signal.SIGKILL)  # after the effect, before its record
            return "sent"

        MinimalLedger(Path({str(tmp_path / "m.db")!r})).call("s", "toolu_1", send)
        """
    )
    done = subprocess.run([sys.executable, "-c", child], cwd=ROOT, check=False)
    assert done.returncode == -9
    ledger = MinimalLedger(tmp_path / "m.db")
    try:
        with pytest.raises(RuntimeError, match="in doubt"):
            ledger.call("s", "toolu_1", lambda: world.open("a").write("sent\n"))
    finally:
        ledger.close()
    assert world.read_text() == "sent\n"
