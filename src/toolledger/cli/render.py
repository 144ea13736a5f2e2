"""Turning records into tables and JSON for the command line.

Everything read from a store is data: it is printed literally (rich markup in a result or a
session id is shown, never interpreted; terminal control characters are shown escaped), ids and
commands are never cut (they wrap), and JSON output is never truncated. Secrets are masked unless
``--show-secrets`` (see ``toolledger.masking``).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from ..liveness import Running, Verdict
from ..masking import is_secret_key, masked, masked_text
from ..records import (
    ApprovalRecord,
    EffectRecord,
    Lease,
    PastAttempt,
    RunStatus,
    SessionState,
    Status,
)
from ..stores import DEFAULT_STORE_URL
from .format import STATUS_STYLE, owner, when
from .timeline import Event, timeline

__all__ = [
    "STATUS_STYLE",
    "Event",
    "approval_json",
    "approvals_table",
    "command",
    "effect_json",
    "effects_table",
    "in_doubt_table",
    "in_progress_table",
    "is_secret_key",
    "lease_text",
    "masked",
    "masked_text",
    "owner",
    "resumed_table",
    "safe",
    "session_json",
    "sessions_table",
    "settle_commands",
    "styled",
    "timeline",
    "timeline_json",
    "timeline_table",
    "when",
]


_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))}
_CONTROL.pop(ord("\n"))
_CONTROL.pop(ord("\t"))


def safe(text: object, style: str = "") -> Text:
    """Data as rich will print it literally: no markup is read in it, and control characters
    (an escape sequence in a tool result) are shown as ``\\x1b``, never sent to the terminal."""
    return Text(str(text).translate(_CONTROL), style=style)


def styled(status: str) -> Text:
    return safe(status, STATUS_STYLE.get(status, ""))


def preview(text: str | None, width: int = 60) -> str:
    """A one-line preview of *content* (a result, an input) — never of an id or a command."""
    if text is None:
        return ""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def command(*argv: str, url: str | None = None) -> str:
    """A ``toolledger`` command a person can paste: every argument shell-quoted, ``--store``
    when the store is not the default."""
    store = ["--store", url] if url is not None and url != DEFAULT_STORE_URL else []
    return "toolledger " + shlex.join([*store, *argv])


def _table(title: str, *columns: str, ids: Sequence[str] = ()) -> Table:
    """A table whose id and command columns wrap rather than cut."""
    table = Table(title=safe(title))
    for col in columns:
        table.add_column(col, overflow="fold", no_wrap=False, min_width=8 if col in ids else None)
    return table


# -- JSON ----------------------------------------------------------------------------------------


def effect_json(
    r: EffectRecord, *, reveal: bool = False, verdict: Verdict | None = None
) -> dict[str, Any]:
    result = None if r.result is None else json.loads(r.result)
    succeeded = r.status is Status.SUCCEEDED
    out: dict[str, Any] = {
        "session_id": r.session_id,
        "tool_use_id": r.tool_use_id,
        "tool": r.tool,
        "status": r.status.value,
        "attempt": r.attempt,
        "input_hash": r.input_hash,
        "result": result if reveal else masked(result),
        # On a success the text says how it was settled: a note, not an error.
        "error": None if succeeded else r.error,
        "note": r.error if succeeded else None,
        "created_at": r.created_at,
        "updated_at": r.updated_at,
        "approved_by": r.approved_by,
        "worker": r.worker,
        "holder": None if r.holder is None else r.holder.text(),
        "lease_token": r.lease_token,
        "deadline": r.deadline,
        "history": [_past_json(a, reveal) for a in r.history],
    }
    if verdict is not None:
        out["state"] = "in_progress" if isinstance(verdict, Running) else "in_doubt"
        out["why"] = verdict.why
        out["until"] = verdict.until if isinstance(verdict, Running) else None
    return out


def _past_json(a: PastAttempt, reveal: bool) -> dict[str, Any]:
    out = a.as_json()
    if not reveal:
        out["late_result"] = masked_text(a.late_result)
    return out


def session_json(s: SessionState) -> dict[str, Any]:
    return {
        "session_id": s.session_id,
        "status": s.status.value,
        "reason": s.reason,
        "turns": s.turns,
        "input_tokens": s.input_tokens,
        "output_tokens": s.output_tokens,
        "messages": s.messages,
        "version": s.version,
        "created_at": s.created_at,
        "updated_at": s.updated_at,
    }


def approval_json(a: ApprovalRecord, *, reveal: bool = False) -> dict[str, Any]:
    return {
        "session_id": a.session_id,
        "tool_use_id": a.tool_use_id,
        "tool": a.tool,
        "input": a.input if reveal else masked(a.input),
        "in_doubt": a.in_doubt,
        "attempt": a.attempt,
        "reason": a.reason,
        "status": a.status.value,
        "requested_at": a.requested_at,
        "decided_at": a.decided_at,
        "decided_by": a.decided_by,
        "used_at": a.used_at,
    }


def timeline_json(events: list[Event]) -> list[dict[str, Any]]:
    """Every event whole: JSON output is never truncated."""
    return [
        {"at": e.at, "event": e.what, "tool_use_id": e.ref or None, "detail": e.text}
        for e in events
    ]


# -- tables --------------------------------------------------------------------------------------


def lease_text(lease: Lease | None, verdict: Verdict | None) -> str:
    """Who holds a session, for people: the owner and until when (or that nobody does)."""
    if lease is None or verdict is None or not isinstance(verdict, Running):
        return ""
    until = f" until {when(verdict.until)}" if verdict.until is not None else " (alive)"
    return f"{lease.owner}{until}"


def sessions_table(
    states: list[SessionState],
    ledger_only: list[str],
    leases: dict[str, str] | None = None,
    started: dict[str, str] | None = None,
) -> Table:
    table = _table(
        "sessions",
        "session",
        "status",
        "turns",
        "tokens in/out",
        "updated",
        "held by",
        "started calls",
        "reason",
        ids=("session",),
    )
    leases, started = leases or {}, started or {}
    for s in sorted(states, key=lambda s: s.updated_at, reverse=True):
        held = leases.get(s.session_id, "")
        if not held and s.status is RunStatus.RUNNING:
            held = "nobody: interrupted (run it again to resume)"
        table.add_row(
            safe(s.session_id),
            styled(s.status.value),
            str(s.turns),
            f"{s.input_tokens}/{s.output_tokens}",
            when(s.updated_at),
            safe(held),
            safe(started.get(s.session_id, "")),
            safe(s.reason or ""),
        )
    for sid in ledger_only:
        table.add_row(
            safe(sid), safe("ledger only", "dim"), "-", "-", "-", "", safe(started.get(sid, "")), ""
        )
    return table


def effects_table(records: list[EffectRecord], title: str, *, reveal: bool = False) -> Table:
    table = _table(
        title,
        "tool_use_id",
        "tool",
        "status",
        "attempt",
        "result / error",
        "approved by",
        "updated",
        ids=("tool_use_id",),
    )
    for r in records:
        succeeded = r.status is Status.SUCCEEDED
        shown = (r.result if reveal else masked_text(r.result)) if succeeded else r.error
        note = f" ({r.error})" if succeeded and r.error else ""
        table.add_row(
            safe(r.tool_use_id),
            safe(r.tool),
            styled(r.status.value),
            str(r.attempt),
            safe(preview(shown) + note),
            safe(r.approved_by or ""),
            when(r.updated_at),
        )
    return table


def in_doubt_table(records: Sequence[tuple[EffectRecord, Verdict]]) -> Table:
    """Calls whose attempt is over and whose outcome nobody knows: a person settles them (the
    commands follow the table, one per line: see ``settle_commands``)."""
    table = _table(
        "in doubt: the attempt is over, nobody knows whether it took effect",
        "session",
        "tool_use_id",
        "tool",
        "attempt",
        "owner",
        "why over",
        ids=("session", "tool_use_id"),
    )
    for r, verdict in records:
        table.add_row(
            safe(r.session_id),
            safe(r.tool_use_id),
            safe(r.tool),
            str(r.attempt),
            safe(owner(r)),
            safe(verdict.why),
        )
    return table


def settle_commands(
    records: Sequence[tuple[EffectRecord, Verdict]], url: str | None = None
) -> list[Text]:
    """The command that settles each call, whole and shell-quoted: one line each, to paste."""
    return [
        safe(command("resolve", r.session_id, r.tool_use_id, url=url) + " --happened")
        + safe(" | --not-happened", "dim")
        for r, _ in records
    ]


def in_progress_table(records: Sequence[tuple[EffectRecord, Verdict]]) -> Table:
    """Calls whose attempt may still take effect: nobody may settle them yet."""
    table = _table(
        "in progress: the attempt may still take effect — do not settle",
        "session",
        "tool_use_id",
        "tool",
        "attempt",
        "owner",
        "deadline",
        "why",
        "until",
        ids=("session", "tool_use_id"),
    )
    for r, verdict in records:
        until = verdict.until if isinstance(verdict, Running) else None
        table.add_row(
            safe(r.session_id),
            safe(r.tool_use_id),
            safe(r.tool),
            str(r.attempt),
            safe(owner(r)),
            when(r.deadline),
            safe(verdict.why),
            when(until) if until is not None else "while its process lives",
        )
    return table


def approvals_table(records: list[ApprovalRecord], *, reveal: bool = False) -> Table:
    table = _table(
        "approval requests",
        "session",
        "tool_use_id",
        "tool",
        "input",
        "in doubt",
        "status",
        "requested",
        "decided by",
        ids=("session", "tool_use_id"),
    )
    for a in records:
        table.add_row(
            safe(a.session_id),
            safe(a.tool_use_id),
            safe(a.tool),
            safe(preview(json.dumps(a.input if reveal else masked(a.input), ensure_ascii=False))),
            "YES" if a.in_doubt else "",
            styled(a.status.value),
            when(a.requested_at),
            safe(a.decided_by or ""),
        )
    return table


def timeline_table(events: list[Event], title: str) -> Table:
    table = _table(title, "t (s)", "event", "tool_use_id", "detail", ids=("tool_use_id",))
    start = events[0].at if events else 0.0
    for e in events:
        table.add_row(
            f"{e.at - start:.3f}", safe(e.what, e.style), safe(e.ref), safe(preview(e.text, 90))
        )
    return table


def resumed_table(rows: list[dict[str, str]]) -> Table:
    table = _table("resumed sessions", "session", "status", "detail", ids=("session",))
    for r in rows:
        table.add_row(safe(r["session_id"]), styled(r["status"]), safe(r["detail"]))
    if not rows:
        table.caption = "no unfinished session with a free lease"
    return table
