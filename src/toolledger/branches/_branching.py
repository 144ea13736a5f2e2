"""Rewind and fork: going back to an earlier turn of a session without forgetting what the world
saw (docs/design.md, rule 15).

``fork(store, session, at_turn=K)`` makes a new session whose transcript is ``session``'s through
the end of turn K — the assistant message and the results of every call it made, a checkpoint-B
boundary — and whose ledger holds copies of those calls' records, so a replay of their ids
answers from the ledger. ``rewind(store, session, to_turn=K)`` does the same in place: the turns
after K leave the transcript but are kept, whole, as the session's abandoned branch
(``Store.abandoned``); their records stay in its ledger.

An e-mail sent at turn 3 is not unsent by going back to turn 2, and a model that is not told
would send it again under a new tool_use id, which no ledger can match. So every call the kept
transcript does not account for that took effect, or may have (succeeded; started and in doubt;
started and still in progress), is listed on the branch (``SessionState.lineage``,
``Run.effects_after_fork``, ``toolledger history``) and, unless ``effects_after_fork="ignore"``,
told to the model once: a short factual note appended to the transcript right after the branch
point, so that the first request of the branch carries it (and every later one, as part of the
conversation). The calls are those of the turns left behind, those a kept note did not already
tell of on earlier branches, and any record the transcript does not hold. The states are as the
ledger had them when the branch was made.

Both are one transaction (every backend): a killed fork leaves the whole new session or nothing,
a killed rewind the session as it was or rewound. A rewind takes the session's lease for that
transaction (``SessionBusyError`` while a worker holds it) and gives it back, so a worker paused
past its lease and waking afterwards has its writes refused by the token; a fork reads its parent
without stopping it, as a snapshot. The branch is left ``ready``: ``Agent.run`` with no prompt
asks the model to go on from it, a new prompt is appended first.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal
from uuid import uuid4

from .._lineage import Branch, BranchKind, ForkedEffect
from ..adapters import transcript_reader
from ..adapters._shapes import Provider
from ..engine import _leases as leases
from ..engine._copies import copy_of
from ..engine._copies import lineage_calls as _lineage_calls
from ..errors import BranchPointError, ConfigurationError, SessionConflictError
from ..ops import (
    AbandonMessages,
    AppendMessages,
    DropLease,
    InsertEffect,
    Op,
    PutApproval,
    PutSession,
)
from ..records import ApprovalStatus, RunStatus, SessionState, StoredMessage
from ..stores.store import Store, check_session_id
from ..tools import ToolSet
from ._left_behind import Snapshot, call_ids, effects_left_behind
from ._note import note_text

__all__ = ["EffectsAfterFork", "copy_of", "fork", "note_text", "rewind"]

EffectsAfterFork = Literal["tell", "ignore"]

_SNAPSHOT_TRIES = 5


def fork(
    store: Store,
    session: str,
    *,
    at_turn: int,
    new_session: str | None = None,
    effects_after_fork: EffectsAfterFork = "tell",
    tools: ToolSet | None = None,
    by: str | None = None,
) -> str:
    """Make a new session from ``session``'s transcript through the end of turn ``at_turn``
    (1-based; 0 keeps only what came before the model's first answer) and return its id
    (``new_session``, or a fresh one). The new session holds copies of the kept calls' ledger
    records and lists, and by default tells the model of, every effect the kept transcript does
    not account for (see the module docstring). ``tools``, when given, leaves out calls of
    ``read_only`` tools. ``session`` is not changed.

    Raises ``BranchPointError`` (no such session or turn; the turn's calls not all answered),
    ``SessionConflictError`` (``new_session`` exists, or ``session`` kept changing while it was
    read) and ``StoreError``. One transaction: a killed fork leaves all of it or nothing."""
    sid = check_session_id(session)
    new = check_session_id(new_session) if new_session is not None else f"{sid[:200]}~{_tag()}"
    _check_choice(effects_after_fork)
    if new == sid:
        raise ConfigurationError("a fork needs a session id of its own")
    snap = _snapshot(store, sid, at_turn)
    cut = _cut(snap, sid, at_turn)
    kept = snap.messages[:cut]
    now = store.clock()
    effects = effects_left_behind(store, snap, cut, tools)
    note = _note(
        snap.reader, effects=effects, turn=at_turn, seq=cut, now=now, choice=effects_after_fork
    )
    messages = [*kept, *([note] if note is not None else [])]
    entry = Branch(
        kind=BranchKind.FORK,
        source=sid,
        turn=at_turn,
        at=now,
        cut=cut,
        note_seq=None if note is None else note.seq,
        effects=effects,
        by=by,
        root=store.lineage_root(sid) or sid,
    )
    state = SessionState(
        session_id=new,
        status=RunStatus.READY,
        reason=f"forked from {sid!r} at turn {at_turn}",
        version=1,
        turns=at_turn,
        messages=len(messages),
        created_at=now,
        updated_at=now,
        lineage=(*_fork_lineage(snap.state.lineage, cut), entry),
    )
    lineage = _lineage_calls(
        snap.records, snap.messages, snap.reader, source=sid, session=new, at=now
    )
    copies = [InsertEffect(r) for r in lineage]
    if store.holds(new):
        raise SessionConflictError(
            f"cannot fork into {new!r}: a session of that id exists already. Nothing was "
            "written; choose another id.",
            session_id=new,
        )
    ops: list[Op] = [PutSession(state, None), AppendMessages(tuple(messages)), *copies]
    store.apply(new, ops)
    store.note_lineage(new, state.lineage)
    return new


def rewind(
    store: Store,
    session: str,
    *,
    to_turn: int,
    effects_after_fork: EffectsAfterFork = "tell",
    tools: ToolSet | None = None,
    by: str | None = None,
    watch: float | None = None,
) -> Branch:
    """Take ``session`` back to the end of turn ``to_turn``, in place. The later messages leave
    the transcript and are kept as its next abandoned branch (``Store.abandoned``), never
    deleted; their calls' records stay in its ledger. Every effect the kept transcript does not
    account for is listed on the session and, by default, told to the model in a note (see the
    module docstring). Returns the ``Branch`` added to the session's lineage.

    The session's lease is taken for the one transaction the rewind is, then given back: a
    worker running the session makes it raise ``SessionBusyError`` (stop it first), and one
    paused past its lease is refused at its next write. A worker this process can judge only by
    its lease's renewals (another host or container, no readable ``/proc``) is watched for up
    to ``watch`` seconds (``None``: its lease's time to live) first. Raises ``BranchPointError``
    as ``fork`` does, and ``SessionConflictError`` when the session changed while it was being
    rewound."""
    sid = check_session_id(session)
    _check_choice(effects_after_fork)
    snap = _snapshot(store, sid, to_turn)
    cut = _cut(snap, sid, to_turn)
    if cut == len(snap.messages):
        raise BranchPointError(
            f"turn {to_turn} is where session {sid!r} stands: there is nothing to rewind",
            session_id=sid,
            turn=to_turn,
        )
    current, verdict = leases.decided(store, sid, watch=watch)
    lease = leases.take(
        current,
        verdict,
        session_id=sid,
        owner=f"{store.worker_id}/rewind",
        holder=store.runtime.holder,
        now=store.now(),
        ttl=60.0,
    )
    now = store.clock()
    effects = effects_left_behind(store, snap, cut, tools)
    note = _note(
        snap.reader, effects=effects, turn=to_turn, seq=cut, now=now, choice=effects_after_fork
    )
    branch = 1 + sum(
        1 for b in snap.state.lineage if b.kind is BranchKind.REWIND and b.source == sid
    )
    abandoned = snap.messages[cut:]
    entry = Branch(
        kind=BranchKind.REWIND,
        source=sid,
        turn=to_turn,
        at=now,
        cut=cut,
        note_seq=None if note is None else note.seq,
        effects=effects,
        branch=branch,
        abandoned_calls=tuple(sorted(call_ids(snap.reader, abandoned))),
        by=by,
    )
    kept_turns = sum(1 for m in snap.messages[:cut] if m.role == "assistant")
    state = replace(
        snap.state,
        status=RunStatus.READY,
        reason=f"rewound to turn {to_turn}",
        version=snap.state.version + 1,
        turns=kept_turns,
        messages=cut + (0 if note is None else 1),
        updated_at=now,
        lineage=(*(_untold(b, cut) for b in snap.state.lineage), entry),
    )
    # An approval asked for a call left behind would never be used: it is declined, so no
    # person is asked about it and the session can be removed one day.
    left = set(entry.abandoned_calls)
    declined = [
        PutApproval(
            replace(
                a,
                status=ApprovalStatus.DENIED,
                decided_at=now,
                decided_by=f"rewind to turn {to_turn}",
            ),
            expect_status=ApprovalStatus.PENDING,
        )
        for a in store.approvals(sid)
        if a.status is ApprovalStatus.PENDING and a.tool_use_id in left
    ]
    ops: list[Op] = [
        lease,
        AbandonMessages(cut, branch),
        *([AppendMessages((note,))] if note is not None else []),
        PutSession(state, snap.state.version),
        *declined,
        DropLease(sid, lease.lease.token),
    ]
    store.apply(sid, ops)
    return entry


# -- reading the source ----------------------------------------------------------------------------


def _snapshot(store: Store, sid: str, turn: int) -> Snapshot:
    """The session's state, transcript and records, read until the state is the same before
    and after (a worker may be appending turns meanwhile)."""
    if isinstance(turn, bool) or not isinstance(turn, int):
        # True would count as turn 1, and "1" or None fail in a comparison far from here.
        raise ConfigurationError(
            f"a branch point is a whole number of turns (0: before the first answer, 1: after "
            f"it, …), not {turn!r} ({type(turn).__name__}); nothing was written"
        )
    if turn < 0:
        raise BranchPointError(
            f"turn {turn} of session {sid!r}: turns count from 1 (0: before the first answer)",
            session_id=sid,
            turn=turn,
        )
    for _ in range(_SNAPSHOT_TRIES):
        state = store.session(sid)
        if state is None:
            raise BranchPointError(
                f"session {sid!r} has no transcript to branch from (no agent session of that id)",
                session_id=sid,
                turn=turn,
            )
        messages = store.messages(sid)
        records = {r.tool_use_id: r for r in store.ledger(sid).records()}
        if store.session(sid) == state and len(messages) == state.messages:
            return Snapshot(state, messages, records, transcript_reader(messages))
    raise SessionConflictError(
        f"session {sid!r} kept changing while it was read; nothing was written. Try again, or "
        "stop the worker running it first.",
        session_id=sid,
    )


def _cut(snap: Snapshot, sid: str, turn: int) -> int:
    """The first seq after the end of turn ``turn``: its assistant message and the messages that
    answer its calls, every one of them."""
    messages, reader = snap.messages, snap.reader
    answers = [i for i, m in enumerate(messages) if m.role == "assistant"]
    if turn == 0:
        return answers[0] if answers else len(messages)
    if turn > len(answers):
        raise BranchPointError(
            f"session {sid!r} has {len(answers)} turn(s); there is no turn {turn}",
            session_id=sid,
            turn=turn,
        )
    at = answers[turn - 1]
    pending = {c.tool_use_id for c in reader.tool_calls(messages[at])}
    end = at + 1
    while pending and end < len(messages) and messages[end].role != "assistant":
        pending -= {call_id for call_id, _, _ in reader.read_message(messages[end]).results}
        end += 1
    if pending:
        raise BranchPointError(
            f"turn {turn} of session {sid!r} is not over: its call(s) "
            f"{', '.join(sorted(pending))} have no result yet. Branch from an earlier turn, or "
            "run the session until they are answered.",
            session_id=sid,
            turn=turn,
        )
    return end


def _untold(b: Branch, cut: int) -> Branch:
    """``b`` once the transcript is cut at ``cut``: a note that is not kept no longer tells
    anything (its effects are carried into the new branch's)."""
    return b if b.note_seq is None or b.note_seq < cut else replace(b, note_seq=None)


def _fork_lineage(lineage: tuple[Branch, ...], cut: int) -> tuple[Branch, ...]:
    """What a fork inherits of its parent's lineage: the branches that made the part it keeps
    (those whose point is within it)."""
    return tuple(_untold(b, cut) for b in lineage if b.cut <= cut)


def _note(
    reader: Provider,
    *,
    effects: tuple[ForkedEffect, ...],
    turn: int,
    seq: int,
    now: float,
    choice: EffectsAfterFork,
) -> StoredMessage | None:
    if choice == "ignore" or not effects:
        return None
    role, content = reader.prompt_message(note_text(effects, turn))
    return StoredMessage(seq=seq, role=role, content=content, created_at=now)


def _check_choice(choice: str) -> None:
    if choice not in ("tell", "ignore"):
        raise ConfigurationError(f'effects_after_fork must be "tell" or "ignore", not {choice!r}')


def _tag() -> str:
    return f"fork-{uuid4().hex[:12]}"
