"""The operator's day two: ``toolledger show``, ``history`` and ``effects`` of a 5,000-turn session.

The session is written straight into a SQLite store (a turn: the model's message with one
tool_use, its tool_result, and the call's ledger record). Each command then runs as a person runs
it — ``python -m toolledger …`` in a process of its own, its output into a pipe — and is timed
from start to exit, with its peak resident memory (``ru_maxrss`` of the child). The bounds: 1 s
and 100 MB for the default view (the latest turns); ``--all`` and ``--json`` are measured beside
it, for the record.

``python -m bench.cli_reads [--turns 5000] [--dir DIR]`` prints the table; ``python -m bench
--only cli`` includes it in the report.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import resource
import struct
import subprocess
import sys
import tempfile
import termios
import time
from dataclasses import dataclass
from pathlib import Path

import toolledger as tl
from toolledger.codec import input_hash
from toolledger.ops import AppendMessages, InsertEffect, Op, PutSession
from toolledger.records import EffectRecord, RunStatus, SessionState, Status, StoredMessage

SESSION = "day-two"
BOUND_S = 1.0
BOUND_MB = 100.0


def build(url: str, turns: int) -> None:
    """A completed session of ``turns`` turns, each one call of a non-idempotent tool."""
    t0 = 1_700_000_000.0
    messages: list[StoredMessage] = [
        StoredMessage(seq=0, role="user", content="Settle the backlog.", created_at=t0)
    ]
    records: list[EffectRecord] = []
    for n in range(turns):
        at = t0 + n
        call = f"toolu_{n:08d}{'a' * 16}"
        body = {"ticket": f"T-{n}", "note": "checked and closed " * 4}
        messages.append(
            StoredMessage(
                seq=len(messages),
                role="assistant",
                content=[
                    {"type": "text", "text": f"Closing ticket T-{n}."},
                    {"type": "tool_use", "id": call, "name": "close_ticket", "input": body},
                ],
                created_at=at,
            )
        )
        messages.append(
            StoredMessage(
                seq=len(messages),
                role="user",
                content=[{"type": "tool_result", "tool_use_id": call, "content": '"closed"'}],
                created_at=at + 0.5,
            )
        )
        records.append(
            EffectRecord(
                session_id=SESSION,
                tool_use_id=call,
                tool="close_ticket",
                input_hash=input_hash(body),
                status=Status.SUCCEEDED,
                attempt=1,
                result='"closed"',
                created_at=at + 0.1,
                updated_at=at + 0.2,
                worker="bench",
            )
        )
    state = SessionState(
        session_id=SESSION,
        status=RunStatus.COMPLETED,
        reason=None,
        version=1,
        turns=turns,
        input_tokens=turns * 100,
        output_tokens=turns * 20,
        messages=len(messages),
        created_at=t0,
        updated_at=t0 + turns,
    )
    with tl.open_store(url) as store:
        ops: list[Op] = [PutSession(state, None), AppendMessages(tuple(messages))]
        ops += [InsertEffect(r) for r in records]
        store.backend.apply(SESSION, ops)


@dataclass(frozen=True)
class Measured:
    argv: tuple[str, ...]
    seconds: float
    peak_mb: float
    lines: int


def measure(url: str, *argv: str) -> Measured:
    """One run of ``python -m toolledger ARGV --store URL``: its output into a pipe, or — with
    ``TERMINAL`` first in ``argv`` — onto a terminal 120 columns wide (a pty, read as fast as it
    writes)."""
    terminal = argv[:1] == (TERMINAL,)
    argv = argv[1:] if terminal else argv
    cmd = [sys.executable, "-m", "toolledger", *argv, "--store", url]
    start = time.perf_counter()
    if terminal:
        code, out = _on_terminal(cmd)
    else:
        proc = subprocess.run(cmd, capture_output=True, timeout=600, check=False)
        code, out = proc.returncode, proc.stdout + proc.stderr
    seconds = time.perf_counter() - start
    if code != 0:
        raise RuntimeError(f"{cmd} exited {code}: {out.decode(errors='replace')[-2000:]}")
    # The largest child's peak so far: run() measures each command from a process of its own.
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    shown = (TERMINAL, *argv) if terminal else argv
    return Measured(tuple(shown), seconds, peak_kb / 1024, out.count(b"\n"))


def _on_terminal(cmd: list[str]) -> tuple[int, bytes]:
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 120, 0, 0))
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm-256color"}
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, env=env
    )
    os.close(follower)
    chunks: list[bytes] = []
    while True:
        try:
            chunk = os.read(leader, 1 << 16)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return proc.wait(timeout=600), b"".join(chunks)


TERMINAL = "(terminal)"


VIEWS: tuple[tuple[str, ...], ...] = (
    ("show", SESSION),
    ("history", SESSION),
    ("effects", SESSION),
    (TERMINAL, "show", SESSION),
    (TERMINAL, "history", SESSION),
    (TERMINAL, "effects", SESSION),
    (TERMINAL, "show", SESSION, "--all"),
    ("show", SESSION, "--all"),
    ("history", SESSION, "--all"),
    ("effects", SESSION, "--all"),
    ("show", SESSION, "--json"),
)


def run(turns: int, directory: Path, views: tuple[tuple[str, ...], ...] = VIEWS) -> list[Measured]:
    """Build the session, then measure each view in a process of its own (so that each peak is
    that command's own)."""
    url = f"sqlite:///{directory / 'day-two.db'}"
    build(url, turns)
    out = []
    for view in views:
        probe = subprocess.run(
            [sys.executable, "-m", "bench.cli_reads", "--measure", url, *view],
            capture_output=True,
            text=True,
            check=True,
        )
        raw = json.loads(probe.stdout)
        out.append(Measured(tuple(view), raw["seconds"], raw["peak_mb"], raw["lines"]))
    return out


def table(turns: int, results: list[Measured]) -> list[str]:
    lines = [
        f"#### `toolledger` reading a {turns:,}-turn session (SQLite; into a pipe, or onto a "
        "120-column terminal)",
        "",
        "| command | wall (s) | peak memory (MB) | lines printed | within 1 s and 100 MB |",
        "|---|---:|---:|---:|---|",
    ]
    for m in results:
        default = not any(a in m.argv for a in ("--all", "--json"))
        ok = m.seconds <= BOUND_S and m.peak_mb <= BOUND_MB
        verdict = ("yes" if ok else "**no**") if default else "(not bound)"
        where = "terminal: " if m.argv[:1] == (TERMINAL,) else ""
        argv = " ".join(a for a in m.argv if a != TERMINAL)
        lines.append(
            f"| {where}`toolledger {argv}` | {m.seconds:.2f} | {m.peak_mb:.0f} | "
            f"{m.lines} | {verdict} |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cli_reads")
    parser.add_argument("--turns", type=int, default=5000)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--measure", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        url, *view = args.measure
        m = measure(url, *view)
        print(json.dumps({"seconds": m.seconds, "peak_mb": m.peak_mb, "lines": m.lines}))
        return 0
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        results = run(args.turns, Path(tmp))
    print("\n".join(table(args.turns, results)))
    bad = [
        m
        for m in results
        if not any(a in m.argv for a in ("--all", "--json"))
        and (m.seconds > BOUND_S or m.peak_mb > BOUND_MB)
    ]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
