"""The store contract: what a storage engine implements, as Protocols.

A backend implements reads and one write primitive, ``apply``: a list of the conditional
operations of ``toolledger.ops`` committed durably in one transaction. Everything else —
judging liveness, redaction, ledgers, in-doubt listings — is written once above them, in
``Store`` (``stores/store.py``). ``Inspectable`` is optional: a backend with its own integrity
check (SQLite's ``PRAGMA integrity_check``, PostgreSQL's constraints) offers it there.
``GroupCommit`` is optional too: a backend that can commit several callers' batches in one
transaction offers it, and concurrent asyncio tasks then share its commits (``InlineAsync``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol, cast, runtime_checkable

from ..errors import StoreError
from ..ops import Op
from ..records import ApprovalRecord, EffectRecord, Lease, SessionState, StoredMessage

__all__ = [
    "OP_BUDGET",
    "AsyncBackend",
    "Backend",
    "GroupCommit",
    "InlineAsync",
    "Inspectable",
    "Pending",
    "op_deadline",
    "operations_within",
]

OP_BUDGET: ContextVar[float | None] = ContextVar("toolledger_op_budget", default=None)
"""The most one store operation may take here, when something tighter than the store's own
operation deadline applies: a run holding a lease sets a third of its time to live, so that no
operation (a renewal least of all) can hang past the lease it is meant to keep."""


def op_deadline(configured: float) -> float:
    """The deadline of one store operation: the store's own (``configured``), or the budget in
    force here (``OP_BUDGET``) if shorter. Backends with an operation deadline call it."""
    budget = OP_BUDGET.get()
    return configured if budget is None else min(configured, budget)


@contextlib.contextmanager
def operations_within(seconds: float | None) -> Iterator[None]:
    """Store operations made in the block take at most ``seconds`` each (``None``: as
    before)."""
    token = OP_BUDGET.set(seconds)
    try:
        yield
    finally:
        OP_BUDGET.reset(token)


@runtime_checkable
class Backend(Protocol):
    """What a storage engine implements. Everything else is built on these.

    ``shared_clock`` (optional; ``False`` when absent) says that ``now()`` is one clock every
    worker reads — a database server's — so a lease may be judged expired by its expiry. A
    backend whose ``now()`` is each machine's own clock leaves it ``False``: leases are then
    judged only by watching their renewals (``toolledger._liveness``).

    ``checks_clock`` (optional; ``False`` when absent) says that ``apply`` checks an intent's
    deadline against ``now()`` as it writes it (``UpdateEffect.at``): the engine then gives it
    the reading the deadline was set on.

    ``fresh_now()`` (optional) is ``now()`` read afresh, for a ``now()`` that carries an older
    reading of a shared clock forward (PostgreSQL's): a judgement that an attempt is over is
    made again on it, as the clock may have stepped back since that reading."""

    url: str
    durable: bool

    def read_effects(
        self, session_id: str, tool_use_ids: Sequence[str] | None = None
    ) -> dict[str, EffectRecord]:
        """Records of one session; all of them when ``tool_use_ids`` is None."""
        ...

    def read_effect_ids(self, session_id: str) -> list[str]:
        """The tool_use ids of every record of one session (in no set order), without reading
        the records themselves."""
        ...

    def apply(self, session_id: str, ops: Sequence[Op]) -> list[bool]:
        """Commit ``ops`` (all of one session) durably in one transaction; per op, whether its
        condition held. A failed guard (``PutSession``, ``AppendMessages``) rolls everything
        back and raises ``SessionConflictError``. Raises ``StoreError`` (nothing committed) when
        the store cannot be written."""
        ...

    def read_session(self, session_id: str) -> SessionState | None: ...

    def read_messages(self, session_id: str, since: int = 0) -> list[StoredMessage]:
        """The transcript from ``seq >= since``, in order."""
        ...

    def read_approvals(self, session_id: str | None = None) -> list[ApprovalRecord]:
        """Approval records of one session, or of every session."""
        ...

    def read_abandoned(self, session_id: str) -> dict[int, list[StoredMessage]]:
        """The session's abandoned branches (``AbandonMessages``): by branch number, their
        messages in order, each with the seq it had in the transcript."""
        ...

    def read_lease(self, session_id: str) -> Lease | None: ...

    def now(self) -> float:
        """The store's clock, in epoch seconds: what lease expiries and attempt deadlines are
        written on. The machine's own clock for embedded stores (which may step: liveness then
        judges leases by watching their renewals, ``shared_clock``); the server's for
        PostgreSQL."""
        ...

    def list_sessions(self) -> list[SessionState]:
        """Every agent session's state (sessions used only through ``run_tool_uses`` have
        effects but no state: see ``session_ids``)."""
        ...

    def session_ids(self) -> list[str]:
        """Every session with an effect record or a state."""
        ...

    def in_doubt(self) -> list[EffectRecord]:
        """Every ``started`` record of every session."""
        ...

    def close(self) -> None: ...


class AsyncBackend(Protocol):
    """The async twin of ``Backend`` (PostgreSQL implements it natively)."""

    async def read_effects(
        self, session_id: str, tool_use_ids: Sequence[str] | None = None
    ) -> dict[str, EffectRecord]: ...

    async def read_effect_ids(self, session_id: str) -> list[str]: ...

    async def apply(self, session_id: str, ops: Sequence[Op]) -> list[bool]: ...

    async def read_session(self, session_id: str) -> SessionState | None: ...

    async def read_messages(self, session_id: str, since: int = 0) -> list[StoredMessage]: ...

    async def read_approvals(self, session_id: str | None = None) -> list[ApprovalRecord]: ...

    async def read_lease(self, session_id: str) -> Lease | None: ...

    async def close(self) -> None: ...


@runtime_checkable
class Inspectable(Protocol):
    """Optional: a backend that can check its own storage (``toolledger verify`` runs it)."""

    def integrity_check(self) -> list[str]:
        """What is wrong with the storage itself (an empty list: sound)."""
        ...


@dataclass
class Pending:
    """One caller's batch in a shared commit: what to write, then what came of it (``flags``,
    or ``error``), once ``done``."""

    session_id: str
    ops: list[Op]
    flags: list[bool] | None = None
    error: BaseException | None = None
    done: bool = False
    held: bool = False
    """Taken by a commit (set under the store's lock as it takes it): that commit answers it,
    whoever else is interrupted meanwhile."""


class GroupCommit(Protocol):
    """Optional: a backend that commits the batches of several callers in one transaction (one
    fsync for all) while each batch keeps the meaning ``apply`` gives it."""

    url: str

    def apply_group(self, group: list[Pending]) -> None:
        """Commit the batches of ``group`` in one transaction (which may hold other callers'
        batches too), in order, each all or nothing; set each one's ``flags`` or ``error``
        (what ``apply`` would have returned or raised), then ``done``. Returns once the commit
        holding them has returned."""
        ...


def _grouping(backend: Backend) -> GroupCommit | None:
    """``backend`` if it offers ``GroupCommit``. Looked up on its class, as Python looks up
    special methods: a wrapper that writes through its own ``apply`` and hands every other
    attribute to the backend it wraps is not taken for one (its ``apply`` would be skipped)."""
    if callable(getattr(type(backend), "apply_group", None)):
        return cast(GroupCommit, backend)
    return None


class InlineAsync:
    """An embedded backend seen through the async contract.

    Embedded stores do their I/O on the event loop's thread: a commit is one fsync, well under a
    millisecond on an idle disk, and a hop to a worker thread and back would add a good part of
    that again (~70 µs measured bare, more around an fsync) without making the disk faster.

    Concurrent tasks share commits on a backend that offers ``GroupCommit`` (SQLite). A task
    whose batch finds no group being gathered leads one: it lets the loop run — every task that
    is ready to commit queues its batch behind it — until a turn of the loop brings no batch,
    then commits them all in one transaction, inline, and wakes their tasks. So a group is what
    became ready while the previous one was being committed, and the loop is blocked for each
    group's commit as it was before for each batch's. A task whose last group held no one else
    commits at once, without a turn of the loop, so a lone task pays nothing; another task that
    comes to commit leads a gathered group again.

    Other backends commit each batch as it comes: ``json://`` rewrites and fsyncs the session's
    own files, so batches of different sessions have no commit to share; ``memory://`` has no
    commit to share.

    A commit, once asked for, is carried out: a task cancelled while its batch waits in a group
    is cancelled when that group is committed (a commit could not be interrupted when each ran
    inline, either). It learns nothing of it — as when a connection to a server store is cut
    mid-commit — but nothing of the task is left to land after it ended. A task that ends
    otherwise while its batch waits (a ``KeyboardInterrupt`` raised as it resumes) takes its
    batch out of the group.
    """

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._group_commit = _grouping(backend)
        self._local = threading.local()  # the group being gathered, per thread (and so per loop)

    async def read_effects(
        self, session_id: str, tool_use_ids: Sequence[str] | None = None
    ) -> dict[str, EffectRecord]:
        return self._backend.read_effects(session_id, tool_use_ids)

    async def read_effect_ids(self, session_id: str) -> list[str]:
        return self._backend.read_effect_ids(session_id)

    async def apply(self, session_id: str, ops: Sequence[Op]) -> list[bool]:
        backend = self._group_commit
        if backend is None or not ops:
            return self._backend.apply(session_id, ops)
        loop = asyncio.get_running_loop()
        group: _Group | None = getattr(self._local, "group", None)
        if group is None or group.loop is not loop:
            group = self._local.group = _Group(loop)
        me = Pending(session_id, list(ops))
        if group.committed is not None:
            try:
                await _follow(group, group.committed, me)
            except BaseException:
                # Ended before its group was handed over (a ``KeyboardInterrupt`` raised as it
                # resumed): its batch leaves the group — nothing of a task is written after it
                # ended. (A group is committed inline, in one step of its leader: once handed
                # over, it is written before any follower resumes.) Cancelled once another
                # thread's commit took it: it ends once that commit answered.
                group.followers = [f for f in group.followers if f[0] is not me]
                while me.held and not me.done:
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.sleep(_HELD_POLL)
                raise
        elif group.alone is not None and group.alone is asyncio.current_task():
            backend.apply_group([me])  # it committed alone last time: nobody to wait for
        else:
            await _lead(group, me, backend)
        if not me.done:
            await _answered(me, self._backend.url)
        return answer(me, self._backend.url)

    async def read_session(self, session_id: str) -> SessionState | None:
        return self._backend.read_session(session_id)

    async def read_messages(self, session_id: str, since: int = 0) -> list[StoredMessage]:
        return self._backend.read_messages(session_id, since)

    async def read_approvals(self, session_id: str | None = None) -> list[ApprovalRecord]:
        return self._backend.read_approvals(session_id)

    async def read_lease(self, session_id: str) -> Lease | None:
        return self._backend.read_lease(session_id)

    async def close(self) -> None:
        self._backend.close()


_HELD_POLL = 0.001

GATHER_TURNS = 8
"""At most this many turns of the loop gather a group (a turn that brings a batch earns the
next): a bound on how long a batch can wait for others."""


@dataclass
class _Group:
    """The group of batches a loop's tasks are gathering."""

    loop: asyncio.AbstractEventLoop
    committed: asyncio.Future[None] | None = None  # while gathering: set once it is committed
    followers: list[tuple[Pending, asyncio.Future[None]]] = field(default_factory=list)
    alone: asyncio.Task[Any] | None = None  # the task whose last group had no one else in it


async def _lead(group: _Group, me: Pending, backend: GroupCommit) -> None:
    """Gather a group behind ``me``, then commit it. The loop runs until a turn brings no batch:
    one turn alone would miss the tasks woken by a worker thread (a sync tool's), which take
    two to get here.

    A cancellation while gathering commits the group all the same. Anything else raised before
    the group is handed to the backend (a ``KeyboardInterrupt``, which a signal raises where a
    function is entered or resumed) ends the group unwritten: the batches queued behind ``me``
    are told so, as the commit's own interruption tells them (``interrupted``), and the group is
    no longer the one being gathered — a later batch on this loop leads its own instead of
    waiting, forever, for a commit nobody will make. Once handed over, the backend answers every
    batch it took, interrupted or not: a batch another thread's commit took is that commit's to
    answer (it may well be written; ``Pending.held``). One it never took — the interrupt struck
    as its function was entered — is told it was not written."""
    committed = group.committed = group.loop.create_future()
    followers: list[tuple[Pending, asyncio.Future[None]]] = []
    cancelled: asyncio.CancelledError | None = None
    handed = False
    try:
        try:
            for _ in range(GATHER_TURNS):
                before = len(group.followers)
                await asyncio.sleep(0)  # the tasks ready now queue their batches behind ours
                if len(group.followers) == before:
                    break
        except asyncio.CancelledError as exc:
            cancelled = exc  # committed all the same: the followers' batches are in it
        followers, group.followers, group.committed = group.followers, [], None
        group.alone = None if followers else asyncio.current_task()
        handed = True
        backend.apply_group([me, *(p for p, _ in followers)])
    except BaseException as exc:
        if not handed and group.committed is committed:  # raised while gathering
            followers, group.followers, group.committed = group.followers, [], None
        for p, _ in followers:
            if not p.done and not p.held:  # no commit took it, nor will
                p.flags, p.error, p.done = None, interrupted(backend.url, exc), True
        raise
    finally:
        committed.set_result(None)
        for _, done in followers:
            if not done.done():  # a cancelled follower's wait was cancelled with it
                done.set_result(None)
    if cancelled is not None:
        raise cancelled


def answer(me: Pending, url: str) -> list[bool]:
    """What ``apply`` returns for ``me``, whose commit is over: its flags, or its error raised.
    Told neither (its leader interrupted twice: once in the commit, once as it told the
    callers), nobody knows whether it was written: a ``StoreError`` whose outcome is unknown,
    which its caller reads back before it acts (docs/design.md, rule 16)."""
    if me.error is not None:
        raise me.error
    if me.flags is None:
        raise StoreError(
            f"{url}: the commit that was to hold this batch was interrupted as it answered; "
            "whether the batch was written is not known. Read it back before acting on it.",
            url=url,
            outcome_unknown=True,
        )
    return me.flags


def interrupted(url: str, exc: BaseException | None = None) -> StoreError:
    """What a batch's caller is told when the commit that was to hold it was interrupted
    (``exc``, when known) before it was written."""
    how = "" if exc is None else f" ({type(exc).__name__})"
    return StoreError(
        f"{url}: the commit that was to hold this batch was interrupted{how} before it was "
        "written; nothing of it was written. Send it again.",
        url=url,
    )


async def _answered(me: Pending, url: str) -> None:
    """``me`` answered. Unanswered once its group's commit is over, it was handed over by a
    task interrupted before it told it anything: held by another thread's commit, which will
    answer it (``Pending.held``) — or taken by none, nor ever: not written, as it is told."""
    while not me.done:
        if not me.held:
            me.flags, me.error, me.done = None, interrupted(url), True
            return
        await asyncio.sleep(_HELD_POLL)


async def _follow(group: _Group, committed: asyncio.Future[None], me: Pending) -> None:
    """Queue ``me`` in the group being gathered and wait until it is committed. A cancelled
    follower still waits for that commit, then raises its cancellation."""
    done = group.loop.create_future()
    group.followers.append((me, done))
    try:
        await done  # not shielded: set, it wakes this task in the next turn of the loop
    except asyncio.CancelledError:
        while not committed.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(committed)
        raise
