"""``toolledger`` — look into a store, settle in-doubt calls, decide approvals, run the demo.

The store comes from ``--store URL``, else ``$TOOLLEDGER_STORE``, else ``sqlite:///toolledger.db``.
Every command takes ``--json`` for machine-readable output.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from .. import approval_queue
from ..codec import MAX_NESTING, nesting
from ..errors import ToolLedgerError
from ..liveness import Over, Running, lease_state
from ..records import RunStatus
from ..stores import DEFAULT_STORE_URL, Store, open_store
from ..verify import Severity, verify
from . import render
from .render import safe

Handler = Callable[[argparse.Namespace, Console], int]


def _url(args: argparse.Namespace) -> str:
    return str(args.store or os.environ.get("TOOLLEDGER_STORE") or DEFAULT_STORE_URL)


def _store(args: argparse.Namespace) -> Store:
    """The store the command looks at. It must exist: looking never creates one (a forgotten
    ``--store`` says "no store at …", it does not leave an empty ``toolledger.db`` behind)."""
    return open_store(_url(args), create=False)


def _session_or_exit(store: Store, session_id: str) -> bool:
    """Whether ``session_id`` is in ``store`` (a state or a ledger); an unknown one is an error
    for every command that names a session."""
    return store.session(session_id) is not None or session_id in store.sessions()


def _no_session(console: Console, args: argparse.Namespace, store: Store) -> int:
    if args.json:
        _emit_json({"error": "NoSuchSession", "message": f"no session {args.session!r}"})
    else:
        console.print(
            safe(f"no session {args.session!r} in {store.url}", "red"),
        )
    return 1


def _emit_json(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


# -- commands ------------------------------------------------------------------------------------


def cmd_sessions(args: argparse.Namespace, console: Console) -> int:
    """List sessions: agent sessions with their status, and ledgers used on their own."""
    with _store(args) as store:
        states = store.session_states()
        with_state = {s.session_id for s in states}
        ledger_only = [sid for sid in store.sessions() if sid not in with_state]
        now = store.now()
        held: dict[str, dict[str, Any]] = {}
        for s in states:
            lease = store.lease(s.session_id)
            state = lease_state(lease, now=now, runtime=store.runtime)
            if lease is not None and isinstance(state, Running):
                held[s.session_id] = {
                    "owner": lease.owner,
                    "token": lease.token,
                    "until": state.until,
                    "why": state.why,
                    "text": render.lease_text(lease, state),
                }
        calls: dict[str, list[str]] = {}
        for record, verdict in store.started():
            kind = "in progress" if isinstance(verdict, Running) else "in doubt"
            calls.setdefault(record.session_id, []).append(kind)
    if args.json:
        _emit_json(
            {
                "sessions": [
                    {
                        **render.session_json(s),
                        "lease": {k: v for k, v in held[s.session_id].items() if k != "text"}
                        if s.session_id in held
                        else None,
                        "started_calls": calls.get(s.session_id, []),
                        # running, and nobody holds it: its process is gone (run it again)
                        "interrupted": s.status is RunStatus.RUNNING and s.session_id not in held,
                    }
                    for s in states
                ],
                "ledger_only": ledger_only,
            }
        )
    else:
        summary = {
            sid: ", ".join(f"{kinds.count(k)} {k}" for k in sorted(set(kinds)))
            for sid, kinds in calls.items()
        }
        text = {sid: h["text"] for sid, h in held.items()}
        console.print(render.sessions_table(states, ledger_only, text, summary))
    return 0


def cmd_show(args: argparse.Namespace, console: Console) -> int:
    """Show one session: its state and a timeline of turns, tool calls, ledger and approvals."""
    with _store(args) as store:
        if not _session_or_exit(store, args.session):
            return _no_session(console, args, store)
        state = store.session(args.session)
        events = render.timeline(store, args.session, reveal=args.show_secrets)
    if args.json:
        _emit_json(
            {
                "session": render.session_json(state) if state else None,
                "timeline": render.timeline_json(events),
            }
        )
        return 0
    if state is not None:
        console.print(
            safe(state.session_id, "bold"),
            ": ",
            render.styled(state.status.value),
            f" — {state.turns} turns, {state.input_tokens}/{state.output_tokens} tokens",
        )
        if state.reason:
            console.print(safe(f"  {state.reason}"))
    console.print(render.timeline_table(events, f"timeline of {args.session}"))
    return 0


def cmd_effects(args: argparse.Namespace, console: Console) -> int:
    """List the ledger records of one session."""
    with _store(args) as store:
        if not _session_or_exit(store, args.session):
            return _no_session(console, args, store)
        records = store.ledger(args.session).records()
    if args.json:
        _emit_json([render.effect_json(r, reveal=args.show_secrets) for r in records])
    else:
        console.print(
            render.effects_table(records, f"effects of {args.session}", reveal=args.show_secrets)
        )
    return 0


def cmd_in_doubt(args: argparse.Namespace, console: Console) -> int:
    """List every call that started and has no outcome, in every session: in doubt (its attempt
    is over: a person may settle it) or still in progress (its worker may still be running it:
    leave it alone)."""
    with _store(args) as store:
        started = store.started()
    if args.json:
        _emit_json([render.effect_json(r, reveal=args.show_secrets, verdict=v) for r, v in started])
        return 0
    doubt = [(r, v) for r, v in started if isinstance(v, Over)]
    running = [(r, v) for r, v in started if not isinstance(v, Over)]
    if running:
        console.print(render.in_progress_table(running))
    if doubt:
        console.print(render.in_doubt_table(doubt))
        console.print("settle each with one of:")
        for line in render.settle_commands(doubt, url=_url(args)):
            console.print(line, soft_wrap=True)  # never folded: it is pasted whole
    if not started:
        console.print("no call is in doubt")
    elif not doubt:
        console.print("no call is in doubt (the calls above are still in progress)")
    return 0


def cmd_resolve(args: argparse.Namespace, console: Console) -> int:
    """Settle an in-doubt call: it --happened (optionally with --result JSON) or
    --not-happened (it will run on the next run of the session)."""
    result = None
    if args.result is not None:
        if not args.happened:
            console.print(
                "[red]--result goes with --happened (what the model is told it returned); a "
                "call that did not happen has no result[/red]"
            )
            return 2
        try:
            result = json.loads(args.result, parse_constant=_not_json)
            if nesting(result) > MAX_NESTING:
                raise ValueError(f"nested more than {MAX_NESTING} levels deep")
        except (ValueError, RecursionError) as exc:
            why = "nested too deep" if isinstance(exc, RecursionError) else str(exc)
            console.print(f"[red]--result is not JSON the model can be told: {escape(why)}[/red]")
            return 2
    with _store(args) as store:
        record = store.ledger(args.session).resolve(
            args.tool_use_id, happened=args.happened, result=result, by=args.by, force=args.force
        )
    if args.json:
        _emit_json(render.effect_json(record))
    else:
        console.print(
            safe(f"{args.tool_use_id} resolved: "),
            render.styled(record.status.value),
            safe(f" (by {args.by}). Run the session again to go on."),
        )
        if args.force and record.error and "forced while" in record.error:
            console.print(f"[yellow]{escape(record.error)}[/yellow]")
    return 0


def _not_json(word: str) -> Any:
    raise ValueError(f"{word} is not JSON (Python writes it; JSON has no such number)")


def cmd_approvals(args: argparse.Namespace, console: Console) -> int:
    """List approval requests waiting for a person (--all: every request)."""
    with _store(args) as store:
        if args.all:
            records = sorted(store.approvals(args.session), key=lambda a: a.requested_at)
        else:
            records = approval_queue.pending(store, args.session)
    if args.json:
        _emit_json([render.approval_json(a, reveal=args.show_secrets) for a in records])
    elif records:
        console.print(render.approvals_table(records, reveal=args.show_secrets))
    else:
        console.print("no approval request is waiting")
    return 0


def _decide(args: argparse.Namespace, console: Console, approved: bool) -> int:
    with _store(args) as store:
        record = approval_queue.decide(
            store, args.session, args.tool_use_id, approved=approved, by=args.by
        )
    if args.json:
        _emit_json(render.approval_json(record))
    else:
        console.print(
            safe(f"{record.tool} ({record.tool_use_id}): "),
            render.styled(record.status.value),
            safe(f" by {record.decided_by}. Run the session again to go on."),
        )
    return 0


def cmd_approve(args: argparse.Namespace, console: Console) -> int:
    """Approve a pending request."""
    return _decide(args, console, True)


def cmd_deny(args: argparse.Namespace, console: Console) -> int:
    """Deny a pending request."""
    return _decide(args, console, False)


def cmd_verify(args: argparse.Namespace, console: Console) -> int:
    """Check the store's integrity and that every transcript agrees with its ledger."""
    with _store(args) as store:
        problems = verify(store)
        url = store.url
    errors = [p for p in problems if p.severity is Severity.ERROR]
    if args.json:
        _emit_json(
            {
                "store": url,
                "ok": not errors,
                "problems": [
                    {"severity": p.severity.value, "session_id": p.session_id, "message": p.message}
                    for p in problems
                ],
            }
        )
    else:
        for p in problems:
            style = "red" if p.severity is Severity.ERROR else "yellow"
            where = f"[{p.session_id}] " if p.session_id else ""
            console.print(safe(p.severity.value, style), " ", safe(f"{where}{p.message}"))
        console.print(
            safe(f"{url}: "),
            safe("ok", "green") if not errors else safe(f"{len(errors)} error(s)", "red"),
        )
    return 1 if errors else 0


