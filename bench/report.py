"""Tables (terminal and Markdown), the targets, the machine, the plot."""

from __future__ import annotations

import os
import platform
import sqlite3
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from .core import Statements
from .groupcommit import Cell
from .measure import Sample
from .pg import RoundTrips, Throughput
from .procs import BARE, TOOLLEDGER, Rate
from .scale import Lookup, SizeGroup


@dataclass
class Tab:
    title: str
    headers: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)
    sections: list[int] = field(default_factory=list)  # row indexes that start a new section

    def rich(self) -> Table:
        table = Table(title=self.title, title_justify="left")
        for i, h in enumerate(self.headers):
            table.add_column(h, justify="left" if i == 0 else "right")
        for i, row in enumerate(self.rows):
            if i in self.sections and i:
                table.add_section()
            table.add_row(*row)
        return table

    def markdown(self) -> str:
        out = [f"#### {self.title}", ""]
        out.append("| " + " | ".join(self.headers) + " |")
        out.append(
            "|" + "|".join("---" if i == 0 else "---:" for i in range(len(self.headers))) + "|"
        )
        out.extend(
            "| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in self.rows
        )
        out.extend(f"\n{n}" for n in self.notes)
        return "\n".join(out) + "\n"


def us(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}" if x >= 10 else f"{x:.2f}"


def ratio(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def machine(directory: Path) -> dict[str, str]:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 1024 / 1024:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return {
        "load": conditions(),
        "host": platform.node(),
        "cpu": f"{os.cpu_count()} cores, {cpu}",
        "memory": mem,
        "disk": _filesystem(directory),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "sqlite": sqlite3.sqlite_version,
    }


def conditions() -> str:
    """How busy the machine is: load average and I/O pressure (the share of the last minute in
    which some task waited for I/O). Neighbours move the floor; this says how much they did."""
    one, five, _ = os.getloadavg()
    io = "?"
    try:
        first = Path("/proc/pressure/io").read_text().split()
        io = next(f.split("=")[1] for f in first if f.startswith("avg60=")) + "%"
    except (OSError, StopIteration):
        pass
    return f"load {one:.1f} (5 min {five:.1f}), I/O pressure {io}"


def _filesystem(directory: Path) -> str:
    best = ("", "?", "?")
    try:
        target = str(directory.resolve())
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mount, fstype, *_ = line.split()
            inside = target == mount or target.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) > len(best[0]):
                best = (mount, dev, fstype)
    except OSError:
        pass
    return f"{best[2]} on {best[1]}"


@dataclass
class Target:
    what: str
    goal: str
    measured: str
    met: bool | None  # None: not measured in this run
    note: str = ""  # how it is measured, under the table


@dataclass
class Results:
    machine: dict[str, str]
    command: str
    seconds: float = 0.0
    main: list[Sample] = field(default_factory=list)
    sizes: list[SizeGroup] = field(default_factory=list)
    describe: dict[str, str] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    lookups: list[Lookup] = field(default_factory=list)
    longrun: list[Sample] = field(default_factory=list)
    long_start_turn: int = 0
    within_turn: list[Sample] = field(default_factory=list)
    concurrency: list[Cell] = field(default_factory=list)
    hot: list[Sample] = field(default_factory=list)
    cpu: list[Sample] = field(default_factory=list)
    cpu_where: str = ""
    micro: list[tuple[str, float]] = field(default_factory=list)
    scripted: list[Sample] = field(default_factory=list)
    json_store: list[Sample] = field(default_factory=list)
    turn_commits: tuple[float, float] = (0.0, 0.0)  # per tool turn, per run
    turn_statements: Statements | None = None
    callers: list[Cell] = field(default_factory=list)  # threads against asyncio tasks
    procs: list[Rate] = field(default_factory=list)
    pg: list[Sample] = field(default_factory=list)
    pg_throughput: list[Throughput] = field(default_factory=list)
    pg_procs: list[Rate] = field(default_factory=list)
    pg_round_trips: RoundTrips | None = None
    cli_reads: str = ""  # the markdown of bench/cli_reads.py

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for c in data["concurrency"] + data["callers"]:
            c.pop("latencies_ns")
        return data


