"""OpenTelemetry: a span per ``agent.run``, per model call and per tool call, and a counter of
what happened to each call — when the ``opentelemetry-api`` package is installed (extra ``otel``)
and a tracer provider is set. Otherwise every function here returns at once.

Spans follow the OpenTelemetry semantic conventions for generative AI:

* ``invoke_agent toolledger`` — ``gen_ai.operation.name=invoke_agent``,
  ``gen_ai.conversation.id`` and ``toolledger.session`` (the session id), ``gen_ai.request.model``,
  ``gen_ai.provider.name``; at its end ``toolledger.status`` (the run's status), its reason and
  the session's token counts;
* ``chat {model}`` — ``gen_ai.operation.name=chat``, the model, ``gen_ai.request.max_tokens``,
  and the answer's ``gen_ai.usage.input_tokens`` / ``output_tokens``;
* ``execute_tool {tool}`` — ``gen_ai.operation.name=execute_tool``, ``gen_ai.tool.name``,
  ``gen_ai.tool.call.id``, ``gen_ai.tool.type=function``, ``toolledger.session``,
  ``toolledger.effect`` (the tool's effect class) and ``toolledger.disposition`` (``executed``,
  ``replayed``, ``in_doubt`` …: see ``toolledger.engine._runner.Disposition``). A call answered
  with an
  error has the span's status set to ``ERROR``. The span is current while the tool runs, so what
  the tool itself traces (an HTTP call) is its child.

The counter ``toolledger.tool.calls`` counts calls by ``toolledger.disposition``,
``gen_ai.tool.name`` and ``toolledger.effect`` (through the global meter provider).

Nothing about inputs or results is put on a span: they may hold what only the store should.
Tracing watches and never decides: a span processor that raises as a span ends (after the tool
ran) is not let into the run (``_end``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..records import ToolCall
    from ._batch import CallOutcome

try:
    from opentelemetry import context as _context
    from opentelemetry import metrics as _metrics
    from opentelemetry import trace as _trace
except ImportError:  # pragma: no cover - exercised where the extra is not installed
    _trace = None  # type: ignore[assignment]

__all__ = [
    "agent_span",
    "end_spans",
    "enter",
    "leave",
    "model_done",
    "model_span",
    "tool_done",
    "tool_span",
    "watching",
]

_NAME = "toolledger"
_PUBLIC_ONLY = _trace is not None and (
    not hasattr(_trace, "_TRACER_PROVIDER") or "OTEL_PYTHON_TRACER_PROVIDER" in os.environ
)
_cache: dict[str, Any] = {"provider": None, "tracer": None, "counter": None}
_metrics_internal: Any = None
if _trace is not None:
    # The API's own module, where its global meter provider lives; laid out otherwise, the
    # public getter is asked every time (``_metered``).
    with suppress(ImportError):
        from opentelemetry.metrics import _internal as _metrics_internal
_ProxyMeterProvider: Any = getattr(_metrics_internal, "_ProxyMeterProvider", type(None))
_PUBLIC_ONLY_METRICS = (
    not hasattr(_metrics_internal, "_METER_PROVIDER") or "OTEL_PYTHON_METER_PROVIDER" in os.environ
)


def _provider() -> Any:
    """The global tracer provider, ``None`` when none is set. The API's own getter reads the
    environment on every call while none is set (1.4 µs, several times per tool call), so its
    global is read directly where it exists and no provider is named in the environment."""
    if _PUBLIC_ONLY:
        provider = _trace.get_tracer_provider()
        return None if isinstance(provider, _trace.ProxyTracerProvider) else provider
    return _trace._TRACER_PROVIDER


def _metered() -> bool:
    """Whether a global meter provider is set, read as ``_provider`` reads the tracer's."""
    if _PUBLIC_ONLY_METRICS:
        return not isinstance(_metrics.get_meter_provider(), _ProxyMeterProvider)
    return _metrics_internal._METER_PROVIDER is not None


def watching() -> bool:
    """Whether a tool call would be traced or counted: a tracer or a meter provider is set. A
    call with nobody watching skips its span and its count in one test (``_runner``)."""
    if _trace is None:
        return False
    if _PUBLIC_ONLY or _PUBLIC_ONLY_METRICS:
        return _provider() is not None or _metered()
    return _trace._TRACER_PROVIDER is not None or _metrics_internal._METER_PROVIDER is not None


def _tracer() -> Any:
    """The tracer, or ``None`` when no tracer provider is set (nothing would be recorded)."""
    if _trace is None:
        return None
    provider = _provider()
    if provider is None:
        return None
    if provider is not _cache["provider"]:
        from .._version import __version__

        _cache["tracer"] = provider.get_tracer(_NAME, __version__)
        _cache["provider"] = provider
    return _cache["tracer"]


def _counter() -> Any:
    """The call counter, or ``None`` while no meter provider is set (a count would go nowhere;
    once one is set, calls are counted from then on)."""
    if not _metered():
        return None
    if _cache["counter"] is None:
        _cache["counter"] = _metrics.get_meter(_NAME).create_counter(
            "toolledger.tool.calls",
            unit="{call}",
            description="Tool calls by what happened to them (toolledger.disposition)",
        )
    return _cache["counter"]


# -- the agent's run -----------------------------------------------------------------------------