def cmd_resume_all(args: argparse.Namespace, console: Console) -> int:
    """Resume every unfinished session whose lease is free (after a fleet restart). --agent
    MODULE:ATTR names your Agent, or a function taking the store and returning one."""
    from ..agent import Agent
    from ..resume import resume_all
    from .loading import load_object

    target = load_object(args.agent, shape="MODULE:AGENT", example="myapp.worker:make_agent")
    if isinstance(target, Agent):
        agent = target
    elif callable(target):
        agent = target(_store(args))
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
    try:
        done = resume_all(agent, workers=args.workers)
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
        _emit_json(rows)
    else:
        console.print(render.resumed_table(rows))
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
        _emit_json({"target": args.target, **result.as_json()})
        return 0
    for line in lines(result):
        console.print(line, highlight=False, soft_wrap=True)
    return 0


def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    """The brief's story end to end, offline: an agent is killed right after opening a ticket,
    resumed, and opens exactly one."""
    from .demo import run_demo

    return run_demo(console, directory=args.dir, as_json=args.json)


# -- the parser ----------------------------------------------------------------------------------


def _first_sentence(doc: str) -> str:
    """A command's one-line help: its docstring's first sentence, whole."""
    flat = " ".join(doc.split())
    end = flat.find(". ")
    return flat if end < 0 else flat[: end + 1]


