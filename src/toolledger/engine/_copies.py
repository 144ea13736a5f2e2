"""A branch's copies of its lineage's calls (docs/design.md, rule 19: one lineage, one call per id).

A fork copies every call of its lineage into the new session's ledger (``branching.fork``):
the same call, not a new one. Its idempotency key is made from the session it was made in
(``EffectRecord.made_in``), and a model on the branch that issues its id again gets its
outcome (or ``LedgerMismatchError`` for another input). A copy with an outcome — succeeded,
failed, declined — answers as the original does. One without — the call was in progress, in
doubt, or resolved as not having happened when the branch was made — stands for its origin's
record (``EffectRecord.origin``), which alone settles the call: one runner for every branch.

* It takes the origin's outcome as soon as there is one (written into the copy, a
  compare-and-set, so the branch's ledger answers alone from then on).
* While the origin's attempt may still run, the call is in progress on the branch too (judged
  where it runs: the origin's record, lease and process).
* In doubt there, it answers in doubt here, naming the origin: a run of the origin re-runs the
  call if that is safe, or a person settles it there — once for the whole lineage — and the
  branch takes that outcome at its next run. It is never run on the branch meanwhile, so a call
  in doubt runs again at most once, wherever its id is replayed.
* Not run there — no record yet (asked for, its turn under way or awaiting approval), or
  resolved as not having happened — it runs where a turn still asks for it: in the origin, if
  the origin's transcript ends with the turn that asks for it (the branch answers in doubt
  meanwhile, naming the origin, and takes the outcome later); otherwise here, as the branch's own.

A copy whose origin no longer holds the call (the origin was removed) is the branch's own: its
attempt as copied is over, and the branch settles and runs it like any other. Whatever runs it,
the call forwards the lineage's key.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import replace
from typing import Any

from .._liveness import Over, Running, Verdict
from ..adapters import transcript_reader
from ..adapters._shapes import Provider
from ..errors import EffectInProgressError
from ..records import EffectRecord, Lease, SessionState, Status, StoredMessage, ToolCall
from ..stores._copies import same_call
from ..stores.store import in_progress_error
from ._batch import Buffer, Buffered, CallOutcome, Disposition, Env, write
from ._drivers import ReadEffects, ReadLease, ReadMessages, ReadSession, Request, Sleep
from ._messages import in_doubt_message
from ._outcomes import flush

__all__ = [
    "adopted",
    "copy_of",
    "defer",
    "lineage_calls",
    "settled_elsewhere",
    "stand_in",
    "still_to_run",
]

_POLL_FIRST_S = 0.005
_POLL_MAX_S = 0.25


# -- what a fork copies ---------------------------------------------------------------------------


def copy_of(record: EffectRecord, session: str) -> EffectRecord:
    """``record`` as a branch ``session`` holds it: the same call, made (and keyed) where it
    was made, standing for the record it was copied from — or for the one that one stands
    for (``EffectRecord.made_in``, ``EffectRecord.origin``)."""
    return replace(
        record,
        session_id=session,
        made_in=record.key_session,
        origin=record.origin if record.origin is not None else record.session_id,
    )


def lineage_calls(
    records: dict[str, EffectRecord],
    messages: Sequence[StoredMessage],
    reader: Provider,
    *,
    source: str,
    session: str,
    at: float,
) -> list[EffectRecord]:
    """What a fork ``session`` of ``source`` starts its ledger with: every call of its
    lineage, kept or left behind (docs/design.md, rule 19) — ``source``'s ``records``, copied, so a
    model that issues one of their ids again gets its outcome, never a second run, and
    forwards the lineage's key. A call ``source``'s transcript (``messages``) asked for without
    a record yet (its turn under way, awaiting approval) is copied as not having happened: run
    on the branch, it forwards the lineage's key; run in the source first, the branch takes its
    outcome."""
    copies = [copy_of(r, session) for r in records.values()]
    for m in messages:
        if m.role != "assistant":
            continue
        for c in reader.tool_calls(m):
            if c.tool_use_id in records:
                continue
            copies.append(
                stand_in(
                    c,
                    session=session,
                    origin=source,
                    made_in=source,
                    at=at,
                    why=f"asked for in session {source!r}, not run there when this branch was made",
                )
            )
    return copies


def stand_in(
    call: ToolCall, *, session: str, origin: str, made_in: str, at: float, why: str
) -> EffectRecord:
    """A record in ``session`` of ``call`` that has not happened there and stands for
    ``origin``'s (keyed by ``made_in``): a fork's copy of a call asked for and not run, or a
    branch's claim in its lineage's root (``toolledger.engine._claims``)."""
    return EffectRecord(
        session_id=session,
        tool_use_id=call.tool_use_id,
        tool=call.name,
        input_hash=call.input_hash,
        status=Status.NOT_HAPPENED,
        error=why,
        created_at=at,
        updated_at=at,
        made_in=made_in,
        origin=origin,
    )


# -- deciding a copy ------------------------------------------------------------------------------


def adopted(copy: EffectRecord, there: EffectRecord) -> EffectRecord:
    """The origin's outcome ``there``, as the branch's copy holds it: made (and keyed) where
    ``there`` was made."""
    return replace(there, session_id=copy.session_id, origin=copy.origin, made_in=there.key_session)


def settled_elsewhere(copy: EffectRecord, origin: str) -> str:
    """What the model is told of a copy whose call waits to be settled in ``origin``."""
    return in_doubt_message(
        copy.tool,
        f"the same call of session {origin!r}, where this conversation's lineage holds it, has "
        "no outcome yet; it is settled (or run) there, once for every branch",
    )


def defer(
    call: ToolCall,
    copy: EffectRecord,
    env: Env,
    buf: Buffer,
) -> Generator[Request, Any, EffectRecord | CallOutcome]:
    """Decide a copy without an outcome of its own by its origin (the module docstring): the
    record to go on deciding from — the origin's outcome, adopted; or the copy itself when the
    origin will not settle the call (it no longer holds it, or holds it as not having happened
    with no turn left to run it) — or the call's answer, in doubt, while only the origin may
    settle it. Raises ``EffectInProgressError`` while the origin's attempt may still run (after
    ``env.wait`` seconds)."""
    assert copy.origin is not None
    origin = copy.origin
    waited, pause = 0.0, _POLL_FIRST_S
    while True:
        found: dict[str, EffectRecord] = yield ReadEffects([call.tool_use_id], session=origin)
        there = found.get(call.tool_use_id)
        if there is not None and not same_call(copy, there):
            return copy  # another call of that id there: this one is the branch's own
        if there is not None and there.copied and not there.status.terminal:
            # The origin only stands for another session's record now (a claim moved on):
            # the lineage's claim says who makes it (``_claims.take_over``).
            return copy
        if there is not None and there.status.terminal:
            # Recorded so the branch answers alone from now on; losing it only reads again.
            mine = adopted(copy, there)
            buf.items.append(Buffered(write(mine, copy), urgent=False, outcome=None))
            return mine
        verdict: Verdict
        if there is None or there.status is Status.NOT_HAPPENED:
            # Not run there (yet): it runs where a turn still asks for it — there, if the
            # origin's last turn waits for it; else here, as the branch's own.
            if not (yield from still_to_run(origin, call.tool_use_id)):
                # Its record was read before its transcript: a run of the origin may have made
                # the call and moved on in between (its outcome lands before its next turn).
                # What the record holds now decides; unchanged, the origin has given it up.
                again: dict[str, EffectRecord] = yield ReadEffects(
                    [call.tool_use_id], session=origin
                )
                if again.get(call.tool_use_id) != there:
                    continue
                if there is not None and copy.status is Status.STARTED:
                    # A person's word there ("it did not happen") settles the attempt copied
                    # here.
                    mine = adopted(copy, there)
                    buf.items.append(Buffered(write(mine, copy), urgent=False, outcome=None))
                    return mine
                return copy
            # A run of the origin may be making it this instant (its claim landed, its intent
            # not yet): wait for it as for an attempt; else it waits for that run.
            verdict = env.lease_state((yield ReadLease(session=origin)))
            if isinstance(verdict, Over):
                return _elsewhere(call, copy, origin, not_run=True)
        else:
            verdict = Over(f"it is {there.status.value} in session {origin!r}")
            if there.status is Status.STARTED:
                lease: Lease | None = None
                if there.lease_token is not None:
                    lease = yield ReadLease(session=origin)
                verdict = env.judge(there, lease)
            if isinstance(verdict, Over):
                return _elsewhere(call, copy, origin)  # in doubt there: a person settles it
        assert isinstance(verdict, Running)
        if waited >= env.wait:
            if buf.items:
                yield from flush(buf, env, [])
            if there is None or there.status is Status.NOT_HAPPENED:
                raise _being_made(call, origin, env, verdict)
            raise in_progress_error(there, verdict)
        step = min(pause, env.wait - waited)
        yield Sleep(step)
        waited += step
        pause = min(pause * 2, _POLL_MAX_S)


def _being_made(call: ToolCall, origin: str, env: Env, verdict: Running) -> EffectInProgressError:
    return EffectInProgressError(
        f"{call.name!r} ({call.tool_use_id}) in session {env.session_id!r} is the call of "
        f"session {origin!r}, where this conversation's lineage holds it, and a run of that "
        f"session is under way ({verdict.why}): it cannot be run here. Retry later to get its "
        "outcome.",
        session_id=env.session_id,
        tool_use_id=call.tool_use_id,
        holder=None,
        until=verdict.until,
    )


def _elsewhere(
    call: ToolCall, copy: EffectRecord, origin: str, *, not_run: bool = False
) -> CallOutcome:
    """The call's answer while ``origin`` settles it: in doubt there, or — ``not_run`` — not run
    there yet, its last turn asking for it (a run of it runs the call; nothing to resolve)."""
    return CallOutcome(
        call,
        Disposition.IN_DOUBT,
        settled_elsewhere(copy, origin),
        is_error=True,
        settle_in=origin,
        not_run_in=not_run,
        attempt=copy.attempt,
    )


def still_to_run(origin: str, tool_use_id: str) -> Generator[Request, Any, bool]:
    """Whether ``origin``'s transcript ends with a turn that asks for ``tool_use_id``: its next
    run runs the call."""
    state: SessionState | None = yield ReadSession(session=origin)
    if state is None or state.messages == 0:
        return False
    last: list[StoredMessage] = yield ReadMessages(since=state.messages - 1, session=origin)
    if not last or last[-1].role != "assistant":
        return False
    return tool_use_id in transcript_reader(last).call_ids(last[-1])