def _by_key(samples: list[Sample]) -> dict[str, Sample]:
    return {s.key: s for s in samples if s.key}


def sample_table(title: str, samples: list[Sample], notes: list[str] | None = None) -> Tab:
    """Rows relative to the first sample keyed ``floor`` (the group's own raw floor)."""
    raw = next(s for s in samples if s.key == "floor")
    rows = []
    for s in samples:
        per_write = f"{s.per_write_ratio(raw):.2f}" if s.writes and s.key != "floor" else ""
        rows.append(
            [
                s.name + (f" ({s.note})" if s.note else ""),
                f"{s.n:,}",
                us(s.median_us),
                us(s.p99_us),
                f"{s.writes:.3g}" if s.writes else "",
                ratio(s.ratio(raw)),
                per_write,
                ratio(s.paired) if s.paired is not None else "",
            ]
        )
    headers = [
        "measurement",
        "N",
        "median µs",
        "p99 µs",
        "writes",
        "x floor",
        "x (writes x floor)",
        "paired x floor",
    ]
    return Tab(title, headers, rows, notes or [])


def size_table(results: Results) -> Tab:
    sizes = [g.size for g in results.sizes]
    keys: list[str] = []
    for g in results.sizes:
        keys.extend(s.key for s in g.samples if s.key not in keys)
    headers = ["per durable record (median µs, x floor)"] + [f"N = {n:,}" for n in sizes]
    rows = []
    for key in keys:
        row = [results.names.get(key, key)]
        for g in results.sizes:
            s = _by_key(g.samples).get(key)
            raw = _by_key(g.samples)["floor"]
            row.append("—" if s is None else f"{us(s.median_us)} ({ratio(s.ratio(raw))}x)")
        rows.append(row)
    notes = [f"- {results.names.get(k, k)}: {d}" for k, d in results.describe.items() if d]
    notes.append(
        "- N is the ledger's size when its timing starts. The floor and the SQLite-based "
        "contenders (a fsync or so per record) take more samples than the whole-file ones, so "
        "their ledgers grow by up to that many records meanwhile; a B-tree does not notice."
    )
    for g in results.sizes:
        notes.extend(f"- skipped: {s}" for s in g.skipped)
    notes.extend(f"- {m}" for m in results.missing)
    return Tab(
        "Cost of one more durable record as the ledger grows (each N its own interleaved run)",
        headers,
        rows,
        notes,
    )


def lookup_table(results: Results) -> Tab:
    rows = [
        [f.name, f"{f.size:,}", us(f.median_us), us(f.p99_us), f"{f.n:,}"]
        for f in results.lookups
        if not f.name.startswith("sqlite: build")
    ]
    notes = [
        f"- {f.name} ({f.size:,} records)"
        for f in results.lookups
        if f.name.startswith("sqlite: build")
    ]
    notes.append(
        "- warm page cache: the files were just written; open includes the WAL and "
        "migration checks."
    )
    return Tab(
        "Lookups and open time on big ledgers",
        ["measurement", "records", "median µs", "p99 µs", "N"],
        rows,
        notes,
    )


def concurrency_table(results: Results) -> Tab:
    rows: list[list[str]] = []
    baseline = "one commit per batch (before)"
    shipped = {(c.workload, c.threads): c for c in results.concurrency if c.backend == baseline}
    sections = []
    last = None
    for c in results.concurrency:
        if c.workload != last:
            sections.append(len(rows))
            last = c.workload
        base = shipped[(c.workload, c.threads)]
        rows.append(
            [
                c.workload,
                c.backend,
                str(c.threads),
                f"{c.ops_per_s:,.0f}",
                f"{c.ops_per_s / base.ops_per_s:.2f}x",
                us(c.median_us),
                us(c.p99_us),
                f"{c.commits / c.ops:.2f}" if c.ops else "",
            ]
        )
    headers = [
        "workload",
        "backend",
        "threads",
        "ops/s",
        "vs one commit per batch",
        "median µs",
        "p99 µs",
        "commits/op",
    ]
    return Tab(
        "Concurrent sessions in one process, one SQLite store", headers, rows, sections=sections
    )


