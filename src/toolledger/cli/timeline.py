"""A session's timeline for ``toolledger show``: its turns, tool calls and results — read
through the transcript's own API shape (Anthropic, OpenAI Chat Completions, OpenAI Responses) —
its ledger records and its approvals, in time order, secrets masked unless revealed.

An event's ``ref`` (a tool_use id) is never cut; its ``text`` is whole (JSON output shows it
whole; a table shows a preview of it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..adapters import openai as _openai
from ..adapters.anthropic import read_tool_uses
from ..errors import ToolLedgerError
from ..liveness import Running
from ..records import Status, StoredMessage, ToolCall
from ..stores.base import Store
from .format import STATUS_STYLE, owner, when
from .masking import masked, masked_text

__all__ = ["Event", "timeline"]


@dataclass(frozen=True, slots=True)
class Event:
    at: float
    order: int
    what: str
    ref: str  # the call it concerns (never cut), or ""
    text: str  # what it says, whole
    style: str = ""


@dataclass(frozen=True, slots=True)
class _Read:
    texts: list[str]
    calls: list[ToolCall]
    results: list[tuple[str, str, bool]]  # (call id, content, is_error)


def timeline(store: Store, session_id: str, *, reveal: bool = False) -> list[Event]:
    """Turns, tool calls, ledger records and approvals of a session, in time order."""
    events: list[Event] = []
    messages: list[StoredMessage] = store.messages(session_id)
    kind = _openai.transcript_kind(messages)
    for m in messages:
        events.extend(_message_events(m, kind, reveal))
    for r in store.ledger(session_id).records():
        intent = r.deadline is not None or (r.holder is None and r.attempt > 0)
        if intent:
            events.append(
                Event(r.created_at, 1, f"ledger: {r.tool} intent", r.tool_use_id, "started", "dim")
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


def _message_events(m: StoredMessage, kind: str | None, reveal: bool) -> list[Event]:
    read = _read(m, kind)
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


def _read(m: StoredMessage, kind: str | None) -> _Read:
    """A stored message's texts, calls and results, by its API's shape."""
    try:
        if kind == "openai-chat":
            return _read_chat(m)
        if kind == "openai-responses":
            return _read_responses(m)
        return _read_anthropic(m)
    except (ToolLedgerError, AttributeError, TypeError, ValueError):
        return _Read([_text(m.content)], [], [])  # a shape we cannot read: shown as it is


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _read_anthropic(m: StoredMessage) -> _Read:
    content = m.content
    if isinstance(content, str):
        return _Read([content], [], [])
    blocks = [b for b in content if isinstance(b, Mapping)]
    texts = [str(b.get("text", "")) for b in blocks if b.get("type") == "text"]
    if m.role == "assistant":
        return _Read(texts, read_tool_uses(content), [])
    results = []
    for b in blocks:
        if b.get("type") != "tool_result":
            continue
        value = b.get("content")
        if isinstance(value, list):
            value = "\n".join(
                str(p.get("text", "")) if isinstance(p, Mapping) else str(p) for p in value
            )
        results.append((str(b.get("tool_use_id", "")), _text(value), bool(b.get("is_error"))))
    return _Read(texts, [], results)


def _read_chat(m: StoredMessage) -> _Read:
    content = m.content
    if not isinstance(content, Mapping):
        return _Read([_text(content)], [], [])
    if m.role == "tool" or content.get("role") == "tool":
        text = _text(content.get("content"))
        failed = text.startswith(_openai.ERROR_PREFIX)
        return _Read([], [], [(str(content.get("tool_call_id", "")), text, failed)])
    calls = _openai.read_chat_tool_calls(content.get("tool_calls"))
    words = content.get("content")
    return _Read([_text(words)] if words else [], calls, [])


def _read_responses(m: StoredMessage) -> _Read:
    content = m.content
    if not isinstance(content, list):
        return _Read([_text(content)], [], [])
    texts: list[str] = []
    results: list[tuple[str, str, bool]] = []
    for item in content:
        if not isinstance(item, Mapping):
            continue
        if item.get("type") == "message" or "role" in item:
            parts = item.get("content")
            if isinstance(parts, str):
                texts.append(parts)
            for part in parts if isinstance(parts, list) else []:
                if isinstance(part, Mapping) and "text" in part:
                    texts.append(str(part["text"]))
        elif item.get("type") == "function_call_output":
            text = _text(item.get("output"))
            results.append(
                (str(item.get("call_id", "")), text, text.startswith(_openai.ERROR_PREFIX))
            )
    calls = _openai.read_function_calls(content) if m.role == "assistant" else []
    return _Read(texts, calls, results)
