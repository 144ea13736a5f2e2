"""``python -m toolledger._harness.simulation`` — explore seeds, or replay one.

    python -m toolledger._harness.simulation --seeds 200            # seeds 0..199
    python -m toolledger._harness.simulation --seed 1234 --trace    # replay one, print its steps
    python -m toolledger._harness.simulation --minutes 10           # as many seeds as fit

Exits 1 when a check fails, printing the seed, the violations and the last steps.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from . import (
    BRANCHY,
    EVERYTHING,
    EVERYWHERE,
    REGRESSIONS,
    SimConfig,
    explore,
    shrink,
    simulate,
    world_for,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolledger._harness.simulation")
    parser.add_argument("--seed", type=int, help="replay this seed alone")
    parser.add_argument(
        "--seeds", type=int, default=100, help="explore seeds 0..N-1 (from --first)"
    )
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--minutes", type=float, help="explore until this much time is spent")
    parser.add_argument(
        "--steps", type=int, default=SimConfig.chaos_steps, help="chaos steps per run"
    )
    parser.add_argument("--lost-replies", type=float, default=SimConfig.lost_reply)
    parser.add_argument("--force", type=float, default=SimConfig.force)
    parser.add_argument("--sloppy", type=float, default=SimConfig.sloppy)
    parser.add_argument("--regression", choices=REGRESSIONS, help="switch a fixed bug back on")
    parser.add_argument(
        "--everything",
        action="store_true",
        help="every fault on: lost replies, late senders, forced resolutions, containers, "
        "more processes, threads and sessions (what make simulate runs)",
    )
    parser.add_argument(
        "--everywhere",
        action="store_true",
        help="--everything on every kind of machine: process tables missing, hidden or another "
        "namespace's, time namespaces, file-store clocks that step",
    )
    parser.add_argument(
        "--branchy",
        action="store_true",
        help="--everything with forks and rewinds twenty times as often: deep lineages racing "
        "on the calls they share",
    )
    parser.add_argument("--trace", action="store_true", help="print every step of --seed")
    parser.add_argument("--shrink", action="store_true", help="shrink a failing --seed")
    args = parser.parse_args(argv)
    config = SimConfig(
        chaos_steps=args.steps,
        max_steps=max(SimConfig.max_steps, args.steps * 10),
        lost_reply=args.lost_replies,
        force=args.force,
        sloppy=args.sloppy,
    )
    if args.regression is not None:
        config = replace(world_for(args.regression), chaos_steps=args.steps)
    if args.everything or args.everywhere or args.branchy:
        chosen = EVERYWHERE if args.everywhere else BRANCHY if args.branchy else EVERYTHING
        config = replace(chosen, chaos_steps=args.steps, max_steps=config.max_steps)
    if args.seed is not None:
        sim = simulate(args.seed, config, regression=args.regression)
        if args.trace:
            print("\n".join(sim.trace))
        for v in sim.violations:
            print(f"! {v}")
        print(f"seed {args.seed}: {sim.steps:,} steps, {len(sim.violations)} violation(s)")
        if sim.violations and args.shrink:
            smallest = shrink(args.seed, config, regression=args.regression)
            print(f"smallest failing configuration: {smallest}")
        return 1 if sim.violations else 0
    seeds = range(args.first, args.first + (10**9 if args.minutes else args.seeds))
    budget = args.minutes * 60 if args.minutes else None
    report = explore(seeds, config, regression=args.regression, budget_s=budget)
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
