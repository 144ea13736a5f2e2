"""Group commit's queue: callers sharing one store object — threads, and the asyncio tasks of
``InlineAsync`` — share one transaction and one fsync, each batch keeping its own meaning. The
queue, its leader and its waiters live here; the backend commits a group (``_commit_one``,
``_commit_group``: ``toolledger.stores.sqlite``)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ..ops import Op
from .contract import Pending, answer, interrupted

__all__ = ["GroupQueue"]

_WAKE_EVERY = 1.0
"""How long a caller waiting for another's commit waits before it looks again, however it was
(or was not) woken (``GroupQueue._wake``)."""


class GroupQueue:
    """``apply`` and ``apply_group`` over a queue of callers' batches; a subclass commits them:
    ``_commit_one`` (a batch alone, its flags or what it raises) and ``_commit_group`` (a group,
    each batch answered: ``Pending.flags`` or ``error``, then ``done``)."""

    url: str

    def _init_queue(self) -> None:
        # The queue's lock is taken directly (no Condition method call per commit); only a
        # caller that must wait for a commit under way uses the condition, and only then is it
        # notified. Reentrant, for what a wait cut short needs (``_wait``).
        self._queue_lock = threading.RLock()
        self._queue_cv = threading.Condition(self._queue_lock)
        self._queue: list[Pending] = []
        self._leading = False
        self._waiting = 0

    def _commit_one(self, session_id: str, ops: Sequence[Op]) -> list[bool]:
        raise NotImplementedError

    def _commit_group(self, group: list[Pending]) -> None:
        raise NotImplementedError

    def apply(self, session_id: str, ops: Sequence[Op]) -> list[bool]:
        """Group commit: concurrent callers (threads sharing this store, and the asyncio tasks
        of ``InlineAsync``) share one transaction and one fsync (``apply_group``). A caller
        that finds nobody committing and nobody queued leads at once, with no queue entry:
        its batch is the whole group (``_commit_one``)."""
        if not ops:
            return []
        alone = False
        try:
            with self._queue_lock:
                if not self._leading and not self._queue:
                    self._leading = alone = True
            if alone:
                return self._commit_one(session_id, ops)
        finally:
            if alone:
                self._leading = False  # first, with no call before it (``_wake``)
                self._wake()
        me = Pending(session_id, list(ops))
        self.apply_group([me])
        return answer(me, self.url)

    def apply_group(self, group: list[Pending]) -> None:
        """Commit the batches of ``group`` in one transaction, with whatever other callers are
        committing at the time (``GroupCommit``).

        A caller queues its batches. If no commit is in progress it leads: it takes every queued
        batch and applies them in one ``BEGIN IMMEDIATE`` transaction, each inside its own
        savepoint — a failed guard rolls that batch alone back and is its error — then commits
        once. Batches queued meanwhile wait for that commit, and one of their callers leads the
        next group. There is no timer: a group is what arrived during the previous fsync, so a
        lone caller pays nothing extra. Every op is still one conditional statement, evaluated
        in the queue's serial order; a batch is all or nothing; nobody is answered before the
        COMMIT that holds its batch has returned. If the COMMIT itself fails, every batch of
        the group gets the error — none of them was committed.
        """
        if not group:
            return
        first = group[0]  # a caller's batches are queued, and taken, together
        lead = False
        taken: list[Pending] = []
        try:
            with self._queue_lock:
                self._queue.extend(group)
                try:
                    while self._leading and not first.done:
                        self._waiting += 1
                        try:
                            self._wait()
                        finally:
                            self._waiting -= 1
                except BaseException as exc:  # (the lock is held again: ``_wait``)
                    self._withdraw(group, exc)
                    raise
                if not first.done:
                    self._leading = lead = True
                    taken, self._queue = self._queue, []
                    for p in taken:
                        p.held = True
            if lead:
                self._commit_group(taken)
        except BaseException as exc:
            self._unanswered(taken, exc)
            raise
        finally:
            if lead:
                self._leading = False  # first, with no call before it (``_wake``)
                self._wake()

    def _wait(self) -> None:
        """Wait for the commit under way (``_WAKE_EVERY`` at most), and hold the queue's lock
        again as the wait ends, interrupted or not. ``Condition.wait`` takes a plain lock back
        with an acquire that a signal cuts short: a Ctrl-C while another thread held it left
        this caller without it, and the ``with`` around then released the other thread's hold.
        A reentrant lock is taken back with an acquire no signal cuts short; a wait interrupted
        after it gave the lock up and before it took it back (a narrower window) takes it back
        here. Only a further interrupt in that very acquire leaves it unheld — and then the
        ``with`` around raises, a reentrant lock being its owner's alone to release, instead of
        releasing another thread's hold."""
        try:
            self._queue_cv.wait(_WAKE_EVERY)
        finally:
            # ``_is_owned``: the reentrant lock's own test, which ``Condition`` itself uses (not
            # in the type stubs).
            if not self._queue_lock._is_owned():  # type: ignore[attr-defined]
                self._queue_lock.acquire()

    def _withdraw(self, group: list[Pending], exc: BaseException) -> None:
        """A caller interrupted while it waited for another's commit (a ``KeyboardInterrupt``):
        its batches no leader took yet leave the queue, answered as not written — none is
        written after its caller was told it failed. One a leader took already is that
        leader's to answer."""
        mine = {id(p) for p in group}
        withdrawn = [p for p in self._queue if id(p) in mine]
        if withdrawn:
            self._queue = [p for p in self._queue if id(p) not in mine]
            self._unanswered(withdrawn, exc)

    def _unanswered(self, taken: list[Pending], exc: BaseException) -> None:
        """The leader was interrupted (a ``KeyboardInterrupt`` where ``_commit_group`` is
        entered, say) with batches it took still unanswered: their callers are told, not left
        waiting for a commit nobody will make. One the commit had not settled was not written;
        one it had (interrupted as it told them) keeps its answer."""
        for p in taken:
            if p.done:
                continue
            if p.flags is None and p.error is None:
                p.error = interrupted(self.url, exc)
            p.done = True

    def _wake(self) -> None:
        """The leader's commit returned, and it leads no more: the callers that queued
        meanwhile lead the next. Leading is given up before this is called, and taken inside
        the ``try`` whose ``finally`` gives it up: Python raises a ``KeyboardInterrupt`` where a
        function is entered or returns, and one raised there must not leave the store led by
        nobody, every later write waiting. A wake-up such an interrupt loses costs a waiter
        ``_WAKE_EVERY`` at most: it looks again by then."""
        with self._queue_lock:
            if self._waiting:
                self._queue_cv.notify_all()
