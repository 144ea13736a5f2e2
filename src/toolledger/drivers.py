"""The I/O the runner and the agent need, as requests — and the two drivers that carry them out.

``runner._process`` and ``agent._loop`` are generators: they *yield* a request (read records,
commit writes, ask the approver, call a function, call the model) and receive its answer. The sync
driver answers with plain calls, the async driver with ``await``. Everything else — every rule,
every decision, every write — is written once, in the generators, so the sync and async paths
cannot drift apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Generator, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol, TypeVar

from . import leases
from .approvals import ApprovalRequest, normalise
from .errors import (
    ConfigurationError,
    LedgerWriteError,
    OutcomeUnknown,
    SessionConflictError,
    StoreError,
)
from .records import Lease, Status, same_write
from .stores.base import DropLease, Op, Store, UpdateEffect
from .tools import ToolContext

__all__ = [
    "Alert",
    "Ask",
    "CallModel",
    "Commit",
    "Failure",
    "Fence",
    "IOContext",
    "Invoke",
    "ReadEffects",
    "ReadLease",
    "ReadMessages",
    "ReadSession",
    "Remember",
    "Request",
    "Sleep",
    "adrive",
    "drive",
    "refuse_async_in_loop",
]

logger = logging.getLogger("toolledger")

AlertHook = Callable[[LedgerWriteError], Any]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ReadEffects:
    tool_use_ids: list[str] | None


@dataclass(frozen=True, slots=True)
class ReadSession:
    pass


@dataclass(frozen=True, slots=True)
class ReadMessages:
    since: int = 0


@dataclass(frozen=True, slots=True)
class Commit:
    """Commit ops in one transaction; answered with the per-op flags or a ``Failure`` holding a
    ``StoreError`` or ``SessionConflictError``. ``fenced=False`` leaves the run's lease fence
    out: for an attempt's outcome written after a take-over (a compare-and-set on its record
    needs no fence)."""

    ops: list[Op]
    fenced: bool = True


@dataclass(frozen=True, slots=True)
class Ask:
    request: ApprovalRequest


@dataclass(frozen=True, slots=True)
class Invoke:
    """Call a tool or a check; answered with its value or a ``Failure``. An ``async def`` one is
    cancelled after ``timeout`` seconds, answered with ``Failure(OutcomeUnknown)``; a plain
    function cannot be stopped and runs to its end."""

    fn: Callable[[], Any]
    is_async: bool
    timeout: float | None = None
    ctx: ToolContext | None = None  # the call it serves (for drivers that watch, not to use)
    check: bool = False  # the tool's ``check``, not the tool


@dataclass(frozen=True, slots=True)
class Remember:
    """Writes this process must not lose — outcomes of its attempts that a failed commit left
    unwritten: commit them (without the fence) in the background, retrying until they apply or
    are refused, then release the calls in flight (``keys``). Answered at once with ``None``."""

    ops: list[Op]
    keys: list[tuple[str, str, str]]


@dataclass(frozen=True, slots=True)
class Sleep:
    """Wait ``seconds`` (for another attempt to finish)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Alert:
    alert: LedgerWriteError


@dataclass(frozen=True, slots=True)
class CallModel:
    """Call the model API; answered with the response or a ``Failure``."""

    kwargs: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ReadLease:
    pass


@dataclass(frozen=True, slots=True)
class Fence:
    """From now on every commit carries this lease's fence, a heartbeat renews it, and it is
    given up when the generator ends (see ``toolledger.leases``)."""

    lease: Lease
    ttl: float


@dataclass(frozen=True, slots=True)
class Failure:
    """An exception raised while carrying out a request, handed back to the generator."""

    exc: Exception


Request = (
    ReadEffects
    | ReadSession
    | ReadMessages
    | ReadLease
    | Commit
    | Ask
    | Invoke
    | Alert
    | CallModel
    | Fence
    | Sleep
    | Remember
)


class ModelClient(Protocol):
    """How the drivers call a model API; the provider adapters implement it."""

    def create(self, kwargs: dict[str, Any]) -> Any: ...

    async def acreate(self, kwargs: dict[str, Any]) -> Any: ...


