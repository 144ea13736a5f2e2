"""What a fork or a rewind leaves behind: every effect the transcript it keeps does not account
for (``toolledger.branches._branching``; docs/design.md, rule 15: nothing is un-happened by going
back)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .._lineage import ForkedEffect
from .._liveness import Running
from ..adapters._shapes import Provider
from ..records import EffectClass, EffectRecord, SessionState, Status, StoredMessage
from ..stores.store import Store
from ..tools import ToolSet

__all__ = ["Snapshot", "call_ids", "effects_left_behind"]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A session read whole, its state unchanged from the first read to the last."""

    state: SessionState
    messages: list[StoredMessage]
    records: dict[str, EffectRecord]
    reader: Provider


def call_ids(reader: Provider, messages: Sequence[StoredMessage]) -> set[str]:
    return {i for m in messages for i in reader.call_ids(m)}


def effects_left_behind(
    store: Store, snap: Snapshot, cut: int, tools: ToolSet | None
) -> tuple[ForkedEffect, ...]:
    """Every effect the transcript's first ``cut`` messages do not account for: records of
    calls they do not hold (the turns after the point, earlier abandoned branches, a record
    with no turn at all) and effects earlier branches listed, less those a kept note told."""
    kept = snap.messages[:cut]
    called = call_ids(snap.reader, kept)
    told = {
        e.tool_use_id
        for b in snap.state.lineage
        if b.note_seq is not None and b.note_seq < cut
        for e in b.effects
    }
    # The inputs of calls left behind: in the messages after the point, or in the session's
    # abandoned branches (read once, and only when a record left behind was made there).
    later = list(snap.messages[cut:])
    sid = snap.state.session_id
    left = {i for i in snap.records if i not in called and i not in told}
    if left & snap.state.abandoned_calls():
        later += [m for branch in store.abandoned(sid).values() for m in branch]
    # A call copied from the lineage was made in another transcript: its input is in the
    # effects the lineage's branches listed.
    inputs = {e.tool_use_id: e.input for b in snap.state.lineage for e in b.effects}
    inputs.update(
        (c.tool_use_id, c.input)
        for m in later
        if m.role == "assistant"
        for c in snap.reader.tool_calls(m)
    )
    out: dict[str, ForkedEffect] = {}
    lease = store.lease(sid) if any(snap.records[i].in_doubt for i in left) else None
    for read in sorted(snap.records.values(), key=lambda r: (r.created_at, r.tool_use_id)):
        if read.tool_use_id not in left or _harmless(read.tool, tools):
            continue
        r, verdict = read, None
        if r.status is Status.STARTED:
            r, verdict = store.current(r, lease)  # an "over" read again: what it is now
        if verdict is not None:
            state = "in_progress" if isinstance(verdict, Running) else "in_doubt"
        elif r.status is Status.SUCCEEDED:
            state = Status.SUCCEEDED.value
        else:
            continue  # failed, declined, did not happen: nothing took effect
        out[r.tool_use_id] = ForkedEffect(
            session_id=r.key_session,
            tool_use_id=r.tool_use_id,
            tool=r.tool,
            input=inputs.get(r.tool_use_id),
            state=state,
            result=r.result if r.status is Status.SUCCEEDED else None,
            at=r.updated_at,
        )
    for b in snap.state.lineage:
        for e in b.effects:
            if e.tool_use_id not in told and e.tool_use_id not in called:
                out.setdefault(e.tool_use_id, e)
    return tuple(out.values())


def _harmless(tool: str, tools: ToolSet | None) -> bool:
    known = tools.get(tool) if tools is not None else None
    return known is not None and known.effect is EffectClass.READ_ONLY
