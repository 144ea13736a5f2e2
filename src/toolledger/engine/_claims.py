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

Only calls whose second run would add an effect and whose intent is written before they run are
claimed (non-idempotent tools that do not forward their key, and high-impact ones); a read-only,
idempotent or key-forwarding call runs where it is asked — a non-idempotent key-forwarding one
once its claim in the root found no record of it there (``looks_up``), under the root's key.
Such a claim only pins which call the id is (``pins_only``): another input is refused wherever
it is met later, and nobody waits for it. A session no fork made claims nothing: its own ledger
is the root's, where its intents meet the claims.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import replace
from typing import Any

from .._crash import hit as crash_point
from ..errors import EffectInProgressError
from ..ops import InsertEffect, UpdateEffect
from ..records import EffectClass, EffectRecord, Status, ToolCall
from ..stores._copies import same_call
from ..tools import Tool
from ._batch import Buffer, Env, write
from ._copies import copy_of, stand_in, still_to_run
from ._decide import Action, Reject, Replay, refuse_mismatch
from ._outcomes import flush
from ._requests import Commit, Failure, ReadEffects, ReadLineageRoot, Request

__all__ = [
    "before_making",
    "claim",
    "claims",
    "lineage_root",
    "look_up",
    "looks_up",
    "pinned",
    "pins_only",
    "take_over",
    "to_claim",
]


def claims(tool: Tool[Any, Any] | None) -> bool:
    """Whether a fresh call of ``tool`` is claimed for the lineage: its second run would add an
    effect (or a second question to a person), and it records its intent before it runs — which
    is what the lineage's first session makes its own claim with. (A key-forwarding tool writes
    none: the receiver's key is its guard, and it runs where it is asked.)"""
    return tool is not None and tool.needs_intent


def looks_up(tool: Tool[Any, Any] | None) -> bool:
    """Whether a branch's fresh call of ``tool`` is looked up, not claimed, in its lineage's
    root first: its second run would add an effect, but it writes no intent (a key-forwarding
    tool that is not high-impact), so it is not claimed. A call the root recorded is the
    lineage's: the branch answers from that record, under its key, and does not run it again
    under its own (a receiver that honours keys would take it twice). One the root holds no
    record of is pinned there (``look_up``), and no one waits for it."""
    return tool is not None and not tool.needs_intent and tool.effect is EffectClass.NON_IDEMPOTENT


def to_claim(
    record: EffectRecord | None, tool: Tool[Any, Any] | None, action: Action, env: Env
) -> bool:
    """Whether a call whose first step is ``action`` may have to be claimed before it is made
    here: not made here yet (no ``record``, or one of its own that did not happen), its second
    run would add an effect, the step makes something, and this session is not known to be no
    branch (the common case goes straight on, with a cache lookup)."""
    fresh = record is None or (record.status is Status.NOT_HAPPENED and not record.copied)
    return (
        fresh
        and (claims(tool) or looks_up(tool))
        and not isinstance(action, _MAKES_NOTHING)
        and env.ledger.store.known_lineage_root(env.session_id) != (True, None)
    )


_MAKES_NOTHING = (Reject, Replay)


def lineage_root(env: Env) -> Generator[Request, Any, str | None]:
    """Where this session's lineage claims its calls (``None``: in its own ledger): fixed when
    the session was made, so read once per store (``Store.lineage_root``)."""
    known, root = env.ledger.store.known_lineage_root(env.session_id)
    if not known:
        root = yield ReadLineageRoot()
    return root


def before_making(
    call: ToolCall, record: EffectRecord | None, env: Env, unread: bool
) -> Generator[Request, Any, tuple[EffectRecord | None, bool]]:
    """Before this session makes ``call`` — its ledger holds no ``record`` of it (``unread``:
    not read yet), or one of its own that did not happen — claim it for the lineage if this
    session is a branch (``claim``). Returns the record to decide the call from instead
    (``None``: it is this session's to make) and whether its record is still unread."""
    root = yield from lineage_root(env)
    if root is None:
        return None, unread
    if unread:
        own: dict[str, EffectRecord] = yield ReadEffects([call.tool_use_id])
        if call.tool_use_id in own:
            return own[call.tool_use_id], False
    if not claims(env.tools.get(call.name)):
        return (yield from look_up(call, record, root, env)), False
    held = yield from claim(call, record, root, env)
    return held, False