@dataclass(slots=True)
class IOContext:
    store: Store
    session_id: str
    approve: Any = None
    on_alert: AlertHook | None = None
    model: ModelClient | None = None
    fence: Fence | None = None
    keeper: Any = None  # the async run's heartbeat task
    # Held while the heartbeat renews and while the run gives its lease up, so a renewal in
    # flight can never land after the give-back (and keep a finished run's lease alive).
    guard: threading.Lock = field(default_factory=threading.Lock)

    def fenced(self, ops: list[Op], fenced: bool = True) -> list[Op]:
        if self.fence is None or not fenced:
            return ops
        return [leases.fence(self.fence.lease, self.store.now, self.fence.ttl), *ops]

    def unfenced(self, flags: list[bool], fenced: bool = True) -> list[bool]:
        return flags[1:] if self.fence is not None and fenced else flags


class _Heartbeats:
    """One daemon thread per process renewing the leases of every sync run in flight, each every
    third of its time to live. A run registers when it takes its lease and leaves when it ends:
    no thread is started per run."""

    def __init__(self) -> None:
        self._cv = threading.Condition(threading.Lock())
        self._due: dict[int, tuple[float, IOContext]] = {}  # id(io) -> (next renewal, io)
        self._thread: threading.Thread | None = None

    def add(self, io: IOContext) -> None:
        assert io.fence is not None
        with self._cv:
            self._due[id(io)] = (time.monotonic() + io.fence.ttl / 3, io)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, daemon=True, name="toolledger-leases"
                )
                self._thread.start()
            self._cv.notify()

    def remove(self, io: IOContext) -> None:
        with self._cv:
            self._due.pop(id(io), None)

    def _loop(self) -> None:
        while True:
            with self._cv:
                now = time.monotonic()
                due = [io for at, io in self._due.values() if at <= now]
                for io in due:
                    assert io.fence is not None
                    self._due[id(io)] = (now + io.fence.ttl / 3, io)
                wait = min((at for at, _ in self._due.values()), default=now + 60) - now
            for io in due:
                self._renew(io)
            with self._cv:
                self._cv.wait(timeout=max(wait, 0.01))

    def _renew(self, io: IOContext) -> None:
        try:
            with io.guard:
                if io.fence is not None:
                    io.store.apply(io.session_id, io.fenced([]))
        except SessionConflictError:
            self.remove(io)  # taken over: the run's next commit is refused and says so
        except Exception as exc:  # a store hiccup: the next beat (or commit) tries again
            logger.warning("toolledger: renewing the lease of %r failed: %s", io.session_id, exc)


_heartbeats = _Heartbeats()


@dataclass
class _Kept:
    store: Store
    session_id: str
    ops: list[Op]
    keys: list[tuple[str, str, str]]
    due: float
    delay: float


