"""OpenTelemetry: spans for the agent's run, its model calls and its tool calls, named after the
GenAI semantic conventions, and the disposition counter — recorded by the SDK's in-memory
exporter and reader. Without the API (or without a provider) nothing is made at all."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import opentelemetry.metrics._internal as metrics_internal
import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

import toolledger as tl
from toolledger.engine import _telemetry as telemetry
from toolledger.testing.scripted import Flaky, Reply, ScriptedModel, ToolUse

EXPORTER = InMemorySpanExporter()
READER = InMemoryMetricReader()


@pytest.fixture(scope="module", autouse=True)
def providers() -> Iterator[None]:
    """Global providers for this module only: put back to unset afterwards, as OpenTelemetry's
    own test utilities do, so the rest of the suite runs with none — as a user without an SDK
    does."""
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(EXPORTER))
    metering = MeterProvider(metric_readers=[READER])
    trace.set_tracer_provider(tracing)
    metrics.set_meter_provider(metering)
    assert trace.get_tracer_provider() is tracing, "another test set a tracer provider first"
    yield
    tracing.shutdown()
    metering.shutdown()
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    metrics_internal._METER_PROVIDER_SET_ONCE = Once()
    metrics_internal._METER_PROVIDER = None
    metrics_internal._PROXY_METER_PROVIDER = metrics_internal._ProxyMeterProvider()
    telemetry._cache.update(provider=None, tracer=None, counter=None)
    assert telemetry._tracer() is None


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


def by_name(exporter: InMemorySpanExporter) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for s in exporter.get_finished_spans():
        out.setdefault(s.name, []).append(s)
    return out


def counted() -> dict[tuple[str, str], int]:
    """``toolledger.tool.calls`` by (tool, disposition), cumulative over the module."""
    data = READER.get_metrics_data()
    out: dict[tuple[str, str], int] = {}
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == "toolledger.tool.calls":
                    for p in m.data.data_points:
                        a = p.attributes
                        key = (str(a["gen_ai.tool.name"]), str(a["toolledger.disposition"]))
                        out[key] = out.get(key, 0) + int(p.value)
    return out


def test_an_agent_run_is_one_span_with_its_model_and_tool_calls_inside(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    inner: list[Any] = []

    @tl.tool(effect="non_idempotent")
    def create_ticket(title: str) -> str:
        # What the tool traces itself is a child of the tool call's span.
        with trace.get_tracer("app").start_as_current_span("POST /tickets") as s:
            inner.append(s)
        return "T-1"

    script = [
        Reply(text="On it.", tool_uses=[ToolUse("create_ticket", {"title": "Outage"})]),
        Reply(text="Opened T-1."),
    ]
    with ScriptedModel(script) as m, tl.open_store(f"sqlite:///{tmp_path / 'l.db'}") as store:
        agent = tl.Agent(client=m.client(), model="claude-test", tools=[create_ticket], store=store)
        run = agent.run(session="s-1", prompt="Outage!")
        (record,) = store.ledger("s-1").records()
    assert run.status is tl.RunStatus.COMPLETED
    found = by_name(spans)
    (root,) = found["invoke_agent toolledger"]
    chats = found["chat claude-test"]
    (tool,) = found["execute_tool create_ticket"]
    (post,) = found["POST /tickets"]
    assert len(chats) == 2
    assert root.attributes is not None and dict(root.attributes) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "toolledger",
        "gen_ai.conversation.id": "s-1",
        "gen_ai.request.model": "claude-test",
        "gen_ai.provider.name": "anthropic",
        "toolledger.session": "s-1",
        "toolledger.status": "completed",
        "toolledger.turns": 2,
        "gen_ai.usage.input_tokens": run.usage.input_tokens,
        "gen_ai.usage.output_tokens": run.usage.output_tokens,
    }
    for chat in chats:
        assert chat.parent is not None and chat.parent.span_id == root.context.span_id
        assert chat.attributes is not None
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.usage.output_tokens"] > 0
    assert sum(c.attributes["gen_ai.usage.input_tokens"] for c in chats) == (  # type: ignore[index,misc]
        run.usage.input_tokens
    )
    assert tool.parent is not None and tool.parent.span_id == root.context.span_id
    assert tool.attributes is not None and dict(tool.attributes) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "create_ticket",
        "gen_ai.tool.call.id": record.tool_use_id,
        "gen_ai.tool.type": "function",
        "toolledger.session": "s-1",
        "toolledger.effect": "non_idempotent",
        "toolledger.disposition": "executed",
    }
    assert post.parent is not None and post.parent.span_id == tool.context.span_id
    assert tool.status.status_code is trace.StatusCode.UNSET


def test_a_replay_and_a_call_in_doubt_are_told_apart(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    before = counted()

    @tl.tool
    def pay(amount: int) -> str:
        return "paid"

    @tl.tool
    def mail(to: str) -> str:
        raise tl.OutcomeUnknown("timed out after sending")

    content = [
        {"type": "tool_use", "id": "toolu_p", "name": "pay", "input": {"amount": 5}},
        {"type": "tool_use", "id": "toolu_m", "name": "mail", "input": {"to": "a@b"}},
    ]
    with tl.open_store(f"sqlite:///{tmp_path / 'l.db'}") as store:
        for _ in range(2):
            tl.run_tool_uses(content, [pay, mail], ledger=store.ledger("s"))
    pays = by_name(spans)["execute_tool pay"]
    mails = by_name(spans)["execute_tool mail"]
    dispositions = [s.attributes["toolledger.disposition"] for s in pays]  # type: ignore[index]
    assert dispositions == ["executed", "replayed"]
    assert [s.attributes["toolledger.disposition"] for s in mails] == ["in_doubt", "in_doubt"]  # type: ignore[index]
    assert all(s.status.status_code is trace.StatusCode.ERROR for s in mails)
    after = counted()
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert delta[("pay", "executed")] == 1 and delta[("pay", "replayed")] == 1
    assert delta[("mail", "in_doubt")] == 2


def test_a_failed_model_call_and_a_raising_batch_end_their_spans_in_error(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    with (
        ScriptedModel([Flaky(Reply(text="hi"), status=500)]) as m,
        tl.open_store(f"sqlite:///{tmp_path / 'l.db'}") as store,
    ):
        agent = tl.Agent(client=m.client(), model="claude-test", tools=[], store=store)
        with pytest.raises(tl.ModelCallError):
            agent.run(session="s", prompt="hello")
        ledger = store.ledger("s2")
        tl.run_tool_uses(
            [{"type": "tool_use", "id": "toolu_0", "name": "nope", "input": {}}], [], ledger=ledger
        )

        @tl.tool
        def pay(amount: int) -> str:
            return "paid"

        for amount in (1, 2):  # the same id, another input: refused, nothing runs
            content = [
                {"type": "tool_use", "id": "toolu_1", "name": "pay", "input": {"amount": amount}}
            ]
            if amount == 1:
                tl.run_tool_uses(content, [pay], ledger=ledger)
            else:
                with pytest.raises(tl.LedgerMismatchError):
                    tl.run_tool_uses(content, [pay], ledger=ledger)
    found = by_name(spans)
    (chat,) = found["chat claude-test"]
    assert chat.status.status_code is trace.StatusCode.ERROR
    (root,) = found["invoke_agent toolledger"]
    assert root.status.status_code is trace.StatusCode.ERROR
    (rejected,) = found["execute_tool nope"]
    _, mismatched = found["execute_tool pay"]
    assert rejected.attributes is not None
    assert rejected.attributes["toolledger.disposition"] == "rejected"
    assert "toolledger.effect" not in rejected.attributes  # an unknown tool has no class
    assert mismatched.status.status_code is trace.StatusCode.ERROR
    assert mismatched.attributes is not None
    assert mismatched.attributes["error.type"] == "LedgerMismatchError"


class Failing(SpanProcessor):
    """A span processor that raises as each span ends while ``armed`` (a broken pipeline)."""

    armed = False

    def on_end(self, span: ReadableSpan) -> None:
        if Failing.armed:
            raise RuntimeError("the span pipeline is broken")


def test_a_span_processor_that_raises_changes_nothing_of_the_run(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    """Tracing watches; it never decides. A processor that raises as a span ends — after the
    tool ran — neither fails the batch (its result lost to the caller, the next call never run,
    every retry failing the same way) nor the agent's run."""
    ran: list[int] = []

    @tl.tool
    def pay(amount: int) -> str:
        ran.append(amount)
        return f"paid {amount}"

    content = [
        {"type": "tool_use", "id": f"toolu_{i}", "name": "pay", "input": {"amount": i}}
        for i in (1, 2)
    ]
    script = [Reply(text="Paying.", tool_uses=[ToolUse("pay", {"amount": 3})]), Reply(text="Paid.")]
    trace.get_tracer_provider().add_span_processor(Failing())  # type: ignore[attr-defined]
    Failing.armed = True
    try:
        with (
            ScriptedModel(script) as m,
            tl.open_store(f"sqlite:///{tmp_path / 'l.db'}") as store,
        ):
            results = tl.run_tool_uses(content, [pay], ledger=store.ledger("s"))
            agent = tl.Agent(client=m.client(), model="claude-test", tools=[pay], store=store)
            run = agent.run(session="a", prompt="Pay 3.")
            statuses = [r.status for s in ("s", "a") for r in store.ledger(s).records()]
    finally:
        Failing.armed = False
    assert [r["content"] for r in results] == ["paid 1", "paid 2"]
    assert run.status is tl.RunStatus.COMPLETED and run.final_text == "Paid."
    assert ran == [1, 2, 3]
    assert statuses == [tl.Status.SUCCEEDED] * 3
    assert len(by_name(spans)["execute_tool pay"]) == 3  # the other processors still had them


