"""The two drivers that carry out the I/O the runner and the agent request.

``runner._process`` and ``agent._loop`` are generators: they *yield* a request (read records,
commit writes, ask the approver, call a function, call the model; ``toolledger.engine._requests``)
and
receive its answer. The sync driver answers with plain calls, the async driver with ``await``.
Everything else — every rule, every decision, every write — is written once, in the generators,
so the sync and async paths cannot drift apart; and the drivers share all but the ``await``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Generator, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from ..errors import (
    ConfigurationError,
    LedgerWriteError,
    OutcomeUnknown,
    SessionConflictError,
    StoreError,
)
from ..ops import Op
from ..stores.contract import OP_BUDGET, operations_within
from . import _telemetry as telemetry
from ._background import heartbeats, keeper
from ._gate import normalise
from ._io import AlertHook, IOContext, drop_lease, give_back_later, hold
from ._requests import (
    Alert,
    Ask,
    CallModel,
    CancelledAfterAnswer,
    Commit,
    Failure,
    Fence,
    Invoke,
    ReadEffectIds,
    ReadEffects,
    ReadLease,
    ReadLineageRoot,
    ReadMessages,
    ReadSession,
    Remember,
    Request,
    Sleep,
)

__all__ = [
    "Alert",
    "AlertHook",
    "Ask",
    "CallModel",
    "CancelledAfterAnswer",
    "Commit",
    "Failure",
    "Fence",
    "IOContext",
    "Invoke",
    "ReadEffectIds",
    "ReadEffects",
    "ReadLease",
    "ReadLineageRoot",
    "ReadMessages",
    "ReadSession",
    "Remember",
    "Request",
    "Sleep",
    "adrive",
    "commit_now",
    "drive",
    "invoke_now",
    "refuse_async_in_loop",
]

logger = logging.getLogger("toolledger")

T = TypeVar("T")


async def _abeat(io: IOContext, fence: Fence) -> None:
    """The async heartbeat (a task on the run's event loop): renews while the run makes
    progress, as ``background.Heartbeats`` does for sync runs."""
    while True:
        await asyncio.sleep(fence.ttl / 3)
        stuck = io.busy_since
        if stuck is not None and time.monotonic() - stuck > fence.ttl / 3:
            logger.warning(
                "toolledger: not renewing the lease of %r: its run has waited %.1fs on the store",
                io.session_id,
                time.monotonic() - stuck,
            )
            continue
        try:
            ops = io.fenced([])
            with operations_within(fence.ttl / 3):
                await io.store.aapply(io.session_id, ops)
            io.landed(ops)
        except SessionConflictError:
            return
        except Exception as exc:
            logger.warning("toolledger: renewing the lease of %r failed: %s", io.session_id, exc)


_COMMIT_ERRORS = (StoreError, SessionConflictError)
# What a run waits on the store for: a heartbeat stops renewing a run stuck in one too long.
# (Matched by type: no request is subclassed, and a set lookup beats an ``isinstance`` walk.)
_STORE_REQUESTS = frozenset(
    {
        ReadEffects,
        ReadEffectIds,
        ReadSession,
        ReadMessages,
        ReadLease,
        ReadLineageRoot,
        Commit,
    }
)


def _emit(alert: LedgerWriteError, on_alert: AlertHook | None) -> Any:
    logger.error("toolledger alert: %s", alert.message, extra={"toolledger": alert.as_dict()})
    return on_alert(alert) if on_alert is not None else None


# What a plain function returns most often, and what is never awaitable: ``isawaitable`` (an ABC
# check) is skipped for them.
_PLAIN = frozenset({type(None), str, int, float, bool, dict, list, tuple, bytes})


def _call_sync(fn: Callable[[], Any], timeout: float | None = None) -> Any:
    value = fn()
    if type(value) not in _PLAIN and inspect.isawaitable(value):
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
    names = [t.name for t in tools if t.is_async or t.check_is_async]
    if not names:
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
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


async def _in_thread(fn: Callable[[], Any]) -> Any:
    """A tool's plain function run in a worker thread. A thread cannot be stopped: a
    cancellation meanwhile waits for it to return (or raise), then goes up — so the attempt
    stays in flight (rule 13) for as long as it may still take effect, and no other attempt of
    this process runs it a second time. What the function returned or raised goes up with the
    cancellation (``CancelledAfterAnswer``): the attempt's outcome is known, and is recorded
    before the run ends cancelled."""
    # A future, not a task (as ``asyncio.to_thread`` would make): ``asyncio.run``'s shutdown
    # cancels every task left, and the wait below must not end before the thread does.
    loop = asyncio.get_running_loop()
    thread = loop.run_in_executor(None, partial(contextvars.copy_context().run, fn))
    try:
        return await asyncio.shield(thread)
    except asyncio.CancelledError as cancelled:
        while not thread.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({thread})  # (never raises what the thread raised)
        if thread.cancelled():
            raise
        exc = thread.exception()  # (retrieved: not logged as never retrieved)
        if exc is None:
            answer: Any = thread.result()
            if inspect.isawaitable(answer):  # its answer is still to be awaited: not known
                raise
        elif isinstance(exc, Exception):
            answer = Failure(exc)
        else:
            raise
        raise CancelledAfterAnswer(answer, *cancelled.args) from None


def _is_async(fn: Any) -> bool:
    """An ``async def`` function, or an object whose ``__call__`` is one."""
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - the method, not callability
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


async def _acall(
    fn: Callable[[], Any], is_async: bool, timeout: float | None = None, *, tool: bool = False
) -> Any:
    """``fn`` called on the loop (``is_async``) or in a worker thread. ``tool``: a tool's (or
    its check's) function, whose thread a cancellation waits for (``_in_thread``); an approver's
    or an alert hook's is left to finish on its own — a person may take hours to answer."""
    if is_async:
        value = fn()
    elif tool:
        value = await _in_thread(fn)
    else:
        value = await asyncio.to_thread(fn)
    if inspect.isawaitable(value):
        value = await _await(value, timeout)
    return value


@dataclass(frozen=True, slots=True)
class _Raised:
    """Carrying out a request raised ``exc``: it is raised inside the generator, which may handle
    it (a read the store refused, an approver that failed). A ``KeyboardInterrupt`` or a
    cancellation too: the generator's own handlers and ``finally`` blocks — the calls it holds in
    flight released, its span ended — run as it goes up, not whenever the generator is
    collected (as they do where no generator stands between: ``_runner.run_batch``)."""

    exc: BaseException


def _advance(gen: Generator[Request, Any, T], io: IOContext, answer: Any) -> Request:
    """Hand ``gen`` the answer to its last request and return its next one (``StopIteration``
    when it is done). While a store request is carried out the run counts as waiting on the
    store (a heartbeat stops renewing a run stuck in one too long)."""
    io.busy_since = None
    request = gen.throw(answer.exc) if type(answer) is _Raised else gen.send(answer)
    if type(request) in _STORE_REQUESTS:
        io.busy_since = time.monotonic()
    return request


def drive(gen: Generator[Request, Any, T], io: IOContext) -> T:
    """Carry out the generator's requests synchronously."""
    budget = OP_BUDGET.set(OP_BUDGET.get())  # a lease taken below bounds the run's operations
    try:
        request = _advance(gen, io, None)
        while True:
            try:
                answer = _answer(request, io)
            except BaseException as exc:  # raised inside the generator (``_Raised``)
                answer = _Raised(exc)
            if isinstance(request, Fence):  # no store operation may outlast a third of the lease
                OP_BUDGET.set(request.ttl / 3)
            request = _advance(gen, io, answer)
    except StopIteration as stop:
        result: T = stop.value
        return result
    finally:
        try:
            io.busy_since = None
            if io.fence is not None:  # first, with no call before it: never left held by a run
                io.store.runtime.live_runs.discard(io.fence.lease.owner)
            heartbeats.remove(io)
            dropped = drop_lease(io)
            if dropped:
                try:
                    io.store.apply(io.session_id, dropped)
                except Exception as exc:
                    give_back_later(io, dropped, exc)
        finally:  # an interrupt above (Ctrl-C) leaves no lease's budget on later operations
            OP_BUDGET.reset(budget)


def commit_now(
    io: IOContext, ops: list[Op], *, fenced: bool = True, session: str | None = None
) -> list[bool] | Failure:
    """A ``Commit``'s answer, carried out synchronously: the per-op flags, or a ``Failure``
    holding the store's error. (Also what the straight path of ``run_tool_uses`` calls,
    without a request: ``toolledger.engine._straight.run``.)"""
    sid = session or io.session_id
    try:
        if io.fence is None:  # no lease (``run_tool_uses``): nothing to put first or renew
            return io.store.apply(sid, ops)
        fenced_ops = io.fenced(ops, fenced)
        flags = io.store.apply(sid, fenced_ops)
        io.landed(fenced_ops)
        return io.unfenced(flags, fenced)
    except _COMMIT_ERRORS as exc:
        return Failure(exc)


def invoke_now(request: Invoke) -> Any:
    """An ``Invoke``'s answer, carried out synchronously: the value, or a ``Failure``."""
    try:
        return _call_sync(request.fn, request.timeout)
    except Exception as exc:
        return Failure(exc)


def _answer(request: Request, io: IOContext) -> Any:
    backend = io.store.backend
    sid = io.session_id
    if isinstance(request, Commit):
        return commit_now(io, request.ops, fenced=request.fenced, session=request.session)
    if isinstance(request, Invoke):
        return invoke_now(request)
    if isinstance(request, CallModel):
        assert io.model is not None
        token = telemetry.enter(request.span)
        try:
            if request.on_text is not None:
                return io.model.stream(request.kwargs, request.on_text)
            return io.model.create(request.kwargs)
        except Exception as exc:
            return Failure(exc)
        finally:
            telemetry.leave(token)
    if isinstance(request, ReadEffects):
        return backend.read_effects(request.session or sid, request.tool_use_ids)
    if isinstance(request, Sleep):
        time.sleep(request.seconds)
        return None
    if isinstance(request, Remember):
        keeper.keep(io.store, sid, request.ops, request.keys, request.moved)
        return None
    if isinstance(request, Ask):
        answer = _call_sync(partial(io.approve, request.request))
        return normalise(answer, io.approve, in_doubt=request.request.in_doubt)
    if isinstance(request, ReadSession):
        return backend.read_session(request.session or sid)
    if isinstance(request, ReadMessages):
        return backend.read_messages(request.session or sid, request.since)
    if isinstance(request, ReadEffectIds):
        return backend.read_effect_ids(sid)
    if isinstance(request, ReadLease):
        return backend.read_lease(request.session or sid)
    if isinstance(request, ReadLineageRoot):
        return io.store.lineage_root(sid)
    if isinstance(request, Fence):
        hold(io, request)
        heartbeats.add(io)
        return None
    _call_sync(partial(_emit, request.alert, io.on_alert))
    return None


async def adrive(gen: Generator[Request, Any, T], io: IOContext) -> T:
    """Carry out the generator's requests on the event loop (the async twin of ``drive``)."""
    budget = OP_BUDGET.set(OP_BUDGET.get())
    try:
        request = _advance(gen, io, None)
        while True:
            try:
                answer = await _aanswer(request, io)
            except BaseException as exc:  # a cancellation too (``_Raised``)
                answer = _Raised(exc)
            if isinstance(request, Fence):
                OP_BUDGET.set(request.ttl / 3)
            request = _advance(gen, io, answer)
    except StopIteration as stop:
        result: T = stop.value
        return result
    except CancelledAfterAnswer as late:
        # The answer it carried is recorded. What goes up is the cancellation itself: on
        # Python 3.11 ``asyncio.timeout`` and ``TaskGroup`` know it by its exact type.
        raise asyncio.CancelledError(*late.args) from None
    finally:
        try:
            io.busy_since = None
            if io.fence is not None:  # first, with no call before it: never left held by a run
                io.store.runtime.live_runs.discard(io.fence.lease.owner)
            if isinstance(io.keeper, asyncio.Task):
                io.keeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await io.keeper
            dropped = drop_lease(io)
            if dropped:
                try:
                    await io.store.aapply(io.session_id, dropped)
                except Exception as exc:
                    give_back_later(io, dropped, exc)
        finally:  # a cancellation or an interrupt above leaves no lease's budget behind
            OP_BUDGET.reset(budget)


async def _aanswer(request: Request, io: IOContext) -> Any:
    backend = io.store.async_backend
    sid = io.session_id
    if isinstance(request, Commit):
        try:
            if io.fence is None:
                return await io.store.aapply(request.session or sid, request.ops)
            ops = io.fenced(request.ops, request.fenced)
            flags = await io.store.aapply(request.session or sid, ops)
            io.landed(ops)
            return io.unfenced(flags, request.fenced)
        except _COMMIT_ERRORS as exc:
            return Failure(exc)
    if isinstance(request, Invoke):
        try:
            return await _acall(request.fn, request.is_async, request.timeout, tool=True)
        except Exception as exc:
            return Failure(exc)
    if isinstance(request, CallModel):
        assert io.model is not None
        token = telemetry.enter(request.span)
        try:
            if request.on_text is not None:
                return await io.model.astream(request.kwargs, request.on_text)
            return await io.model.acreate(request.kwargs)
        except Exception as exc:
            return Failure(exc)
        finally:
            telemetry.leave(token)
    if isinstance(request, ReadEffects):
        return await backend.read_effects(request.session or sid, request.tool_use_ids)
    if isinstance(request, Sleep):
        await asyncio.sleep(request.seconds)
        return None
    if isinstance(request, Remember):
        keeper.keep(io.store, sid, request.ops, request.keys, request.moved)
        return None
    if isinstance(request, Ask):
        call = partial(io.approve, request.request)
        answer = await _acall(call, _is_async(io.approve))
        return normalise(answer, io.approve, in_doubt=request.request.in_doubt)
    if isinstance(request, ReadSession):
        return await backend.read_session(request.session or sid)
    if isinstance(request, ReadMessages):
        return await backend.read_messages(request.session or sid, request.since)
    if isinstance(request, ReadEffectIds):
        return await backend.read_effect_ids(sid)
    if isinstance(request, ReadLease):
        return await backend.read_lease(request.session or sid)
    if isinstance(request, ReadLineageRoot):
        return await io.store.alineage_root(sid)
    if isinstance(request, Fence):
        hold(io, request)
        io.keeper = asyncio.create_task(_abeat(io, request))
        return None
    await _acall(partial(_emit, request.alert, io.on_alert), _is_async(io.on_alert))
    return None