def cpu_table(results: Results) -> Tab:
    base = _by_key(results.cpu).get("cpu_minimal_call")
    rows = [
        [
            s.name,
            f"{s.n:,}",
            us(s.median_us),
            us(s.p99_us),
            us(s.wall_us) if s.wall_us is not None else "",
            f"{s.writes:.3g}",
            f"{s.median_us / base.median_us:.2f}x" if base else "",
        ]
        for s in results.cpu
    ]
    return Tab(
        f"CPU only: the same code on synchronous=OFF stores in {results.cpu_where}, interleaved",
        [
            "measurement",
            "N",
            "CPU median µs",
            "CPU p99 µs",
            "wall median µs",
            "writes",
            "x minimal correct ledger (CPU)",
        ],
        rows,
        [
            "- CPU: the process's CPU time per operation (every thread of it); wall: the same "
            "operations on the wall clock, which also holds waits for a core or for another "
            "thread."
        ],
    )


def statements_table(st: Statements) -> Tab:
    rows = [["every statement", f"{st.per_turn:g}", f"{st.per_run:g}"]]
    rows.extend([kind, f"{t:g}", f"{r:g}"] for kind, t, r in st.kinds)
    return Tab(
        "SQL statements SQLite ran for agent turns with one non-idempotent call",
        ["statement", "per turn", "per run"],
        rows,
        [
            "- counted with set_trace_callback on every connection the store opened; per turn: "
            "(20-turn run - 10-turn run) ÷ 10; per run: the rest of the 10-turn run."
        ],
        sections=[1],
    )


def callers_table(results: Results) -> Tab:
    rows = [
        [
            c.workload,
            c.backend,
            str(c.threads),
            f"{c.ops_per_s:,.0f}",
            us(c.median_us),
            us(c.p99_us),
            f"{c.commits / c.ops:.2f}" if c.ops else "",
            f"{c.ops / c.commits:.2f}" if c.commits else "",
        ]
        for c in results.callers
    ]
    return Tab(
        "Concurrent callers on one SQLite store: threads against asyncio tasks",
        [
            "workload",
            "callers",
            "N",
            "calls/s",
            "median µs",
            "p99 µs",
            "commits/call",
            "calls/commit",
        ],
        rows,
        ["- commits: the backend's physical transactions (group commit shares them)."],
    )


def procs_table(where: str, rates: list[Rate]) -> Tab:
    bare = next((r for r in rates if r.contender == BARE), None)
    rows = [
        [
            r.contender,
            str(r.procs),
            f"{r.calls:,}",
            f"{r.per_s:,.0f}",
            ", ".join(f"{x:,.0f}" for x in r.rates),
            f"{r.per_s / bare.per_s:.0%}" if bare and bare.per_s else "",
        ]
        for r in rates
    ]
    return Tab(
        f"{where}: worker processes on distinct sessions, calls per second",
        ["contender", "processes", "calls", "calls/s (median)", "per round", "x bare loop"],
        rows,
        [
            "- one non-idempotent no-op call each; the bare loop is the minimal correct "
            "ledger's two commits (INSERT the intent, UPDATE the outcome) without its read. "
            "Workers start together (a barrier) and call for a fixed time; the contenders "
            "alternate round by round."
        ],
    )


def micro_table(results: Results) -> Tab:
    return Tab(
        "What single steps cost (CPU, median)",
        ["step", "µs"],
        [[name, us(v)] for name, v in results.micro],
    )


