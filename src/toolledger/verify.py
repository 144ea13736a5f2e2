"""``verify(store)``: is the store sound, and does every transcript agree with its ledger?

Checks, per store: the engine's own integrity check (SQLite ``PRAGMA integrity_check``; every JSON
file parsed and its digests checked). Per agent session: the transcript has as many messages as
its state says; it obeys the Messages API's tool_use/tool_result pairing rule (a pending last
turn is allowed while the session is unfinished); every tool_result that reports success has a
``succeeded`` record in the ledger; every ledger record belongs to a tool_use of the transcript.
In-doubt calls are reported as warnings: they are legitimate, and they need a person.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .adapters.anthropic import merged, pairing_errors, read_tool_uses
from .errors import ToolLedgerError
from .records import RunStatus, Status
from .stores.base import Store

__all__ = ["Problem", "Severity", "verify"]


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True, slots=True)
class Problem:
    severity: Severity
    session_id: str | None
    message: str


def verify(store: Store) -> list[Problem]:
    """Every problem found; an empty list means the store is sound."""
    problems: list[Problem] = []
    check = getattr(store.backend, "integrity_check", None)
    if callable(check):
        problems += [Problem(Severity.ERROR, None, p) for p in check()]
    try:
        session_ids = store.sessions()
    except ToolLedgerError as exc:
        return [*problems, Problem(Severity.ERROR, None, str(exc))]
    for sid in session_ids:
        try:
            problems += _session(store, sid)
        except ToolLedgerError as exc:
            problems.append(Problem(Severity.ERROR, sid, str(exc)))
    return problems


def _session(store: Store, sid: str) -> list[Problem]:
    out: list[Problem] = []
    records = store.ledger(sid).records()
    for r in records:
        if r.status is Status.STARTED:
            out.append(
                Problem(
                    Severity.WARNING,
                    sid,
                    f"{r.tool!r} ({r.tool_use_id}) is in doubt since attempt {r.attempt}: "
                    f"resolve it with `toolledger resolve {sid} {r.tool_use_id} "
                    "--happened|--not-happened`",
                )
            )
    state = store.backend.read_session(sid)
    if state is None:
        return out  # a ledger used through run_tool_uses alone: no transcript to compare
    messages = store.backend.read_messages(sid)
    if len(messages) != state.messages or [m.seq for m in messages] != list(range(len(messages))):
        out.append(
            Problem(
                Severity.ERROR,
                sid,
                f"the state counts {state.messages} messages, the transcript holds {len(messages)}",
            )
        )
    wire = merged(messages)
    pending: list[str] = []
    if wire and wire[-1]["role"] == "assistant" and isinstance(wire[-1]["content"], list):
        pending = [c.tool_use_id for c in read_tool_uses(wire[-1]["content"])]
    checked = wire[:-1] if pending else wire
    out += [Problem(Severity.ERROR, sid, f"transcript: {p}") for p in pairing_errors(checked)]
    if pending and state.status is RunStatus.COMPLETED:
        out.append(
            Problem(
                Severity.ERROR,
                sid,
                f"completed, but its last turn's calls have no results: {', '.join(pending)}",
            )
        )
    by_id = {r.tool_use_id: r for r in records}
    called: set[str] = set()
    for m in messages:
        blocks: list[Any] = m.content if isinstance(m.content, list) else []
        if m.role == "assistant":
            called.update(c.tool_use_id for c in read_tool_uses(blocks))
            continue
        for b in blocks:
            if b.get("type") != "tool_result" or b.get("is_error"):
                continue
            record = by_id.get(b.get("tool_use_id", ""))
            if record is None or record.status is not Status.SUCCEEDED:
                found = "no record" if record is None else f"a {record.status.value} record"
                out.append(
                    Problem(
                        Severity.ERROR,
                        sid,
                        f"the transcript reports {b.get('tool_use_id')} succeeded but the "
                        f"ledger has {found}: an effect the ledger cannot vouch for",
                    )
                )
    for tid in sorted(set(by_id) - called):
        out.append(
            Problem(
                Severity.ERROR,
                sid,
                f"ledger record {tid} ({by_id[tid].tool}) matches no tool_use in the transcript",
            )
        )
    return out
