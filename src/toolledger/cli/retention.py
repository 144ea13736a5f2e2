"""The retention commands: ``prune`` old sessions, ``export`` one as JSON lines first."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console

from .._invisible import json_invisible_escaped
from .._shell import shown
from .._views.format import when
from .._views.overview import known_session
from ..errors import ConfigurationError
from ..masking import masked
from ..records import StoredMessage
from ..stores.retention import PruneReport
from . import render
from ._command import emit_json, no_session, store_of
from .branching import branch_json
from .output import Col, Grid, Out
from .render import safe, safe_id

__all__ = ["cmd_export", "cmd_prune", "duration"]

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0, "w": 604_800.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def duration(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` as seconds (an ``argparse`` type)."""
    m = _DURATION.fullmatch(text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration: a number and a unit, s, m, h, d or w (e.g. 30d)"
        )
    return float(m[1]) * _UNITS[m[2]]


def spoken(seconds: float) -> str:
    """``seconds`` as ``duration`` reads it, in the largest unit that holds it whole (30d, not
    2.592e+06s): what the user wrote, or the same age said as plainly."""
    for unit, size in sorted(_UNITS.items(), key=lambda item: -item[1]):
        if seconds >= size and (seconds / size).is_integer():
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def cmd_prune(args: argparse.Namespace, console: Console) -> int:
    """Remove ended sessions (completed, max_turns, failed, or records alone) idle for longer
    than --older-than, one transaction each: state, transcript, records, approvals. Never one
    with a call in progress or in doubt, a pending approval or a held lease. Their calls are
    forgotten: `toolledger export` keeps a copy first."""
    with store_of(args, write=not args.dry_run) as store:
        report = store.prune(older_than=args.older_than, status=args.status, dry_run=args.dry_run)
    if args.json:
        emit_json(_report_json(report))
        return 0
    verb = "would remove" if report.dry_run else "removed"
    out = Out(console)
    if report.removed:
        columns = ("session", "status", "last activity", "messages", "records", "approvals")
        table = Grid(f"{verb} {len(report.removed)} session(s)", [Col(c) for c in columns])
        for p in report.removed:
            table.add(
                safe_id(p.session_id),
                p.status.value if p.status else "records only",
                when(p.last_activity),
                str(p.messages),
                str(p.records),
                str(p.approvals),
            )
        out.grid(table)
    else:
        out.note(
            f"nothing to remove: no ended session idle for longer than {spoken(args.older_than)}"
        )
    for k in report.kept:
        out.note(
            safe("kept ", "yellow"), safe_id(k.session_id, "yellow"), safe(f": {k.why}", "yellow")
        )
    return 0


def _report_json(report: PruneReport) -> dict[str, Any]:
    return {
        "dry_run": report.dry_run,
        "removed": [
            {
                "session_id": p.session_id,
                "status": p.status.value if p.status else None,
                "last_activity": p.last_activity,
                "messages": p.messages,
                "records": p.records,
                "approvals": p.approvals,
            }
            for p in report.removed
        ],
        "kept": [{"session_id": k.session_id, "why": k.why} for k in report.kept],
    }


def _message(m: StoredMessage, reveal: bool) -> dict[str, Any]:
    return {
        "seq": m.seq,
        "role": m.role,
        "content": m.content if reveal else masked(m.content),
        "created_at": m.created_at,
    }


def cmd_export(args: argparse.Namespace, console: Console) -> int:
    """Write one session as JSON lines: its state (with how forks and rewinds made it), every
    message, every message of its abandoned branches, every ledger record, every approval
    request and its lease, one object per line with its "kind". Secrets are masked
    unless --show-secrets (for a faithful copy to keep before `prune`)."""
    with store_of(args) as store:
        if not known_session(store, args.session):
            return no_session(console, args, store)
        sid = args.session
        reveal = args.show_secrets
        state = store.session(sid)
        lines: list[dict[str, Any]] = [
            {"kind": "session", "session_id": sid}
            | ({"state": render.session_json(state)} if state else {"state": None})
            | {"lineage": [branch_json(b, reveal=reveal) for b in state.lineage] if state else []}
        ]
        lines += [{"kind": "message"} | _message(m, reveal) for m in store.messages(sid)]
        lines += [
            {"kind": "abandoned", "branch": n} | _message(m, reveal)
            for n, messages in store.abandoned(sid).items()
            for m in messages
        ]
        lines += [
            {"kind": "effect"} | render.effect_json(r, reveal=reveal)
            for r in store.ledger(sid).records()
        ]
        lines += [
            {"kind": "approval"} | render.approval_json(a, reveal=reveal)
            for a in store.approvals(sid)
        ]
        lease = store.lease(sid)
        if lease is not None:
            lines.append(
                {
                    "kind": "lease",
                    "owner": lease.owner,
                    "token": lease.token,
                    "expires_at": lease.expires_at,
                }
            )
    if args.output is None:
        _write(sys.stdout, lines)
    elif Path(args.output).exists() and not Path(args.output).is_file():
        # A device or a pipe (/dev/stdout, a shell's >(…)): written to, never replaced.
        try:
            with open(args.output, "w", encoding="utf-8") as fh:
                _write(fh, lines)
        except OSError as exc:
            raise ConfigurationError(
                f"cannot write --output {shown(str(args.output))}: {exc.strerror or exc}."
            ) from exc
    else:
        # Created private (it may hold what --show-secrets revealed) under a name of its own —
        # a new file (``mkstemp``: 0600, never one left over or planted, never through a link)
        # — then put in place whole.
        target = Path(args.output)
        tmp: str | None = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            with open(fd, "w", encoding="utf-8") as fh:
                _write(fh, lines)
            os.replace(tmp, target)
            tmp = None
        except OSError as exc:
            raise ConfigurationError(
                f"cannot write --output {shown(str(args.output))}: {exc.strerror or exc}. "
                "Name a file in a directory that exists and that you may write to."
            ) from exc
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        Out(console).line(
            safe(f"wrote {len(lines)} lines of session "),
            safe_id(sid),
            safe(" to "),
            safe_id(args.output),  # a no-break space, a tab in the path shown, not sent
        )
    return 0


def _write(fh: TextIO, lines: list[dict[str, Any]]) -> None:
    for line in lines:
        text = json.dumps(line, ensure_ascii=False, separators=(",", ":"))
        fh.write(json_invisible_escaped(text) + "\n")
