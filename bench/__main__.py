"""``python -m bench [--quick] [--dir DIR] [--only SECTION ...] [--publish]``

Every figure is measured in one run, on one disk, interleaved with the raw floor it is compared
to. Sections: main (toolledger per record, call and turn, beside the minimal correct ledger,
durable and CPU only; statements per turn), sizes (every approach at N = 100, 1k, 10k), lookups
(100k and 1M records), long (turn 1 against turn 1,000; opening a 1,000-turn session), group
(commit sharing within a turn, across concurrent sessions, threads against asyncio tasks, and
16 processes against a bare loop of the same commits), postgres (a record next to a bare INSERT,
throughput with 1, 4 and 16 worker processes and against a bare loop, round trips per call;
skipped without a server), hot (profile-guided patches, bench-only), cli (``toolledger show``,
``history`` and ``effects`` of a 5,000-turn session: wall time and peak memory), instructions
(per call and per turn beside the minimal ledger's, counted under callgrind: a figure machine
load does not move).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

import toolledger as tl

from . import (
    cli_reads,
    core,
    cpu,
    floor,
    groupcommit,
    hotpath,
    instructions,
    longrun,
    minimal,
    pg,
    procs,
    report,
    rivals,
    scale,
)
from .measure import Contender, interleaved
from .results import Results

SECTIONS = ("main", "sizes", "lookups", "long", "group", "postgres", "hot", "cli", "instructions")


@dataclass(frozen=True)
class Plan:
    n_main: int
    sizes: tuple[int, ...]
    samples_at: dict[int, int]
    setup_budget_s: float
    cheap_n: int
    lookup_sizes: tuple[int, ...]
    lookups_n: int
    opens_n: int
    json_sizes: frozenset[int]
    long_turns: int
    n_long: int
    n_group: int
    threads: tuple[int, ...]
    per_thread: int
    rounds: int
    n_hot: int
    n_json: int
    n_pg: int = 500
    pg_workers: tuple[int, ...] = (1, 4, 16)
    pg_per_worker: int = 200
    procs: int = 16  # worker processes against the bare INSERT + UPDATE loop
    proc_seconds: float = 3.0  # each contender's time per round
    proc_rounds: int = 3
    callers: int = 16  # threads against asyncio tasks on one store
    per_caller: int = 50
    instructions: tuple[int, int] = (100, 300)  # operations counted under callgrind, twice


FULL = Plan(
    n_main=2000,
    sizes=(100, 1_000, 10_000),
    samples_at={100: 100, 1_000: 200, 10_000: 100},
    setup_budget_s=60,
    cheap_n=1000,
    lookup_sizes=(100_000, 1_000_000),
    lookups_n=5000,
    opens_n=100,
    json_sizes=frozenset({100_000, 1_000_000}),
    long_turns=1000,
    n_long=400,
    n_group=400,
    threads=(1, 2, 4, 8, 16),
    per_thread=100,
    rounds=3,
    n_hot=1000,
    n_json=20,
)
QUICK = Plan(
    n_main=300,
    sizes=(100, 1_000, 10_000),
    samples_at={100: 40, 1_000: 40, 10_000: 12},
    setup_budget_s=4,
    cheap_n=200,
    lookup_sizes=(100_000, 1_000_000),
    lookups_n=1000,
    opens_n=20,
    json_sizes=frozenset({100_000}),
    long_turns=1000,
    n_long=60,
    n_group=80,
    threads=(1, 4, 8),
    per_thread=40,
    rounds=1,
    n_hot=200,
    n_json=6,
    n_pg=150,
    pg_per_worker=40,
    proc_seconds=1.0,
    proc_rounds=3,
    per_caller=25,
    instructions=(20, 60),
)


# Seconds, not minutes: what `make test` runs so the bench never rots (no figure is published).
SMOKE = Plan(
    n_main=20,
    sizes=(100,),
    samples_at={100: 5},
    setup_budget_s=2,
    cheap_n=20,
    lookup_sizes=(1_000,),
    lookups_n=50,
    opens_n=3,
    json_sizes=frozenset(),
    long_turns=30,
    n_long=5,
    n_group=10,
    threads=(1, 2),
    per_thread=5,
    rounds=1,
    n_hot=20,
    n_json=2,
    n_pg=10,
    pg_workers=(1, 2),
    pg_per_worker=5,
    procs=4,
    proc_seconds=0.2,
    proc_rounds=1,
    per_caller=3,
    instructions=(20, 40),
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer samples, about a minute")
    parser.add_argument(
        "--smoke", action="store_true", help="a few samples of everything, seconds (no figures)"
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path("bench-out"),
        help="where the files go (a temporary directory inside it) and the reports are written",
    )
    parser.add_argument("--only", nargs="+", choices=SECTIONS, help="run only these sections")
    parser.add_argument(
        "--publish",
        action="store_true",
        help="also refresh docs/bench.png and docs/performance.md's figures (between its bench "
        "markers; the README links to that page)",
    )
    args = parser.parse_args(argv)
    plan = SMOKE if args.smoke else QUICK if args.quick else FULL
    only = set(args.only or SECTIONS)
    args.dir.mkdir(parents=True, exist_ok=True)
    console = Console(stderr=True)
    command = "python -m bench" + (" " + shlex.join(argv if argv is not None else sys.argv[1:]))
    results = Results(report.machine(args.dir), command.strip())
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp, ExitStack() as stack:
        d = Path(tmp)
        for section in SECTIONS:
            if section in only:
                started = time.perf_counter()
                console.print(f"[dim]bench: {section} …[/dim]")
                RUNNERS[section](results, plan, d, stack)
                console.print(
                    f"[dim]bench: {section} done in {time.perf_counter() - started:.0f} s[/dim]"
                )
    results.seconds = time.perf_counter() - t0
    results.machine["load_end"] = report.conditions()
    report.print_all(results)
    (args.dir / "results.json").write_text(json.dumps(results.to_json(), indent=1))
    text = report.markdown(results)
    (args.dir / "report.md").write_text(text)
    if results.sizes:
        for path in [args.dir / "bench.png", *([PNG] if args.publish else [])]:
            problem = report.plot(results, path)
            if problem:
                console.print(problem)
                break
    if args.publish:
        publish(DOC, text)
        console.print(f"[dim]published: {PNG}, {DOC}[/dim]")
    console.print(f"[dim]reports: {args.dir / 'report.md'}, {args.dir / 'results.json'}[/dim]")


BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
PNG, DOC = Path("docs/bench.png"), Path("docs/performance.md")


def publish(path: Path, text: str) -> None:
    """Write ``text`` between the ``bench:begin``/``bench:end`` markers of ``path``; the prose
    around them is kept. A file without the markers is left alone."""
    old = path.read_text() if path.exists() else ""
    if BEGIN not in old or END not in old:
        Console(stderr=True).print(f"{path} has no {BEGIN} … {END} markers: not updated")
        return
    head, rest = old.split(BEGIN, 1)
    path.write_text(f"{head}{BEGIN}\n{text}{END}{rest.split(END, 1)[1]}")


def run_main(results: Results, plan: Plan, d: Path, stack: ExitStack) -> None:
    def store(name: str) -> tl.Store:
        return core.open_bench_store("sqlite", d, name, stack)

    contenders: list[Contender] = [
        floor.append_fsync(d, stack),
        floor.pwrite_fdatasync(d, stack, plan.n_main),
        core.per_record(store("record"), "sqlite", key="tl_record"),
        minimal.per_call(d, stack),
        core.per_call(store("effect"), "sqlite", "noop_effect", key="call_effect"),
        core.per_call(store("idem"), "sqlite", "noop_idem", key="call_idem"),
        core.per_call(store("read"), "sqlite", "noop_read", key="call_read"),
        core.agent_turn(store("agent"), "sqlite", key="turn"),
    ]
    model = core.scripted_model(stack)
    if model is None:
        results.missing.append(
            "anthropic is not installed: the SDK + ScriptedModel turn is skipped"
        )
    else:
        contenders.append(core.agent_turn_sdk(store("sdk"), model, "sqlite", key="turn_sdk"))
        contenders.append(core.sdk_round_trip(model, key="sdk_rtt"))
    results.main = interleaved(contenders, plan.n_main)
    results.turn_commits = core.turn_commits(store("count"))
    results.turn_statements = core.turn_statements(d)
    scratch, results.cpu_where = cpu.scratch_dir(d, stack)
    results.cpu = cpu.cpu_rows(scratch, stack, plan.n_main)


def run_sizes(results: Results, plan: Plan, d: Path, stack: ExitStack) -> None:
    approaches, missing = rivals.all_approaches(d, stack)
    results.missing.extend(missing)
    results.names.update({"floor": "raw: 300 B append + fsync"})
    results.names.update({a.key: a.name for a in approaches})
    results.describe.update({a.key: a.describe() for a in approaches})
    results.sizes = scale.per_size(
        approaches,
        plan.sizes,
        lambda n: plan.samples_at[n],
        d,
        stack,
        setup_budget_s=plan.setup_budget_s,
        cheap_n=plan.cheap_n,
    )


def run_lookups(results: Results, plan: Plan, d: Path, stack: ExitStack) -> None:
    results.lookups = scale.lookups(
        d,
        plan.lookup_sizes,
        lookups_n=plan.lookups_n,
        opens_n=plan.opens_n,
        json_sizes=set(plan.json_sizes),
    )


def run_long(results: Results, plan: Plan, d: Path, stack: ExitStack) -> None:
    store = core.open_bench_store("sqlite", d, "long", stack)
    run = longrun.long_run(store, grow_to=plan.long_turns)
    turns = interleaved(run.contenders, plan.n_long)
    results.longrun = turns + run.checkpoint_samples()
    results.long_start_turn = run.start_turn


def run_group(results: Results, plan: Plan, d: Path, stack: ExitStack) -> None:
    results.within_turn = groupcommit.within_turn(d, stack, plan.n_group)
    results.concurrency = groupcommit.concurrent_sessions(
        d, stack, threads=plan.threads, per_thread=plan.per_thread, rounds=plan.rounds
    )
    results.callers = groupcommit.threads_and_tasks(
        d, stack, callers=plan.callers, per_caller=plan.per_caller, rounds=plan.rounds
    )
    results.procs = procs.sqlite(
        d, procs=plan.procs, seconds=plan.proc_seconds, rounds=plan.proc_rounds
    )


def run_hot(results: Results, plan: Plan, d: Path, stack: ExitStack) -> None:
    results.hot = hotpath.patched_rows(d, stack, plan.n_hot)
    results.micro = hotpath.micro(2000)
    results.scripted = hotpath.scripted_rows(stack, 20)
    results.json_store = hotpath.json_rows(d, stack, plan.n_json, 10_000)


def run_postgres(results: Results, plan: Plan, d: Path, stack: ExitStack) -> None:
    url, why = pg.server_url()
    if url is None:
        results.missing.append(why)
        return
    results.pg = pg.rows(url, stack, plan.n_pg)
    results.pg_throughput = pg.throughput(url, stack, plan.pg_workers, plan.pg_per_worker)
    results.pg_procs = procs.postgres(
        url,
        pg.new_schema(url, stack),
        procs=plan.procs,
        seconds=plan.proc_seconds,
        rounds=plan.proc_rounds,
    )
    results.pg_round_trips = pg.round_trips(url, stack, plan.n_pg)
    results.pg_cpu = pg.cpu_rows(url, stack, plan.n_pg)


def run_cli(results: Results, plan: Plan, d: Path, stack: ExitStack) -> None:
    smoke = plan is SMOKE  # a short session, the default views only
    turns = 500 if smoke else 5000
    views = cli_reads.VIEWS[:3] if smoke else cli_reads.VIEWS
    results.cli_reads = "\n".join(cli_reads.table(turns, cli_reads.run(turns, d, views))) + "\n"


def run_instructions(results: Results, plan: Plan, d: Path, stack: ExitStack) -> None:
    why = instructions.valgrind()
    if why is not None:
        results.missing.append(f"instructions not counted: {why}")
        return
    lo, hi = plan.instructions
    results.instructions = instructions.count(d, lo=lo, hi=hi)


RUNNERS = {
    "main": run_main,
    "sizes": run_sizes,
    "lookups": run_lookups,
    "long": run_long,
    "group": run_group,
    "postgres": run_postgres,
    "hot": run_hot,
    "cli": run_cli,
    "instructions": run_instructions,
}


if __name__ == "__main__":
    main()