class _Keeper:
    """One daemon thread per process writing what a failed commit left unwritten (``Remember``):
    retried with a growing pause (1 s to 30 s) until the store takes it — the writes land, or
    their compare-and-set is refused because the record moved on — then the calls it held in
    flight are released. A process that ends first loses them, as a crash would."""

    def __init__(self) -> None:
        self._cv = threading.Condition(threading.Lock())
        self._jobs: list[_Kept] = []
        self._thread: threading.Thread | None = None

    def keep(self, store: Store, session_id: str, request: Remember) -> None:
        job = _Kept(store, session_id, list(request.ops), list(request.keys), 0.0, 1.0)
        job.due = time.monotonic() + job.delay
        store.before_close(partial(self.last_try, store))
        with self._cv:
            self._jobs.append(job)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, daemon=True, name="toolledger-keeper"
                )
                self._thread.start()
            self._cv.notify()

    def last_try(self, store: Store) -> None:
        """``store`` is being closed: one last attempt at its jobs, now; then they are given up
        (and their calls released) whatever happens."""
        with self._cv:
            mine = [j for j in self._jobs if j.store is store]
            self._jobs = [j for j in self._jobs if j.store is not store]
        for job in mine:
            if not self._try(job):
                for key in job.keys:
                    store.runtime.in_flight.discard(key)
                logger.error(
                    "toolledger: the outcome of %s in session %r was never written: the store "
                    "was closed first. A resume finds the call in doubt.",
                    ", ".join(k[2] for k in job.keys),
                    job.session_id,
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

    def _try(self, job: _Kept) -> bool:
        try:
            flags = job.store.apply(job.session_id, job.ops)
        except StoreError as exc:
            job.delay = min(job.delay * 2, 30.0)
            job.due = time.monotonic() + job.delay
            logger.warning(
                "toolledger: writing the outcome of %s in session %r failed again (%s); "
                "retrying in %.0fs",
                ", ".join(k[2] for k in job.keys),
                job.session_id,
                exc,
                job.delay,
            )
            return False
        except Exception as exc:  # refused (the session moved on) or broken: give up loudly
            flags = [False] * len(job.ops)
            logger.error("toolledger: the outcome of %s was not written: %s", job.keys, exc)
        for key in job.keys:
            job.store.runtime.in_flight.discard(key)
        for op, ok in zip(job.ops, flags, strict=True):
            if ok or not isinstance(op, UpdateEffect) or op.record.status is Status.NOT_HAPPENED:
                continue  # written; or a clean-up whose intent never landed: nothing to do
            try:
                now = job.store.backend.read_effects(job.session_id, [op.record.tool_use_id])
            except StoreError:
                now = {}
            if same_write(now.get(op.record.tool_use_id), op.record):
                continue  # its first send had landed after all
            logger.error(
                "toolledger: the outcome of %r (%s) in session %r could not be written: its "
                "record moved on meanwhile. A person must check it.",
                op.record.tool,
                op.record.tool_use_id,
                job.session_id,
            )
        return True


_keeper = _Keeper()


async def _abeat(io: IOContext, fence: Fence) -> None:
    """The async heartbeat (a task on the run's event loop)."""
    while True:
        await asyncio.sleep(fence.ttl / 3)
        try:
            await io.store.aapply(io.session_id, io.fenced([]))
        except SessionConflictError:
            return
        except Exception as exc:
            logger.warning("toolledger: renewing the lease of %r failed: %s", io.session_id, exc)


def _hold(io: IOContext, fence: Fence) -> None:
    io.fence = fence
    io.store.runtime.live_runs.add(fence.lease.owner)


def _drop_lease(io: IOContext) -> list[Op]:
    if io.fence is None:
        return []
    lease = io.fence.lease
    io.fence = None
    io.store.runtime.live_runs.discard(lease.owner)
    return [DropLease(lease.session_id, lease.token)]


_COMMIT_ERRORS = (StoreError, SessionConflictError)


def _emit(alert: LedgerWriteError, on_alert: AlertHook | None) -> Any:
    logger.error("toolledger alert: %s", alert.message, extra={"toolledger": alert.as_dict()})
    return on_alert(alert) if on_alert is not None else None


def _call_sync(fn: Callable[[], Any], timeout: float | None = None) -> Any:
    value = fn()
    if inspect.isawaitable(value):
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(_await(value, timeout))
        if inspect.iscoroutine(value):
            value.close()
        raise ConfigurationError(
            "an async tool, check or approver was called from run_tool_uses (or Agent.run) "
            "inside a running event loop; use `await arun_tool_uses(...)` (or Agent.arun) there"
        )
    return value


def refuse_async_in_loop(tools: Iterable[Any], where: str) -> None:
    """The sync entry points cannot run an ``async def`` tool (or check) from inside a running
    event loop. Say so before anything is written, rather than leave a record for a call that
    never ran."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    names = [t.name for t in tools if t.is_async or t.check_is_async]
    if names:
        raise ConfigurationError(
            f"{where} was called inside a running event loop, and {', '.join(names)} "
            f"{'is' if len(names) == 1 else 'are'} async: use the async twin "
            "(`await arun_tool_uses(...)` / `await agent.arun(...)`) there. Nothing was run."
        )


async def _await(value: Awaitable[T], timeout: float | None = None) -> T:
    if timeout is None:
        return await value
    try:
        return await asyncio.wait_for(value, timeout)
    except TimeoutError:
        raise OutcomeUnknown(
            f"it was cancelled at its deadline, {timeout:g}s after it started (raise the "
            "tool's timeout= if it needs longer)"
        ) from None


def _is_async(fn: Any) -> bool:
    """An ``async def`` function, or an object whose ``__call__`` is one."""
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - the method, not callability
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


async def _acall(fn: Callable[[], Any], is_async: bool, timeout: float | None = None) -> Any:
    value = await asyncio.to_thread(fn) if not is_async else fn()
    if inspect.isawaitable(value):
        value = await _await(value, timeout)
    return value


def drive(gen: Generator[Request, Any, T], io: IOContext) -> T:
    """Carry out the generator's requests synchronously. A request that raises (a read the
    store refused, an approver that failed) raises inside the generator, which may handle it."""
    answer: Any = None
    error: Exception | None = None
    try:
        while True:
            try:
                request = gen.throw(error) if error is not None else gen.send(answer)
            except StopIteration as stop:
                result: T = stop.value
                return result
            error = None
            try:
                answer = _answer(request, io)
            except Exception as exc:
                answer, error = None, exc
    finally:
        _heartbeats.remove(io)
        with io.guard:
            dropped = _drop_lease(io)
        if dropped:
            try:
                io.store.apply(io.session_id, dropped)
            except Exception as exc:  # it expires on its own
                logger.warning(
                    "toolledger: giving the lease of %r up failed: %s", io.session_id, exc
                )


def _answer(request: Request, io: IOContext) -> Any:
    backend = io.store.backend
    sid = io.session_id
    if isinstance(request, ReadEffects):
        return backend.read_effects(sid, request.tool_use_ids)
    if isinstance(request, Commit):
        try:
            ops = io.fenced(request.ops, request.fenced)
            return io.unfenced(io.store.apply(sid, ops), request.fenced)
        except _COMMIT_ERRORS as exc:
            return Failure(exc)
    if isinstance(request, Invoke):
        try:
            return _call_sync(request.fn, request.timeout)
        except Exception as exc:
            return Failure(exc)
    if isinstance(request, Sleep):
        time.sleep(request.seconds)
        return None
    if isinstance(request, Remember):
        _keeper.keep(io.store, sid, request)
        return None
    if isinstance(request, Ask):
        return normalise(_call_sync(partial(io.approve, request.request)), io.approve)
    if isinstance(request, CallModel):
        assert io.model is not None
        try:
            return io.model.create(request.kwargs)
        except Exception as exc:
            return Failure(exc)
    if isinstance(request, ReadSession):
        return backend.read_session(sid)
    if isinstance(request, ReadMessages):
        return backend.read_messages(sid, request.since)
    if isinstance(request, ReadLease):
        return backend.read_lease(sid)
    if isinstance(request, Fence):
        _hold(io, request)
        _heartbeats.add(io)
        return None
    _call_sync(partial(_emit, request.alert, io.on_alert))
    return None


async def adrive(gen: Generator[Request, Any, T], io: IOContext) -> T:
    """Carry out the generator's requests on the event loop (the async twin of ``drive``)."""
    answer: Any = None
    error: Exception | None = None
    try:
        while True:
            try:
                request = gen.throw(error) if error is not None else gen.send(answer)
            except StopIteration as stop:
                result: T = stop.value
                return result
            error = None
            try:
                answer = await _aanswer(request, io)
            except Exception as exc:
                answer, error = None, exc
    finally:
        if isinstance(io.keeper, asyncio.Task):
            io.keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await io.keeper
        dropped = _drop_lease(io)
        if dropped:
            try:
                await io.store.aapply(io.session_id, dropped)
            except Exception as exc:  # it expires on its own
                logger.warning(
                    "toolledger: giving the lease of %r up failed: %s", io.session_id, exc
                )


