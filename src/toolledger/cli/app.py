"""``toolledger`` — look into a store, settle in-doubt calls, decide approvals, run the demo.

The store comes from ``--store URL``, else ``$TOOLLEDGER_STORE``, else ``sqlite:///toolledger.db``.
Every command takes ``--json`` for machine-readable output; otherwise a terminal gets tables (or
records, one field a line, when a table would not fit) and a pipe gets tab-separated lines
(``output``). The exit status is one of ``EXIT_CODES``. Every command is registered here
(``build_parser``); they are written in ``looking`` (what a store holds), ``history`` (a
session's turns), ``settling`` (in-doubt calls and approvals), ``retention`` (prune, export),
``running`` (resume-all, bench, audit, demo) and ``serving`` (the web console).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from .._version import __version__
from .._views.window import LAST_RECORDS, LAST_TURNS, add_window
from ..approvals._terminal import user
from ..errors import ToolLedgerError
from ..ops import PRUNABLE
from ..stores import DEFAULT_STORE_URL
from ._command import Handler, emit_json
from .branching import add_branching
from .history import cmd_history
from .looking import cmd_effects, cmd_in_doubt, cmd_sessions, cmd_show, cmd_verify
from .render import safe
from .retention import cmd_export, cmd_prune, duration
from .running import cmd_audit, cmd_bench, cmd_demo, cmd_resume_all
from .serving import TOKEN_ENV, cmd_console
from .settling import cmd_approvals, cmd_approve, cmd_deny, cmd_resolve

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_CLOSED_PIPE = 141

EXIT_CODES = {
    EXIT_OK: "done (for verify: the store is sound)",
    EXIT_FAILED: "the command could not do what it was asked (no such store or session, a call "
    "not in doubt, a store error; for verify: errors found; for demo: the story went wrong); "
    "the message says what happened and what to do",
    EXIT_USAGE: "the command line is wrong (an unknown option, a missing argument, --result "
    "that is not JSON)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
    EXIT_CLOSED_PIPE: "the reader of its output went away (`| head`): it stops quietly",
}


# -- the parser ----------------------------------------------------------------------------------


def _first_sentence(doc: str) -> str:
    """A command's one-line help: its docstring's first sentence, whole."""
    flat = " ".join(doc.split())
    end = flat.find(". ")
    return flat if end < 0 else flat[: end + 1]


def _watch(p: argparse.ArgumentParser, default: float) -> None:
    p.add_argument(
        "--watch",
        type=float,
        default=default,
        metavar="SECONDS",
        help="where a worker can be judged only by its lease's renewals (another host or "
        "container, no readable /proc), watch them for up to SECONDS to tell a live worker "
        "from a dead one; not at all when SECONDS could not tell it "
        f"(default: {default:g})",
    )


def _common(*, store: bool, json: bool = True) -> argparse.ArgumentParser:
    """The options every command takes. The demo makes its own store: its help offers no
    --store, and one given to it is refused (``_no_store_for_the_demo``), not ignored."""
    # SUPPRESS: an option given before the command must not be reset by the command's parser.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--store",
        default=argparse.SUPPRESS,
        help=f"store URL (default: $TOOLLEDGER_STORE or {DEFAULT_STORE_URL})"
        if store
        else argparse.SUPPRESS,
    )
    common.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="machine-readable output" if json else argparse.SUPPRESS,
    )
    return common


def build_parser() -> argparse.ArgumentParser:
    common = _common(store=True)
    parser = argparse.ArgumentParser(
        prog="toolledger",
        parents=[common],
        description="Inspect and repair toolledger stores: sessions, effects, in-doubt calls, "
        "approvals.",
        epilog="exit status: "
        + "; ".join(f"{code} {what.split(' (')[0]}" for code, what in EXIT_CODES.items()),
    )
    parser.add_argument("--version", action="version", version=f"toolledger {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(
        name: str, handler: Handler, *, store: bool = True, json: bool = True, **kwargs: Any
    ) -> argparse.ArgumentParser:
        doc = (handler.__doc__ or "").strip()
        parents = [common if store and json else _common(store=store, json=json)]
        p = sub.add_parser(
            name, parents=parents, help=_first_sentence(doc), description=doc, **kwargs
        )
        p.set_defaults(handler=handler)
        return p

    p = add("demo", cmd_demo, store=False)
    p.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="keep the demo's store and world here (default: a temporary directory)",
    )

    def show_secrets(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument(
            "--show-secrets",
            action="store_true",
            help="show the values of secret-looking fields (password, token, api_key, "
            "authorization, …) instead of ***",
        )
        return p

    add("sessions", cmd_sessions)
    _reading(add, show_secrets)
    add_branching(add, show_secrets)
    _watch(show_secrets(add("in-doubt", cmd_in_doubt)), 0.0)
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
    p.add_argument("--by", default=user(), help="who decides (default: you)")
    p.add_argument(
        "--force",
        action="store_true",
        help="settle it even though its attempt may still be running (its worker is alive, its "
        "lease held or its deadline not passed): only if you know that worker is gone for good",
    )
    _watch(p, 60.0)
    p = add("approvals", cmd_approvals)
    p.add_argument("session", nargs="?", help="only this session")
    p.add_argument("--all", action="store_true", help="decided and used requests too")
    show_secrets(p)
    for name, handler in (("approve", cmd_approve), ("deny", cmd_deny)):
        p = add(name, handler)
        p.add_argument("session")
        p.add_argument("tool_use_id")
        p.add_argument("--by", default=user(), help="who decides (default: you)")
        _as_shown(p)
    add("verify", cmd_verify)
    _console(add)
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
    _retention(add, show_secrets)
    p = add("bench", cmd_bench)
    p.add_argument("--quick", action="store_true", help="about a minute")
    return parser


def _attempt(text: str) -> int:
    try:
        attempt = int(text)
    except ValueError:
        attempt = -1
    if attempt < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not an attempt: a number, 0 or more")
    return attempt


def _as_shown(p: argparse.ArgumentParser) -> None:
    """``approve``/``deny``: the request as the person was shown it (``approvals --json``).
    Each one given binds the decision: a request that is another question by now is refused,
    not decided."""
    shown = p.add_argument_group(
        "the request as you were shown it (from `approvals --json`): a request that is "
        "another question by now is refused, not decided"
    )
    shown.add_argument(
        "--input-hash", metavar="HASH", help="its input_hash: decide it only for that input"
    )
    shown.add_argument(
        "--in-doubt",
        choices=("yes", "no"),
        help="its in_doubt: yes, to run again a call that may already have happened; no, a "
        "first run",
    )
    shown.add_argument(
        "--attempt", type=_attempt, metavar="N", help="its attempt: the attempt it asks about"
    )


def _reading(
    add: Callable[..., argparse.ArgumentParser],
    show_secrets: Callable[[argparse.ArgumentParser], object],
) -> None:
    """``show``, ``effects`` and ``history``: one session, its latest turns (or records) by
    default."""
    p = add("show", cmd_show)
    p.add_argument("session")
    add_window(p, "turn", LAST_TURNS)
    show_secrets(p)
    p = add("effects", cmd_effects)
    p.add_argument("session")
    add_window(p, "record", LAST_RECORDS)
    show_secrets(p)
    p = add("history", cmd_history)
    p.add_argument("session")
    add_window(p, "turn", LAST_TURNS)
    p.add_argument(
        "--tools",
        metavar="MODULE:TOOLSET",
        help="the session's tools, to show each call's effect class (e.g. myapp.tools:TOOLS)",
    )
    show_secrets(p)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port: a number 0-65535")
    return port


def _console(add: Callable[..., argparse.ArgumentParser]) -> None:
    p = add("console", cmd_console, json=False)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=_port, default=8765, help="port (default: 8765; 0: any free one)")
    p.add_argument(
        "--token",
        default=None,
        help=f"required on every request (default: ${TOKEN_ENV}); needed beyond 127.0.0.1",
    )
    p.add_argument(
        "--origin",
        default=None,
        metavar="URL",
        help="where browsers see the console, behind a proxy (e.g. https://ops.example.com): "
        "its forms are taken from there only; beyond this machine it needs a token",
    )


def _retention(
    add: Callable[..., argparse.ArgumentParser],
    show_secrets: Callable[[argparse.ArgumentParser], object],
) -> None:
    p = add("prune", cmd_prune)
    p.add_argument(
        "--older-than",
        type=duration,
        required=True,
        metavar="AGE",
        help="idle for longer than this: 30d, 12h, 90m, 45s, 2w",
    )
    p.add_argument(
        "--status",
        choices=sorted(s.value for s in PRUNABLE),
        help="only sessions that ended so (default: every ended session, and sessions of "
        "records alone; a ready session — forked or rewound, not run since — only when asked "
        "for)",
    )
    p.add_argument("--dry-run", action="store_true", help="remove nothing; say what would go")
    p = add("export", cmd_export)
    p.add_argument("session")
    p.add_argument("--output", "-o", help="write to this file (default: standard output)")
    show_secrets(p)


class _Console(Console):
    """rich's console, leaving a closed pipe to ``main`` (rich exits 1 on its own)."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError


