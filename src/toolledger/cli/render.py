"""Turning records into tables and JSON for the command line.

Everything read from a store is data: it is printed literally (rich markup in a result or a
session id is shown, never interpreted; terminal control characters are shown escaped), ids and
commands are never cut or wrapped (``output`` picks a table, records or TSV to keep them whole),
and JSON output is never truncated. Secrets are masked unless
``--show-secrets`` (see ``toolledger.masking``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich.text import Text

from .._liveness import Running, Verdict
from .._shell import command as shell_command
from .._shell import shown, shown_id
from .._views.format import STATUS_STYLE, owner, when
from .._views.overview import SETTLED_SINCE, reason_parts, stopped_reason
from .._views.timeline import Event, timeline
from ..masking import is_secret_key, masked, masked_text
from ..records import (
    ApprovalRecord,
    ApprovalStatus,
    EffectRecord,
    PastAttempt,
    RunStatus,
    SessionState,
    Status,
)
from ..stores import DEFAULT_STORE_URL
from .output import Col, Grid

__all__ = [
    "HAPPENED",
    "NOT_HAPPENED",
    "SETTLED_SINCE",
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
    "masked",
    "masked_text",
    "owner",
    "reason_parts",
    "resumed_table",
    "safe",
    "safe_id",
    "session_json",
    "sessions_table",
    "settle_command",
    "settle_commands",
    "stopped_reason",
    "styled",
    "timeline",
    "timeline_json",
    "timeline_table",
    "when",
]


def safe(text: object, style: str = "") -> Text:
    """Data as rich will print it literally: no markup is read in it, and control and
    bidirectional characters (an escape sequence in a tool result, a U+202E in a reason) are
    shown as ``\\x1b``, ``\\u202e``, never sent to the terminal. Line breaks and tabs lay out
    content and stay."""
    return Text(shown(str(text), keep="\n\t"), style=style)


def safe_id(text: object, style: str = "") -> Text:
    """An id — a session's, a call's, a tool's name — as ``safe``, on one line and never alike
    another id (``_shell.shown_id``): a tab or a line break in it would cut a column that is
    never cut or split a row, and a character that shows nothing would make two ids look one."""
    return Text(shown_id(str(text)), style=style)


def styled(status: str) -> Text:
    return safe(status, STATUS_STYLE.get(status, ""))


def preview(text: str | None, width: int = 60) -> str:
    """A one-line preview of *content* (a result, an input) — never of an id or a command."""
    if text is None:
        return ""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def command(*argv: str, options: Sequence[str] = (), url: str | None = None) -> str:
    """A ``toolledger`` command a person can paste: every argument shell-quoted (control and
    bidirectional characters as ``$'\\x…'`` escapes the shell turns back into the real id),
    ``--store`` when the store is not the default, ``--`` before ids that begin with ``-``
    (``toolledger._shell.command``)."""
    return shell_command(*argv, options=options, url=url, default_url=DEFAULT_STORE_URL)


# -- JSON ----------------------------------------------------------------------------------------


def effect_json(
    r: EffectRecord, *, reveal: bool = False, verdict: Verdict | None = None
) -> dict[str, Any]:
    result = None if r.result is None else json.loads(r.result)
    succeeded = r.status is Status.SUCCEEDED
    said = r.error if reveal else masked_text(r.error)  # an error's text may carry a credential
    out: dict[str, Any] = {
        "session_id": r.session_id,
        "tool_use_id": r.tool_use_id,
        "tool": r.tool,
        "status": r.status.value,
        "attempt": r.attempt,
        "input_hash": r.input_hash,
        "result": result if reveal else masked(result),
        # On a success the text says how it was settled: a note, not an error.
        "error": None if succeeded else said,
        "note": said if succeeded else None,
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
        # What `approve`/`deny --input-hash` binds a decision to: the input the person saw.
        "input_hash": a.input_hash,
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


# -- tables ------------------------------------------------------------------------------------


def sessions_table(
    states: list[SessionState],
    ledger_only: list[str],
    leases: dict[str, str] | None = None,
    started: dict[str, str] | None = None,
    settled: dict[str, bool] | None = None,
    *,
    url: str | None = None,
    lineages: dict[str, set[str]] | None = None,
) -> Grid:
    """``settled``: per session stopped for a person, whether that is settled since
    (``stopped_reason``). ``url`` (on a screen): a reason's commands for the store there, for a
    call of a session in the session's ``lineages`` entry (``lineage_sessions``), are named by
    what they do, and the caller prints them after the grid, one a line (``reason_parts``); in
    a pipe a reason is whole, as stored."""
    grid = Grid(
        "sessions",
        [
            Col("session"),
            Col("status"),
            Col("turns"),
            Col("tokens in/out"),
            Col("updated"),
            Col("held by"),
            Col("started calls"),
            Col("reason"),  # whole: it names the commands that settle the session's calls
        ],
    )
    leases, started, settled, lineages = leases or {}, started or {}, settled or {}, lineages or {}
    for s in sorted(states, key=lambda s: s.updated_at, reverse=True):
        held = leases.get(s.session_id, "")
        if not held and s.status is RunStatus.RUNNING:
            held = "nobody: interrupted (run it again to resume)"
        grid.add(
            safe_id(s.session_id),
            styled(s.status.value),
            str(s.turns),
            f"{s.input_tokens}/{s.output_tokens}",
            when(s.updated_at),
            safe(held),
            safe(started.get(s.session_id, "")),
            safe(
                stopped_reason(
                    s,
                    settled.get(s.session_id),
                    url=url,
                    sessions=lineages.get(s.session_id, ()),
                )
            ),
        )
    for sid in ledger_only:
        grid.add(
            safe_id(sid),
            safe("ledger only", "dim"),
            *("-", "-", "-", ""),
            safe(started.get(sid, "")),
            "",
        )
    if not states and not ledger_only:
        grid.caption = "no session in this store"
    return grid


def effects_table(records: list[EffectRecord], title: str, *, reveal: bool = False) -> Grid:
    grid = Grid(
        title,
        [
            Col("tool_use_id"),
            Col("tool"),
            Col("status"),
            Col("attempt"),
            Col("result / error", preview=True),
            Col("approved by", preview=True),
            Col("updated"),
        ],
    )
    for r in records:
        succeeded = r.status is Status.SUCCEEDED
        said = r.error if reveal else masked_text(r.error)
        shown_ = (r.result if reveal else masked_text(r.result)) if succeeded else said
        note = f" ({said})" if succeeded and said else ""
        grid.add(
            safe_id(r.tool_use_id),
            safe_id(r.tool),
            styled(r.status.value),
            str(r.attempt),
            safe(preview(shown_) + note),
            safe(r.approved_by or ""),
            when(r.updated_at),
        )
    return grid


def settle_command(r: EffectRecord, happened: bool, url: str | None) -> str:
    """The one command that settles ``r`` one way."""
    how = "--happened" if happened else "--not-happened"
    return command("resolve", r.session_id, r.tool_use_id, options=[how], url=url)


HAPPENED = (
    "it took effect: the model is told it succeeded (add --result JSON to say what it returned)"
)
NOT_HAPPENED = "it did not take effect: the call runs on the session's next run"


def in_doubt_table(records: Sequence[tuple[EffectRecord, Verdict]], url: str | None = None) -> Grid:
    """Calls whose attempt is over and whose outcome nobody knows: a person settles them. The
    two commands that settle each call are columns of records and TSV; after a table they are
    printed one a line (``settle_commands``)."""
    grid = Grid(
        "in doubt: the attempt is over, nobody knows whether it took effect",
        [
            Col("session"),
            Col("tool_use_id"),
            Col("tool"),
            Col("attempt"),
            Col("owner", preview=True),
            Col("why over", preview=True),
            Col("if it happened", in_table=False, command=True),
            Col("if it did not", in_table=False, command=True),
        ],
    )
    for r, verdict in records:
        grid.add(
            safe_id(r.session_id),
            safe_id(r.tool_use_id),
            safe_id(r.tool),
            str(r.attempt),
            safe(owner(r)),
            safe(verdict.why),
            Text(settle_command(r, True, url)),
            Text(settle_command(r, False, url)),
        )
    return grid


def settle_commands(
    records: Sequence[tuple[EffectRecord, Verdict]], url: str | None = None
) -> list[tuple[str, str]]:
    """The commands that settle each call, whole and shell-quoted, each with what it means:
    two per call, one choice each — run exactly one of a call's two."""
    out: list[tuple[str, str]] = []
    for r, _ in records:
        call = f"{shown_id(r.tool)} {shown_id(r.tool_use_id)} in {shown_id(r.session_id)}"
        out.append((f"{call}: {HAPPENED}", settle_command(r, True, url)))
        out.append((f"{call}: {NOT_HAPPENED}", settle_command(r, False, url)))
    return out


