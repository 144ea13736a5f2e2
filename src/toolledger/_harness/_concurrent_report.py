"""The concurrency torture's report: what one run did and found, and how it is printed."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ._report import summary_lines, violation_lines

__all__ = ["ConcurrentReport"]


@dataclass
class ConcurrentReport:
    """What one concurrency torture did and found. ``violations`` is empty when the promise held.

    The documented limit (docs/design.md, rule 14) — an attempt paused past its deadline on another
    host wakes after its call was settled — is counted, not a violation, when the world shows
    exactly that: ``late_effects``, calls done twice, each late success in its record's history
    and alerted; ``late_outcomes``, such late successes that added nothing to the world;
    ``cut_off``, such attempts killed between their effect and their report, which no ledger can
    learn of (silent). ``settled_elsewhere_past_deadline``: attempts another host settled past
    their deadline while their process was alive. ``judged_ended``: judgements by a worker that
    a process of its own host had ended, each checked to come after that process was killed.
    """

    backend: str
    seed: int
    chaos_seconds: float
    lease_ttl: float = 0.0
    tool_timeouts: dict[str, float] = field(default_factory=dict)
    workers: int = 0  # processes started, restarts included
    other_host_workers: int = 0
    threads: int = 0
    clock_offsets: list[float] = field(default_factory=list)
    sessions: int = 0
    runs: Counter[str] = field(default_factory=Counter)  # outcome -> worker runs
    pauses: int = 0
    pauses_past_lease: int = 0
    pauses_past_timeout: int = 0
    kills: int = 0
    kills_in_tool: int = 0
    approvals: int = 0
    resolves: Counter[str] = field(default_factory=Counter)  # happened | not happened | refused
    alerts: Counter[str] = field(default_factory=Counter)
    tool_calls: int = 0
    executions: int = 0
    effects_checked: int = 0
    late_effects: int = 0
    late_outcomes: int = 0
    cut_off: int = 0
    settled_elsewhere_past_deadline: int = 0
    judged_ended: int = 0
    not_executed: list[str] = field(default_factory=list)
    store_errors: int = 0
    invariants_checked: int = 0
    violations: list[str] = field(default_factory=list)
    kept: str | None = None  # where a failed run's files (and schema) were kept
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # chaos, quiet, checks: seconds

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        spread = Counter(_skew(o) for o in self.clock_offsets)
        rows = [
            ("backend", self.backend),
            ("seed", str(self.seed)),
            (
                "workers",
                f"{self.workers} processes ({self.other_host_workers} as another host), "
                f"{self.threads} threads",
            ),
            (
                "clock offsets",
                ", ".join(f"{n} {k}" for k, n in spread.most_common())
                + f" (largest {max(self.clock_offsets, key=abs, default=0.0):+,.0f} s)",
            ),
            (
                "lease, timeouts",
                f"{self.lease_ttl:g}s; "
                + ", ".join(f"{k} {v:g}s" for k, v in sorted(self.tool_timeouts.items())),
            ),
            (
                "pauses",
                f"{self.pauses:,} ({self.pauses_past_lease:,} past the lease, "
                f"{self.pauses_past_timeout:,} past every tool's timeout)",
            ),
            ("kills", f"{self.kills:,} ({self.kills_in_tool:,} inside a tool)"),
            ("sessions", f"{self.sessions:,}"),
            ("worker runs", ", ".join(f"{k} {n:,}" for k, n in self.runs.most_common())),
            (
                "operator",
                f"{self.approvals:,} approvals; resolves: "
                + (", ".join(f"{k} {n:,}" for k, n in sorted(self.resolves.items())) or "none"),
            ),
            ("alerts", ", ".join(f"{k} {n:,}" for k, n in sorted(self.alerts.items())) or "none"),
            ("tool calls", f"{self.tool_calls:,} ({self.executions:,} executions)"),
            ("effects checked", f"{self.effects_checked:,} (ticket files counted in the world)"),
            (
                "late effects",
                f"{self.late_effects:,} duplicated, alerted (the documented limit); "
                f"{self.late_outcomes:,} late outcomes that duplicated nothing; "
                f"{self.cut_off:,} killed before they could report",
            ),
            (
                "settled elsewhere",
                f"{self.settled_elsewhere_past_deadline:,} attempts settled past their deadline "
                "while alive on another host",
            ),
            (
                "judged ended",
                f"{self.judged_ended:,} times a worker found a process of its host ended "
                "(each after the kill)",
            ),
            ("answered not executed", f"{len(self.not_executed):,}"),
            ("store errors", f"{self.store_errors:,} (a paused worker held the store's lock)"),
            ("invariant checks", f"{self.invariants_checked:,}"),
            ("violations", f"{len(self.violations):,}"),
            (
                "time",
                f"{self.seconds:,.1f} s ("
                + ", ".join(f"{k} {v:,.1f} s" for k, v in self.phases.items())
                + ")",
            ),
        ]
        lines = summary_lines("concurrency torture", self.ok, rows)
        lines += [f"  · {n}" for n in self.not_executed[:5]]
        lines += violation_lines(self.violations)
        if self.kept:
            lines.append(f"  kept for inspection: {self.kept}")
        return "\n".join(lines)


def _skew(offset: float) -> str:
    if offset == 0:
        return "on time"
    if abs(offset) <= 5:
        return "within 5 s"
    return "within an hour" if abs(offset) <= 3600 else "a year behind"


# -- the store of the run -------------------------------------------------------------------------
