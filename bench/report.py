"""Tables (terminal and Markdown), the targets, the machine, the plot."""

from __future__ import annotations

import os
import platform
import sqlite3
import sys
from pathlib import Path

from rich.console import Console

from .results import Results, Tab, by_key, ratio, us
from .tables import (
    callers_table,
    concurrency_table,
    cpu_table,
    lookup_table,
    micro_table,
    pg_cpu_table,
    procs_table,
    sample_table,
    size_table,
    statements_table,
)
from .targets import target_table


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
    if results.pg_cpu:
        tabs.append(pg_cpu_table(results))
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
            (g.size, by_key(g.samples)[key].median_us)
            for g in results.sizes
            if key in by_key(g.samples)
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
    m = by_key(results.main)
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
        floor_g = by_key(g.samples)["floor"]
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