def targets(results: Results) -> list[Target]:
    m = _by_key(results.main)
    raw = m.get("floor")
    out: list[Target] = []

    def add(
        what: str, goal: str, value: float | None, limit: float, fmt: str, *, le: bool = True
    ) -> None:
        if value is None:
            out.append(Target(what, goal, "not measured", None))
            return
        out.append(Target(what, goal, fmt.format(value), value <= limit if le else value >= limit))

    def r(key: str) -> float | None:
        return m[key].ratio(raw) if raw and key in m else None

    add("sqlite: one durable record", "≤ 1.3x floor", r("tl_record"), 1.3, "{:.2f}x floor")
    pg = _by_key(results.pg)
    if "floor" in pg and "pg_record" in pg:
        add(
            "postgres: one durable record",
            "≤ 1.3x a bare INSERT … ON CONFLICT",
            pg["pg_record"].ratio(pg["floor"]),
            1.3,
            "{:.2f}x",
        )
    add(
        "run_tool_uses, non-idempotent call", "≤ 2.5x floor", r("call_effect"), 2.5, "{:.2f}x floor"
    )
    add("run_tool_uses, read-only call", "≤ 1.3x floor", r("call_read"), 1.3, "{:.2f}x floor")
    add("run_tool_uses, idempotent call", "≤ 1.3x floor", r("call_idem"), 1.3, "{:.2f}x floor")
    turn = m.get("turn")
    if turn is not None and raw is not None:
        add(
            "Agent turn (fake client)",
            "≤ 1.2x (its writes x floor)",
            turn.per_write_ratio(raw),
            1.2,
            "{:.2f}x",
        )
        per_turn, per_run = results.turn_commits
        out.append(
            Target(
                "writes for a turn with one non-idempotent call",
                "≤ 3",
                f"{per_turn:g} per turn + {per_run:g} per run (counted: {turn.writes:.2f} per "
                "turn over 20-turn runs)",
                per_turn <= 3,
            )
        )
    for key, goal_us, what in (("get", 20.0, "lookup"), ("open", 10_000.0, "open")):
        big = [f for f in results.lookups if f.key == key]
        at = max(big, key=lambda f: f.size) if big else None
        add(
            f"{what} at {at.size:,} records" if at else f"{what} at 1M records",
            f"≤ {us(goal_us)} µs" if key == "get" else "≤ 10 ms",
            at.median_us if at else None,
            goal_us,
            "{:,.1f} µs median",
        )
    lr = {s.key: s for s in results.longrun}
    if "cp_early" in lr and "cp_late" in lr:
        add(
            f"checkpoint commit at turn {results.long_start_turn:,} vs turns 1-20",
            "≤ 1.2x",
            lr["cp_late"].median_us / lr["cp_early"].median_us,
            1.2,
            "{:.2f}x",
        )
    dbos_at = _at_size(results, "dbos", 1000)
    idem_at = _at_size(results, "tl_sqlite_call_noop_idem", 1000)
    eff_at = _at_size(results, "tl_sqlite_call_noop_effect", 1000)
    add(
        "DBOS step ÷ toolledger idempotent call (1 write each; N = 1,000)",
        "≥ 8x",
        dbos_at / idem_at if dbos_at and idem_at else None,
        8.0,
        "{:.1f}x",
        le=False,
    )
    if dbos_at and eff_at:
        out.append(
            Target(
                "DBOS step ÷ toolledger non-idempotent call (2 writes; N = 1,000)",
                "(for information)",
                f"{dbos_at / eff_at:.1f}x",
                None,
            )
        )
    brief = _at_size(results, "brief_json", 10_000)
    ours = _at_size(results, "tl_sqlite_record", 10_000)
    add(
        "whole-file JSON ÷ toolledger sqlite record at N = 10,000",
        "≥ 100x",
        brief / ours if brief and ours else None,
        100.0,
        "{:.0f}x",
        le=False,
    )
    out.extend(correctness_targets(results))
    return out


def correctness_targets(results: Results) -> list[Target]:
    """Pay for correctness and nothing else: each figure beside what correctness alone costs
    (or the comparison its goal names), both measured in the same run."""
    return [
        *_beside_minimal(results),
        *_throughput(results),
        *_per_turn(results),
        _async_sharing(results),
    ]


def _row(what: str, goal: str, *, met: bool | None, measured: str, note: str) -> Target:
    """``met`` None: not measured in this run."""
    return Target(what, goal, measured if met is not None else "not measured", met, note)