def look_up(
    call: ToolCall, record: EffectRecord | None, root: str, env: Env
) -> Generator[Request, Any, EffectRecord | None]:
    """``call`` of a tool that is not claimed (``looks_up``), about to be made on this branch:
    ``None`` when its lineage's root holds no record of it (it runs here), else the record this
    session now holds for it — a copy of the root's, settled as a fork's copies are. Run here,
    it forwards the root's key (``Env.keyed``): the key of the lineage, which every session of
    it that makes the call first forwards too — the root, or another branch — so a receiver
    that honours keys takes it once, though no ledger of the lineage saw the others' runs.
    The look-up is a claim in the root (``_claim_in``): the root held no record of the call
    before, and a session of the lineage that makes it later under another input — the root
    itself, another branch — would send that input under the same key, and a receiver that
    honours keys would answer it with this call's outcome, its own effect never made. The claim
    pins the call; it makes no one wait (``pins_only``). Raises ``LedgerMismatchError`` when
    the root's record of the id is another call's."""
    there = yield from _claim_in(root, call, env, made_in=root, why=_PINNED)
    if there is None or pins_only(there):
        env.keyed[call.tool_use_id] = root
        return None
    copy = copy_of(there, env.session_id)
    return (yield from _hold(call, copy, record))


_PINNED = (
    "made first by session {sid!r}, a branch of this lineage, under this session's key: "
    "recorded here so that every session of the lineage meets one call under this id; not run here"
)


def pinned(
    record: EffectRecord, tool: Tool[Any, Any] | None, env: Env
) -> Generator[Request, Any, bool]:
    """Whether ``record``, this session's copy of a call of ``tool``, is a branch's claim on a
    key-forwarding call in the lineage's first session — this one (``look_up``): it pins which
    call the id is and no more. The call runs here as if unrecorded, under this session's key
    (``EffectRecord.made_in``), not deferred to the branch: a branch that stopped while it made
    the call settles nothing, and the receiver's key is the call's guard."""
    if not (looks_up(tool) and pins_only(record)):
        return False
    return (yield from lineage_root(env)) is None


def pins_only(record: EffectRecord) -> bool:
    """Whether ``record``, in a lineage's first session, is a branch's claim on a call and no
    more: not run there, standing for the branch that asked for it. Of a key-forwarding call
    (``looks_up``) it only pins which call the id is (rule 7, across the lineage): the call
    still runs where it is asked, under the first session's key, and the receiver's key is its
    guard."""
    return record.copied and record.status is Status.NOT_HAPPENED


def _hold(
    call: ToolCall, copy: EffectRecord, record: EffectRecord | None
) -> Generator[Request, Any, EffectRecord]:
    """Write ``copy`` of the lineage's record over this session's ``record`` of ``call``: the
    record the session holds now (another writer's, if it moved first). Raises the store's
    error when it cannot be written."""
    stored = yield Commit([write(copy, record)])
    if isinstance(stored, Failure):
        raise stored.exc
    if not stored[0]:
        mine: dict[str, EffectRecord] = yield ReadEffects([call.tool_use_id])
        return mine.get(call.tool_use_id, copy)
    return copy


def claim(
    call: ToolCall, record: EffectRecord | None, root: str, env: Env
) -> Generator[Request, Any, EffectRecord | None]:
    """Claim ``call`` in its lineage's ``root`` before this branch makes it: its ledger holds no
    ``record`` of it, or one of its own that did not happen (a person said so; its attempt was
    given up). Returns ``None`` when the call is this session's to make (the lineage's first,
    or the claim is its own), else the record the session now holds for it: a copy of the
    lineage's record, settled where that one is. Raises the store's error when the claim cannot
    be written or read (nothing ran; the next run claims again)."""
    sid = env.session_id
    if record is None and (yield from still_to_run(root, call.tool_use_id)):
        # The root claims nothing of its own (its ledger is where claims land): a turn of it
        # that asks for the call and has no record of it yet — under way, or stopped for a
        # person's approval — is the lineage making it. Claimed here, the root's question would
        # be overtaken and its answer never used, and a second person asked on this branch.
        # The branch stands for the root's call, as a fork's copy of such a call does.
        copy = stand_in(
            call,
            session=sid,
            origin=root,
            made_in=root,
            at=env.clock(),
            why=f"asked for in session {root!r}, the first of this lineage, not run there yet",
        )
        return (yield from _hold(call, copy, record))
    made_in = sid if record is None else record.key_session
    there = yield from _claim_in(root, call, env, made_in=made_in)
    if there is None or (there.origin == sid and there.status is Status.NOT_HAPPENED):
        return None  # the lineage's first, or this session's own claim from a run that stopped
    copy = copy_of(there, sid)
    if copy.origin == sid:
        # The root took this session's outcome since, and this session's record is gone: the
        # root's record answers.
        copy = replace(copy, origin=root)
    return (yield from _hold(call, copy, record))


