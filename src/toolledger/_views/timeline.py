"""A session's timeline for ``toolledger show``: its turns, tool calls and results — read
through the transcript's own API shape (Anthropic, OpenAI Chat Completions, OpenAI Responses) —
its ledger records and its approvals, in time order, secrets masked unless revealed.

An event's ``ref`` (a tool_use id) is never cut; its ``text`` is whole (JSON output shows it
whole; a table shows a preview of it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from .._liveness import Running
from ..adapters import Provider, read_or_text, transcript_reader
from ..masking import masked, masked_text
from ..records import Status, StoredMessage
from ..stores.store import Store
from .format import STATUS_STYLE, owner, when
from .window import Window

__all__ = ["Event", "timeline", "timeline_window"]


@dataclass(frozen=True, slots=True)
class Event:
    at: float
    order: int
    what: str
    ref: str  # the call it concerns (never cut), or ""
    text: str  # what it says, whole
    style: str = ""


def timeline(store: Store, session_id: str, *, reveal: bool = False) -> list[Event]:
    """Turns, tool calls, ledger records and approvals of a session, in time order."""
    return _timeline(store, session_id, store.messages(session_id), None, reveal)


def timeline_window(
    store: Store, session_id: str, pick: Callable[[int], Window], *, reveal: bool = False
) -> tuple[list[Event], Window]:
    """The timeline of the turns ``pick(number of turns)`` chooses: their messages, and the
    records and approvals of the calls they made (a turn is a model reply; what comes before
    the first one belongs to the first)."""
    messages = store.messages(session_id)
    turn_of: list[int] = []
    turn = 0
    for m in messages:
        if m.role == "assistant":
            turn += 1
        turn_of.append(max(turn, 1))
    window = pick(turn)
    if window.whole:
        return _timeline(store, session_id, messages, None, reveal), window
    kept = [m for m, t in zip(messages, turn_of, strict=True) if window.holds(t)]
    return _timeline(store, session_id, kept, _calls(kept), reveal), window


def _calls(messages: list[StoredMessage]) -> set[str]:
    reader = transcript_reader(messages)
    out: set[str] = set()
    for m in messages:
        read = read_or_text(m, reader)
        out.update(call.tool_use_id for call in read.calls)
        out.update(call_id for call_id, _, _ in read.results)
    return out


def _timeline(
    store: Store,
    session_id: str,
    messages: list[StoredMessage],
    calls: set[str] | None,
    reveal: bool,
) -> list[Event]:
    """The events of ``messages``, and of the ledger records and approvals of ``calls`` (all
    of them when ``None``)."""
    events: list[Event] = []
    reader = transcript_reader(messages)
    for m in messages:
        events.extend(_message_events(m, reader, reveal))
    for r in store.ledger(session_id).records():
        if calls is not None and r.tool_use_id not in calls:
            continue
        intent = r.deadline is not None or (r.holder is None and r.attempt > 0)
        if intent:
            events.append(
                Event(r.created_at, 1, f"ledger: {r.tool} intent", r.tool_use_id, "started", "dim")
            )
        if r.status is Status.STARTED:
            verdict = store.shown(r)
            running = isinstance(verdict, Running)
            deadline = f", deadline {when(r.deadline)}" if r.deadline is not None else ""
            events.append(
                Event(
                    r.updated_at,
                    3,
                    f"ledger: {r.tool} {'IN PROGRESS' if running else 'IN DOUBT'}",
                    r.tool_use_id,
                    f"started (attempt {r.attempt} by {owner(r)}{deadline}), no outcome "
                    f"recorded — {verdict.why}",
                    "bold yellow" if running else "bold red",
                )
            )
            continue
        shown = r.result if r.status is Status.SUCCEEDED else r.error
        if not reveal:
            shown = masked_text(shown)
        notes = [f"attempt {r.attempt}" if intent else "no intent needed"]
        if r.status is Status.SUCCEEDED and r.error:
            notes.append(r.error)
        if r.approved_by:
            notes.append(f"approved by {r.approved_by}")
        notes += [f"attempt {p.attempt} settled: {p.settled}" for p in r.history]
        notes += [f"attempt {p.attempt} reported late: {p.late}" for p in r.history if p.late]
        events.append(
            Event(
                r.updated_at,
                3,
                f"ledger: {r.tool} → {r.status.value}",
                r.tool_use_id,
                f"{shown or ''} ({'; '.join(notes)})",
                STATUS_STYLE.get(r.status.value, ""),
            )
        )
    for a in store.approvals(session_id):
        if calls is not None and a.tool_use_id not in calls:
            continue
        events.append(
            Event(
                a.requested_at,
                2,
                f"approval asked: {a.tool}",
                a.tool_use_id,
                f"{'(in doubt) ' if a.in_doubt else ''}{a.reason}",
                "yellow",
            )
        )
        if a.decided_at is not None:
            events.append(
                Event(
                    a.decided_at,
                    2,
                    f"approval {a.status.value}: {a.tool}",
                    a.tool_use_id,
                    f"by {a.decided_by}",
                    STATUS_STYLE.get(a.status.value, ""),
                )
            )
    return sorted(events, key=lambda e: (e.at, e.order))


def _message_events(m: StoredMessage, reader: Provider, reveal: bool) -> list[Event]:
    read = read_or_text(m, reader)
    speaker = "model" if m.role == "assistant" else "user"
    out = [
        Event(m.created_at, 0, speaker, "", text, "cyan" if speaker == "model" else "")
        for text in read.texts
        if text
    ]
    for call in read.calls:
        shown = call.input if reveal else masked(call.input)
        out.append(
            Event(
                m.created_at,
                0,
                f"model asks: {call.name}",
                call.tool_use_id,
                json.dumps(shown, ensure_ascii=False),
                "cyan",
            )
        )
    for call_id, content, is_error in read.results:
        flag = " (is_error)" if is_error else ""
        out.append(
            Event(
                m.created_at,
                4,
                f"→ model: tool_result{flag}",
                call_id,
                content if reveal else masked_text(content),
                "red" if flag else "",
            )
        )
    return out
