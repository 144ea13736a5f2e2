"""Turning records into tables, timelines and JSON for the command line.

Fields marked secret are masked in everything shown (``show``, ``effects``, ``in-doubt``,
``approvals``) unless ``--show-secrets`` is given: in any JSON object of a tool input, a tool
result or an approval request, the value of a key whose words include ``password``, ``passwd``,
``passphrase``, ``secret``, ``token``, ``credential(s)``, ``authorization``, ``cookie``, or that
names an API, access, private or secret key (``api_key``, ``apiKey``, ``X-Api-Key``,
``access_key``, ``client_secret`` …) is shown as ``***``. Words are split at ``_``, ``-``, other
punctuation and camelCase, so ``max_tokens`` is not a secret and ``authToken`` is.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, overload

from rich.table import Table
from rich.text import Text

from ..adapters.anthropic import read_tool_uses
from ..liveness import Running, Verdict
from ..records import (
    ApprovalRecord,
    EffectRecord,
    Lease,
    PastAttempt,
    SessionState,
    Status,
    StoredMessage,
)
from ..stores.base import Store

STATUS_STYLE = {
    "succeeded": "green",
    "completed": "green",
    "approved": "green",
    "started": "bold red",
    "needs_attention": "bold red",
    "failed": "red",
    "denied": "yellow",
    "awaiting_approval": "yellow",
    "pending": "yellow",
    "running": "cyan",
    "not_happened": "magenta",
    "max_turns": "yellow",
    "used": "dim",
}


MASK = "***"
_SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "passphrase",
        "secret",
        "token",
        "credential",
        "credentials",
        "authorization",
        "cookie",
        "apikey",
        "accesskey",
        "privatekey",
        "secretkey",
    }
)
_SECRET_PAIRS = frozenset({("api", "key"), ("access", "key"), ("private", "key")})


def is_secret_key(key: str) -> bool:
    """Whether a JSON key marks its value secret (see the module docstring)."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", key).lower()
    words = [w for w in re.split(r"[^a-z0-9]+", spaced) if w]
    return any(w in _SECRET_WORDS for w in words) or any(
        pair in _SECRET_PAIRS for pair in itertools.pairwise(words)
    )


