"""What each page of the console shows, read from the store through the command line's own
readers (``toolledger.cli``): the same timeline, the same masking of secrets, the same verdicts
on started calls. Reads only: nothing here writes.

Values are plain data for the templates, which escape all of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .._lineage import Branch, BranchKind
from .._liveness import Running, Verdict
from .._shell import asked, command
from .._verify import Problem, verify
from .._views.branch import STATE_STYLE, rewound, told
from .._views.format import owner, when
from .._views.overview import (
    lineage_sessions,
    overview,
    reason_parts,
    settled_since,
    stopped_reason,
)
from .._views.timeline import Event, timeline
from ..adapters import transcript_reader
from ..approvals._queue import pending
from ..errors import ToolLedgerError
from ..masking import masked, masked_text
from ..records import ApprovalRecord, EffectRecord, RunStatus, SessionState, Status
from ..stores import DEFAULT_STORE_URL, Store

__all__ = [
    "CallRow",
    "DoubtRow",
    "Field",
    "SessionRow",
    "approvals_view",
    "css",
    "fields_of",
    "in_doubt_view",
    "pretty",
    "session_view",
    "sessions_view",
    "verify_view",
]

STATUSES = [s.value for s in RunStatus]


def css(style: str) -> str:
    """The CSS classes for a CLI style (``bold red`` → ``st-bold st-red``)."""
    return " ".join(f"st-{word}" for word in style.split())


def pretty(value: Any) -> str:
    """A JSON value, secrets masked, indented for reading — its fields in the order the model
    wrote them."""
    return json.dumps(masked(value), indent=2, ensure_ascii=False)


FOLD_CHARS = 80
"""How much of a long value a card shows before it is opened."""


@dataclass(frozen=True, slots=True)
class Field:
    """One argument of a call, as a card shows it: its name, the start of its value on one line,
    and the whole value (``None`` when the start is all of it)."""

    name: str
    start: str
    whole: str | None = None


def fields_of(value: Any) -> list[Field]:
    """A call's arguments, secrets masked, in the order the model wrote them — a long value
    folded to its start, so every field's name and the start of its value stay in view."""
    shown = masked(value)
    items = list(shown.items()) if isinstance(shown, dict) else [("", shown)]
    out: list[Field] = []
    for name, v in items:
        line = json.dumps(v, ensure_ascii=False)
        if len(line) <= FOLD_CHARS:
            out.append(Field(str(name), line))
            continue
        whole = v if isinstance(v, str) else json.dumps(v, indent=2, ensure_ascii=False)
        out.append(Field(str(name), line[: FOLD_CHARS - 1] + "…", whole))
    return out


def _pretty_text(text: str | None) -> str:
    """A stored JSON text (a result), secrets masked, indented when it is JSON."""
    shown = masked_text(text)
    if shown is None:
        return ""
    try:
        return json.dumps(json.loads(shown), indent=2, ensure_ascii=False)
    except ValueError:
        return shown


# -- sessions ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionRow:
    session_id: str
    status: str
    turns: str
    tokens: str
    updated: str
    updated_at: float
    held: str
    started: str
    reason: str
    commands: tuple[str, ...] = ()
    """The commands ``reason`` names, whole, each shown on a line of its own (``reason_parts``);
    none once what stopped the session is settled."""


def _why(store: Store, s: SessionState) -> dict[str, Any]:
    """Why ``s`` stopped, its commands for the store shown named by what they do, and those
    commands whole (``reason_parts``), none once what stopped it is settled
    (``settled_since``). A command is one for a call of any session of its lineage
    (``lineage_sessions``), a sibling branch where a call made for the lineage is settled too."""
    settled, url = settled_since(store, s), store.url
    sessions = lineage_sessions(store, s) if s.reason else set()
    commands = () if settled else reason_parts(s.reason or "", sessions, url)[1]
    return {"reason": stopped_reason(s, settled, url=url, sessions=sessions), "commands": commands}


def sessions_view(store: Store, status: str | None) -> dict[str, Any]:
    """Every session (newest activity first), or those with ``status`` (``ledger_only``: ledgers
    used without an agent)."""
    seen = overview(store)
    summary = seen.started_summary()
    rows: list[SessionRow] = []
    for s in sorted(seen.states, key=lambda s: s.updated_at, reverse=True):
        held = seen.held.get(s.session_id, {}).get("text", "")
        if not held and s.status is RunStatus.RUNNING:
            held = "nobody: interrupted (run it again to resume)"
        rows.append(
            SessionRow(
                session_id=s.session_id,
                status=s.status.value,
                turns=str(s.turns),
                tokens=f"{s.input_tokens}/{s.output_tokens}",
                updated=when(s.updated_at),
                updated_at=s.updated_at,
                held=held,
                started=summary.get(s.session_id, ""),
                **_why(store, s),
            )
        )
    for sid in seen.ledger_only:
        rows.append(
            SessionRow(
                session_id=sid,
                status="ledger_only",
                turns="-",
                tokens="-",
                updated="-",
                updated_at=0.0,
                held="",
                started=summary.get(sid, ""),
                reason="",
            )
        )
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    chosen = status if status in [*STATUSES, "ledger_only"] else None
    return {
        "rows": [r for r in rows if chosen is None or r.status == chosen],
        "status": chosen,
        "statuses": [*STATUSES, "ledger_only"],
        "counts": counts,
        "total": len(rows),
    }


