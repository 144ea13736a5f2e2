"""CPU only: toolledger and the minimal correct ledger on stores with ``synchronous=OFF``, in a
tmpfs directory when the machine has one (``/dev/shm``), interleaved. No fsync is left to wait
for, so what remains is the CPU each spends per call and per turn — what caps throughput when
many workers share a store, and where a gain of a few microseconds shows.

Each operation is timed on the process's CPU clock (all its threads: a lease renewer's work
counts), its wall-clock median kept beside it: on a shared machine the wall clock also holds the
time a thread waited for a core, or for another thread.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import ExitStack
from pathlib import Path

import toolledger as tl

from . import core, minimal
from .measure import Contender, Sample, interleaved

TMPFS = Path("/dev/shm")


def scratch_dir(fallback: Path, stack: ExitStack) -> tuple[Path, str]:
    """A directory in tmpfs (removed at the end) if there is one, else ``fallback``; and where
    it is, for the report."""
    if TMPFS.is_dir() and os.access(TMPFS, os.W_OK):
        path = Path(tempfile.mkdtemp(prefix="toolledger-bench-", dir=TMPFS))
        stack.callback(shutil.rmtree, path, ignore_errors=True)
        return path, f"tmpfs ({TMPFS})"
    return fallback, "the bench directory's disk (no tmpfs at /dev/shm)"


def synchronous_off(store: tl.Store) -> tl.Store:
    """The store's SQLite connection stops waiting for fsyncs: the same statements, the same
    commits, no durability."""
    conn = store.backend._conn  # type: ignore[attr-defined]
    conn.execute("PRAGMA synchronous = OFF")
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 0
    return store


def cpu_rows(directory: Path, stack: ExitStack, n: int) -> list[Sample]:
    """The minimal correct ledger first (the rows' reference), then toolledger's call, turn and
    record, every one on its own ``synchronous=OFF`` file in ``directory``."""

    def store(name: str) -> tl.Store:
        return synchronous_off(core.open_bench_store("sqlite", directory, name, stack))

    contenders: list[Contender] = [
        minimal.per_call(
            directory, stack, synchronous="OFF", key="cpu_minimal_call", label="CPU only: minimal"
        )
    ]
    for tool in ("noop_effect", "noop_read"):
        c = core.per_call(store(f"cpu-call-{tool}"), "CPU only", tool)
        c.key = f"cpu_call_{tool}"
        contenders.append(c)
    c = core.agent_turn(store("cpu-turn"), "CPU only")
    c.key = "cpu_turn"
    contenders.append(c)
    contenders.append(core.per_record(store("cpu-record"), "CPU only", key="cpu_record"))
    for c in contenders:
        c.cpu_time = True
    return interleaved(contenders, n)
