"""Timing: contenders run *interleaved*, in rounds, so that drift on a shared virtual disk (other
tenants, writeback, thermal) hits every contender alike. Report median and p99 per contender.

A contender's ``step(i)`` is timed from outside, or — for a ``self_timed`` contender whose
operations only exist inside a larger unit (a DBOS step inside its workflow, one turn of an agent
run) — returns its own per-operation durations in nanoseconds. A ``cpu_time`` contender is timed
on the process's CPU clock (every thread of it), its wall-clock median kept beside: time spent
waiting — for another thread, for the machine's other tenants — is not CPU.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

Step = Callable[[int], Any]


@dataclass(frozen=True)
class Sample:
    name: str
    n: int
    median_us: float
    p99_us: float
    writes: float = 0.0  # durable writes (commits) per operation, counted where known
    key: str = ""  # a stable id for reports and targets
    note: str = ""
    # The median, over the rotations where both ran, of (this contender's median in the
    # rotation / the floor's median in the same rotation): pairs measured ~0.1 s apart, so a
    # neighbour's burst of I/O that lasts seconds lands on both sides of each pair.
    paired: float | None = None
    wall_us: float | None = None  # a cpu_time contender's wall-clock median

    def ratio(self, floor: Sample) -> float:
        """Cost relative to the floor of the same group: the ratio of the medians."""
        return self.median_us / floor.median_us

    def per_write_ratio(self, floor: Sample) -> float:
        """Cost over (its durable writes x the floor): 1.0 means nothing but the writes."""
        return self.ratio(floor) / self.writes if self.writes else 0.0


@dataclass
class Contender:
    name: str
    step: Step
    writes: float = 0.0
    ops_per_step: int = 1  # a step doing several operations reports the cost of one
    key: str = ""
    note: str = ""
    self_timed: bool = False  # step returns a list of per-operation durations in ns
    # Entered around each round, outside the timed region (e.g. a monkeypatch to switch on).
    around: Callable[[], AbstractContextManager[Any]] = field(default=nullcontext)
    # Operations to time, if not the group's ``n`` (cheap contenders take more samples; once the
    # dear ones are done they go on interleaved among themselves, the floor included).
    n: int | None = None
    # Commits made so far (see ``core.count_commits``): writes per operation are then counted
    # over the whole run instead of declared.
    counter: Callable[[], int] | None = None
    cpu_time: bool = False  # timed on the process's CPU clock (``time.process_time_ns``)


def interleaved(
    contenders: list[Contender], n: int, *, round_size: int = 25, warmup: int = 20
) -> list[Sample]:
    """Run every contender until it has ``n`` operations, ``round_size`` at a time, in
    rotation; the first ``warmup`` operations of each are not kept."""
    samples: dict[int, list[float]] = {id(c): [] for c in contenders}
    walls: dict[int, list[float]] = {id(c): [] for c in contenders}
    by_round: dict[int, dict[int, list[float]]] = {id(c): {} for c in contenders}
    rotation = 0
    counters = dict.fromkeys(samples, 0)
    start = {id(c): c.counter() if c.counter else 0 for c in contenders}
    for c in contenders:
        with c.around():
            for i in range(max(1, warmup // c.ops_per_step)):
                c.step(-1 - i)

    def missing(c: Contender) -> int:
        want = c.n if c.n is not None else n
        return want - len(samples[id(c)]) * (1 if c.self_timed else c.ops_per_step)

    while any(missing(c) > 0 for c in contenders):
        rotation += 1
        for c in contenders:
            if missing(c) <= 0:
                continue
            before = len(samples[id(c)])
            with c.around():
                for _ in _round(c, round_size):
                    if missing(c) <= 0:
                        break
                    i = counters[id(c)]
                    counters[id(c)] += 1
                    if c.self_timed:
                        samples[id(c)].extend(float(x) for x in c.step(i))
                        continue
                    if c.cpu_time:
                        t0, p0 = time.perf_counter_ns(), time.process_time_ns()
                        c.step(i)
                        p1, t1 = time.process_time_ns(), time.perf_counter_ns()
                        samples[id(c)].append((p1 - p0) / c.ops_per_step)
                        walls[id(c)].append((t1 - t0) / c.ops_per_step)
                        continue
                    t0 = time.perf_counter_ns()
                    c.step(i)
                    samples[id(c)].append((time.perf_counter_ns() - t0) / c.ops_per_step)
            by_round[id(c)][rotation] = samples[id(c)][before:]
    for c in contenders:
        if c.counter is not None:
            steps = counters[id(c)] + max(1, warmup // c.ops_per_step)
            c.writes = (c.counter() - start[id(c)]) / (steps * c.ops_per_step)
    out = [summarise(c, samples[id(c)]) for c in contenders]
    out = [
        replace(s, wall_us=statistics.median(walls[id(c)]) / 1000) if walls[id(c)] else s
        for c, s in zip(contenders, out, strict=True)
    ]
    floor = contenders[0]
    if floor.key == "floor":
        out = [
            replace(s, paired=_paired(by_round[id(c)], by_round[id(floor)]))
            for c, s in zip(contenders, out, strict=True)
        ]
    return out


def _paired(mine: dict[int, list[float]], floor: dict[int, list[float]]) -> float | None:
    ratios = [
        statistics.median(mine[r]) / statistics.median(floor[r])
        for r in mine
        if mine[r] and floor.get(r)
    ]
    return statistics.median(ratios) if ratios else None


def _round(c: Contender, round_size: int) -> Iterator[None]:
    for _ in range(max(1, round_size // c.ops_per_step)):
        yield None


def summarise(c: Contender, xs_ns: list[float]) -> Sample:
    xs = sorted(xs_ns)
    p99 = xs[min(len(xs) - 1, int(len(xs) * 0.99))]
    count = len(xs) if c.self_timed else len(xs) * c.ops_per_step
    return Sample(
        c.name,
        count,
        statistics.median(xs) / 1000,
        p99 / 1000,
        c.writes,
        key=c.key,
        note=c.note,
    )


def timed_ns(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter_ns()
    fn()
    return float(time.perf_counter_ns() - t0)