def _versus(
    what: str, goal: str, limit: float, *, ours: Sample | None, base: Sample | None, note: str
) -> Target:
    """``ours`` over ``base``, the ratio of their medians (and of their paired x floor when
    both have one)."""
    if ours is None or base is None:
        return _row(what, goal, met=None, measured="", note=note)
    x = ours.median_us / base.median_us
    paired = (
        f"; paired {ours.paired / base.paired:.2f}x"
        if ours.paired is not None and base.paired
        else ""
    )
    measured = f"{x:.2f}x ({us(ours.median_us)} µs vs {us(base.median_us)} µs{paired})"
    return _row(what, goal, met=x <= limit, measured=measured, note=note)


def _beside_minimal(results: Results) -> list[Target]:
    m, cpu = _by_key(results.main), _by_key(results.cpu)
    return [
        _versus(
            "non-idempotent call, CPU only ÷ minimal correct ledger",
            "≤ 2.0x",
            2.0,
            ours=cpu.get("cpu_call_noop_effect"),
            base=cpu.get("cpu_minimal_call"),
            note="run_tool_uses against the minimal ledger, both on synchronous=OFF SQLite files "
            f"in {results.cpu_where or '?'}, interleaved; ratio of the medians of process CPU "
            "time per call.",
        ),
        _versus(
            "non-idempotent call, durable ÷ minimal correct ledger",
            "≤ 1.0x",
            1.0,
            ours=m.get("call_effect"),
            base=m.get("minimal_call"),
            note="the main section's rows: synchronous=FULL, same disk, interleaved; ratio of "
            "medians (paired: the ratio of the two rows' paired x floor, each the median over "
            "rotations of the row over the floor measured in the same rotation).",
        ),
    ]


def _throughput(results: Results) -> list[Target]:
    out = []
    for backend, rates in (("sqlite", results.procs), ("PostgreSQL", results.pg_procs)):
        by = {r.contender: r for r in rates}
        ours, bare = by.get(TOOLLEDGER), by.get(BARE)
        shared = "file" if backend == "sqlite" else "server"
        what = (
            f"{ours.procs if ours else 16} processes, distinct sessions, calls/s ÷ bare "
            f"INSERT+UPDATE loop, {backend}"
        )
        note = (
            f"each process on its own session of one shared {shared}; the loop commits the "
            "intent (INSERT) and the outcome (UPDATE) in autocommit; calls/s: median over "
            f"{len(ours.rates) if ours else 0} rounds, the contenders alternating (paired: the "
            "median over rounds of the ratio of each round to the loop's round after it)."
        )
        if ours is None or bare is None or not bare.per_s:
            out.append(_row(what, "≥ 80%", met=None, measured="", note=note))
            continue
        share = ours.per_s / bare.per_s
        paired = statistics.median(a / b for a, b in zip(ours.rates, bare.rates, strict=True))
        measured = (
            f"{share:.0%} ({ours.per_s:,.0f} vs {bare.per_s:,.0f} calls/s; paired {paired:.0%})"
        )
        out.append(_row(what, "≥ 80%", met=share >= 0.8, measured=measured, note=note))
    rt = results.pg_round_trips
    out.append(
        _row(
            "PostgreSQL round trips per non-idempotent call",
            "≤ 2",
            met=None if rt is None else rt.round_trips <= 2,
            measured=""
            if rt is None
            else f"{rt.round_trips:.2f} ({rt.statements:.2f} statements, {rt.ready:.2f} "
            "ReadyForQuery)",
            note="counted on the wire by a relay between the store and the server: a round trip "
            "is the server answering after the client sent something (one wait, however many "
            f"statements were pipelined before it); over {rt.calls if rt else 0} calls.",
        )
    )
    return out


