"""``toolledger history``: a session's turns — when, what the model asked for, and each call's
tool, effect class and disposition in the ledger (see ``toolledger.stores._history``).

Everything shown is data from the store: printed literally (``safe``), secrets masked unless
``--show-secrets``, ids never cut. The model's text is shortened in the table only; ``--json``
has it whole.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console

from .._views.format import when
from .._views.overview import known_session
from .._views.window import window_of
from ..masking import masked, masked_text
from ..stores._history import CallState, Turn, TurnCall
from ..tools import ToolSet
from ._command import emit_json, no_session, store_of
from .branching import branch_lines, branches_json
from .output import Col, Grid, Out
from .render import preview, safe, safe_id

__all__ = ["cmd_history", "history_json", "history_table"]

DISPOSITION_STYLE = {
    CallState.SUCCEEDED: "green",
    CallState.FAILED: "red",
    CallState.IN_PROGRESS: "bold yellow",
    CallState.IN_DOUBT: "bold red",
    CallState.DECLINED: "yellow",
    CallState.NOT_HAPPENED: "magenta",
    CallState.NOT_RECORDED: "dim",
}


def cmd_history(args: argparse.Namespace, console: Console) -> int:
    """Show a session's history: every turn (one per model reply), when, what the model asked
    for, and each call's tool, effect class (with --tools) and disposition in the ledger; then
    the forks and rewinds that made it, with what they left behind and abandoned."""
    tools: ToolSet | None = None
    if args.tools:
        from .audit import load_toolset

        tools = load_toolset(args.tools)
    with store_of(args) as store:
        if not known_session(store, args.session):
            return no_session(console, args, store)
        turns = store.history(args.session, tools=tools)
        branches = store.branches(args.session, tools=tools)
    window = window_of(args, len(turns), "turn")
    turns = turns[window.first - 1 : window.last]
    reveal = args.show_secrets
    if args.json:
        emit_json(
            {
                "window": window.as_json(),
                "session_id": args.session,
                "turns": history_json(turns, reveal=reveal),
                "branches": branches_json(
                    branches, lambda ts: history_json(ts, reveal=reveal), reveal=reveal
                ),
            }
        )
        return 0
    out = Out(console)
    if window.note():
        out.note(window.note())
    out.grid(history_table(turns, f"history of {args.session}", reveal=reveal))
    if window.note():
        out.note(window.note())
    for h in branches:
        for line in branch_lines(h.branch, reveal=reveal):
            out.note(line)
        if h.abandoned:
            title = f"abandoned branch {h.branch.branch} of {args.session}"
            out.grid(history_table(list(h.abandoned), title, reveal=reveal))
    return 0


def history_json(turns: list[Turn], *, reveal: bool = False) -> list[dict[str, Any]]:
    """The turns as JSON, whole (nothing cut), secrets masked unless ``reveal``."""
    return [
        {
            "turn": t.number,
            "at": t.at,
            "text": t.text if reveal else masked_text(t.text),
            "calls": [_call_json(c, reveal) for c in t.calls],
        }
        for t in turns
    ]


def _call_json(c: TurnCall, reveal: bool) -> dict[str, Any]:
    return {
        "tool_use_id": c.tool_use_id,
        "tool": c.tool,
        "input": c.input if reveal else masked(c.input),
        "effect": None if c.effect is None else c.effect.value,
        "disposition": c.disposition.value,
        "why": c.why or None,
        "result": c.result if reveal else masked_text(c.result),
    }


def history_table(turns: list[Turn], title: str, *, reveal: bool = False) -> Grid:
    """One row per call, the turn's number, time and text on its first (a turn without calls
    has one row). Ids are whole; the text, inputs and results the model was told are previews
    (``--json``: whole)."""
    table = Grid(
        title,
        [
            Col("turn"),
            Col("when"),
            Col("model said", preview=True),
            Col("tool_use_id"),
            Col("asks", preview=True, words=True),  # the tool's name, then its input
            Col("effect"),
            Col("disposition"),
            Col("told", preview=True),
        ],
    )
    for t in turns:
        text = t.text if reveal else masked_text(t.text)
        head = [safe(t.number), safe(when(t.at)), safe(preview(text, 60))]
        blank = [safe(t.number), safe(when(t.at)), safe("")]
        for i, c in enumerate(t.calls):
            shown = json.dumps(c.input if reveal else masked(c.input), ensure_ascii=False)
            table.add(
                *(head if i == 0 else blank),
                safe_id(c.tool_use_id),
                safe_id(c.tool).append_text(safe(f" {preview(shown, 40)}")),
                safe("?" if c.effect is None else c.effect.value),
                safe(c.disposition.value, DISPOSITION_STYLE[c.disposition]),
                safe(preview(c.result if reveal else masked_text(c.result), 40)),
            )
        if not t.calls:
            table.add(*head, *[safe("")] * 5)
    if not turns:
        table.caption = "no turns: the session has no transcript (a ledger used on its own)"
    elif any(c.effect is None for t in turns for c in t.calls):
        table.caption = "effect ?: a tool not given (--tools MODULE:TOOLSET names them)"
    return table
