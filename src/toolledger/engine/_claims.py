"""A branch's claim on a call its lineage has not made yet (docs/design.md, rule 19: one lineage,
one call per id).

A fork copies the calls its lineage had made when it was made (``toolledger.engine._copies``).
A call none of them had made yet — a turn its source had not reached, replayed on two branches
by a model that answers as before — has no copy to find. So before a branch first records such a
call (its intent, its question to the approver), it claims the id in its lineage's root
(``Store.lineage_root``): an insert-if-absent of a record standing for the branch's
(``EffectRecord.origin``), never run there. The first session to record the id — the root
itself by its own intent, or a branch by its claim — makes the call for the whole lineage; any
other that meets it later holds a copy of it and is settled by it, as a fork's copies are: it
takes its outcome, waits while it runs, answers in doubt naming where it is settled.

Only calls whose second run would add an effect are claimed (non-idempotent and high-impact
tools); a read-only or idempotent call runs where it is asked. A session no fork made claims
nothing: its own ledger is the root's, where its intents meet the claims.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import replace
from typing import Any

from .._crash import hit as crash_point
from ..ops import InsertEffect
from ..records import EffectClass, EffectRecord, Status, ToolCall
from ..stores._copies import same_call
from ..tools import Tool
from ._batch import Env
from ._copies import copy_of
from ._requests import Commit, Failure, ReadEffects, ReadLineageRoot, Request

__all__ = ["claim", "claims", "lineage_root"]


def claims(tool: Tool[Any, Any] | None) -> bool:
    """Whether a fresh call of ``tool`` is claimed for the lineage: its second run would add an
    effect (or a second question to a person)."""
    return tool is not None and (tool.high_impact or tool.effect is EffectClass.NON_IDEMPOTENT)


def lineage_root() -> Generator[Request, Any, str | None]:
    """Where this session's lineage claims its calls (``None``: in its own ledger)."""
    root: str | None = yield ReadLineageRoot()
    return root


def claim(call: ToolCall, root: str, env: Env) -> Generator[Request, Any, EffectRecord | None]:
    """Claim ``call`` — which this branch's ledger does not hold — in its lineage's ``root``.
    Returns ``None`` when the call is this session's to make (the lineage's first, or the claim
    is its own), else the record the session now holds for it: a copy of the lineage's record,
    settled where that one is. Raises the store's error when the claim cannot be written or read
    (nothing ran; the next run claims again)."""
    sid = env.session_id
    now = env.clock()
    mark = EffectRecord(
        session_id=root,
        tool_use_id=call.tool_use_id,
        tool=call.name,
        input_hash=call.input_hash,
        status=Status.NOT_HAPPENED,
        error=f"claimed by session {sid!r}, a branch of this lineage, which makes this call for "
        "every session of it; not run here",
        created_at=now,
        updated_at=now,
        made_in=sid,
        origin=sid,
    )
    answer = yield Commit([InsertEffect(mark)], fenced=False, session=root)
    if isinstance(answer, Failure):
        raise answer.exc
    if answer[0]:
        crash_point("after_claim")
        return None  # the lineage's first: this session makes it
    found: dict[str, EffectRecord] = yield ReadEffects([call.tool_use_id], session=root)
    there = found.get(call.tool_use_id)
    if there is None or not same_call(mark, there):
        # Gone since (its root removed), or another call of that id: this call is its own.
        return None
    if there.origin == sid and there.status is Status.NOT_HAPPENED:
        return None  # this session's own claim, from a run that stopped before its intent
    copy = copy_of(there, sid)
    if copy.origin == sid:
        # The root took this session's outcome since, and this session's record is gone: the
        # root's record answers.
        copy = replace(copy, origin=root)
    stored = yield Commit([InsertEffect(copy)])
    if isinstance(stored, Failure):
        raise stored.exc
    if not stored[0]:
        mine: dict[str, EffectRecord] = yield ReadEffects([call.tool_use_id])
        return mine.get(call.tool_use_id, copy)
    return copy
