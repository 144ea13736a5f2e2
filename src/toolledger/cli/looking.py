"""The commands that look: ``sessions``, ``show``, ``effects``, ``in-doubt``, ``verify``."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.text import Text

from .._liveness import Over, Running
from .._shell import shown
from .._verify import Problem, Severity, verify
from .._views.overview import known_session, lineage_sessions, overview, settled_since
from .._views.timeline import timeline_window
from .._views.window import window_of
from ..errors import CorruptLedgerError
from ..records import RunStatus
from . import render
from ._command import emit_json, no_session, store_of, url_of
from .branching import branch_json, branch_lines
from .output import Layout, Out
from .render import safe, safe_id

__all__ = [
    "cmd_effects",
    "cmd_in_doubt",
    "cmd_sessions",
    "cmd_show",
    "cmd_verify",
]


def cmd_sessions(args: argparse.Namespace, console: Console) -> int:
    """List sessions: agent sessions with their status, and ledgers used on their own."""
    with store_of(args) as store:
        seen = overview(store)
        # Only sessions stopped for a person are looked into (``settled_since``).
        settled = {s.session_id: settled_since(store, s) for s in seen.states}
        lineages = {s.session_id: lineage_sessions(store, s) for s in seen.states if s.reason}
        url = store.url
    states, ledger_only, held, calls = seen.states, seen.ledger_only, seen.held, seen.calls
    if args.json:
        emit_json(
            {
                "sessions": [
                    {
                        **render.session_json(s),
                        # stopped for a person, and settled since: the reason is history
                        "settled_since": settled[s.session_id],
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
        summary = seen.started_summary()
        text = {sid: h["text"] for sid, h in held.items()}
        known = {sid: v for sid, v in settled.items() if v is not None}
        out = Out(console)
        shown = url if out.terminal else None
        grid = render.sessions_table(
            states, ledger_only, text, summary, known, url=shown, lineages=lineages
        )
        if out.grid(grid) is not Layout.TSV:
            for s in states:
                if not known.get(s.session_id):  # settled since: history, nothing to run
                    commands = render.reason_parts(
                        s.reason or "", lineages.get(s.session_id, set()), url
                    )[1]
                    out.reason_commands(safe_id(s.session_id), commands)
    return 0


def cmd_show(args: argparse.Namespace, console: Console) -> int:
    """Show one session: its state and a timeline of turns, tool calls, ledger and approvals."""
    with store_of(args) as store:
        if not known_session(store, args.session):
            return no_session(console, args, store)
        state = store.session(args.session)
        settled = settled_since(store, state) if state else None
        lineage = lineage_sessions(store, state) if state else set()
        url = store.url
        events, window = timeline_window(
            store,
            args.session,
            lambda total: window_of(args, total, "turn"),
            reveal=args.show_secrets,
        )
    if args.json:
        emit_json(
            {
                "window": window.as_json(),
                "session": {**render.session_json(state), "settled_since": settled}
                if state
                else None,
                "lineage": [branch_json(b, reveal=args.show_secrets) for b in state.lineage]
                if state
                else [],
                "timeline": render.timeline_json(events),
            }
        )
        return 0
    out = Out(console)
    if state is not None:
        out.note(
            safe_id(state.session_id, "bold"),
            ": ",
            render.styled(state.status.value),
            f" — {state.turns} turn{'' if state.turns == 1 else 's'}, "
            f"{state.input_tokens}/{state.output_tokens} tokens",
        )
        if state.reason:
            # On a screen each command on a line of its own, whole (docs/design.md, rule 21);
            # in a pipe the reason is one comment line, as stored, and the rows are TSV alone.
            words, commands = render.reason_parts(state.reason, lineage, url)
            out.note(safe(f"  {words if out.terminal else state.reason}"))
            if settled:
                out.note(safe(f"  {render.SETTLED_SINCE}"))
            elif out.terminal:
                for c in commands:
                    out.command(c)
        for b in state.lineage:
            for line in branch_lines(b, reveal=args.show_secrets):
                out.note(Text("  ").append_text(line))
    if window.note():
        out.note(window.note())
    out.grid(render.timeline_table(events, f"timeline of {args.session}"))
    if window.note():
        out.note(window.note())
    return 0


def cmd_effects(args: argparse.Namespace, console: Console) -> int:
    """List the ledger records of one session."""
    with store_of(args) as store:
        if not known_session(store, args.session):
            return no_session(console, args, store)
        records = store.ledger(args.session).records()
    window = window_of(args, len(records), "record")
    records = records[window.first - 1 : window.last]
    if args.json:
        emit_json([render.effect_json(r, reveal=args.show_secrets) for r in records])
        return 0
    out = Out(console)
    if window.note():
        out.note(window.note())
    out.grid(render.effects_table(records, f"effects of {args.session}", reveal=args.show_secrets))
    if window.note():
        out.note(window.note())
    return 0


def cmd_in_doubt(args: argparse.Namespace, console: Console) -> int:
    """List every call that started and has no outcome, in every session: in doubt (its attempt
    is over: a person may settle it) or still in progress (its worker may still be running it:
    leave it alone)."""
    with store_of(args) as store:
        started = store.started(watch=args.watch)
    if args.json:
        emit_json([render.effect_json(r, reveal=args.show_secrets, verdict=v) for r, v in started])
        return 0
    watching = [v for _, v in started if isinstance(v, Running) and v.watch and not v.renewed]
    out = Out(console)
    if watching:
        wait = max(v.watch or 0.0 for v in watching)
        out.note(  # a comment line in a pipe, as every remark about the rows
            Text(
                f"{len(watching)} of these can be judged only by watching their workers' "
                f"leases from here: run with --watch {wait:.0f} to tell the live from the dead",
                style="yellow",
            )
        )
    doubt = [(r, v) for r, v in started if isinstance(v, Over)]
    running = [(r, v) for r, v in started if not isinstance(v, Over)]
    if running:
        out.grid(render.in_progress_table(running))
    if doubt:
        url = url_of(args)
        if out.grid(render.in_doubt_table(doubt, url=url)) is Layout.TABLE:
            out.line("")
            out.line("settle each call with exactly one of its two commands:")
            for note, line in render.settle_commands(doubt, url=url):
                out.command(line, note=note)
    if not started:
        out.note("no call is in doubt")
    elif not doubt:
        out.note("no call is in doubt (the calls above are still in progress)")
    return 0


def _unreadable(exc: CorruptLedgerError, url: str) -> Problem:
    """A store too damaged to open is verify's finding — what is damaged, and what can still
    be done — not an error that sends the reader back to verify."""
    why = str(exc).split(" It is not read as empty", 1)[0].rstrip(".")
    salvage = (
        " An SQLite file's readable rows may be salvaged into a new one (`sqlite3 DAMAGED "
        ".recover | sqlite3 NEW`), which verify can then check."
        if url.startswith("sqlite:")
        else ""
    )
    return Problem(
        Severity.ERROR,
        None,
        f"{why}: nothing of it can be read, and it is not read as empty (that would re-run "
        f"every recorded effect). Restore it from a backup.{salvage}",
    )


def cmd_verify(args: argparse.Namespace, console: Console) -> int:
    """Check the store's integrity and that every transcript agrees with its ledger."""
    try:
        opened = store_of(args)
    except CorruptLedgerError as exc:  # too damaged to open: that is the finding
        url = exc.url or url_of(args)
        problems = [_unreadable(exc, url)]
    else:
        with opened as store:
            problems = verify(store)
            url = store.url
    errors = [p for p in problems if p.severity is Severity.ERROR]
    if args.json:
        emit_json(
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
        out = Out(console)
        for p in problems:
            style = "red" if p.severity is Severity.ERROR else "yellow"
            # The session as every id is shown: on one line, a space that is not U+0020 (or
            # one at its end) escaped, so two sessions that print alike read apart.
            where = [safe("["), safe_id(p.session_id), safe("] ")] if p.session_id else []
            # One finding, one line: a line break in what it quotes (a call's id, a worker's
            # name) is shown escaped, never starting a line that passes for a finding or a
            # command of its own.
            out.line(safe(p.severity.value, style), " ", *where, Text(shown(p.message)))
        out.line(
            safe(f"{url}: "),
            safe("ok", "green") if not errors else safe(f"{len(errors)} error(s)", "red"),
        )
    return 1 if errors else 0
