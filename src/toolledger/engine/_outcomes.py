"""How the writes of one batch of calls reach the store.

``runner`` decides what happens to each call; the batch keeps the writes it produced
(``toolledger.engine._batch``) and this module commits them by the rule of when each must be
durable at
the latest:

* the intent (``started``) of a call whose re-run is unsafe: before that tool runs;
* the outcome of such a call: before anything else can happen — the next tool, the approver's
  wait, the return to the caller. It rides in the same commit as the next intent, or as the
  turn's checkpoint when the agent passes one (``tail``);
* the outcome of a call whose re-run is safe (read-only, idempotent, key-forwarding): with the
  next commit, whenever that is. Losing it costs a harmless re-run.

An attempt is registered in flight in this process (``liveness``) from before its intent commits
until the commit holding its outcome has returned, so that no other thread or task of this
process can take it for an attempt that is over.

When an outcome cannot be written as it stands — the record moved on while the tool ran,
because another attempt replaced it or a person settled it — the attempt's outcome is written
into the record's history and raised as an alert (``LateOutcomeError``;
``toolledger.engine._late``).
When the commit failed because this worker's lease was taken over, the outcomes are written
again without the fence: each is a compare-and-set on the record, which is all the protection a
record needs.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from .._crash import hit as crash_point
from ..errors import ClockMovedError, LeaseLostError, SessionConflictError, StoreError
from ..ops import AppendMessages, Op, PutSession, UpdateEffect
from ..records import EffectRecord, Status
from ._background import keeper
from ._batch import (
    Batch,
    Buffer,
    Buffered,
    CallOutcome,
    Disposition,
    Env,
    Flushed,
    release,
    write,
)
from ._drivers import Commit, Failure, IOContext, Remember, Request, commit_now, drive
from ._late import kept_late, late, write_failed
from ._reconcile import commit

__all__ = [
    "Batch",
    "Buffer",
    "Buffered",
    "CallOutcome",
    "Disposition",
    "Env",
    "Flushed",
    "ahead",
    "clock_moved",
    "flush",
    "flush_now",
    "given_up",
    "hold_while_it_may_run",
    "not_run",
    "on_intent",
    "release",
    "write",
]


def given_up(env: Env, buf: Buffer) -> None:
    """The batch ends (an exception, an interrupt) with attempts still registered in flight
    whose outcome was never written: each is over — its tool returned, raised or was never
    called — and no outcome of it is on its way. Released from flight, and their intents
    released in the background (in doubt for everyone, as for this process) — or, whose tool
    was never called (``Buffer.unrun``), said not to have happened — unless the record moved on
    meanwhile or the attempt is still held in flight here (an ``async def`` tool whose run was
    cancelled: ``hold_while_it_may_run``; ``InFlight.held``). Left as they are, a
    worker of this host would judge them by this process, alive, and wait for as long as it
    lives (a server that caught the interrupt, a notebook)."""
    in_flight = env.ledger.store.runtime.in_flight
    for key in list(buf.flights):
        unrun = key in buf.unrun
        release(env, key, buf)
        intent = buf.intents.pop(key, None)
        ends = buf.ends.pop(key, None)
        # Held: its work may run on. Another thread's registration of the same call (racing
        # on it, its intent refused behind this one's) keeps nothing: this attempt is over.
        if intent is None or in_flight.held(key):
            continue
        # Said not to have happened only while no other thread or task of this process is
        # registered on the call: racing on it, theirs may be the intent that landed — ours
        # refused — and the compare-and-set below tells two intents of the same attempt apart
        # only by their ``updated_at``, which a coarse (or shared) clock can give both.
        if unrun and key not in in_flight:
            # Its tool was never called (the run ended between its intent and its tool), and
            # no attempt before it may have taken effect: it did not happen, which this process
            # alone knows — in doubt, it would wait for a person. The next run runs it.
            # In flight here until that is written (at once, in the background): its record
            # still names this process, alive, and a run of it meanwhile would otherwise find
            # the call over, in doubt — it waits for the write instead, then runs the call.
            never = not_run(intent, "its run ended before the tool was called", env)
            in_flight.add(key)
            keeper.keep(env.ledger.store, env.session_id, [never], [key], after=0.0)
            continue
        # A plain tool the interrupt ended is over now. An ``async def`` one may have left
        # work behind it (a thread of ``asyncio.to_thread``, which ``asyncio.run`` does not
        # stop when Ctrl-C ends it in ``run_tool_uses``): over only once its time is up —
        # counted on this process's monotonic clock, as its tool counts it down: a wall clock
        # stepped forward meanwhile must not release it while that work still runs.
        tool = env.tools.get(intent.tool)
        left = 0.0
        if (tool is None or tool.is_async) and intent.deadline is not None:
            runtime = env.ledger.store.runtime
            now = runtime.monotonic()
            until = ends if ends is not None else now + intent.deadline - env.now()
            left = max(0.0, until - now)
            in_flight.hold(key, now + left)  # in progress here too till then
        _release_later(env, intent, left, "its run ended before its outcome was written")


def not_run(intent: EffectRecord, why: str, env: Env) -> UpdateEffect:
    """The write saying that the attempt of ``intent``, whose tool was never called, did not
    happen (``why``): a compare-and-set on that very intent (``on_intent``), so a record that
    moved on, or an intent that never landed, is left be."""
    never = replace(
        intent,
        status=Status.NOT_HAPPENED,
        error=f"its worker did not run it: {why}",
        updated_at=max(env.clock(), intent.updated_at + 1e-6),
    )
    return on_intent(never, intent)


def on_intent(new: EffectRecord, intent: EffectRecord) -> UpdateEffect:
    """``new`` written over ``intent`` — a clean-up of an intent whose commit may not have
    landed — only if the record is that very intent: its attempt, its ``updated_at``, its
    worker and its process (another worker's intent of the same attempt, racing on the call,
    may carry the same time, and another process the same worker id;
    ``UpdateEffect.expect_worker``, ``UpdateEffect.expect_holder``)."""
    return UpdateEffect(
        new,
        Status.STARTED,
        intent.attempt,
        expect_at=intent.updated_at,
        expect_worker=intent.worker,
        expect_holder=intent.holder,
    )


def _release_later(env: Env, intent: EffectRecord, after: float, why: str) -> None:
    """Release ``intent`` (its attempt over, outcome unknown) in ``after`` seconds, in the
    background: a compare-and-set on that very intent (``on_intent``), so a record that moved
    on is left be."""
    released = replace(
        intent,
        holder=None,
        deadline=intent.deadline or intent.updated_at,
        error=f"in doubt: {why}",
        updated_at=max(env.clock(), intent.updated_at + 1e-6),
    )
    op = on_intent(released, intent)
    keeper.keep(
        env.ledger.store,
        env.session_id,
        [op],
        [],
        lambda _: None,  # moved on (settled, run again): nothing to release
        after=after,
    )


def hold_while_it_may_run(
    env: Env, key: tuple[str, str, str], until: float, intent: EffectRecord
) -> None:
    """The run stopped awaiting its tool (a cancellation) with no answer from it, and the
    tool's work may go on without it — an ``async def`` tool's thread (``asyncio.to_thread``, a
    blocking client) runs on, and nothing stops it: the attempt stays in flight here until its
    deadline (``until``, on this process's monotonic clock). Released at once, a retry in this
    process would find the call in doubt and could run it again while the first still takes
    effect.

    Then its attempt is over, and this process alone knows it: its intent (``intent``) is
    released in the background — in doubt for everyone, as for this process — unless the
    record moved on meanwhile. Left as it is, a worker of this host would judge the attempt by
    its process, alive, and wait for as long as this process lives."""
    runtime = env.ledger.store.runtime
    runtime.in_flight.hold(key, until)
    _release_later(
        env,
        intent,
        until - runtime.monotonic(),
        "its run was cancelled while its tool ran, and its deadline has passed",
    )


def _guarded(item: Buffered) -> Op:
    op = item.op
    if item.closes is not None and isinstance(op, UpdateEffect):
        return UpdateEffect(op.record, op.expect_status, op.expect_attempt, op.expect_at, True)
    return op


def _moved(error: BaseException | None) -> bool:
    """The commit was refused because a guarded outcome's record moved on."""
    return (
        isinstance(error, SessionConflictError)
        and not isinstance(error, LeaseLostError)
        and error.tool_use_id is not None
    )


_CHECKPOINT = (PutSession, AppendMessages)  # a tuple: ``X | Y`` is built at every test


def clock_moved(answer: Any) -> ClockMovedError | None:
    """The error of a commit refused whole by a shared clock: nothing of it landed."""
    if isinstance(answer, Failure) and isinstance(answer.exc, ClockMovedError):
        return answer.exc
    return None


def _commit_ops(items: list[Buffered], extra: list[Op]) -> list[Op]:
    """What commits ``items`` with ``extra``. A checkpoint that reports an outcome never lands
    without it: with one in ``extra``, our attempts' outcomes are guards — if a record moved
    on, nothing of the commit lands."""
    if extra and any(isinstance(op, _CHECKPOINT) for op in extra):
        return [_guarded(i) for i in items] + extra
    return [i.op for i in items] + extra


def _landed(items: list[Buffered], flags: list[bool], buf: Buffer, env: Env) -> Flushed:
    """Every write of ours landed: the attempts they close are over."""
    for item in items:
        if item.closes is not None:
            release(env, item.closes, buf)
    if any(item.outcome is not None for item in items):
        crash_point("after_record")
    return Flushed(None, flags[len(items) :])


def _alone(
    items: list[Buffered], error: BaseException | None, applied: list[bool]
) -> Generator[Request, Any, StoreError | None]:
    """Our writes sent again alone after their commit was refused (``applied`` updated with
    what landed); the store's failure, if it failed then or before."""
    failed: StoreError | None = error if isinstance(error, StoreError) else None
    if _moved(error) and items:
        # A record moved on while we ran the call: the checkpoint did not land. Our writes
        # alone learn which records moved; those outcomes are kept beside them (``flush``).
        again = yield from commit([i.op for i in items])
        if not isinstance(again, Failure):
            applied[:] = list(again)
        elif isinstance(again.exc, StoreError):
            failed = again.exc
    if isinstance(error, LeaseLostError):
        # Taken over: nothing of this commit landed, and this worker may not go on. But the
        # outcomes of its own attempts are facts; each is a compare-and-set on its record,
        # which needs no fence. Written alone, they land unless the record moved on.
        closing = [n for n, i in enumerate(items) if i.closes is not None]
        if closing:
            again = yield from commit([items[n].op for n in closing], fenced=False)
            if not isinstance(again, Failure):
                for n, ok in zip(closing, again, strict=True):
                    applied[n] = ok
            elif isinstance(again.exc, StoreError):
                failed = again.exc
    return failed


def ahead(head: Sequence[Op]) -> Generator[Request, Any, None]:
    """Commit checkpoint A (``head``) on its own, reconciled: the agent's turn, when its first
    call cannot carry it (``toolledger.engine._straight``). A failure raises: nothing ran."""
    answer = yield from commit(list(head))
    if isinstance(answer, Failure):
        raise answer.exc
    crash_point("after_checkpoint_a")


def flush_now(buf: Buffer, env: Env, io: IOContext) -> Flushed:
    """``flush`` with nothing extra, carried out synchronously (the straight path of
    ``run_tool_uses``): the commit sent at once, its common answer — every write landed —
    handled here, any other by ``flush`` itself, driven."""
    items = buf.items
    answer = commit_now(io, _commit_ops(items, []))
    if type(answer) is list and all(answer):
        buf.items = []
        return _landed(items, answer, buf, env)
    return drive(flush(buf, env, [], answered=answer), io)


def flush(
    buf: Buffer, env: Env, extra: list[Op], answered: list[bool] | Failure | None = None
) -> Generator[Request, Any, Flushed]:
    """Commit the buffered writes plus ``extra`` in one transaction (``answered``: sent already,
    as ``_commit_ops`` says, by ``toolledger.engine._straight``, and this is its answer).

    A recorded effect whose write did not land raises an alert (rule 4): it happened, and only a
    person can now say so for sure.
    """
    items, buf.items = buf.items, []
    sent = _commit_ops(items, extra)
    answer: Any = answered if answered is not None else (yield Commit(sent))  # flags, or Failure
    if type(answer) is not list:  # it failed: an unknown outcome is reconciled (rule 16)
        moved = clock_moved(answer)
        if moved is None:
            answer = yield from commit(sent, answered=answer)
            moved = clock_moved(answer)
        if moved is not None:
            # Nothing landed (sent again after an unknown outcome, too), and nothing is wrong
            # with the store: the caller builds its intent anew on the clock read again and
            # sends it with our writes, as they were.
            buf.items = items + buf.items
            return Flushed(moved, [])
    error = answer.exc if isinstance(answer, Failure) else None
    if error is None and all(answer[: len(items)]):
        return _landed(items, answer, buf, env)  # the common case
    if error is not None and not isinstance(error, StoreError | SessionConflictError):
        raise error
    everything: list[bool] = [False] * (len(items) + len(extra)) if error is not None else answer
    applied = everything[: len(items)]
    # The store failed (now, or when our writes were sent again alone): our outcomes cannot
    # be learned or written by reading back, only kept and alerted.
    failed = yield from _alone(items, error, applied)
    if error is not None:
        # Writes that may wait (safe calls' records, denials) go back in the queue: the next
        # commit — checkpoint B, say — carries them, so a transcript never reports a success
        # its ledger lacks. If that commit fails too, they are lost together.
        buf.items = [i for n, i in enumerate(items) if not i.urgent and not applied[n]]
    held: list[Buffered] = []
    if failed is not None:
        # The store failed: our attempts' outcomes are known here and nowhere else. Keep trying
        # to write them, holding the calls in flight meanwhile — others in this process wait,
        # and on this host a live process's attempt is not called over — rather than leave a
        # record ``started`` that nobody runs any more.
        held = [i for n, i in enumerate(items) if i.closes is not None and not applied[n]]
        if held:
            keys = [i.closes for i in held if i.closes is not None]
            for key in keys:
                buf.flights.remove(key)  # ours no more: the background writer releases them
                buf.kept.add(key[2])
            yield Remember([i.op for i in held], keys, moved=partial(kept_late, held, env))
    for item, ok in zip(items, applied, strict=True):
        if item.closes is not None and item not in held:
            release(env, item.closes, buf)  # its outcome is written, or cannot be by us
        if ok:
            continue
        if not item.urgent:
            if item.must_land and error is None:
                yield from late(item, env, finding=True)  # a note was added: write it again
            continue
        if item.outcome is None or item.outcome.disposition is not Disposition.EXECUTED:
            late_failure = (
                isinstance(item.op, UpdateEffect) and item.op.record.status is Status.FAILED
            )
            if late_failure and failed is None:
                yield from late(item, env)  # kept in the history; nothing happened twice
            continue
        if failed is not None:
            yield from write_failed(
                item,
                env,
                f"{item.outcome.call.name!r} ({item.outcome.call.tool_use_id}) in session "
                f"{env.session_id!r} took effect but the ledger write failed ({failed}). The "
                "model is given its real result, never an error. This process keeps trying to "
                "write it and holds the call meanwhile; if it ends first, a resume finds the "
                "call in doubt. A person should check.",
                failed,
            )
            continue
        yield from late(item, env)
    if error is None and any(
        ok and i.outcome is not None for i, ok in zip(items, applied, strict=True)
    ):
        crash_point("after_record")
    return Flushed(error, everything[len(items) :])