# -- one session ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CallRow:
    """One tool call of a session: what the model asked, and what the ledger and the approval
    queue know of it."""

    tool_use_id: str
    tool: str
    input: str
    disposition: str
    disposition_style: str
    intent: str
    attempts: list[str] = field(default_factory=list)
    record: str = ""
    approval: str = ""


def calls_of(store: Store, session_id: str) -> dict[str, tuple[str, Any]]:
    """The tool calls of a session's transcript: tool_use id → (tool, input), in order."""
    messages = store.messages(session_id)
    if not messages:
        return {}
    reader = transcript_reader(messages)
    out: dict[str, tuple[str, Any]] = {}
    for m in messages:
        try:
            parts = reader.read_message(m)
        except (ToolLedgerError, AttributeError, TypeError, ValueError):
            continue  # a shape we cannot read: the timeline shows it as it is
        for call in parts.calls:
            out[call.tool_use_id] = (call.name, call.input)
    return out


def _disposition(
    record: EffectRecord | None, verdict: Verdict | None, approval: ApprovalRecord | None
) -> tuple[str, str]:
    if record is None:
        if approval is not None and approval.status.value in ("pending", "denied"):
            return f"approval {approval.status.value}", approval.status.value
        return "no ledger record (not run, or answered without running)", ""
    if record.status is Status.STARTED:
        if isinstance(verdict, Running):
            return "in progress", "running"
        return "in doubt", "started"
    if record.status is Status.SUCCEEDED and record.error and record.error.startswith("resolved"):
        return f"succeeded ({record.error})", "succeeded"
    if record.status is Status.NOT_HAPPENED:
        return f"did not happen: runs on the next run ({record.error or ''})", "not_happened"
    return record.status.value, record.status.value


def _attempts(record: EffectRecord | None) -> list[str]:
    if record is None:
        return []
    lines = [f"attempt {p.attempt}: settled {p.settled}" for p in record.history]
    lines += [f"attempt {p.attempt} reported late: {p.late}" for p in record.history if p.late]
    if record.attempt:
        deadline = f", deadline {when(record.deadline)}" if record.deadline is not None else ""
        lines.append(f"attempt {record.attempt} by {owner(record)}{deadline}")
    return lines


def session_view(store: Store, session_id: str) -> dict[str, Any]:
    """A session's state, its timeline (as ``toolledger show``) and a row per tool call."""
    state: SessionState | None = store.session(session_id)
    events: list[Event] = timeline(store, session_id)
    records = {r.tool_use_id: r for r in store.ledger(session_id).records()}
    approvals = {a.tool_use_id: a for a in store.approvals(session_id)}
    asked = calls_of(store, session_id)
    ids = list(asked) + [i for i in records if i not in asked]
    ids += [i for i in approvals if i not in asked and i not in records]
    rows: list[CallRow] = []
    for tid in ids:
        record, approval = records.get(tid), approvals.get(tid)
        known = record.tool if record else approval.tool if approval else "?"
        tool, given = asked.get(tid, (known, None))
        if given is None and approval is not None:
            given = approval.input
        verdict = store.shown(record) if record and record.status is Status.STARTED else None
        disposition, style = _disposition(record, verdict, approval)
        intent = ""
        if record is not None:
            intent = (
                "intent written first (a re-run is not known to be safe)"
                if record.attempt > 0 or record.deadline is not None
                else "no intent needed (safe to run again)"
            )
        shown = ""
        if record is not None and record.status is not Status.STARTED:
            shown = _pretty_text(record.result) if record.result else (record.error or "")
        approval_text = ""
        if approval is not None:
            approval_text = approval.status.value + (
                f" by {approval.decided_by}" if approval.decided_by else ""
            )
            if approval.in_doubt:
                approval_text += " (asked in doubt)"
        rows.append(
            CallRow(
                tool_use_id=tid,
                tool=tool,
                input=pretty(given) if given is not None else "(not in the transcript)",
                disposition=disposition,
                disposition_style=style,
                intent=intent,
                attempts=_attempts(record),
                record=shown,
                approval=approval_text,
            )
        )
    start = events[0].at if events else 0.0
    return {
        "session_id": session_id,
        "state": state,
        **(_why(store, state) if state else {"reason": "", "commands": ()}),
        "updated": when(state.updated_at) if state else "-",
        "events": [
            {
                "t": f"{e.at - start:.3f}",
                "what": e.what,
                "ref": e.ref,
                "text": e.text,
                "css": css(e.style),
            }
            for e in events
        ],
        "calls": rows,
        "branches": [_branch(b) for b in state.lineage] if state else [],
    }