def build_parser() -> argparse.ArgumentParser:
    # SUPPRESS: an option given before the command must not be reset by the command's parser.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--store",
        default=argparse.SUPPRESS,
        help=f"store URL (default: $TOOLLEDGER_STORE or {DEFAULT_STORE_URL})",
    )
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output"
    )
    parser = argparse.ArgumentParser(
        prog="toolledger",
        parents=[common],
        description="Inspect and repair toolledger stores: sessions, effects, in-doubt calls, "
        "approvals.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, handler: Handler, **kwargs: Any) -> argparse.ArgumentParser:
        doc = (handler.__doc__ or "").strip()
        p = sub.add_parser(
            name, parents=[common], help=_first_sentence(doc), description=doc, **kwargs
        )
        p.set_defaults(handler=handler)
        return p

    p = add("demo", cmd_demo)
    p.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="keep the demo's store and world here (default: a temporary directory)",
    )

    def show_secrets(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--show-secrets",
            action="store_true",
            help="show the values of secret-looking fields (password, token, api_key, "
            "authorization, …) instead of ***",
        )

    add("sessions", cmd_sessions)
    p = add("show", cmd_show)
    p.add_argument("session")
    show_secrets(p)
    p = add("effects", cmd_effects)
    p.add_argument("session")
    show_secrets(p)
    show_secrets(add("in-doubt", cmd_in_doubt))
    p = add("resolve", cmd_resolve)
    p.add_argument("session")
    p.add_argument("tool_use_id")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--happened",
        dest="happened",
        action="store_true",
        help="the effect took place (answer the model with --result)",
    )
    how.add_argument(
        "--not-happened",
        dest="happened",
        action="store_false",
        help="it did not take place: the call runs on the next run",
    )
    p.add_argument("--result", help="JSON the model is told (with --happened)")
    p.add_argument("--by", default=getpass.getuser(), help="who decides (default: you)")
    p.add_argument(
        "--force",
        action="store_true",
        help="settle it even though its attempt may still be running (its worker is alive, its "
        "lease held or its deadline not passed): only if you know that worker is gone for good",
    )
    p = add("approvals", cmd_approvals)
    p.add_argument("session", nargs="?", help="only this session")
    p.add_argument("--all", action="store_true", help="decided and used requests too")
    show_secrets(p)
    for name, handler in (("approve", cmd_approve), ("deny", cmd_deny)):
        p = add(name, handler)
        p.add_argument("session")
        p.add_argument("tool_use_id")
        p.add_argument("--by", default=getpass.getuser(), help="who decides (default: you)")
    add("verify", cmd_verify)
    p = add("audit", cmd_audit)
    p.add_argument("target", metavar="MODULE:TOOLSET", help="e.g. examples.brief_tools:TOOLS")
    p = add("resume-all", cmd_resume_all)
    p.add_argument(
        "--agent",
        required=True,
        metavar="MODULE:ATTR",
        help="your Agent, or a function taking the store and returning one",
    )
    p.add_argument("--workers", type=int, default=1, help="sessions resumed at once")
    p = add("bench", cmd_bench)
    p.add_argument("--quick", action="store_true", help="about a minute")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.store = getattr(args, "store", None)
    args.json = getattr(args, "json", False)
    console = Console()
    handler: Handler = args.handler
    try:
        return handler(args, console)
    except ToolLedgerError as exc:
        if getattr(args, "json", False):
            _emit_json({"error": type(exc).__name__, "message": str(exc)})
        else:
            Console(stderr=True).print(safe(f"{type(exc).__name__}:", "red"), safe(f" {exc}"))
        return 1


if __name__ == "__main__":
    sys.exit(main())
