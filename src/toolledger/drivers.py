"""The I/O the runner and the agent need, as requests — and the two drivers that carry them out.

``runner._process`` and ``agent._loop`` are generators: they *yield* a request (read records,
commit writes, ask the approver, call a function, call the model) and receive its answer. The sync
driver answers with plain calls, the async driver with ``await``. Everything else — every rule,
every decision, every write — is written once, in the generators, so the sync and async paths
cannot drift apart.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Generator, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, TypeVar

from .approvals import ApprovalRequest, normalise
from .errors import ConfigurationError, LedgerWriteError, SessionConflictError, StoreError
from .stores.base import Op, Store

__all__ = [
    "Alert",
    "Ask",
    "CallModel",
    "Commit",
    "Failure",
    "IOContext",
    "Invoke",
    "ReadEffects",
    "ReadMessages",
    "ReadSession",
    "Request",
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
    ``StoreError`` or ``SessionConflictError``."""

    ops: list[Op]


@dataclass(frozen=True, slots=True)
class Ask:
    request: ApprovalRequest


@dataclass(frozen=True, slots=True)
class Invoke:
    """Call a tool or a check; answered with its value or a ``Failure``."""

    fn: Callable[[], Any]
    is_async: bool


@dataclass(frozen=True, slots=True)
class Alert:
    alert: LedgerWriteError


@dataclass(frozen=True, slots=True)
class CallModel:
    """Call the model API; answered with the response or a ``Failure``."""

    kwargs: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Failure:
    """An exception raised while carrying out a request, handed back to the generator."""

    exc: Exception


Request = ReadEffects | ReadSession | ReadMessages | Commit | Ask | Invoke | Alert | CallModel


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


_COMMIT_ERRORS = (StoreError, SessionConflictError)


def _emit(alert: LedgerWriteError, on_alert: AlertHook | None) -> Any:
    logger.error("toolledger alert: %s", alert.message, extra={"toolledger": alert.as_dict()})
    return on_alert(alert) if on_alert is not None else None


def _call_sync(fn: Callable[[], Any]) -> Any:
    value = fn()
    if inspect.isawaitable(value):
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(_await(value))
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


async def _await(value: Awaitable[T]) -> T:
    return await value


def _is_async(fn: Any) -> bool:
    """An ``async def`` function, or an object whose ``__call__`` is one."""
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - the method, not callability
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


async def _acall(fn: Callable[[], Any], is_async: bool) -> Any:
    value = await asyncio.to_thread(fn) if not is_async else fn()
    if inspect.isawaitable(value):
        value = await value
    return value


def drive(gen: Generator[Request, Any, T], io: IOContext) -> T:
    """Carry out the generator's requests synchronously."""
    backend = io.store.backend
    sid = io.session_id
    answer: Any = None
    while True:
        try:
            request = gen.send(answer)
        except StopIteration as stop:
            result: T = stop.value
            return result
        if isinstance(request, ReadEffects):
            answer = backend.read_effects(sid, request.tool_use_ids)
        elif isinstance(request, Commit):
            try:
                answer = io.store.apply(sid, request.ops)
            except _COMMIT_ERRORS as exc:
                answer = Failure(exc)
        elif isinstance(request, Invoke):
            try:
                answer = _call_sync(request.fn)
            except Exception as exc:
                answer = Failure(exc)
        elif isinstance(request, Ask):
            answer = normalise(_call_sync(partial(io.approve, request.request)), io.approve)
        elif isinstance(request, CallModel):
            assert io.model is not None
            try:
                answer = io.model.create(request.kwargs)
            except Exception as exc:
                answer = Failure(exc)
        elif isinstance(request, ReadSession):
            answer = backend.read_session(sid)
        elif isinstance(request, ReadMessages):
            answer = backend.read_messages(sid, request.since)
        else:
            _call_sync(partial(_emit, request.alert, io.on_alert))
            answer = None


async def adrive(gen: Generator[Request, Any, T], io: IOContext) -> T:
    """Carry out the generator's requests on the event loop (the async twin of ``drive``)."""
    backend = io.store.async_backend
    sid = io.session_id
    answer: Any = None
    while True:
        try:
            request = gen.send(answer)
        except StopIteration as stop:
            result: T = stop.value
            return result
        if isinstance(request, ReadEffects):
            answer = await backend.read_effects(sid, request.tool_use_ids)
        elif isinstance(request, Commit):
            try:
                answer = await io.store.aapply(sid, request.ops)
            except _COMMIT_ERRORS as exc:
                answer = Failure(exc)
        elif isinstance(request, Invoke):
            try:
                answer = await _acall(request.fn, request.is_async)
            except Exception as exc:
                answer = Failure(exc)
        elif isinstance(request, Ask):
            call = partial(io.approve, request.request)
            answer = normalise(await _acall(call, _is_async(io.approve)), io.approve)
        elif isinstance(request, CallModel):
            assert io.model is not None
            try:
                answer = await io.model.acreate(request.kwargs)
            except Exception as exc:
                answer = Failure(exc)
        elif isinstance(request, ReadSession):
            answer = await backend.read_session(sid)
        elif isinstance(request, ReadMessages):
            answer = await backend.read_messages(sid, request.since)
        else:
            await _acall(partial(_emit, request.alert, io.on_alert), _is_async(io.on_alert))
            answer = None
