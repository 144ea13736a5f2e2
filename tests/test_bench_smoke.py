"""The benchmarks run: ``python -m bench --smoke`` (every section, a few samples, seconds) and
``toolledger bench --help``. Their figures are measured by hand (``make bench``), never here:
the targets' rows must be there with a number, not meet their goals."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Each target row measured beside its comparison in the same run: (target, measured), as
# regular expressions. ``postgres`` rows are "not measured" when no server answers.
NUMBER = r"-?[\d,]+(\.\d+)?"
TARGETS = [
    (r"non-idempotent call, CPU only ÷ minimal correct ledger", rf"{NUMBER}x \({NUMBER} µs vs"),
    (r"non-idempotent call, durable ÷ minimal correct ledger", rf"{NUMBER}x \({NUMBER} µs vs"),
    (
        r"non-idempotent call, instructions ÷ minimal correct ledger",
        rf"{NUMBER}x \({NUMBER} vs {NUMBER} per call; agent turn {NUMBER}\)",
    ),
    (r"\d+ processes, distinct sessions, calls/s ÷ bare INSERT\+UPDATE loop, sqlite", r"\d+% \("),
    (r"agent turn CPU beyond its commits \(fake client\)", rf"{NUMBER} µs \(turn {NUMBER} µs"),
    (r"SQL statements per agent turn with one non-idempotent call", rf"{NUMBER} per turn"),
    (r"whole turn at turn [\d,]+ ÷ turns 1-20", rf"{NUMBER}x \({NUMBER} µs vs"),
    (r"`agent\.run` open of a [\d,]+-turn session", rf"{NUMBER} ms median"),
    (
        r"`arun_tool_uses`, 16 concurrent tasks on one sqlite store: calls per commit",
        rf"{NUMBER} \(16 threads: {NUMBER}\)",
    ),
]
POSTGRES_TARGETS = [
    (
        r"\d+ processes, distinct sessions, calls/s ÷ bare INSERT\+UPDATE loop, PostgreSQL",
        r"\d+% \(",
    ),
    (r"PostgreSQL round trips per non-idempotent call", rf"{NUMBER} \({NUMBER} statements"),
    (
        r"PostgreSQL non-idempotent call, client CPU ÷ minimal correct ledger",
        rf"{NUMBER}x \({NUMBER} µs vs",
    ),
]


def target_rows(report: str) -> dict[str, str]:
    """The Targets table of ``report.md``: target → measured."""
    table = report.split("#### Targets", 1)[1]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if line.startswith("| ") and len(cells) == 4:
            rows[cells[0]] = cells[2]
    return rows


def test_the_bench_runs_every_section(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,  # the instructions section runs Python under callgrind: about 2 minutes
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results, "results written"
    report = (tmp_path / "report.md").read_text()
    assert "floor" in report and "run_tool_uses" in report
    assert "minimal correct ledger" in report, "every figure stands beside what correctness costs"
    for section in ("main", "sizes", "lookups", "long", "group", "postgres", "instructions"):
        assert f"bench: {section} done" in done.stdout + done.stderr, section
    # How much of the call is SQLite running toolledger's own statements, measured beside it.
    assert re.search(r"CPU only: toolledger's SQL alone \(a call's 2 writes, replayed\)", report)
    assert re.search(rf"own SQL replayed alone takes {NUMBER} µs \({NUMBER}x", report), report
    rows = target_rows(report)
    no_server = any(m.startswith("PostgreSQL rows skipped") for m in results["missing"])
    for target, measured in TARGETS + POSTGRES_TARGETS:
        found = [(name, value) for name, value in rows.items() if re.fullmatch(target, name)]
        assert len(found) == 1, (target, sorted(rows))
        value = found[0][1]
        if no_server and (target, measured) in POSTGRES_TARGETS:
            assert value == "not measured", (target, value)
        else:
            assert re.match(measured, value), (target, value)


def test_the_instruction_count_runs_on_its_own() -> None:
    """``python -m bench.instructions`` (the README's command), at its smallest sizes: every
    contender counted, a figure per operation, the ratio beside it."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.instructions", "--lo", "20", "--hi", "40"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("instructions per operation (callgrind, 20 vs 40"), done.stdout
    counts = [int(line.split()[-1].replace(",", "")) for line in lines[1:4]]
    assert all(c > 10_000 for c in counts), done.stdout  # each contender really ran
    assert re.search(rf"call ÷ minimal\s+{NUMBER}x", lines[4]), done.stdout
