"""Cost against ledger size: one more durable record at N = 100, 1k, 10k for every approach; and
lookups and open time on a 100k- and a 1M-record SQLite ledger."""

from __future__ import annotations

import random
import sqlite3
import statistics
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import toolledger as tl
from toolledger.ops import InsertEffect
from toolledger.stores._sql.rows import insert_params
from toolledger.stores._sql.statements import INSERT_EFFECT

from . import core, floor
from .measure import Contender, Sample, interleaved
from .rivals import Approach, BriefWholeFile
from .wholefile import WholeFileLedger


@dataclass
class SizeGroup:
    size: int
    samples: list[Sample]
    skipped: list[str] = field(default_factory=list)


def per_size(
    approaches: list[Approach],
    sizes: tuple[int, ...],
    samples_at: Callable[[int], int],
    directory: Path,
    stack: ExitStack,
    *,
    setup_budget_s: float,
    cheap_n: int,
) -> list[SizeGroup]:
    """For each size: grow every ledger to it (setup), then time one more record for each,
    interleaved with the raw floor."""
    groups = []
    for size in sizes:
        contenders: list[Contender] = [floor.append_fsync(directory, stack)]
        contenders[0].n = max(cheap_n, samples_at(size))
        skipped = []
        for a in approaches:
            setup_s = a.setup_ms_per_record * max(0, size - a.size()) / 1000
            if setup_s > setup_budget_s:
                skipped.append(
                    f"{a.name} at {size:,}: growing it there takes ~{setup_s:.0f} s of its own "
                    "steps; run without --quick"
                )
                continue
            a.grow_to(size)
            c = a.contender()
            if a.cheap:
                c.n = max(cheap_n, samples_at(size))
            contenders.append(c)
        groups.append(SizeGroup(size, interleaved(contenders, samples_at(size)), skipped))
    return groups


# -- lookups and open time on big ledgers --------------------------------------------------------

PER_SESSION = 1000


def build_sqlite(path: Path, n: int) -> list[tuple[str, str]]:
    """Setup, not measured: a ledger of ``n`` records, ``PER_SESSION`` per session, bulk inserted
    in one transaction. Returns the (session, tool_use_id) keys."""
    tl.open_store(f"sqlite:///{path}").close()  # the schema, by toolledger itself
    keys = [(f"session-{i // PER_SESSION:06d}", f"toolu_{i:024d}") for i in range(n)]
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.executemany(
            INSERT_EFFECT,
            (insert_params(InsertEffect(core.record(s, t))) for s, t in keys),
        )
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return keys


@dataclass
class Lookup:
    name: str
    size: int
    median_us: float
    p99_us: float
    n: int
    key: str = ""


def _stats(name: str, size: int, xs_ns: list[float], key: str = "") -> Lookup:
    xs = sorted(xs_ns)
    return Lookup(
        name,
        size,
        statistics.median(xs) / 1000,
        xs[min(len(xs) - 1, int(len(xs) * 0.99))] / 1000,
        len(xs),
        key,
    )


def _time(fn: Callable[[], Any], times: int) -> list[float]:
    out = []
    for _ in range(times):
        t0 = time.perf_counter_ns()
        fn()
        out.append(float(time.perf_counter_ns() - t0))
    return out


def lookups(
    directory: Path, sizes: tuple[int, ...], *, lookups_n: int, opens_n: int, json_sizes: set[int]
) -> list[Lookup]:
    rng = random.Random(7)
    out: list[Lookup] = []
    for size in sizes:
        path = directory / f"big-{size}.db"
        t0 = time.perf_counter()
        keys = build_sqlite(path, size)
        built = time.perf_counter() - t0
        out.append(_stats(f"sqlite: build (setup, bulk insert) in {built:.1f} s", size, [0.0]))
        picks = [rng.choice(keys) for _ in range(lookups_n)]
        out.extend(_sqlite_lookups(path, size, picks, opens_n))
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
        if size in json_sizes:
            out.extend(_json_open(directory, size, keys, opens=3))
    return out


def _sqlite_lookups(
    path: Path, size: int, picks: list[tuple[str, str]], opens_n: int
) -> list[Lookup]:
    url = f"sqlite:///{path}"

    def open_close() -> None:
        tl.open_store(url).close()

    out = [_stats("sqlite: open_store + close", size, _time(open_close, opens_n), "open")]
    with tl.open_store(url) as store:
        it = iter(picks)

        def hit() -> None:
            s, t = next(it)
            assert store.ledger(s).get(t) is not None

        out.append(_stats("sqlite: ledger.get, recorded id", size, _time(hit, len(picks)), "get"))
        ledger = store.ledger(picks[0][0])

        def miss() -> None:
            assert ledger.get(core.next_id()) is None

        out.append(_stats("sqlite: ledger.get, unknown id", size, _time(miss, len(picks))))
        it2 = iter(picks)

        def replay() -> None:
            s, t = next(it2)
            block = {"type": "tool_use", "id": t, "name": "noop_effect", "input": {"n": 0}}
            tl.run_tool_uses([block], core.TOOLS, ledger=store.ledger(s))

        name = "sqlite: run_tool_uses answered from the ledger (replay)"
        out.append(_stats(name, size, _time(replay, len(picks)), "replay"))
    return out


def _json_open(directory: Path, size: int, keys: list[tuple[str, str]], opens: int) -> list[Lookup]:
    """The brief's whole-file ledger holding ``size`` records: open is load + parse."""
    ledger = WholeFileLedger(directory / f"brief-{size}" / "effects.json")
    ledger.path.parent.mkdir(exist_ok=True)
    ledger.prefill([t for _, t in keys])
    loaded = ledger.load()
    probe = [t for _, t in keys[:: max(1, len(keys) // 1000)]]
    it = iter(probe * 2)
    found = [
        _stats(
            BriefWholeFile.name.split(" (")[0] + ": open (load + parse)",
            size,
            _time(ledger.load, opens),
        ),
        _stats(
            BriefWholeFile.name.split(" (")[0] + ": lookup in the loaded dict",
            size,
            _time(lambda: loaded[next(it)], len(probe)),
        ),
    ]
    ledger.path.unlink()
    return found