def _per_turn(results: Results) -> list[Target]:
    cpu, lr = _by_key(results.cpu), _by_key(results.longrun)
    turn, base = cpu.get("cpu_turn"), cpu.get("cpu_minimal_call")
    what = "agent turn CPU beyond its commits (fake client)"
    note = (
        "the CPU-only turn's median process CPU time minus its commits (counted, the per-run "
        "ones amortised), each priced at the minimal correct ledger's CPU-only call ÷ its 2 "
        "commits (its read included)."
    )
    if turn is None or base is None:
        beyond = _row(what, "≤ 60 µs", met=None, measured="", note=note)
    else:
        per_commit = base.median_us / 2
        cost = turn.median_us - turn.writes * per_commit
        measured = (
            f"{cost:,.0f} µs (turn {us(turn.median_us)} µs - {turn.writes:.2f} commits x "
            f"{us(per_commit)} µs)"
        )
        beyond = _row(what, "≤ 60 µs", met=cost <= 60, measured=measured, note=note)
    st = results.turn_statements
    at = f"{results.long_start_turn or 1000:,}"
    opened = lr.get("open_late")
    return [
        beyond,
        _row(
            "SQL statements per agent turn with one non-idempotent call",
            "≤ 8",
            met=None if st is None else st.per_turn <= 8,
            measured="" if st is None else f"{st.per_turn:g} per turn + {st.per_run:g} per run",
            note="every statement SQLite ran (set_trace_callback on the store's connections: "
            "BEGIN, COMMIT and reads included): (20-turn run - 10-turn run) ÷ 10.",
        ),
        _versus(
            f"whole turn at turn {at} ÷ turns 1-20",
            "≤ 1.1x",
            1.1,
            ours=lr.get("turn_late"),
            base=lr.get("turn_early"),
            note="from one model request to the next, one store, interleaved; ratio of medians.",
        ),
        _row(
            f"`agent.run` open of a {at}-turn session",
            "≤ 2 ms",
            met=None if opened is None else opened.median_us <= 2000,
            measured=""
            if opened is None
            else f"{opened.median_us / 1000:,.2f} ms median (p99 {opened.p99_us / 1000:,.2f} ms)",
            note="from calling agent.run with a new prompt on the finished long session until "
            "the model's client is called (lease, reads, the prompt's commit, the request).",
        ),
    ]


def _async_sharing(results: Results) -> Target:
    by_backend = {c.backend.split(",")[0]: c for c in results.callers}
    threads, tasks = by_backend.get("threads"), by_backend.get("asyncio tasks")
    what = (
        f"`arun_tool_uses`, {tasks.threads if tasks else 16} concurrent tasks on one sqlite "
        "store: calls per commit"
    )
    goal = "≥ 0.9x threads' (same run)"
    note = (
        "physical commits (the backend's transactions) while each caller makes non-idempotent "
        "calls on its own session; threads and tasks alternate round by round."
    )
    if threads is None or tasks is None or not threads.commits or not tasks.commits:
        return _row(what, goal, met=None, measured="", note=note)
    ours, theirs = tasks.ops / tasks.commits, threads.ops / threads.commits
    measured = f"{ours:.2f} ({threads.threads} threads: {theirs:.2f})"
    return _row(what, goal, met=ours >= 0.9 * theirs, measured=measured, note=note)


def _at_size(results: Results, key: str, size: int) -> float | None:
    """``key``'s cost at ``size``, in floors of its own group (so two of them divide)."""
    for g in results.sizes:
        if g.size == size:
            s = _by_key(g.samples).get(key)
            return s.ratio(_by_key(g.samples)["floor"]) if s else None
    return None


def target_table(results: Results) -> Tab:
    found = targets(results)
    rows = [
        [t.what, t.goal, t.measured, "—" if t.met is None else "met" if t.met else "NOT met"]
        for t in found
    ]
    notes = [f"- {t.what}: {t.note}" for t in found if t.note]
    return Tab("Targets", ["target", "goal", "measured (this run)", ""], rows, notes)


