"""A session's history: every turn of its transcript, each call of the turn and where the ledger
says it stands (``Store.history``, ``toolledger history``).

A *turn* is one assistant message: turn 1 is the model's first answer. What the model asked for
is its text, whole, and its calls, read through the provider of the transcript's kind (Anthropic
Messages, OpenAI Chat Completions, OpenAI Responses), so a history reads the same whatever the
API. Each call's disposition comes from its ledger record:

=================  ==========================================================================
``succeeded``      the call took effect and its result is recorded
``failed``         the tool raised: recorded ``failed``, or — a call that needs no intent
                   (a safe tool) — no record and an error result in the transcript
``in_progress``    started, and its attempt may still be running (``Store.judge``: leave it)
``in_doubt``       started, and its attempt is over with no outcome: a person must settle it
``declined``       the approver (or a person) denied it, or its intent could not be recorded
                   ("not executed"): it never ran, and never runs under its id
``not_happened``   settled by a person as "it did not take effect": it may run again
``not_recorded``   no record and no error result: the call has not run yet (or ran without a
                   ledger)
=================  ==========================================================================

Reading a history writes nothing. The turns are those of the session's transcript as it stands;
``branches`` gives the forks and rewinds that made it (``toolledger.branches``): for each, the
effects it listed, and for a rewind the turns it abandoned, read from where they are kept, each
call's disposition still from the session's ledger.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from .._lineage import Branch
from .._liveness import Running
from ..adapters import read_or_text, transcript_reader
from ..records import EffectClass, EffectRecord, Lease, Status, StoredMessage
from ._core import StoreCore

if TYPE_CHECKING:
    from ..tools import ToolSet

__all__ = ["BranchHistory", "CallState", "Turn", "TurnCall", "branches", "history"]


class CallState(StrEnum):
    """Where one call of a turn stands, read from its ledger record (see the module's table)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    IN_DOUBT = "in_doubt"
    DECLINED = "declined"
    NOT_HAPPENED = "not_happened"
    NOT_RECORDED = "not_recorded"


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnCall:
    """One call the model asked for in a turn.

    ``effect`` is the tool's effect class when ``history`` was given the tools and knows this
    one, else ``None``. ``record`` is its ledger record (``None``: not recorded). ``result`` is
    what the transcript told the model (whole; ``None``: not answered yet). ``why`` says, for a
    started call, why it is judged in progress or in doubt."""

    tool_use_id: str
    tool: str
    input: Any
    effect: EffectClass | None
    disposition: CallState
    record: EffectRecord | None
    result: str | None
    why: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Turn:
    """One assistant message of a session: its number (1-based), when it was stored (the
    message's ``created_at``, on the store's clock), its text (whole: only a display shortens
    it), its calls in the order the model made them, and the message's ``seq``."""

    number: int
    at: float
    text: str
    calls: tuple[TurnCall, ...]
    seq: int


@dataclass(frozen=True, slots=True, kw_only=True)
class BranchHistory:
    """One fork or rewind in the making of a session: its lineage entry (where from, at which
    turn, when, the effects it listed) and, for a rewind of this very session, the turns it
    abandoned, numbered from the turn after its point (``()`` for a fork, or a rewind inherited
    from a forked parent: those turns are the parent's)."""

    branch: Branch
    abandoned: tuple[Turn, ...] = ()


def history(store: StoreCore, session_id: str, *, tools: ToolSet | None = None) -> list[Turn]:
    """Every turn of ``session_id``, oldest first (an unknown session has none). ``tools``, when
    given, names each known call's effect class. Reads the transcript, the ledger and the lease
    once each; writes nothing."""
    messages = store.messages(session_id)
    records = store.backend.read_effects(session_id)
    return _turns(store, messages, records, store.lease(session_id), tools, first=1)


def branches(
    store: StoreCore, session_id: str, *, tools: ToolSet | None = None
) -> list[BranchHistory]:
    """The forks and rewinds that made ``session_id``, oldest first (none for a session never
    branched, or unknown). Reads only."""
    state = store.session(session_id)
    if state is None or not state.lineage:
        return []
    own = any(b.branch is not None and b.source == session_id for b in state.lineage)
    abandoned = store.abandoned(session_id) if own else {}
    records = store.backend.read_effects(session_id) if own else {}
    lease = store.lease(session_id) if own else None
    out: list[BranchHistory] = []
    for b in state.lineage:
        turns: list[Turn] = []
        if b.branch is not None and b.source == session_id:
            kept = abandoned.get(b.branch, [])
            turns = _turns(store, kept, records, lease, tools, first=b.turn + 1)
        out.append(BranchHistory(branch=b, abandoned=tuple(turns)))
    return out


def _turns(
    store: StoreCore,
    messages: list[StoredMessage],
    records: dict[str, EffectRecord],
    lease: Lease | None,
    tools: ToolSet | None,
    *,
    first: int,
) -> list[Turn]:
    reader = transcript_reader(messages)
    parts_of = [(m, read_or_text(m, reader)) for m in messages]
    results = {call_id: (text, bad) for _, p in parts_of for call_id, text, bad in p.results}
    turns: list[Turn] = []
    for m, parts in parts_of:
        if m.role != "assistant":
            continue
        calls: list[TurnCall] = []
        for call in parts.calls:
            record = records.get(call.tool_use_id)
            told = results.get(call.tool_use_id)
            disposition, why = _disposition(store, record, lease, told)
            tool = tools.get(call.name) if tools is not None else None
            calls.append(
                TurnCall(
                    tool_use_id=call.tool_use_id,
                    tool=call.name,
                    input=call.input,
                    effect=tool.effect if tool is not None else None,
                    disposition=disposition,
                    record=record,
                    result=None if told is None else told[0],
                    why=why,
                )
            )
        turns.append(
            Turn(
                number=first + len(turns),
                at=m.created_at,
                text="\n".join(t for t in parts.texts if t),
                calls=tuple(calls),
                seq=m.seq,
            )
        )
    return turns


_BY_STATUS = {
    Status.SUCCEEDED: CallState.SUCCEEDED,
    Status.FAILED: CallState.FAILED,
    Status.DENIED: CallState.DECLINED,
    Status.NOT_HAPPENED: CallState.NOT_HAPPENED,
}


def _disposition(
    store: StoreCore,
    record: EffectRecord | None,
    lease: Lease | None,
    told: tuple[str, bool] | None,
) -> tuple[CallState, str]:
    if record is None:
        failed = told is not None and told[1]
        return (CallState.FAILED if failed else CallState.NOT_RECORDED), ""
    if record.status is not Status.STARTED:
        return _BY_STATUS[record.status], ""
    now, verdict = store.current(record, lease)  # an "over" read again: what it is now
    if verdict is None:
        return _BY_STATUS[now.status], ""
    running = isinstance(verdict, Running)
    return (CallState.IN_PROGRESS if running else CallState.IN_DOUBT), verdict.why
