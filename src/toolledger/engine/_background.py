"""The process's background work: renewing the leases of sync runs, and writing what a failed
commit left behind.

**Heartbeats.** One scheduler thread per process; each renewal runs on a thread of a pool that
grows to as many renewals as are under way at once (a session has at most one; up to
``RENEWERS``), so renewals that hang — sessions on a store that went silent — do not delay
another session's; each is bounded by the store's own operation deadline. Idle renewer threads
are reused.
A lease is renewed only while its run is making progress: a run whose own store operation has
been stuck for more than a third of the lease's life stops being renewed, so that once its lease
expires another worker may take over (the fence then refuses whatever the stuck run writes).
No lock is held across a store call: a renewal that lands after the run gave its lease back is
refused by the store itself (a given-back lease is never renewed).

**Kept writes.** Outcomes a failed commit left unwritten, and leases a run could not give back,
are retried with a growing pause (1 s to 30 s) until the store takes them — or refuses them
because the record moved on — and, when their store is closed, tried one last time.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from ..errors import SessionConflictError, StoreError
from ..ops import Op, UpdateEffect
from ..records import Status, same_write
from ..stores.contract import operations_within
from ..stores.store import Store


class _Lease(Protocol):
    @property
    def ttl(self) -> float: ...


class IOContext(Protocol):
    """What a heartbeat needs of a run (``toolledger.engine._drivers.IOContext`` has it)."""

    store: Store
    session_id: str
    busy_since: float | None

    @property
    def fence(self) -> _Lease | None: ...

    def fenced(self, ops: list[Op], fenced: bool = True) -> list[Op]: ...

    def landed(self, ops: list[Op]) -> None: ...


__all__ = ["heartbeats", "keeper"]

logger = logging.getLogger("toolledger")

RENEWERS = 256  # renewals under way at once (at most one per sync run); idle threads are reused


class Heartbeats:
    """Renews the leases of every sync run in flight, each every third of its time to live."""

    def __init__(self) -> None:
        self._cv = threading.Condition(threading.Lock())
        self._due: dict[int, tuple[float, IOContext]] = {}  # id(io) -> (next renewal, io)
        # Renewals under way, by id(io), holding the io itself: while one is under way (a hung
        # store) its io cannot be collected, so no new run can be given its id and be skipped.
        self._busy: dict[int, IOContext] = {}
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None

    def add(self, io: IOContext) -> None:
        assert io.fence is not None
        with self._cv:
            self._due[id(io)] = (time.monotonic() + io.fence.ttl / 3, io)
            if self._thread is None or not self._thread.is_alive():
                self._pool = ThreadPoolExecutor(RENEWERS, thread_name_prefix="toolledger-renew")
                self._thread = threading.Thread(
                    target=self._loop, daemon=True, name="toolledger-leases"
                )
                self._thread.start()
            self._cv.notify()

    def remove(self, io: IOContext) -> None:
        if id(io) not in self._due:
            return  # never added (a run without a lease): only its own thread adds it
        with self._cv:
            entry = self._due.get(id(io))
            if entry is not None and entry[1] is io:
                del self._due[id(io)]

    def _loop(self) -> None:
        while True:
            with self._cv:
                now = time.monotonic()
                due = [io for at, io in self._due.values() if at <= now]
                for io in due:
                    assert io.fence is not None
                    self._due[id(io)] = (now + io.fence.ttl / 3, io)
                due = [io for io in due if self._busy.get(id(io)) is not io]
                self._busy.update((id(io), io) for io in due)
                pool = self._pool
            assert pool is not None
            for io in due:
                try:
                    pool.submit(self._renew, io)
                except RuntimeError as exc:  # no thread could be started: the next beat tries
                    logger.warning(
                        "toolledger: could not renew the lease of %r now (%s)", io.session_id, exc
                    )
                    with self._cv:
                        self._done(io)
            with self._cv:
                # What is due next is read again here, under the lock ``add`` takes: a run added
                # while the renewals above were handed out would otherwise wait out a stale
                # timeout (a minute when there was nothing to renew) and lose its lease.
                now = time.monotonic()
                wait = min((at for at, _ in self._due.values()), default=now + 60) - now
                self._cv.wait(timeout=max(wait, 0.01))

    def _renew(self, io: IOContext) -> None:
        try:
            fence = io.fence
            if fence is None:
                return
            stuck = io.busy_since
            if stuck is not None and time.monotonic() - stuck > fence.ttl / 3:
                logger.warning(
                    "toolledger: not renewing the lease of %r: its run has waited %.1fs on the "
                    "store; another worker may take the session over once the lease expires",
                    io.session_id,
                    time.monotonic() - stuck,
                )
                return
            ops = io.fenced([])
            with operations_within(fence.ttl / 3):  # never hung past the lease it renews
                io.store.apply(io.session_id, ops)
            io.landed(ops)
        except SessionConflictError:
            self.remove(io)  # taken over (or given back): the run's next commit says so
        except Exception as exc:  # a store hiccup: the next beat (or commit) tries again
            logger.warning("toolledger: renewing the lease of %r failed: %s", io.session_id, exc)
        finally:
            with self._cv:
                self._done(io)

    def _done(self, io: IOContext) -> None:
        """(Under the lock.) ``io``'s renewal is over."""
        if self._busy.get(id(io)) is io:
            del self._busy[id(io)]


@dataclass
class _Kept:
    store: Store
    session_id: str
    ops: list[Op]
    keys: list[tuple[str, str, str]]
    due: float
    delay: float
    moved: Callable[[int], None] | None = None
    why: str = ""  # why its last try failed
    early: bool = True  # may be written before it is due (when its store closes)