def all_tables(results: Results) -> list[Tab]:
    tabs = []
    if results.main:
        tabs.append(
            sample_table(
                "toolledger per record, per call, per turn (interleaved with the raw floor)",
                results.main,
                [
                    "- x floor: this row's median over the floor's median (the targets use it). "
                    "paired x floor: the median, over the rotations, of (this row's median / the "
                    "floor's median in the same rotation) — a cross-check against bursts from "
                    "neighbours; noisier for rows that take one sample per rotation.",
                    "- writes: commits counted during the run. x (writes x floor): 1.00 means "
                    "the operation costs exactly its commits at the raw floor's price.",
                    "- Agent turn: the prompt's commit and the final status of each 20-turn run "
                    "are amortised over its turns.",
                ],
            )
        )
    if results.sizes:
        tabs.append(size_table(results))
    if results.lookups:
        tabs.append(lookup_table(results))
    if results.cpu:
        tabs.append(cpu_table(results))
    if results.turn_statements:
        tabs.append(statements_table(results.turn_statements))
    if results.longrun:
        tabs.append(
            Tab(
                "Long sessions: turn 1 against turn 1,000 (one store, interleaved)",
                ["measurement", "N", "median µs", "p99 µs"],
                [[s.name, f"{s.n:,}", us(s.median_us), us(s.p99_us)] for s in results.longrun],
            )
        )
    if results.within_turn:
        tabs.append(
            sample_table(
                "Group commit within a turn: 4 tool_uses in one message",
                results.within_turn,
            )
        )
    if results.concurrency:
        tabs.append(concurrency_table(results))
    if results.callers:
        tabs.append(callers_table(results))
    if results.procs:
        tabs.append(procs_table("SQLite, one file", results.procs))
    if results.hot:
        tabs.append(sample_table("Hot path: stock against patched (durable)", results.hot))
    if results.pg:
        tabs.append(
            sample_table(
                "PostgreSQL: toolledger next to a bare INSERT … ON CONFLICT autocommit round trip",
                results.pg,
                ["- the floor here is the bare insert: one statement, one commit (WAL flush)."],
            )
        )
    if results.pg_throughput:
        one = results.pg_throughput[0].per_s
        tabs.append(
            Tab(
                "PostgreSQL: non-idempotent run_tool_uses calls per second, N worker processes",
                ["workers", "calls", "seconds", "calls/s", "x one worker"],
                [
                    [
                        str(t.workers),
                        f"{t.calls:,}",
                        f"{t.seconds:.2f}",
                        f"{t.per_s:,.0f}",
                        f"{t.per_s / one:.2f}x",
                    ]
                    for t in results.pg_throughput
                ],
            )
        )
    if results.pg_procs:
        tabs.append(procs_table("PostgreSQL", results.pg_procs))
    if results.micro:
        tabs.append(micro_table(results))
    if results.json_store:
        tabs.append(sample_table("Hot path: the json:/// store", results.json_store))
    if results.scripted:
        tabs.append(
            Tab(
                "Test helper: one SDK request to ScriptedModel",
                ["measurement", "N", "median µs", "p99 µs"],
                [[s.name, f"{s.n:,}", us(s.median_us), us(s.p99_us)] for s in results.scripted],
            )
        )
    tabs.append(target_table(results))
    return tabs


def print_all(results: Results) -> None:
    console = Console(width=180)
    for tab in all_tables(results):
        console.print(tab.rich())
        for note in tab.notes:
            console.print(note, markup=False, highlight=False)
        console.print()
    console.print(f"{results.command} — {results.seconds:.0f} s — {_machine_line(results.machine)}")


def _machine_line(m: dict[str, str]) -> str:
    busy = f"; at start: {m['load']}" + (f", at end: {m['load_end']}" if "load_end" in m else "")
    return (
        f"{m['cpu']}, {m['memory']}, {m['disk']}, {m['os']}, "
        f"Python {m['python']}, SQLite {m['sqlite']}{busy}"
    )


def markdown(results: Results) -> str:
    head = [
        "### Latest run",
        "",
        f"Command: `{results.command}` ({results.seconds:.0f} s). "
        f"Machine: {_machine_line(results.machine)}.",
        "",
        "Generated by `python -m bench`; every ratio is to the raw floor measured in the same "
        "interleaved run. See `bench/` for what each row does.",
        "",
    ]
    tables = [t.markdown() for t in all_tables(results)]
    if results.cli_reads:
        tables.append(results.cli_reads)
    return "\n".join(head) + "\n".join(tables)