@contextmanager
def agent_span(session_id: str, model: str, provider: str) -> Iterator[Any]:
    """The span of one ``agent.run``, current for its length; yields it (or ``None``)."""
    tracer = _tracer()
    if tracer is None:
        yield None
        return
    span = tracer.start_span(
        "invoke_agent toolledger",
        kind=_trace.SpanKind.INTERNAL,
        attributes={
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": _NAME,
            "gen_ai.conversation.id": session_id,
            "gen_ai.request.model": model,
            "gen_ai.provider.name": provider,
            "toolledger.session": session_id,
        },
    )
    try:
        with _trace.use_span(span, end_on_exit=False):  # (records an error that goes through)
            yield span
    finally:
        _end(span)


def agent_done(span: Any, run: Any) -> None:
    """What the run came to, on its span."""
    if span is None:
        return
    span.set_attribute("toolledger.status", run.status.value)
    span.set_attribute("toolledger.turns", run.turns)
    span.set_attribute("gen_ai.usage.input_tokens", run.usage.input_tokens)
    span.set_attribute("gen_ai.usage.output_tokens", run.usage.output_tokens)
    if run.reason is not None:
        span.set_attribute("toolledger.reason", run.reason)


# -- model calls ---------------------------------------------------------------------------------


def model_span(model: str, provider: str, max_tokens: int) -> Any:
    """A started ``chat`` span (not current), or ``None``."""
    tracer = _tracer()
    if tracer is None:
        return None
    return tracer.start_span(
        f"chat {model}",
        kind=_trace.SpanKind.CLIENT,
        attributes={
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": model,
            "gen_ai.provider.name": provider,
            "gen_ai.request.max_tokens": max_tokens,
        },
    )


def model_done(
    span: Any, *, input_tokens: int = 0, output_tokens: int = 0, error: BaseException | None = None
) -> None:
    if span is None:
        return
    if error is not None:
        _failed(span, error)
    else:
        span.set_attribute("gen_ai.usage.input_tokens", input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", output_tokens)
    _end(span)


# -- tool calls ----------------------------------------------------------------------------------


def tool_span(session_id: str, call: ToolCall, effect: str | None) -> Any:
    """A started ``execute_tool`` span (made current by ``enter``), or ``None``."""
    tracer = _tracer()
    if tracer is None:
        return None
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": call.name,
        "gen_ai.tool.call.id": call.tool_use_id,
        "gen_ai.tool.type": "function",
        "toolledger.session": session_id,
    }
    if effect is not None:
        attributes["toolledger.effect"] = effect
    return tracer.start_span(f"execute_tool {call.name}", attributes=attributes)


def enter(span: Any) -> Any:
    """Make ``span`` current; returns what ``leave`` needs."""
    if span is None:
        return None
    return _context.attach(_trace.set_span_in_context(span))


def leave(token: Any) -> None:
    if token is None:
        return
    with suppress(Exception):  # a generator closed from another context: nothing to undo
        _context.detach(token)


def tool_done(
    span: Any,
    outcome: CallOutcome | None,
    effect: str | None,
    tool: str,
    ended: list[tuple[Any, int]],
) -> None:
    """The call's span given its disposition, and the call counted. ``outcome`` is ``None``
    when the call raised (``tool_failed`` ends the span then). The span is not ended here but
    put in ``ended`` with the time it is done, for ``end_spans`` to end once the call's outcome
    is written: a span processor may export as a span ends (``SimpleSpanProcessor``), and a
    slow exporter must not hold back the write — a crash meanwhile would leave a call that
    succeeded in doubt."""
    if _trace is None:
        return
    counter = _counter() if outcome is not None else None
    if counter is not None:  # (the attributes are built only when a count goes somewhere)
        assert outcome is not None
        attributes = {"toolledger.disposition": outcome.disposition.value, "gen_ai.tool.name": tool}
        if effect is not None:
            attributes["toolledger.effect"] = effect
        counter.add(1, attributes)
    if span is None:
        return
    if outcome is not None:
        span.set_attribute("toolledger.disposition", outcome.disposition.value)
        if outcome.is_error:
            span.set_status(_trace.Status(_trace.StatusCode.ERROR, outcome.disposition.value))
    ended.append((span, time.time_ns()))  # the SDK's own clock for a span's times


def end_spans(ended: list[tuple[Any, int]]) -> None:
    """End the spans ``tool_done`` kept, each at the time its call was done."""
    for span, at in ended:
        _end(span, at)
    ended.clear()


def tool_failed(span: Any, exc: BaseException) -> None:
    if span is None:
        return
    _failed(span, exc)
    _end(span)


def _failed(span: Any, exc: BaseException) -> None:
    span.record_exception(exc)
    span.set_attribute("error.type", type(exc).__qualname__)
    span.set_status(_trace.Status(_trace.StatusCode.ERROR, type(exc).__qualname__))


def _end(span: Any, at: int | None = None) -> None:
    """End ``span`` (at ``at``, in ns since the epoch; ``None``: now). The SDK hands it to every
    span processor as it ends, and lets what one raises through: after the tool ran, that would
    fail the batch — its result never returned, the next call never run — for a fault of
    tracing alone."""
    with suppress(Exception):
        span.end(end_time=at)
