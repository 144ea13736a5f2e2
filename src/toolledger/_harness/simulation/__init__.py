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
* **process tables and clocks** — a table's ``/proc`` may be missing, hidden across uids, or
  another PID namespace's; a process may run in a time namespace; the store's clock may be one
  server's, or (a file store) each host's own, which may step forward or back by minutes;
* **people** — an operator who decides pending approvals and settles calls in doubt from the
  world's evidence (and, when configured, forces a running one).

Checked at the instant they apply: no call takes effect twice (bar a person's ``--force`` and the
documented limit of a tool that sends past its deadline); nothing is settled while its attempt can
still take effect; every checkpoint carries its writer's fence; the model is never sent a broken
transcript. Checked at the end: every session completed, every call answered exactly once, every
effect recorded or alerted, an approval used at most once, and ``verify`` finds nothing the run
does not excuse.

A failing seed prints its violations and the last steps; ``python -m toolledger._harness.simulation
--seed N`` replays it exactly, and ``shrink`` looks for a smaller run that still fails.
``REGRESSIONS`` switch fixed bugs back on (a paused worker's call taken over, the race between
an intent and its in-flight registration, a person settling a running call, and five ways a
process table or a clock once fooled liveness; ``_regressions``) so a test can show the
simulation finds them, each in its world (``world_for``).
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any
from unittest import mock

from ...agent import _agent
from .._report import summary_lines
from ._checks import final_checks
from ._config import SimConfig
from ._engine import Simulation
from ._regressions import REGRESSIONS, WORLDS, world_for
from ._regressions import regression as _regression

__all__ = [
    "BRANCHY",
    "EVERYTHING",
    "EVERYWHERE",
    "REGRESSIONS",
    "WORLDS",
    "SimConfig",
    "SimReport",
    "explore",
    "shrink",
    "simulate",
    "world_for",
]


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
            "clock_steps",
            "clock_limit_cases",
            "forks",
            "rewinds",
            "replayed_turns",
            "blanket_yes",
            "branch_limit_cases",
            "safe_effects_lost_rerun_failed",
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
                f"python -m toolledger._harness.simulation --seed {self.failing_seed}"
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
"""Every fault on, and a larger cast: what ``make simulate`` runs (with ``EVERYWHERE``)."""

EVERYWHERE = replace(
    EVERYTHING,
    proc_modes=("own", "own", "none", "hidden", "host"),
    uids=2,
    time_namespaces=0.2,
    store_clock="either",
    clock_step=0.0005,
)
"""``EVERYTHING`` on every kind of machine liveness can meet: a process table missing, hidden
or another namespace's, time namespaces, and half the worlds on a file store whose clock steps.
(Its own constant, so that ``EVERYTHING``'s seeds replay as they always did.)"""

BRANCHY = replace(EVERYTHING, branch=0.05)
"""``EVERYTHING`` with an operator forking and rewinding sessions about twenty times as often:
lineages several forks deep whose sessions race on the calls they share."""


def simulate(
    seed: int, config: SimConfig | None = None, *, regression: str | None = None
) -> Simulation:
    """One run, replayable by its seed; its ``violations`` are empty when every check held."""
    sim = Simulation(seed, config)
    quiet = logging.getLogger("toolledger")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # the simulated runs' own warnings are expected noise
    try:
        # A take no run holds is given back by the process's background writer on simulated
        # time, never by a real thread on the wall clock.
        with (
            _regression(regression),
            warnings.catch_warnings(),
            mock.patch.object(_agent, "give_back_later", sim.give_back_later),
        ):
            warnings.simplefilter("ignore", FutureWarning)  # blanket-yes approvers are warned
            sim.run()
            final_checks(sim)
            sim.bury()
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
    if config == EVERYWHERE:
        report.replay_flags += " --everywhere"
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
