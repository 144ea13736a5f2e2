"""Timing: contenders run *interleaved*, in rounds, so that drift on a shared virtual disk (other
tenants, writeback, thermal) hits every contender alike. Report median and p99 per contender."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

Step = Callable[[int], object]


@dataclass(frozen=True)
class Sample:
    name: str
    n: int
    median_us: float
    p99_us: float
    writes: float = 0.0  # durable writes per operation, where it is known

    def ratio(self, floor: Sample) -> float:
        return self.median_us / floor.median_us


@dataclass(frozen=True)
class Contender:
    name: str
    step: Step
    writes: float = 0.0
    ops_per_step: int = 1  # a step doing several operations reports the cost of one


def interleaved(
    contenders: list[Contender], n: int, *, round_size: int = 25, warmup: int = 20
) -> list[Sample]:
    """Run every contender ``n`` times, ``round_size`` at a time, in rotation."""
    samples: dict[str, list[float]] = {c.name: [] for c in contenders}
    wanted = {c.name: max(1, n // c.ops_per_step) for c in contenders}
    counters = dict.fromkeys(samples, 0)
    for c in contenders:
        for i in range(max(1, warmup // c.ops_per_step)):
            c.step(-1 - i)
    while any(len(samples[c.name]) < wanted[c.name] for c in contenders):
        for c in contenders:
            per_round = max(1, round_size // c.ops_per_step)
            todo = min(per_round, wanted[c.name] - len(samples[c.name]))
            for _ in range(todo):
                i = counters[c.name]
                counters[c.name] += 1
                t0 = time.perf_counter_ns()
                c.step(i)
                samples[c.name].append((time.perf_counter_ns() - t0) / c.ops_per_step)
    out = []
    for c in contenders:
        xs = sorted(samples[c.name])
        p99 = xs[min(len(xs) - 1, int(len(xs) * 0.99))]
        out.append(
            Sample(
                c.name, len(xs) * c.ops_per_step, statistics.median(xs) / 1000, p99 / 1000, c.writes
            )
        )
    return out