class Exporting(SpanProcessor):
    """An exporter that sends each span as it ends (``SimpleSpanProcessor``): it reads, in a
    connection of its own, what the ledger holds of the call the span is about then."""

    url: str | None = None
    seen: ClassVar[list[tuple[str, str | None]]] = []
    added = False

    def on_end(self, span: ReadableSpan) -> None:
        if Exporting.url is None or not span.name.startswith("execute_tool"):
            return
        call = str((span.attributes or {}).get("gen_ai.tool.call.id"))
        with tl.open_store(Exporting.url) as other:
            record = other.ledger("s").get(call)
        Exporting.seen.append((call, None if record is None else record.status.value))


@pytest.mark.parametrize("calls", [1, 3], ids=["one call", "a batch"])
def test_a_call_s_span_is_exported_after_its_outcome_is_written(
    spans: InMemorySpanExporter, tmp_path: Path, calls: int
) -> None:
    """A span is exported as it ends, and an exporter may be slow or hang (a collector that
    went away, its timeout): ended before the call's outcome is written, it would hold that
    write back — a window in which a crash leaves a call that succeeded in doubt. The span ends
    once the outcome is in the ledger, with the time the call was done."""
    url = f"sqlite:///{tmp_path / 'l.db'}"

    @tl.tool
    def pay(amount: int) -> str:
        return f"paid {amount}"

    content = [
        {"type": "tool_use", "id": f"toolu_{i}", "name": "pay", "input": {"amount": i}}
        for i in range(calls)
    ]
    if not Exporting.added:  # once: the provider is the module's
        trace.get_tracer_provider().add_span_processor(Exporting())  # type: ignore[attr-defined]
        Exporting.added = True
    Exporting.url, Exporting.seen = url, []
    try:
        with tl.open_store(url) as store:
            tl.run_tool_uses(content, [pay], ledger=store.ledger("s"))
    finally:
        Exporting.url = None
    assert Exporting.seen == [(f"toolu_{i}", "succeeded") for i in range(calls)]
    ended = by_name(spans)["execute_tool pay"]
    assert len(ended) == calls
    for span in ended:
        assert span.end_time is not None and span.start_time is not None
        assert span.end_time >= span.start_time