async def _aanswer(request: Request, io: IOContext) -> Any:
    backend = io.store.async_backend
    sid = io.session_id
    if isinstance(request, ReadEffects):
        return await backend.read_effects(sid, request.tool_use_ids)
    if isinstance(request, Commit):
        try:
            ops = io.fenced(request.ops, request.fenced)
            return io.unfenced(await io.store.aapply(sid, ops), request.fenced)
        except _COMMIT_ERRORS as exc:
            return Failure(exc)
    if isinstance(request, Invoke):
        try:
            return await _acall(request.fn, request.is_async, request.timeout)
        except Exception as exc:
            return Failure(exc)
    if isinstance(request, Sleep):
        await asyncio.sleep(request.seconds)
        return None
    if isinstance(request, Remember):
        _keeper.keep(io.store, sid, request)
        return None
    if isinstance(request, Ask):
        call = partial(io.approve, request.request)
        return normalise(await _acall(call, _is_async(io.approve)), io.approve)
    if isinstance(request, CallModel):
        assert io.model is not None
        try:
            return await io.model.acreate(request.kwargs)
        except Exception as exc:
            return Failure(exc)
    if isinstance(request, ReadSession):
        return await backend.read_session(sid)
    if isinstance(request, ReadMessages):
        return await backend.read_messages(sid, request.since)
    if isinstance(request, ReadLease):
        return await backend.read_lease(sid)
    if isinstance(request, Fence):
        _hold(io, request)
        io.keeper = asyncio.create_task(_abeat(io, request))
        return None
    await _acall(partial(_emit, request.alert, io.on_alert), _is_async(io.on_alert))
    return None
