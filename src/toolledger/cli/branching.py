"""``toolledger fork`` and ``toolledger rewind`` (see ``toolledger.branches._branching``), and how
the
branches of a session are shown by ``history`` and ``show``.

Everything shown is data from the store: printed literally (``safe``), secrets masked unless
``--show-secrets``, ids never cut; the command a person is told to run next is shell-quoted.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.text import Text

from .._lineage import Branch, BranchKind, ForkedEffect
from .._views.branch import STATE_STYLE, rewound, told
from .._views.format import when
from .._views.overview import known_session
from ..approvals._terminal import user
from ..branches._branching import fork, rewind
from ..masking import masked, masked_text
from ..stores._history import BranchHistory
from ..tools import ToolSet
from ._command import emit_json, no_session, store_of
from .output import Out
from .render import preview, safe, safe_id

__all__ = [
    "add_branching",
    "branch_json",
    "branch_lines",
    "cmd_fork",
    "cmd_rewind",
    "effect_json",
    "rewound",
    "told",
]


def cmd_fork(args: argparse.Namespace, console: Console) -> int:
    """Fork a session: a new session whose transcript is this one's through the end of turn K,
    carrying a copy of every ledger record of its lineage (the calls of the turns it keeps and
    those after turn K, so none of them runs again on the fork). Every call after turn K that
    took effect (or may have) is listed on the fork and, unless --ignore-effects, told to the
    model in a note."""
    with store_of(args, write=True) as store:
        if not known_session(store, args.session):
            return no_session(console, args, store)
        new = fork(
            store,
            args.session,
            at_turn=args.at_turn,
            new_session=args.as_session,
            effects_after_fork="ignore" if args.ignore_effects else "tell",
            tools=_tools(args),
            by=args.by,
        )
        state = store.session(new)
    entry = state.lineage[-1] if state is not None else None
    if args.json:
        emit_json({"session_id": new, "branch": None if entry is None else branch_json(entry)})
        return 0
    out = Out(console)
    out.line(
        safe("forked "),
        safe_id(args.session, "bold"),
        safe(f" at turn {args.at_turn} into "),
        safe_id(new, "bold"),
    )
    if entry is not None:
        for line in branch_lines(entry, reveal=args.show_secrets):
            out.line(line)
    out.line(safe(f"next: {_run_hint(new)}"))
    return 0


def cmd_rewind(args: argparse.Namespace, console: Console) -> int:
    """Rewind a session to the end of turn K, in place. The later turns are kept as an abandoned
    branch (see `toolledger history`), never deleted; every call of them that took effect (or
    may have) is listed and, unless --ignore-effects, told to the model in a note."""
    with store_of(args, write=True) as store:
        if not known_session(store, args.session):
            return no_session(console, args, store)
        entry = rewind(
            store,
            args.session,
            to_turn=args.to_turn,
            effects_after_fork="ignore" if args.ignore_effects else "tell",
            tools=_tools(args),
            by=args.by,
        )
    if args.json:
        emit_json({"session_id": args.session, "branch": branch_json(entry)})
        return 0
    out = Out(console)
    out.line(safe("rewound "), safe_id(args.session, "bold"), safe(f" to turn {args.to_turn}"))
    for line in branch_lines(entry, reveal=args.show_secrets):
        out.line(line)
    out.line(safe(f"next: {_run_hint(args.session)}"))
    return 0


def add_branching(add: Any, show_secrets: Any) -> None:
    """The ``fork`` and ``rewind`` commands and their options."""
    p = add("fork", cmd_fork)
    p.add_argument("session")
    p.add_argument("--at-turn", type=int, required=True, metavar="K", help="the last turn kept")
    p.add_argument(
        "--as", dest="as_session", metavar="NEW", help="the new session's id (default: made up)"
    )
    _common(p, show_secrets)
    p = add("rewind", cmd_rewind)
    p.add_argument("session")
    p.add_argument("--to-turn", type=int, required=True, metavar="K", help="the last turn kept")
    _common(p, show_secrets)


def _common(p: argparse.ArgumentParser, show_secrets: Any) -> None:
    p.add_argument(
        "--ignore-effects",
        action="store_true",
        help="list the effects left behind but do not tell the model of them",
    )
    p.add_argument(
        "--tools",
        metavar="MODULE:TOOLSET",
        help="the session's tools: calls of read_only tools are then left out of the note",
    )
    p.add_argument("--by", default=user(), help="who branches (default: you)")
    show_secrets(p)


def _tools(args: argparse.Namespace) -> ToolSet | None:
    if not args.tools:
        return None
    from .audit import load_toolset

    return load_toolset(args.tools)


def _run_hint(session: str) -> str:
    return f"agent.run(session={session!r}) goes on from there (a prompt given is appended first)"


# -- showing branches ------------------------------------------------------------------------------


def branch_lines(b: Branch, *, reveal: bool = False) -> list[Text]:
    """A branch in a few lines: where from, when, by whom, and each effect it left behind."""
    fork = b.kind is BranchKind.FORK
    head = f"forked from {b.source!r} at turn {b.turn}" if fork else rewound(b)
    who = f" by {b.by}" if b.by else ""
    out = [safe(f"{head}, {when(b.at)}{who} — {told(b)}")]
    for e in b.effects:
        out.append(_effect_line(e, reveal))
    return out


def _effect_line(e: ForkedEffect, reveal: bool) -> Text:
    shown = json.dumps(e.input if reveal else masked(e.input), ensure_ascii=False)
    line = Text("  - ")
    line.append_text(safe(e.state, STATE_STYLE.get(e.state, "")))
    line.append_text(safe(" "))
    line.append_text(safe_id(e.tool))
    line.append_text(safe(f" {preview(shown, 60)} "))
    line.append_text(safe_id(e.tool_use_id))
    if e.session_id:
        line.append_text(Text(" (in ", "dim").append_text(safe_id(e.session_id, "dim")))
        line.append_text(Text(")", "dim"))
    return line


def branch_json(b: Branch, *, reveal: bool = False) -> dict[str, Any]:
    return {
        "kind": b.kind.value,
        "source": b.source,
        "turn": b.turn,
        "at": b.at,
        "by": b.by,
        "told": b.told,
        "branch": b.branch,
        "effects": [effect_json(e, reveal=reveal) for e in b.effects],
    }


def effect_json(e: ForkedEffect, *, reveal: bool = False) -> dict[str, Any]:
    return {
        "session_id": e.session_id,
        "tool_use_id": e.tool_use_id,
        "tool": e.tool,
        "input": e.input if reveal else masked(e.input),
        "state": e.state,
        "result": e.result if reveal else masked_text(e.result),
        "at": e.at,
    }


def branches_json(
    branches: Sequence[BranchHistory], turns_json: Any, *, reveal: bool = False
) -> list[dict[str, Any]]:
    """Each branch as JSON, with a rewind's abandoned turns (``turns_json`` renders them)."""
    return [
        {**branch_json(h.branch, reveal=reveal), "abandoned": turns_json(list(h.abandoned))}
        for h in branches
    ]