RUN_A_CALL = textwrap.dedent(
    """
    import json, sys, tempfile
    import toolledger as tl
    from toolledger.engine import _telemetry as telemetry

    @tl.tool
    def pay(amount: int) -> str:
        return "paid"

    with tl.open_store(f"sqlite:///{tempfile.mkdtemp()}/l.db") as store:
        out = tl.run_tool_uses(
            [{"type": "tool_use", "id": "toolu_1", "name": "pay", "input": {"amount": 1}}],
            [pay], ledger=store.ledger("s"))
    print(json.dumps({
        "api": telemetry._trace is not None,
        "tracer": telemetry._tracer() is not None,
        "counter": telemetry._cache["counter"] is not None,
        "loaded": sorted(m for m, v in sys.modules.items() if v and m.startswith("opentelemetry")),
        "content": out[0]["content"],
    }))
    """
)


@pytest.mark.parametrize("installed", [False, True])
def test_without_the_api_or_a_provider_nothing_is_made(installed: bool) -> None:
    """A user without the ``otel`` extra (its import blocked here) gets no spans and loads none
    of it; one with the API and no SDK provider gets no tracer, so no span is even started, and
    no counter, so no call is counted into the API's no-op one."""
    block = "" if installed else "import sys; sys.modules['opentelemetry'] = None\n"
    proc = subprocess.run(
        [sys.executable, "-c", block + RUN_A_CALL],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    seen = json.loads(proc.stdout)
    assert seen["content"] == "paid"
    assert seen["tracer"] is False
    assert seen["counter"] is False
    assert seen["api"] is installed
    if not installed:
        assert seen["loaded"] == []