def _branch(b: Branch) -> dict[str, Any]:
    """A fork or rewind that made the session, and the effects it left behind."""
    fork = b.kind is BranchKind.FORK
    return {
        "head": f"forked at turn {b.turn} from" if fork else rewound(b),
        "source": b.source if fork else None,
        "when": f"{when(b.at)} UTC" + (f" by {b.by}" if b.by else ""),
        "told": told(b),
        "effects": [
            {
                "state": e.state,
                "css": css(STATE_STYLE.get(e.state, "")),
                "tool": e.tool,
                "tool_use_id": e.tool_use_id,
                "input": pretty(e.input),
            }
            for e in b.effects
        ],
    }


# -- in doubt ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DoubtRow:
    session_id: str
    tool_use_id: str
    tool: str
    input: str
    fields: list[Field]
    attempts: list[str]
    why: str
    in_progress: bool
    attempt: int = 0  # the attempt in doubt: a settling form is bound to it
    commands: tuple[str, ...] = ()
    """When its ids cannot be posted back from a form (``postable``): the commands that settle
    it, instead of a form."""


_UNPOSTABLE = frozenset("\r\n\x00")


def postable(*values: str) -> bool:
    """Whether each of ``values`` comes back from a page's form exactly as written into it. An
    HTML parser reads a carriage return as a line feed and a NUL as U+FFFD, a browser sends
    every line break as CR LF, and a lone surrogate cannot be written in UTF-8: a form holding
    such an id would post another id (another call's, perhaps), or the page could not be sent.
    ``toolledger`` refuses such ids in new calls; a store written otherwise may hold them."""
    return not any(c in _UNPOSTABLE or "\ud800" <= c <= "\udfff" for v in values for c in v)


def _command(store: Store, verb: str, sid: str, tid: str, *options: str) -> str:
    """``toolledger VERB SESSION CALL [OPTION…]`` for the store shown, whole and quoted."""
    return command(verb, sid, tid, options=options, url=store.url, default_url=DEFAULT_STORE_URL)


def in_doubt_view(store: Store) -> dict[str, Any]:
    """Every started call without an outcome: in doubt (a person may settle it) or in progress
    (nobody may, yet)."""
    inputs: dict[str, dict[str, tuple[str, Any]]] = {}
    rows: list[DoubtRow] = []
    for record, verdict in store.started():
        sid = record.session_id
        if sid not in inputs:
            inputs[sid] = calls_of(store, sid)
        found = inputs[sid].get(record.tool_use_id)
        tid = record.tool_use_id
        unposted = not postable(sid, tid)
        rows.append(
            DoubtRow(
                session_id=sid,
                tool_use_id=record.tool_use_id,
                tool=record.tool,
                input="" if found else f"(not in a transcript; input hash {record.input_hash})",
                fields=fields_of(found[1]) if found else [],
                attempts=_attempts(record),
                why=verdict.why,
                in_progress=isinstance(verdict, Running),
                attempt=record.attempt,
                commands=(
                    _command(store, "resolve", sid, tid, "--happened"),
                    _command(store, "resolve", sid, tid, "--not-happened"),
                )
                if unposted
                else (),
            )
        )
    return {
        "doubt": [r for r in rows if not r.in_progress],
        "running": [r for r in rows if r.in_progress],
    }


# -- approvals -----------------------------------------------------------------------------------


def approvals_view(store: Store) -> dict[str, Any]:
    """Requests waiting for a person, oldest first, each with its arguments as a card shows
    them (``fields_of``)."""
    return {
        "requests": [
            {
                "record": a,
                "fields": fields_of(a.input),
                "asked": when(a.requested_at),
                "commands": ()
                if postable(a.session_id, a.tool_use_id, a.input_hash)
                else (
                    _command(store, "approve", a.session_id, a.tool_use_id, asked(a.in_doubt)),
                    _command(store, "deny", a.session_id, a.tool_use_id, asked(a.in_doubt)),
                ),
            }
            for a in pending(store)
        ]
    }


# -- verify --------------------------------------------------------------------------------------


def verify_view(store: Store) -> dict[str, Any]:
    """The integrity checks of ``toolledger verify``, and their findings."""
    problems: list[Problem] = verify(store)
    errors = [p for p in problems if p.severity.value == "error"]
    return {"problems": problems, "errors": len(errors), "url": store.url}