def take_over(
    call: ToolCall, held: EffectRecord, env: Env, buf: Buffer
) -> Generator[Request, Any, tuple[EffectRecord, bool]]:
    """``held``, this session's copy of its lineage's call, is about to run here as this
    session's own: the session it stood for gave the call up (no turn there asks for it any
    more), or no longer holds it. On a branch the lineage's claim moves here first — a
    compare-and-set on the claim in the root — so that of two branches that saw it given up one
    runs it; the lineage's first session needs no more than its own record, which is the claim.
    Returns the record to go on with and whether the call is this session's now; if not, the
    record is ``held`` pointed at the session that holds the call (not written: the call is
    decided again from there)."""
    moved = yield from _move_claim(call, held, env)
    if moved is not None:
        return moved, False
    if held.status is not Status.NOT_HAPPENED:
        return held, True  # an attempt copied from an origin that no longer holds the call
    # This session's own from now on, before anything is asked or run: a copy left pointing at
    # the session that gave it up would defer to it again.
    if buf.items:
        yield from flush(buf, env, [])
    mine = replace(held, origin=None)
    answer = yield Commit([write(mine, held)])
    if isinstance(answer, Failure):
        raise answer.exc
    if not answer[0]:
        found: dict[str, EffectRecord] = yield ReadEffects([call.tool_use_id])
        return found.get(call.tool_use_id, held), False
    return mine, True


def _move_claim(
    call: ToolCall, held: EffectRecord, env: Env
) -> Generator[Request, Any, EffectRecord | None]:
    """Move the lineage's claim on ``call`` to this session (``take_over``): ``None`` once it is
    this session's, else ``held`` pointed at the session that holds it."""
    root = yield from lineage_root(env)
    if root is None:
        return None
    sid = env.session_id
    for _ in range(2):  # a claim that moved under us is read again, once
        found: dict[str, EffectRecord] = yield ReadEffects([call.tool_use_id], session=root)
        there = found.get(call.tool_use_id)
        if there is None:
            there = yield from _claim_in(root, call, env, made_in=held.key_session)
            if there is None:
                return None
        if not same_call(held, there):
            return None
        if there.status.terminal:
            return replace(held, origin=root)  # done, and the root's record says how
        holder = there.origin if there.copied else root  # whose call the lineage says it is
        if holder == sid:
            return None
        if there.status is not Status.NOT_HAPPENED or holder != held.origin:
            # Made (or being made) by the root now, or another session took it over first.
            return replace(held, origin=holder)
        moved = replace(
            there,
            origin=sid,
            updated_at=env.clock(),
            error=f"claimed by session {sid!r}, a branch of this lineage, after session "
            f"{holder!r} gave it up; it makes this call for every session of it; not run here",
        )
        answer = yield Commit(
            [UpdateEffect(moved, there.status, there.attempt, expect_at=there.updated_at)],
            fenced=False,
            session=root,
        )
        if isinstance(answer, Failure):
            raise answer.exc
        if answer[0]:
            return None
    raise EffectInProgressError(
        f"{call.name!r} ({call.tool_use_id}) in session {sid!r}: the claim of this lineage's "
        "call kept moving while this session tried to take it over (other branches are at "
        "it); retry later to get its outcome",
        session_id=sid,
        tool_use_id=call.tool_use_id,
        holder=None,
    )


_CLAIMED = (
    "claimed by session {sid!r}, a branch of this lineage, which makes this call for every "
    "session of it; not run here"
)


def _claim_in(
    root: str, call: ToolCall, env: Env, *, made_in: str, why: str = _CLAIMED
) -> Generator[Request, Any, EffectRecord | None]:
    """Insert this session's claim on ``call`` into ``root``'s ledger: ``None`` when it landed,
    else the record there that refused it (``None`` too when that one is gone since: this call
    is this session's own). Raises ``LedgerMismatchError`` when that record is another call of
    that id (rule 7, across the lineage: one lineage, one call per id)."""
    sid = env.session_id
    mark = stand_in(
        call,
        session=root,
        origin=sid,
        made_in=made_in,
        at=env.clock(),
        why=why.format(sid=sid),
    )
    answer = yield Commit([InsertEffect(mark)], fenced=False, session=root)
    if isinstance(answer, Failure):
        raise answer.exc
    if answer[0]:
        crash_point("after_claim")
        return None
    found: dict[str, EffectRecord] = yield ReadEffects([call.tool_use_id], session=root)
    there = found.get(call.tool_use_id)
    if there is not None:
        _same_call(there, call, env, root)
    return there


def _same_call(there: EffectRecord, call: ToolCall, env: Env, root: str) -> None:
    """Rule 7 across a lineage: ``there``, the record of ``call``'s id in the lineage's first
    session ``root``, must be this call's (same tool, same input) — as a copy a fork made of it
    must be. Another call of that id is refused before anything runs or is asked, whichever
    session of the lineage made it first."""
    refuse_mismatch(
        there,
        call,
        env.session_id,
        f"in session {root!r}, the first of session {env.session_id!r}'s lineage, whose "
        "sessions share their calls. Nothing was run. The transcript was edited or a branch's "
        "model reused an id of its lineage for another call.",
    )