def moved_on(store: Store, session_id: str, ops: list[Op], flags: list[bool]) -> list[int]:
    """Which of a kept commit's ``ops`` were refused because their record moved on meanwhile:
    outcomes not written — not a clean-up whose intent never landed, nor one whose first send
    had landed after all."""
    found: list[int] = []
    for n, (op, ok) in enumerate(zip(ops, flags, strict=True)):
        if ok or not isinstance(op, UpdateEffect) or op.record.status is Status.NOT_HAPPENED:
            continue  # written; or a clean-up whose intent never landed: nothing to do
        try:
            now = store.ledger(session_id).get(op.record.tool_use_id)
        except StoreError:
            now = None
        if not same_write(now, op.record):
            found.append(n)
    return found


class Keeper:
    """Writes what a failed commit left unwritten, until the store takes it."""

    def __init__(self) -> None:
        # Reentrant: a run's generator collected while this thread holds it (a lease take an
        # interrupt cut off, ``Agent._take``) keeps a give-back from its ``except``.
        self._cv = threading.Condition(threading.RLock())
        self._jobs: list[_Kept] = []
        self._thread: threading.Thread | None = None
        # One close hook per store, however many writes are kept for it: the store's list of
        # hooks does not grow with every failed commit of a long-lived worker.
        self._hooks: weakref.WeakKeyDictionary[Store, Callable[[], None]] = (
            weakref.WeakKeyDictionary()
        )

    def keep(
        self,
        store: Store,
        session_id: str,
        ops: list[Op],
        keys: list[tuple[str, str, str]],
        moved: Callable[[int], None] | None = None,
        *,
        after: float | None = None,
    ) -> None:
        """Commit ``ops`` (unfenced) in the background; then release the calls ``keys`` held
        in flight. ``moved``: called with the index of each outcome refused because its record
        moved on meanwhile (``Remember.moved``). ``after``: not before that many seconds from
        now (a store closed sooner gives such a write up untried)."""
        due = time.monotonic() + (1.0 if after is None else max(after, 0.0))
        job = _Kept(store, session_id, list(ops), list(keys), due, 1.0, moved)
        job.early = after is None
        with self._cv:
            self._jobs.append(job)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, daemon=True, name="toolledger-keeper"
                )
                self._thread.start()
            self._cv.notify()
        # After the job is kept: on a store closed already, its last try is now.
        with self._cv:
            hook = self._hooks.get(store)
            if hook is None:
                hook = self._hooks[store] = partial(self.last_try, store)
        store.before_close(hook)

    def last_try(self, store: Store) -> None:
        """``store`` is being closed: one last attempt at its jobs, now; then they are given up
        (and their calls released) whatever happens."""
        with self._cv:
            mine = [j for j in self._jobs if j.store is store]
            self._jobs = [j for j in self._jobs if j.store is not store]
        now = time.monotonic()
        for job in mine:
            if not job.early and job.due > now:
                continue  # not to be written yet: given up
            if not self._try(job, last=True):
                for key in job.keys:
                    store.runtime.in_flight.discard(key)
                if job.keys:
                    logger.error(
                        "toolledger: the outcome of %s in session %r was never written: the "
                        "store was closed first (its last try: %s). A resume finds the call in "
                        "doubt.",
                        ", ".join(k[2] for k in job.keys),
                        job.session_id,
                        job.why,
                    )

    def _loop(self) -> None:
        while True:
            with self._cv:
                now = time.monotonic()
                due = [j for j in self._jobs if j.due <= now]
                wait = min((j.due for j in self._jobs), default=now + 60) - now
                if not due:
                    self._cv.wait(timeout=max(wait, 0.01))
                    continue
            for job in due:
                if self._try(job):
                    with self._cv:
                        if job in self._jobs:
                            self._jobs.remove(job)

    def _try(self, job: _Kept, *, last: bool = False) -> bool:
        """One attempt at ``job``: ``True`` once it is over (written, or refused for good).
        ``last``: its store is closing, so a failure is not retried (``last_try`` says so)."""
        try:
            flags = job.store.apply(job.session_id, job.ops)
        except StoreError as exc:
            if last:
                job.why = str(exc)
                return False
            job.delay = min(job.delay * 2, 30.0)
            job.due = time.monotonic() + job.delay
            logger.warning(
                "toolledger: a write kept for session %r failed again (%s); retrying in %.0fs",
                job.session_id,
                exc,
                job.delay,
            )
            return False
        except Exception as exc:  # refused (the session moved on) or broken: give up loudly
            flags = [False] * len(job.ops)
            logger.error("toolledger: a write kept for %r was refused: %s", job.session_id, exc)
        for key in job.keys:
            job.store.runtime.in_flight.discard(key)
        for n in moved_on(job.store, job.session_id, job.ops, flags):
            if job.moved is not None:
                try:
                    job.moved(n)  # kept in the record, as the run keeps a late outcome
                    continue
                except Exception as exc:
                    logger.error("toolledger: keeping a late outcome failed: %s", exc)
            op = job.ops[n]
            assert isinstance(op, UpdateEffect)
            logger.error(
                "toolledger: the outcome of %r (%s) in session %r could not be written: its "
                "record moved on meanwhile. A person must check it.",
                op.record.tool,
                op.record.tool_use_id,
                job.session_id,
            )
        return True


heartbeats = Heartbeats()
keeper = Keeper()

Hook = Callable[[], None]
