"""The targets a bench run is held against, each with what was measured in this run."""

from __future__ import annotations

import statistics

from .measure import Sample
from .procs import BARE, TOOLLEDGER
from .results import Results, Tab, Target, by_key, us


def targets(results: Results) -> list[Target]:
    m = by_key(results.main)
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
    pg = by_key(results.pg)
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
    m, cpu = by_key(results.main), by_key(results.cpu)
    return [
        _versus(
            "non-idempotent call, CPU only ÷ minimal correct ledger",
            "≤ 2.0x",
            2.0,
            ours=cpu.get("cpu_call_noop_effect"),
            base=cpu.get("cpu_minimal_call"),
            note="run_tool_uses against the minimal ledger, both on synchronous=OFF SQLite files "
            f"in {results.cpu_where or '?'}, interleaved; ratio of the medians of process CPU "
            f"time per call.{_sql_share(cpu)}",
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
        _instructions(results),
    ]


def _sql_share(cpu: dict[str, Sample]) -> str:
    """How much of the call's CPU is SQLite running toolledger's statements, and what the 2.0x
    goal leaves for everything else."""
    ours, base, sql = (
        cpu.get("cpu_call_noop_effect"),
        cpu.get("cpu_minimal_call"),
        cpu.get("cpu_sql_alone"),
    )
    if ours is None or base is None or sql is None:
        return ""
    return (
        f" Of the call, toolledger's own SQL replayed alone takes {us(sql.median_us)} µs "
        f"({sql.median_us / base.median_us:.2f}x the minimal ledger's whole call), and "
        f"everything else it does (its Python, file checks, clock reads, locks) the other "
        f"{us(ours.median_us - sql.median_us)} µs; at 2.0x everything else would have "
        f"{us(max(0.0, 2.0 * base.median_us - sql.median_us))} µs."
    )


def _instructions(results: Results) -> Target:
    what = "non-idempotent call, instructions ÷ minimal correct ledger"
    note = (
        "user-space instructions per operation under callgrind, the difference of two runs "
        "of each contender (bench/instructions.py); synchronous=OFF SQLite. Machine load does "
        "not move it."
    )
    counted = results.instructions
    if counted is None:
        return _row(what, "≤ 2.5x", met=None, measured="", note=note)
    per = counted.per_op
    measured = (
        f"{counted.ratio():.2f}x ({per['call']:,.0f} vs {per['minimal']:,.0f} per call; "
        f"agent turn {per['turn']:,.0f})"
    )
    return _row(what, "≤ 2.5x", met=counted.ratio() <= 2.5, measured=measured, note=note)


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
    pg_cpu = by_key(results.pg_cpu)
    out.append(
        _versus(
            "PostgreSQL non-idempotent call, client CPU ÷ minimal correct ledger",
            "≤ 1.3x",
            1.3,
            ours=pg_cpu.get("pg_cpu_call"),
            base=pg_cpu.get("pg_cpu_minimal_call"),
            note="run_tool_uses against a minimal psycopg ledger (insert-if-absent intent, then "
            "the outcome, each in autocommit: two round trips, as toolledger's) on the same "
            "server, interleaved; ratio of the medians of the client process's CPU time per "
            "call.",
        )
    )
    return out


def _per_turn(results: Results) -> list[Target]:
    cpu, lr = by_key(results.cpu), by_key(results.longrun)
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
            "≤ 7",
            met=None if st is None else st.per_turn <= 7,
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
            s = by_key(g.samples).get(key)
            return s.ratio(by_key(g.samples)["floor"]) if s else None
    return None


def target_table(results: Results) -> Tab:
    found = targets(results)
    rows = [
        [t.what, t.goal, t.measured, "—" if t.met is None else "met" if t.met else "NOT met"]
        for t in found
    ]
    notes = [f"- {t.what}: {t.note}" for t in found if t.note]
    return Tab("Targets", ["target", "goal", "measured (this run)", ""], rows, notes)
