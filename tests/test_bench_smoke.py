"""The benchmarks run: ``python -m bench --smoke`` (every section, a few samples, seconds) and
``toolledger bench --help``. Their figures are measured by hand (``make bench``), never here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_bench_runs_every_section(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results, "results written"
    report = (tmp_path / "report.md").read_text()
    assert "floor" in report and "run_tool_uses" in report
    assert "minimal correct ledger" in report, "every figure stands beside what correctness costs"
    for section in ("main", "sizes", "lookups", "long", "group", "postgres"):
        assert f"bench: {section} done" in done.stdout + done.stderr, section
