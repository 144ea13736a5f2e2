"""Deterministic simulation: every interleaving of workers, pauses, crashes, partitions and clocks,
replayable from a seed.

The whole system runs in one thread on simulated time. ``run_tool_uses`` and the agent loop are
generators that yield every piece of I/O; the simulation carries each request out against one
shared in-memory store (the real store semantics) at the current simulated instant and delivers
its answer after a simulated latency, so the code under test is toolledger's own, unchanged.
Around it, all chosen by one ``random.Random(seed)``:

* **hosts and containers** — process tables with their own host identity, PID namespace, clock
  offset (up to minutes) and drift; processes with several worker threads each;
* **workers** — each an ``Agent`` run of a scripted session, or a second delivery of a session's
  pending calls through ``run_tool_uses``; tools of every kind (plain, checked, key-forwarding,
  idempotent, read-only, high-impact with the persisted approval queue) whose effects land in a
  simulated world that keeps its own ledger of truth;
* **faults** — a process crashes at any yield (its memory gone, its store rows kept; its table
  sees it dead, as a reaped or zombie process), pauses for a while (past its lease, past its
  deadline), is cut off from the store (an operation hangs until its deadline, ``op_timeout``,
  then fails; so do its heartbeat's renewals, and a run stuck on the store stops being renewed),
  has a commit land with its answer lost (found out at the deadline); crashed processes are
  replaced by new ones;
* **people** — an operator who decides pending approvals and settles calls in doubt from the
  world's evidence (and, when configured, forces a running one).

Checked at the instant they apply: no call takes effect twice (bar a person's ``--force`` and the
documented limit of a tool that sends past its deadline); nothing is settled while its attempt can
still take effect; every checkpoint carries its writer's fence; the model is never sent a broken
transcript. Checked at the end: every session completed, every call answered exactly once, every
effect recorded or alerted, an approval used at most once, and ``verify`` finds nothing the run
does not excuse.

A failing seed prints its violations and the last steps; ``python -m toolledger.testing.simulation
--seed N`` replays it exactly, and ``shrink`` looks for a smaller run that still fails.
``REGRESSIONS`` switch three fixed bugs back on (a paused worker's call taken over, the race
between an intent and its in-flight registration, a person settling a running call) so a test
can show the simulation finds them.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any
from unittest import mock

from ...branching import _cut as _real_cut
from ...decide import after_approval as _after_approval
from ...liveness import Over
from .._report import summary_lines
from ._checks import final_checks
from ._config import SimConfig
from ._engine import Simulation

__all__ = ["EVERYTHING", "REGRESSIONS", "SimConfig", "SimReport", "explore", "shrink", "simulate"]


@dataclass
class SimReport:
    """One or more simulated runs: what they did and what broke."""

    seeds: list[int] = field(default_factory=list)
    steps: int = 0
    seconds: float = 0.0
    faults: dict[str, int] = field(default_factory=dict)
    effects: int = 0
    limit_cases: int = 0
    cast: dict[str, int] = field(default_factory=dict)  # process tables, processes, workers
    max_offset: float = 0.0  # the largest clock offset of a host from the store's, seconds
    violations: list[str] = field(default_factory=list)
    failing_seed: int | None = None
    replay_flags: str = ""  # what the replay command needs besides --seed
    trace: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds else 0.0

    def add(self, sim: Simulation, seconds: float) -> None:
        self.seeds.append(sim.seed)
        self.steps += sim.steps
        self.seconds += seconds
        self.effects += len(sim.world.effects)
        for name, n in (
            ("hosts and containers", len(sim.tables)),
            ("processes (replacements included)", len(sim.processes) - 1),  # not the operator
            ("workers", sum(len(p.workers) for p in sim.processes)),
        ):
            self.cast[name] = self.cast.get(name, 0) + n
        self.max_offset = max([self.max_offset, *(abs(t.offset) for t in sim.tables)])
        self.limit_cases += sum(e.past_deadline for e in sim.world.effects)
        for name in (
            "crashes",
            "pauses",
            "pauses_past_lease",
            "pauses_past_deadline",
            "partitions",
            "store_refused",
            "lost_replies",
            "renewals_withheld",
            "resolutions",
            "forced",
            "approvals",
            "forks",
            "rewinds",
            "replayed_turns",
            "blanket_yes",
            "branch_limit_cases",
        ):
            self.faults[name] = self.faults.get(name, 0) + sim.stats[name]
        if sim.violations and self.failing_seed is None:
            self.failing_seed = sim.seed
            self.violations = list(sim.violations)
            self.trace = list(sim.trace)

    def summary(self) -> str:
        rows = [
            ("seeds", f"{len(self.seeds):,}"),
            ("steps", f"{self.steps:,} ({self.steps_per_second:,.0f} per second)"),
            *((k, f"{v:,}") for k, v in self.cast.items()),
            ("largest clock offset", f"{self.max_offset:,.0f} s"),
            ("faults and people", ""),
            *((f"  {k}", f"{v:,}") for k, v in self.faults.items()),
            ("effects counted", f"{self.effects:,}"),
            ("effects sent past their deadline (rule 14)", f"{self.limit_cases:,}"),
            ("violations", f"{len(self.violations):,}"),
            ("time", f"{self.seconds:,.1f} s"),
        ]
        lines = summary_lines("simulation", self.ok, rows)
        if not self.ok:
            lines.append(
                f"  failing seed {self.failing_seed}: replay with "
                f"python -m toolledger.testing.simulation --seed {self.failing_seed}"
                f"{self.replay_flags} --trace"
            )
            lines += [f"  ! {v}" for v in self.violations[:20]]
            lines.append("  last steps:")
            lines += [f"    {t}" for t in self.trace[-40:]]
        return "\n".join(lines)


EVERYTHING = SimConfig(
    lost_reply=0.02,
    op_timeout=0.5,  # longer than a third of the lease: stuck runs stop being renewed
    sloppy=0.2,
    force=0.05,
    containers=2,
    sessions=6,
    threads=3,
    processes=4,
)
"""Every fault on, and a larger cast: what ``make simulate`` runs."""

REGRESSIONS = ("takeover", "threads", "resolve", "lineage", "blanket")
"""Fixed bugs a test can switch back on, to show the simulation finds them. ``lineage`` and
``blanket`` need the branches and the blanket-yes approvers (``SimConfig.branch``,
``SimConfig.blanket_yes``) on, as they are by default."""


@contextlib.contextmanager
def _regression(name: str | None) -> Iterator[None]:
    if name is None:
        yield
        return
    bug = Over("a regression switched on")
    if name == "takeover":
        # The old agent ("exclusive"): any started record is a previous holder's, in doubt.
        patch: Any = mock.patch("toolledger.runner.judge", return_value=bug)
    elif name == "threads":
        # An attempt registered in flight only after its intent committed (here: never).
        patch = mock.patch("toolledger.liveness.InFlight.add", return_value=None)
    elif name == "resolve":
        # resolve and in-doubt listings that do not ask whether the attempt still runs.
        patch = mock.patch("toolledger.stores.store.Store.judge", return_value=bug)
    elif name == "lineage":
        # A fork that copies only the calls its transcript keeps, as they were (before rule 19).
        with (
            mock.patch("toolledger.branching._cut", _cut_seen),
            mock.patch("toolledger.branching._lineage_calls", _kept_calls_only),
        ):
            yield
        return
    elif name == "blanket":
        # Any yes re-runs a call in doubt (before rule 21's own yes for a re-run).
        patch = mock.patch("toolledger.decide.after_approval", _any_yes_reruns)
    else:
        raise ValueError(f"unknown regression {name!r}; one of {', '.join(REGRESSIONS)}")
    with patch:
        yield


_CUT: list[tuple[Any, int]] = []  # the last branch point the lineage regression saw


def _cut_seen(snap: Any, sid: str, turn: int) -> int:
    cut = _real_cut(snap, sid, turn)
    _CUT[:] = [(snap, cut)]
    return cut


def _kept_calls_only(records: dict[str, Any], *_: Any, session: str, **__: Any) -> list[Any]:
    """The records a fork copied before rule 19: those of the calls its transcript keeps."""
    ((snap, cut),) = _CUT
    kept = {i for m in snap.messages[:cut] for i in snap.reader.call_ids(m)}
    return [replace(r, session_id=session) for i, r in records.items() if i in kept]


def _any_yes_reruns(call: Any, ask: Any, decision: Any) -> Any:
    yes = None if decision is None else replace(decision, rerun=decision.approved)
    return _after_approval(call, ask, yes)


def simulate(
    seed: int, config: SimConfig | None = None, *, regression: str | None = None
) -> Simulation:
    """One run, replayable by its seed; its ``violations`` are empty when every check held."""
    sim = Simulation(seed, config)
    quiet = logging.getLogger("toolledger")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # the simulated runs' own warnings are expected noise
    try:
        with _regression(regression), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # blanket-yes approvers are warned
            sim.run()
            final_checks(sim)
    finally:
        quiet.setLevel(level)
    return sim


def explore(
    seeds: range | list[int],
    config: SimConfig | None = None,
    *,
    regression: str | None = None,
    stop_at_first: bool = True,
    budget_s: float | None = None,
) -> SimReport:
    """Many seeds; stops at the first failing one (or when ``budget_s`` is spent)."""
    report = SimReport()
    if config == EVERYTHING:
        report.replay_flags += " --everything"
    if regression is not None:
        report.replay_flags += f" --regression {regression}"
    began = time.monotonic()
    for seed in seeds:
        start = time.perf_counter()
        sim = simulate(seed, config, regression=regression)
        report.add(sim, time.perf_counter() - start)
        if sim.violations and stop_at_first:
            break
        if budget_s is not None and time.monotonic() - began > budget_s:
            break
    return report


def shrink(seed: int, config: SimConfig, *, regression: str | None = None) -> SimConfig:
    """A smaller configuration on which ``seed`` still fails (fewer processes, threads,
    sessions and steps), where one is cheap to find."""
    best = config
    floors = {"processes": 1, "threads": 1, "sessions": 1, "chaos_steps": 50}
    for field_name, floor in floors.items():
        while True:
            current: int = getattr(best, field_name)
            smaller = current // 2 if field_name == "chaos_steps" else current - 1
            if max(floor, smaller) == current:
                break
            changes: dict[str, Any] = {field_name: max(floor, smaller)}
            candidate = replace(best, **changes)
            if not simulate(seed, candidate, regression=regression).violations:
                break
            best = candidate
    return best