def main(argv: list[str] | None = None) -> int:
    """Run one command; return its exit status (``EXIT_CODES``)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _no_store_for_the_demo(parser, args)
    _no_empty_store(parser, args)
    if args.handler is cmd_console and getattr(args, "json", False):
        parser.error(
            "console serves web pages: it has no --json. The commands that print (sessions, "
            "show, in-doubt …) take --json."
        )
    args.store = getattr(args, "store", None)
    args.json = getattr(args, "json", False)
    console = _Console()
    handler: Handler = args.handler
    try:
        code = handler(args, console)
        sys.stdout.flush()
    except ToolLedgerError as exc:
        if getattr(args, "json", False):
            emit_json({"error": type(exc).__name__, "message": str(exc)})
        else:
            _Console(stderr=True).print(
                safe(f"{type(exc).__name__}:", "red"), safe(str(exc)), soft_wrap=True
            )
        return EXIT_FAILED
    except BrokenPipeError:
        return _closed_pipe()
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return code


def _no_store_for_the_demo(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--store`` with ``demo``, before or after the command, is a usage error (exit 2): the
    demo makes its own store, so the one named would be silently ignored."""
    if args.handler is cmd_demo and hasattr(args, "store"):
        parser.error(
            "demo takes no --store: it makes its own store, demo.db in --dir DIR (or in a "
            "temporary directory, removed when it ends). Drop --store; use --dir DIR to keep "
            "the store and look at it afterwards."
        )


def _no_empty_store(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--store ""`` is a usage error (exit 2), not the default store: a script's
    ``--store "$STORE"`` with ``$STORE`` unset would otherwise act on another store than the
    one it names."""
    store = getattr(args, "store", None)
    if store is not None and not store.strip():
        parser.error(
            '--store was given an empty URL (an unset variable in --store "$STORE"?). Name '
            f"the store, or leave --store out for $TOOLLEDGER_STORE or {DEFAULT_STORE_URL}."
        )


def _closed_pipe() -> int:
    """Whoever read our output stopped reading (``toolledger sessions | head``): stop, print no
    traceback, and let nothing more be flushed into the closed pipe at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return EXIT_CLOSED_PIPE


if __name__ == "__main__":
    sys.exit(main())