def in_progress_table(records: Sequence[tuple[EffectRecord, Verdict]]) -> Grid:
    """Calls whose attempt may still take effect: nobody may settle them yet."""
    grid = Grid(
        "in progress: the attempt may still take effect — do not settle",
        [
            Col("session"),
            Col("tool_use_id"),
            Col("tool"),
            Col("attempt"),
            Col("owner", preview=True),
            Col("deadline"),
            Col("why", preview=True),
            Col("until", preview=True),
        ],
    )
    for r, verdict in records:
        until = verdict.until if isinstance(verdict, Running) else None
        grid.add(
            safe_id(r.session_id),
            safe_id(r.tool_use_id),
            safe_id(r.tool),
            str(r.attempt),
            safe(owner(r)),
            when(r.deadline),
            safe(verdict.why),
            when(until) if until is not None else "while its process lives",
        )
    return grid


def approvals_table(records: list[ApprovalRecord], *, reveal: bool = False) -> Grid:
    grid = Grid(
        "approval requests",
        [
            Col("session"),
            Col("tool_use_id"),
            Col("tool"),
            Col("input", preview=True),
            Col("in doubt"),
            Col("status"),
            Col("requested"),
            Col("decided by", preview=True),
        ],
    )
    for a in records:
        grid.add(
            safe_id(a.session_id),
            safe_id(a.tool_use_id),
            safe_id(a.tool),
            safe(preview(json.dumps(a.input if reveal else masked(a.input), ensure_ascii=False))),
            # It may already have happened: a yes to a pending request runs it a second time.
            _in_doubt_cell(a),
            styled(a.status.value),
            when(a.requested_at),
            safe(a.decided_by or ""),
        )
    return grid


def _in_doubt_cell(a: ApprovalRecord) -> str:
    if not a.in_doubt:
        return ""
    return "YES: approving runs it again" if a.status is ApprovalStatus.PENDING else "YES"


def timeline_table(events: Sequence[Event], title: str) -> Grid:
    grid = Grid(
        title,
        [
            Col("t (s)"),
            Col("event", preview=True, words=True),  # a tool's name among its words
            Col("tool_use_id"),
            Col("detail", preview=True),
        ],
    )
    start = events[0].at if events else 0.0
    for e in events:
        grid.add(
            f"{e.at - start:.3f}", safe(e.what, e.style), safe_id(e.ref), safe(preview(e.text, 90))
        )
    return grid


def resumed_table(rows: list[dict[str, str]]) -> Grid:
    grid = Grid("resumed sessions", [Col("session"), Col("status"), Col("detail", preview=True)])
    for r in rows:
        grid.add(safe_id(r["session_id"]), styled(r["status"]), safe(r["detail"]))
    if not rows:
        grid.caption = "no unfinished session with a free lease"
    return grid
