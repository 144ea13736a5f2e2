"""The commands that settle: ``resolve`` an in-doubt call, list ``approvals``, ``approve`` and
``deny`` them."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from .._shell import shown_id
from .._views.overview import known_session
from .._views.results import parse_result
from ..approvals import _queue as approvals
from ..approvals._terminal import user
from ..errors import EffectInProgressError, NotInDoubtError, NotPendingError
from ..records import Status
from . import render
from ._command import emit_json, no_session, store_of, url_of
from .output import Out
from .render import safe, safe_id

__all__ = ["cmd_approvals", "cmd_approve", "cmd_deny", "cmd_resolve", "parse_result"]


def cmd_resolve(args: argparse.Namespace, console: Console) -> int:
    """Settle an in-doubt call: it --happened (optionally with --result JSON) or
    --not-happened (it will run on the next run of the session)."""
    result = None
    if args.result is not None:
        # Usage errors, as argparse's own: on stderr (with --json too, stdout stays empty).
        err = Console(stderr=True)
        if not args.happened:
            err.print(
                "[red]--result goes with --happened (what the model is told it returned); a "
                "call that did not happen has no result[/red]"
            )
            return 2
        try:
            result = parse_result(args.result)
        except ValueError as exc:
            err.print(f"[red]--result is not JSON the model can be told: {escape(str(exc))}[/red]")
            return 2
    with store_of(args, write=True) as store:
        try:
            record = store.ledger(args.session).resolve(
                args.tool_use_id,
                happened=args.happened,
                result=result,
                by=args.by,
                force=args.force,
                watch=args.watch,
            )
        except NotInDoubtError:
            if not known_session(store, args.session):  # a mistyped session, most likely
                return no_session(console, args, store)
            raise
        except EffectInProgressError as exc:
            return _in_progress(args, exc, url_of(args))
    if args.json:
        emit_json(render.effect_json(record))
    else:
        what = _call_in(args.session, safe_id(args.tool_use_id)).append(" resolved: ")
        _settled(console, what, record.status.value, f" (by {shown_id(args.by)})")
        if args.force and record.error and "forced while" in record.error:
            Out(console).line(safe(record.error, "yellow"))
    return 0


def _in_progress(args: argparse.Namespace, exc: EffectInProgressError, url: str) -> int:
    """A call whose attempt may still run is not settled: say so, and then — whole, quoted,
    alone on its line — the one command that settles it anyway, the same way (the same
    ``--result``, the same ``--by``), for a person who knows that worker is gone for good."""
    options = ["--happened" if args.happened else "--not-happened"]
    if args.result is not None:
        options += ["--result", args.result]
    if args.by != user():
        options += ["--by", args.by]
    forcing = render.command(
        "resolve", args.session, args.tool_use_id, options=[*options, "--force"], url=url
    )
    if args.json:
        emit_json({"error": type(exc).__name__, "message": str(exc), "force_command": forcing})
        return 1
    err = Console(stderr=True)
    err.print(safe(f"{type(exc).__name__}:", "red"), safe(str(exc)), soft_wrap=True)
    out = Out(err)
    out.line(
        safe(
            "Only if you know that worker is gone for good (its machine or container will not "
            "come back), settle it anyway with:",
            "yellow",
        )
    )
    out.command(forcing)
    return 1


def cmd_approvals(args: argparse.Namespace, console: Console) -> int:
    """List approval requests waiting for a person (--all: every request)."""
    with store_of(args) as store:
        if args.all:
            records = sorted(store.approvals(args.session), key=lambda a: a.requested_at)
        else:
            records = approvals.pending(store, args.session)
    if args.json:
        emit_json([render.approval_json(a, reveal=args.show_secrets) for a in records])
    elif records:
        Out(console).grid(render.approvals_table(records, reveal=args.show_secrets))
    else:
        Out(console).note("no approval request" + ("" if args.all else " is waiting"))
    return 0


def _decide(args: argparse.Namespace, console: Console, approved: bool) -> int:
    with store_of(args, write=True) as store:
        try:
            record = approvals.decide(
                store,
                args.session,
                args.tool_use_id,
                approved=approved,
                by=args.by,
                input_hash=args.input_hash,
                in_doubt=None if args.in_doubt is None else args.in_doubt == "yes",
                attempt=args.attempt,
            )
        except NotPendingError:
            if not known_session(store, args.session):  # a mistyped session, most likely
                return no_session(console, args, store)
            raise
        call_now = store.ledger(record.session_id).get(record.tool_use_id)
    still_in_doubt = record.in_doubt and call_now is not None and call_now.status is Status.STARTED
    if args.json:
        emit_json(render.approval_json(record))
        return 0
    call = Text.assemble(safe_id(record.tool), " (", safe_id(record.tool_use_id), ")")
    what = _call_in(record.session_id, call).append(": ")
    if not approved and still_in_doubt:
        # A no to running it again is not a word on whether it happened: the call stays in
        # doubt, and a run would stop on it again. Its resolve is what comes next.
        out = Out(console)
        out.line(
            what,
            render.styled(record.status.value),
            safe(f" by {shown_id(str(record.decided_by))}."),
        )
        out.line(
            safe(
                "It is still in doubt: it will not be run again, and a run stops on it until "
                "it is settled with exactly one of these two commands:",
                "yellow",
            )
        )
        sid, tid = record.session_id, record.tool_use_id
        for flag, note in (
            ("--happened", "it took effect"),
            ("--not-happened", "it did not take effect: the call runs on the next run"),
        ):
            out.command(
                render.command("resolve", sid, tid, options=[flag], url=url_of(args)), note=note
            )
        return 0
    _settled(console, what, record.status.value, f" by {shown_id(str(record.decided_by))}")
    if approved and record.in_doubt:
        # The yes is to running it again, whatever the first attempt did. The call stays in
        # doubt until that run, so a resolve still settles it — and then nothing runs again.
        out = Out(console)
        out.line(
            safe(
                "It was in doubt: it may already have happened, and the next run executes it "
                "again (a second effect if it had). If it did happen, settle it instead, before "
                "that run:",
                "yellow",
            )
        )
        happened = ["--happened"]
        sid, tid = record.session_id, record.tool_use_id
        out.command(render.command("resolve", sid, tid, options=happened, url=url_of(args)))
    return 0


def cmd_approve(args: argparse.Namespace, console: Console) -> int:
    """Approve a pending request."""
    return _decide(args, console, True)


def cmd_deny(args: argparse.Namespace, console: Console) -> int:
    """Deny a pending request."""
    return _decide(args, console, False)


def _call_in(session_id: str, call: Text) -> Text:
    """A call as a settling command's line names it: a call's id is unique only within its
    session, so the session is named too."""
    return Text.assemble(call, " in session ", safe_id(session_id))


def _settled(console: Console, what: Text, status: str, by: str) -> None:
    """The line for a call a person settled: what (its ids shown as ids: a character that
    shows nothing is never sent raw), its new status, by whom, and what next."""
    Out(console).line(what, render.styled(status), safe(f"{by}. Run the session again to go on."))
