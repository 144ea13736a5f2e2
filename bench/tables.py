"""The tables of a bench run, one per section, relative to what each is compared against."""

from __future__ import annotations

from .core import Statements
from .measure import Sample
from .procs import BARE, Rate
from .results import Results, Tab, by_key, ratio, us


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
            s = by_key(g.samples).get(key)
            raw = by_key(g.samples)["floor"]
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
    return _cpu_table(
        f"CPU only: the same code on synchronous=OFF stores in {results.cpu_where}, interleaved",
        results.cpu,
        "cpu_minimal_call",
    )


def pg_cpu_table(results: Results) -> Tab:
    return _cpu_table(
        "PostgreSQL, the client's CPU: toolledger next to a minimal correct ledger, interleaved",
        results.pg_cpu,
        "pg_cpu_minimal_call",
        ["- the server's CPU is another process's and is not counted."],
    )


def _cpu_table(
    title: str, samples: list[Sample], base_key: str, notes: list[str] | None = None
) -> Tab:
    base = by_key(samples).get(base_key)
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
        for s in samples
    ]
    return Tab(
        title,
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
            "thread.",
            *(notes or []),
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
