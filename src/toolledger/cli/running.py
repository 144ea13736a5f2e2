"""The commands that run something: ``resume-all``, ``bench``, ``audit``, ``demo``."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from .._views.overview import lineage_sessions
from . import render
from ._command import emit_json, store_of
from .output import Out
from .render import safe, safe_id

__all__ = ["cmd_audit", "cmd_bench", "cmd_demo", "cmd_resume_all"]


def cmd_resume_all(args: argparse.Namespace, console: Console) -> int:
    """Resume every unfinished session whose lease is free (after a fleet restart). --agent
    MODULE:ATTR names your Agent, or a function taking the store and returning one."""
    from ..agent._agent import Agent
    from ..agent._resume import resume_all
    from .loading import built, load_object, refused_arguments

    target = load_object(args.agent, shape="MODULE:AGENT", example="myapp.worker:make_agent")
    needs = None if isinstance(target, Agent) else refused_arguments(target, "store")
    if isinstance(target, Agent):
        agent = target
    elif callable(target) and needs is not None:
        console.print(
            safe(
                f"{args.agent} is a function of {needs}: name an Agent or a function taking a "
                "store and returning one",
                "red",
            )
        )
        return 2
    elif callable(target):
        agent = built(target, args.agent, "an Agent", store_of(args, write=True))
        if not isinstance(agent, Agent):
            console.print(
                f"[red]{args.agent} returned a {type(agent).__name__}, not an Agent[/red]"
            )
            return 2
    else:
        console.print(
            f"[red]{args.agent} is a {type(target).__name__}: name an Agent or a "
            "function taking a store and returning one[/red]"
        )
        return 2
    lineages: dict[str, set[str]] = {}
    try:
        done = resume_all(agent, workers=args.workers)
        for r in done:  # the sessions a stop reason may name: read while the store is open
            state = agent.store.session(r.session_id) if r.run is not None else None
            if state is not None:
                lineages[r.session_id] = lineage_sessions(agent.store, state)
    finally:
        agent.store.close()
    rows = [
        {
            "session_id": r.session_id,
            "status": r.run.status.value if r.run else ("skipped" if r.skipped else "error"),
            "detail": (r.run.reason if r.run else r.skipped or str(r.error)) or "",
        }
        for r in done
    ]
    if args.json:
        emit_json(rows)
    else:
        out = Out(console)
        if not out.terminal:  # in a pipe each reason is whole, as stored
            out.grid(render.resumed_table(rows))
            return 1 if any(r.error is not None for r in done) else 0
        # On a screen a reason's detail may wrap: its commands are named by what they do
        # there, and printed after it whole, each on a line of its own (design rule 21). Only
        # a run's stop reason names commands; an error's text is words.
        url = agent.store.url
        parts = {
            r.session_id: render.reason_parts(
                r.run.reason or "", lineages.get(r.session_id, {r.session_id}), url
            )
            if r.run is not None
            else ("", ())
            for r in done
        }
        shown = [
            {**row, "detail": parts[r.session_id][0]} if r.run is not None else row
            for r, row in zip(done, rows, strict=True)
        ]
        out.grid(render.resumed_table(shown))
        for sid, (_, commands) in parts.items():
            out.reason_commands(safe_id(sid), commands)
    return 1 if any(r.error is not None for r in done) else 0


def cmd_bench(args: argparse.Namespace, console: Console) -> int:
    """Run the benchmarks (bench/ of a source checkout)."""
    if not (Path.cwd() / "bench" / "__main__.py").exists():
        console.print(
            "[red]run `toolledger bench` from a toolledger source checkout "
            "(it runs `python -m bench`)[/red]"
        )
        return 2
    extra = ["--quick"] if args.quick else []
    return subprocess.call([sys.executable, "-m", "bench", *extra])


def cmd_audit(args: argparse.Namespace, console: Console) -> int:
    """Audit a toolset (MODULE:TOOLSET): each tool's effect class, approval, what a resume does
    with an interrupted call of it, and its risk (high/medium/low) with the reason."""
    from .audit import audit, lines, load_toolset

    result = audit(load_toolset(args.target))
    if args.json:
        emit_json({"target": args.target, **result.as_json()})
        return 0
    for line in lines(result):
        console.print(line, highlight=False, soft_wrap=True)
    return 0


def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    """The story end to end, offline: an agent is killed right after opening a ticket, resumed,
    and opens exactly one (--dir DIR keeps its store to look at afterwards; a rerun there
    starts afresh)."""
    from .demo import refuse_a_file, run_demo

    refuse_a_file(args.dir)
    return run_demo(console, directory=args.dir, as_json=args.json)