def masked(value: Any) -> Any:
    """A copy of a JSON value with the value of every secret key replaced by ``***``."""
    if isinstance(value, dict):
        return {
            k: MASK if is_secret_key(str(k)) and v is not None else masked(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [masked(v) for v in value]
    return value


@overload
def masked_text(text: str) -> str: ...
@overload
def masked_text(text: None) -> None: ...
def masked_text(text: str | None) -> str | None:
    """``text`` with its secrets masked when it is a JSON object or array; as it is otherwise."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if not isinstance(value, (dict, list)):
        return text
    return json.dumps(masked(value), ensure_ascii=False)


def when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def styled(status: str) -> Text:
    return Text(status, style=STATUS_STYLE.get(status, ""))


def preview(text: str | None, width: int = 60) -> str:
    if text is None:
        return ""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


# -- JSON ----------------------------------------------------------------------------------------


def effect_json(
    r: EffectRecord, *, reveal: bool = False, verdict: Verdict | None = None
) -> dict[str, Any]:
    result = None if r.result is None else json.loads(r.result)
    out = {
        "session_id": r.session_id,
        "tool_use_id": r.tool_use_id,
        "tool": r.tool,
        "status": r.status.value,
        "attempt": r.attempt,
        "input_hash": r.input_hash,
        "result": result if reveal else masked(result),
        "error": r.error,
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
        "reason": a.reason,
        "status": a.status.value,
        "requested_at": a.requested_at,
        "decided_at": a.decided_at,
        "decided_by": a.decided_by,
        "used_at": a.used_at,
    }


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
    table = Table(title="sessions")
    for col in (
        "session",
        "status",
        "turns",
        "tokens in/out",
        "updated",
        "held by",
        "started calls",
        "reason",
    ):
        table.add_column(col)
    leases, started = leases or {}, started or {}
    for s in sorted(states, key=lambda s: s.updated_at, reverse=True):
        table.add_row(
            s.session_id,
            styled(s.status.value),
            str(s.turns),
            f"{s.input_tokens}/{s.output_tokens}",
            when(s.updated_at),
            leases.get(s.session_id, ""),
            started.get(s.session_id, ""),
            preview(s.reason, 50),
        )
    for sid in ledger_only:
        table.add_row(
            sid, Text("ledger only", style="dim"), "-", "-", "-", "", started.get(sid, ""), ""
        )
    return table


def effects_table(records: list[EffectRecord], title: str, *, reveal: bool = False) -> Table:
    table = Table(title=title)
    for col in (
        "tool_use_id",
        "tool",
        "status",
        "attempt",
        "result / error",
        "approved by",
        "updated",
    ):
        table.add_column(col)
    for r in records:
        table.add_row(
            r.tool_use_id,
            r.tool,
            styled(r.status.value),
            str(r.attempt),
            preview(
                (r.result if reveal else masked_text(r.result))
                if r.status is Status.SUCCEEDED
                else r.error
            ),
            r.approved_by or "",
            when(r.updated_at),
        )
    return table


def in_doubt_table(records: Sequence[tuple[EffectRecord, Verdict]]) -> Table:
    """Calls whose attempt is over and whose outcome nobody knows: a person settles them."""
    table = Table(title="in doubt: the attempt is over, nobody knows whether it took effect")
    for col in ("session", "tool_use_id", "tool", "attempt", "owner", "why over", "settle with"):
        table.add_column(col)
    for r, verdict in records:
        table.add_row(
            r.session_id,
            r.tool_use_id,
            r.tool,
            str(r.attempt),
            owner(r),
            verdict.why,
            "toolledger resolve "
            + shlex.join([r.session_id, r.tool_use_id])
            + " --happened|--not-happened",
        )
    return table


def in_progress_table(records: Sequence[tuple[EffectRecord, Verdict]]) -> Table:
    """Calls whose attempt may still take effect: nobody may settle them yet."""
    table = Table(title="in progress: the attempt may still take effect — do not settle")
    for col in ("session", "tool_use_id", "tool", "attempt", "owner", "deadline", "why", "until"):
        table.add_column(col)
    for r, verdict in records:
        until = verdict.until if isinstance(verdict, Running) else None
        table.add_row(
            r.session_id,
            r.tool_use_id,
            r.tool,
            str(r.attempt),
            owner(r),
            when(r.deadline),
            verdict.why,
            when(until) if until is not None else "while its process lives",
        )
    return table


def owner(r: EffectRecord) -> str:
    """Who ran an attempt, for people: the worker, and its process when known."""
    who = r.worker or "?"
    if r.holder is not None:
        who += f" (pid {r.holder.pid})"
    if r.lease_token is not None:
        who += f", lease #{r.lease_token}"
    return who


def approvals_table(records: list[ApprovalRecord], *, reveal: bool = False) -> Table:
    table = Table(title="approval requests")
    for col in (
        "session",
        "tool_use_id",
        "tool",
        "input",
        "in doubt",
        "status",
        "requested",
        "decided by",
    ):
        table.add_column(col)
    for a in records:
        table.add_row(
            a.session_id,
            a.tool_use_id,
            a.tool,
            preview(json.dumps(a.input if reveal else masked(a.input), ensure_ascii=False), 40),
            "YES" if a.in_doubt else "",
            styled(a.status.value),
            when(a.requested_at),
            a.decided_by or "",
        )
    return table


# -- the timeline --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Event:
    at: float
    order: int
    what: str
    detail: str
    style: str = ""


def timeline(store: Store, session_id: str, *, reveal: bool = False) -> list[Event]:
    """Turns, tool calls, ledger records and approvals of a session, in time order; secrets
    masked unless ``reveal``."""
    events: list[Event] = []
    backend = store.backend
    messages: list[StoredMessage] = backend.read_messages(session_id)
    for m in messages:
        events.extend(_message_events(m, reveal))
    for r in store.ledger(session_id).records():
        if r.attempt:
            events.append(
                Event(
                    r.created_at, 1, f"ledger: {r.tool} intent", f"{r.tool_use_id} started", "dim"
                )
            )
        if r.status is Status.STARTED:
            verdict = store.judge(r)
            running = isinstance(verdict, Running)
            deadline = f", deadline {when(r.deadline)}" if r.deadline is not None else ""
            events.append(
                Event(
                    r.updated_at,
                    3,
                    f"ledger: {r.tool} {'IN PROGRESS' if running else 'IN DOUBT'}",
                    f"{r.tool_use_id}: started (attempt {r.attempt} by {owner(r)}{deadline}), "
                    f"no outcome recorded — {verdict.why}",
                    "bold yellow" if running else "bold red",
                )
            )
            continue
        shown = r.result if r.status is Status.SUCCEEDED else r.error
        if not reveal and r.status is Status.SUCCEEDED:
            shown = masked_text(shown)
        notes = [f"attempt {r.attempt}" if r.attempt else "no intent needed"]
        if r.status is Status.SUCCEEDED and r.error:
            notes.append(r.error)
        if r.approved_by:
            notes.append(f"approved by {r.approved_by}")
        events.append(
            Event(
                r.updated_at,
                3,
                f"ledger: {r.tool} → {r.status.value}",
                f"{r.tool_use_id}: {preview(shown, 60)} ({'; '.join(notes)})",
                STATUS_STYLE.get(r.status.value, ""),
            )
        )
    for a in backend.read_approvals(session_id):
        events.append(
            Event(
                a.requested_at,
                2,
                f"approval asked: {a.tool}",
                f"{a.tool_use_id}{' (in doubt)' if a.in_doubt else ''}: {a.reason}",
                "yellow",
            )
        )
        if a.decided_at is not None:
            events.append(
                Event(
                    a.decided_at,
                    2,
                    f"approval {a.status.value}: {a.tool}",
                    f"by {a.decided_by}",
                    STATUS_STYLE.get(a.status.value, ""),
                )
            )
    return sorted(events, key=lambda e: (e.at, e.order))


def _message_events(m: StoredMessage, reveal: bool) -> list[Event]:
    if m.role == "user":
        if isinstance(m.content, str):
            return [Event(m.created_at, 0, "user", preview(m.content, 80))]
        out = []
        for b in m.content:
            if b.get("type") == "tool_result":
                flag = " (is_error)" if b.get("is_error") else ""
                content = b.get("content")
                text = content if isinstance(content, str) else json.dumps(content)
                text = text if reveal else masked_text(text)
                out.append(
                    Event(
                        m.created_at,
                        4,
                        f"→ model: tool_result{flag}",
                        f"{b.get('tool_use_id')}: {preview(text, 70)}",
                        "red" if flag else "",
                    )
                )
            elif b.get("type") == "text":
                out.append(Event(m.created_at, 0, "user", preview(b.get("text"), 80)))
        return out
    out = []
    texts = (
        [b.get("text", "") for b in m.content if b.get("type") == "text"]
        if isinstance(m.content, list)
        else [str(m.content)]
    )
    if any(texts):
        out.append(Event(m.created_at, 0, "model", preview(" ".join(texts), 80), "cyan"))
    if isinstance(m.content, list):
        for call in read_tool_uses(m.content):
            out.append(
                Event(
                    m.created_at,
                    0,
                    f"model asks: {call.name}",
                    f"{call.tool_use_id} "
                    f"{preview(json.dumps(call.input if reveal else masked(call.input)), 60)}",
                    "cyan",
                )
            )
    return out


def timeline_table(events: list[Event], title: str) -> Table:
    table = Table(title=title)
    table.add_column("t (s)", justify="right")
    table.add_column("event")
    table.add_column("detail")
    start = events[0].at if events else 0.0
    for e in events:
        table.add_row(f"{e.at - start:.3f}", Text(e.what, style=e.style), e.detail)
    return table


def timeline_json(events: list[Event]) -> list[dict[str, Any]]:
    return [{"at": e.at, "event": e.what, "detail": e.detail} for e in events]


def resumed_table(rows: list[dict[str, str]]) -> Table:
    table = Table(title="resumed sessions")
    for col in ("session", "status", "detail"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["session_id"], styled(r["status"]), preview(r["detail"], 80))
    if not rows:
        table.caption = "no unfinished session with a free lease"
    return table
