"""Instructions per operation, counted under callgrind: a figure a busy machine does not move.

Each contender — the minimal correct ledger's call, toolledger's ``run_tool_uses`` call (one
non-idempotent no-op) and an agent turn (fake client) — runs in a child process under
``valgrind --tool=callgrind``, twice: ``lo`` and ``hi`` operations. What the two runs share
(starting Python, imports, opening the store, the first operations' warm-up) cancels in the
difference, so ``(Ir(hi) - Ir(lo)) / (hi - lo)`` is the user-space instructions of one
operation: the interpreter, SQLite and the C library, not the kernel (an fsync is a system
call; the files are ``synchronous=OFF`` as in the CPU-only rows).

``python -m bench.instructions`` prints the table alone. Without valgrind the section says so
and counts nothing (``make bench`` installs it where apt-get can: ``.ci/install-valgrind``).
"""

from __future__ import annotations

import argparse
import compileall
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import toolledger

CONTENDERS = ("minimal", "call", "turn")
_COLLECTED = re.compile(r"Collected : (\d+)")


@dataclass(frozen=True)
class Counted:
    """Instructions per operation of each contender (``CONTENDERS``), with the two sizes run."""

    per_op: dict[str, float]
    lo: int
    hi: int

    def ratio(self) -> float:
        return self.per_op["call"] / self.per_op["minimal"]


def valgrind() -> str | None:
    """Why instructions cannot be counted here, or ``None``."""
    if shutil.which("valgrind") is None:
        return "valgrind is not installed (.ci/install-valgrind, or apt-get install valgrind)"
    return None


def count(directory: Path, *, lo: int, hi: int) -> Counted:
    """Run every contender at ``lo`` and ``hi`` operations under callgrind (two at a time: the
    counts do not depend on what else runs) and difference them."""
    jobs = [(what, n) for what in CONTENDERS for n in (lo, hi)]
    # Every module's bytecode cached before counting, and none written while counting: two
    # runs that import a module for the first time side by side must not differ by which of
    # them compiled it (tens of millions of instructions, more than a run of 20 turns).
    root = Path(__file__).parents[1]
    compileall.compile_dir(root / "bench", quiet=1)
    compileall.compile_dir(Path(toolledger.__file__).parent, quiet=1)
    with ThreadPoolExecutor(max_workers=2) as pool:
        totals = dict(zip(jobs, pool.map(lambda job: _run(directory, *job), jobs), strict=True))
    per_op = {what: (totals[what, hi] - totals[what, lo]) / (hi - lo) for what in CONTENDERS}
    return Counted(per_op=per_op, lo=lo, hi=hi)


def _run(directory: Path, what: str, n: int) -> int:
    work = Path(tempfile.mkdtemp(prefix=f"ir-{what}-{n}-", dir=directory))
    out = work / "callgrind.out"
    argv = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        sys.executable,
        "-m",
        "bench.instructions",
        "--child",
        what,
        str(n),
        str(work),
    ]
    # The same dict layouts in both runs; the bytecode cache read, never written (``count``).
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        argv, capture_output=True, text=True, check=False, env=env, cwd=Path(__file__).parents[1]
    )
    found = _COLLECTED.findall(done.stderr)
    if done.returncode != 0 or not found:
        raise RuntimeError(
            f"callgrind run of {what} x {n} failed ({done.returncode}): {done.stderr[-2000:]}"
        )
    shutil.rmtree(work, ignore_errors=True)
    return int(found[-1])


def _child(what: str, n: int, directory: Path) -> None:
    """Run ``n`` operations of ``what`` (a turn contender's step is a 20-turn run: ``n`` counts
    turns, rounded to whole runs)."""
    from . import core, cpu, minimal

    with ExitStack() as stack:
        if what == "minimal":
            step = minimal.per_call(directory, stack, synchronous="OFF").step
            runs = n
        else:
            store = cpu.synchronous_off(core.open_bench_store("sqlite", directory, what, stack))
            if what == "call":
                step, runs = core.per_call(store, "instructions", "noop_effect").step, n
            else:
                # A lease no renewal falls due in: under callgrind, on a busy machine, a run
                # can outlast a third of the default and its heartbeat would be counted too.
                step = core.agent_turn(store, "instructions", lease_ttl=24 * 3600).step
                runs = max(1, n // core.TURNS_PER_RUN)
        for i in range(runs):
            step(i)


def table(counted: Counted) -> str:
    rows = [
        ("minimal correct ledger, one non-idempotent call", counted.per_op["minimal"]),
        ("toolledger run_tool_uses, one non-idempotent call", counted.per_op["call"]),
        ("toolledger agent turn, one non-idempotent call", counted.per_op["turn"]),
    ]
    lines = [
        f"instructions per operation (callgrind, {counted.lo} vs {counted.hi} operations; "
        "synchronous=OFF SQLite)",
        *(f"  {name:<52} {value:>12,.0f}" for name, value in rows),
        f"  {'call ÷ minimal':<52} {counted.ratio():>11.2f}x",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__)
    parser.add_argument("--child", nargs=3, metavar=("WHAT", "N", "DIR"), help=argparse.SUPPRESS)
    parser.add_argument("--lo", type=int, default=100)
    parser.add_argument("--hi", type=int, default=300)
    args = parser.parse_args(argv)
    if args.child:
        what, n, where = args.child
        _child(what, int(n), Path(where))
        return
    why = valgrind()
    if why is not None:
        print(f"instructions not counted: {why}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        print(table(count(Path(tmp), lo=args.lo, hi=args.hi)))


if __name__ == "__main__":
    main()