def plot(results: Results, path: Path) -> str | None:
    """Per-record cost against ledger size, one line per approach (log-log)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot (pip install -e '.[bench]')"
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=110)
    keys: list[str] = []
    for g in results.sizes:
        keys.extend(s.key for s in g.samples if s.key not in keys)
    for key in keys:
        pts = [
            (g.size, _by_key(g.samples)[key].median_us)
            for g in results.sizes
            if key in _by_key(g.samples)
        ]
        if not pts:
            continue
        xs, ys = zip(*pts, strict=True)
        if key == "floor":
            ax.plot(xs, ys, "--", color="black", marker="o", label=results.names.get(key, key))
        else:
            width = 2.2 if key.startswith("tl_") else 1.2
            ax.plot(xs, ys, "-", linewidth=width, marker="o", label=results.names.get(key, key))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("records already in the ledger (N)")
    ax.set_ylabel("one more durable record, median µs (log)")
    ax.set_title("Per-record cost against ledger size (same disk, interleaved)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    m = results.machine
    footer = f"{m['cpu']}, {m['disk']}, Python {m['python']}, SQLite {m['sqlite']}; {m['load']}"
    fig.text(0.01, 0.01, footer, fontsize=6, alpha=0.7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return None


def readme_summary(results: Results) -> str:
    """The README's table: the headline rows of this run, then the targets."""
    m = _by_key(results.main)
    raw = m.get("floor")
    rows: list[list[str]] = []

    def main_row(key: str, label: str, per_write: bool = False) -> None:
        s = m.get(key)
        if s is None or raw is None:
            return
        extra = f" ({s.per_write_ratio(raw):.2f}x its {s.writes:.3g} writes)" if per_write else ""
        rows.append([label, us(s.median_us), ratio(s.ratio(raw)) + "x" + extra])

    main_row("floor", "raw: 300 B append + fsync (the floor)")
    main_row("floor_pwrite", "raw: 300 B pwrite into a preallocated file + fdatasync")
    main_row("tl_record", "toolledger sqlite: one durable record")
    main_row("minimal_call", "minimal correct ledger: one non-idempotent call (2 writes)")
    main_row("call_effect", "`run_tool_uses`, one non-idempotent call (2 writes)")
    main_row("call_idem", "`run_tool_uses`, one idempotent call (1 write)")
    main_row("call_read", "`run_tool_uses`, one read-only call (1 write)")
    main_row("turn", "`Agent` turn, one non-idempotent call", per_write=True)
    main_row("turn_sdk", "`Agent` turn through the anthropic SDK + ScriptedModel (HTTP)")
    main_row("sdk_rtt", "… of which the SDK's HTTP round trip alone")
    for g in results.sizes:
        if g.size != max(x.size for x in results.sizes):
            continue
        floor_g = _by_key(g.samples)["floor"]
        for s in g.samples:
            if s.key in ("floor", "tl_sqlite_call_noop_idem", "tl_sqlite_call_noop_effect"):
                continue
            rows.append(
                [
                    f"{results.names.get(s.key, s.name)}, at {g.size:,} records",
                    us(s.median_us),
                    ratio(s.ratio(floor_g)) + "x",
                ]
            )
    for f in results.lookups:
        if f.key in ("get", "open") and f.size == max(x.size for x in results.lookups):
            rows.append([f"{f.name}, {f.size:,} records", us(f.median_us), ""])
    table = Tab("", ["measurement", "median µs", "x floor"], rows).markdown().split("\n", 2)[2]
    targets_md = target_table(results).markdown().split("\n", 2)[2]
    return (
        f"Measured by `{results.command}` ({results.seconds / 60:.0f} min) on "
        f"{_machine_line(results.machine)}. Every ratio is to the raw floor measured in the same "
        "run, interleaved with it on the same disk.\n\n"
        + table
        + "\n![Per-record cost against ledger size](docs/bench.png)\n\n"
        + targets_md
        + "\nEvery row, the rivals at each size, group commit and the hot-path findings: "
        "[docs/performance.md](docs/performance.md).\n"
    )
