"""Two attempts at one call alive at once, inside one process: threads, asyncio tasks, an
operator resolving a call that runs, a tool past its deadline. Effects are counted in the world
(``Counter`` of real executions), never in the ledger.

The same situations across processes and hosts are in ``tests/agent/test_takeover.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

import toolledger as tl
from toolledger import _liveness as tl_liveness
from toolledger import _switches as switches
from toolledger._liveness import Running
from toolledger.codec import input_hash
from toolledger.errors import ClockMovedError, StoreUnavailableError
from toolledger.ops import HoldLease, InsertEffect, TakeLease, UpdateEffect
from toolledger.records import Holder, Status
from toolledger.testing import Counter
from toolledger.testing.conformance import make_record

from .conftest import Runner, tool_use
from .helpers import SpyBackend

THREADS = 8
CALLS = 30


def checked_ticket(
    counter: Counter, tickets: dict[str, int], lock: threading.Lock
) -> tl.Tool[Any, Any]:
    """A non-idempotent tool with a correct check: the ticket system is ``tickets`` (key → n)."""

    @tl.tool(effect="non_idempotent")
    def create_ticket(title: str, ctx: tl.ToolContext) -> str:
        counter.hit("create_ticket")
        time.sleep(0.002)  # the effect takes a moment, as a real API call does
        with lock:
            tickets[ctx.idempotency_key] = tickets.get(ctx.idempotency_key, 0) + 1
        return f"ticket for {title}"

    @create_ticket.check
    def _(title: str, ctx: tl.ToolContext) -> str | None:
        with lock:
            return f"ticket for {title}" if ctx.idempotency_key in tickets else None

    return create_ticket


def _threads(n: int, target: Callable[[int], None]) -> None:
    barrier = threading.Barrier(n)

    def run(i: int) -> None:
        barrier.wait()
        target(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive()


@pytest.mark.parametrize("wait", [0.0, 10.0])
def test_threads_on_one_checked_call_run_it_once(store: tl.Store, wait: float) -> None:
    """Eight threads hand the same calls to ``run_tool_uses`` at once: each call executes once;
    the others get its stored result (with ``wait``) or ``EffectInProgressError`` — never "in
    doubt" about a call that is running."""
    counter, tickets, lock = Counter(), {}, threading.Lock()
    tool = checked_ticket(counter, tickets, lock)
    answers: list[str] = []
    answers_lock = threading.Lock()

    def worker(i: int) -> None:
        for n in range(CALLS):
            block = tool_use(f"toolu_{n}", "create_ticket", title=f"t{n}")
            try:
                (result,) = tl.run_tool_uses([block], [tool], ledger=store.ledger("s"), wait=wait)
                got = "error: " + result["content"] if result.get("is_error") else result["content"]
            except tl.EffectInProgressError:
                got = "in progress"
            with answers_lock:
                answers.append(got)

    _threads(THREADS, worker)
    assert counter["create_ticket"] == CALLS, "each call executed exactly once"
    assert sorted(tickets.values()) == [1] * CALLS
    errors = [a for a in answers if a.startswith("error")]
    assert errors == [], errors[:3]
    if wait:
        assert "in progress" not in answers, "waited for the running attempt's result"
    for record in store.ledger("s").records():
        assert record.status is Status.SUCCEEDED and record.attempt == 1


def test_asyncio_tasks_on_one_call_run_it_once(store: tl.Store) -> None:
    calls = Counter()

    @tl.tool
    async def charge(amount: int) -> str:
        calls.hit("charge")
        await asyncio.sleep(0.01)
        return f"charged {amount}"

    async def main() -> list[Any]:
        ledger = store.ledger("s")

        async def one(n: int) -> Any:
            block = tool_use(f"toolu_{n % 10}", "charge", amount=n % 10)
            try:
                return await tl.arun_tool_uses([block], [charge], ledger=ledger, wait=5)
            except tl.EffectInProgressError as exc:
                return exc

        return await asyncio.gather(*(one(n) for n in range(100)))

    answers = asyncio.run(main())
    assert calls["charge"] == 10
    assert all(isinstance(a, list) and not a[0].get("is_error") for a in answers), answers[:3]


def _blocking(
    counter: Counter, entered: threading.Event, release: threading.Event
) -> tl.Tool[Any, Any]:
    @tl.tool
    def send(to: str) -> dict[str, str]:
        counter.hit("send")
        entered.set()
        assert release.wait(30)
        return {"sent_to": to}

    return send


@pytest.mark.parametrize("happened", [False, True])
def test_a_running_call_cannot_be_resolved_unless_forced(store: tl.Store, happened: bool) -> None:
    """An operator resolving a call that a worker is still running is refused; forced, the
    person's word stands until the worker's real outcome arrives: then the record holds the
    truth beside the person's word, and the alert is raised."""
    counter, entered, release = Counter(), threading.Event(), threading.Event()
    send = _blocking(counter, entered, release)
    alerts: list[tl.LedgerWriteError] = []
    results: list[Any] = []
    block = tool_use("t", "send", to="a@b")
    worker = threading.Thread(
        target=lambda: results.append(
            tl.run_tool_uses([block], [send], ledger=store.ledger("s"), on_alert=alerts.append)
        )
    )
    worker.start()
    assert entered.wait(30)
    ledger = store.ledger("s")
    assert ledger.in_doubt() == [], "running, not in doubt"
    with pytest.raises(tl.EffectInProgressError, match="this process is running it"):
        ledger.resolve("t", happened=happened, by="ana")
    forced = ledger.resolve("t", happened=happened, by="ana", force=True)
    assert "forced while attempt 1 may still run" in (forced.error or "")
    release.set()
    worker.join(30)
    ((result,),) = results
    assert result["content"] == '{"sent_to": "a@b"}', "the model got the real result"
    record = ledger.get("t")
    assert record is not None
    if happened:
        # The person's word ("it happened") and the attempt agree: nothing happened twice, no
        # alert; the record keeps the word that may already have been told to a model.
        assert alerts == []
        assert record.status is Status.SUCCEEDED and "resolved by ana" in (record.error or "")
    else:
        # "It did not happen" was wrong and nothing ran since: the record now says what did,
        # and whoever settled it is told.
        (alert,) = alerts
        assert isinstance(alert, tl.LateOutcomeError) and alert.attempt == 1
        assert record.status is Status.SUCCEEDED and json.loads(record.result or "") == {
            "sent_to": "a@b"
        }
    assert counter["send"] == 1
    again = tl.run_tool_uses([block], [send], ledger=ledger)
    assert counter["send"] == 1 and not again[0].get("is_error")


class _Unreadable(SpyBackend):
    """A store whose records cannot be read once ``down`` (a partition, for reads)."""

    down = False

    def read_effects(self, session_id: str, tool_use_ids: Any = None) -> Any:
        if self.down:
            raise StoreUnavailableError("injected: the network went away", url=self.url)
        return super().read_effects(session_id, tool_use_ids)


def _forced_then_run_again(store: tl.Store, tool_use_id: str) -> None:
    """While its attempt runs, a person forces ``tool_use_id`` "not happened", then a second
    attempt, elsewhere, replaces it."""
    ledger = store.ledger("s")
    ledger.resolve(tool_use_id, happened=False, by="ana", force=True)
    record = ledger.get(tool_use_id)
    assert record is not None and record.status is Status.NOT_HAPPENED
    second = replace(record, status=Status.STARTED, attempt=2, updated_at=record.updated_at + 1)
    assert store.backend.apply("s", [tl_update(second, record)]) == [True]


@pytest.mark.parametrize("store_kind", ["sqlite", "memory"], indirect=True)
def test_a_late_outcome_whose_record_cannot_be_read_is_alerted(store: tl.Store) -> None:
    """The call's record moved on while it ran (a person forced it "not happened", then a
    second attempt replaced it), and when its real outcome arrives the store cannot even be
    read to find out what the record says now. The effect happened: the model gets the real
    result and a person is alerted — the run does not die with the read's error, the outcome
    told to nobody (the simulation's seed 220865)."""
    counter, entered, release = Counter(), threading.Event(), threading.Event()
    send = _blocking(counter, entered, release)
    alerts: list[tl.LedgerWriteError] = []
    results: list[Any] = []
    errors: list[BaseException] = []

    cut = _Unreadable(store.backend)  # type: ignore[arg-type]
    worker_store = tl.Store(cut, clock=store.clock, worker_id=store.worker_id)
    block = tool_use("t", "send", to="a@b")

    def run() -> None:
        try:
            results.append(
                tl.run_tool_uses(
                    [block], [send], ledger=worker_store.ledger("s"), on_alert=alerts.append
                )
            )
        except BaseException as exc:  # pragma: no cover - what the fix prevents
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    assert entered.wait(30)
    _forced_then_run_again(store, "t")
    cut.down = True
    release.set()
    worker.join(30)
    assert errors == []
    ((result,),) = results
    assert result["content"] == '{"sent_to": "a@b"}', "the model got the real result"
    (alert,) = alerts
    assert alert.tool_use_id == "t" and "could not be read" in alert.message
    assert counter["send"] == 1


def test_a_checkpoint_held_back_for_an_unreadable_late_outcome_says_it_is_not_retried(
    tmp_path: Any,
) -> None:
    """The first of a turn's two calls is settled by a person and run again elsewhere while it
    runs; when its outcome arrives the store cannot be read. Checkpoint B is held back — and
    the error says that outcome is not retried and a person must look, not that this process
    keeps trying to write it (nothing keeps it)."""
    from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

    counter, entered, release = Counter(), threading.Event(), threading.Event()
    send = _blocking(counter, entered, release)

    alerts: list[tl.LedgerWriteError] = []
    errors: list[BaseException] = []
    uses = [ToolUse("send", {"to": "a@b"}, id="t1"), ToolUse("send", {"to": "c@d"}, id="t2")]
    with (
        tl.open_store(f"sqlite:///{tmp_path}/s.db") as store,
        ScriptedModel([Reply(tool_uses=uses), Reply(text="done")]) as model,
    ):
        cut = _Unreadable(store.backend)  # type: ignore[arg-type]
        worker_store = tl.Store(cut, clock=store.clock, worker_id=store.worker_id)
        agent = tl.Agent(
            client=model.client(),
            model="m",
            tools=[send],
            store=worker_store,
            on_alert=alerts.append,
        )

        def run() -> None:
            try:
                agent.run(session="s", prompt="send both")
            except BaseException as exc:
                errors.append(exc)

        worker = threading.Thread(target=run)
        worker.start()
        assert entered.wait(30)
        _forced_then_run_again(store, "t1")
        cut.down = True
        release.set()
        worker.join(30)
        assert not worker.is_alive()
        ((error,),) = [errors]
        assert isinstance(error, StoreUnavailableError), error
        assert "t1" in error.message and "is not retried" in error.message
        assert "keeps trying" not in error.message
        assert [a.tool_use_id for a in alerts] == ["t1"]
        assert counter["send"] == 2, "each call ran once"
        assert len(model.requests) == 1, "the model was not told a result the ledger lacks"


@pytest.mark.parametrize("store_kind", ["sqlite", "memory"], indirect=True)
def test_a_kept_outcome_refused_because_a_person_settled_the_call_is_kept_in_its_record(
    store: tl.Store, caplog: pytest.LogCaptureFixture
) -> None:
    """The call's outcome could not be written (the store failed): this process keeps it and
    retries in the background. Meanwhile a person forces the call "not happened". When the store
    takes writes again, the kept outcome is refused — its record moved on — and it is kept in
    the record as the run keeps a late outcome: the record says it happened (with the person's
    word beside it), so no resume runs it again, and a person is alerted."""
    counter = Counter()

    @tl.tool(effect="non_idempotent")
    def send(to: str) -> str:
        counter.hit("send")
        return f"sent to {to}"

    spy = SpyBackend(store.backend, fail_when=lambda ops: down and _writes_success(ops))  # type: ignore[arg-type]
    worker_store = tl.Store(spy, clock=store.clock, worker_id=store.worker_id)
    down = True
    alerts: list[tl.LedgerWriteError] = []
    block = tool_use("t", "send", to="a@b")
    with caplog.at_level(logging.ERROR, logger="toolledger"):
        (result,) = tl.run_tool_uses(
            [block], [send], ledger=worker_store.ledger("s"), on_alert=alerts.append
        )
        assert result["content"] == "sent to a@b", "the model got the real result"
        assert [a.tool_use_id for a in alerts] == ["t"]
        ledger = store.ledger("s")
        ledger.resolve("t", happened=False, by="ana", force=True)
        down = False
        deadline = time.monotonic() + 30  # the writer's first retry is a second after
        while (record := ledger.get("t")) is not None and record.status is Status.NOT_HAPPENED:
            assert time.monotonic() < deadline, "the kept outcome never reached its record"
            time.sleep(0.05)
    assert record is not None and record.status is Status.SUCCEEDED
    assert record.result == '"sent to a@b"'
    assert record.error is not None and "did not happen" in record.error
    assert "then reported succeeded" in record.error
    assert counter["send"] == 1
    again = tl.run_tool_uses([block], [send], ledger=store.ledger("s"))
    assert again[0]["content"] == "sent to a@b" and counter["send"] == 1, "not run again"
    assert any("a person resolved it as not happened" in r.getMessage() for r in caplog.records)


def _writes_success(ops: Any) -> bool:
    return any(isinstance(op, UpdateEffect) and op.record.status is Status.SUCCEEDED for op in ops)


def test_an_async_tool_is_cancelled_at_its_deadline_and_left_in_doubt(store: tl.Store) -> None:
    started = Counter()

    # Long enough for the tool to be reached after its intent on a loaded host (past it, it
    # is not started at all); far short of the 30 s it would sleep if not cancelled.
    @tl.tool(timeout=2.0)
    async def slow_charge(amount: int) -> str:
        started.hit("slow_charge")
        await asyncio.sleep(30)
        return "charged"

    block = tool_use("t", "slow_charge", amount=5)
    t0 = time.monotonic()
    (result,) = asyncio.run(tl.arun_tool_uses([block], [slow_charge], ledger=store.ledger("s")))
    assert time.monotonic() - t0 < 15, "cancelled at its deadline, not when its sleep ended"
    assert result["is_error"] and "cancelled at its deadline" in result["content"]
    record = store.ledger("s").get("t")
    assert record is not None and record.released, "given up: in doubt for everyone at once"
    assert [r.tool_use_id for r in store.ledger("s").in_doubt()] == ["t"]
    (again,) = tl.run_tool_uses([block], [slow_charge], ledger=store.ledger("s"))
    assert "may already have happened" in again["content"] and started["slow_charge"] == 1


def test_a_sync_tool_past_its_deadline_still_records_its_outcome(
    store: tl.Store, caplog: pytest.LogCaptureFixture
) -> None:
    """A plain function cannot be stopped: if it returns after its deadline and nobody settled
    the call meanwhile, its outcome is recorded (nothing can have happened twice)."""

    # Long enough for its intent to commit first on a loaded host (a tool whose time ran out
    # before it was called is not called); it returns well after the deadline it was given.
    @tl.tool(timeout=2.0)
    def slow_send(to: str, ctx: tl.ToolContext) -> str:
        time.sleep((ctx.remaining() or 0.0) + 0.5)
        return "sent"

    with caplog.at_level(logging.WARNING, logger="toolledger"):
        (result,) = tl.run_tool_uses(
            [tool_use("t", "slow_send", to="a")], [slow_send], ledger=store.ledger("s")
        )
    assert result["content"] == "sent"
    record = store.ledger("s").get("t")
    assert record is not None and record.status is Status.SUCCEEDED
    assert "returned" in caplog.text and "after its deadline" in caplog.text, "never silently"


def test_a_tool_whose_time_ran_out_before_it_was_called_is_not_called(
    store: tl.Store, run: Runner, tmp_path: Any
) -> None:
    """The worker pauses between its intent and its tool (a GC, ``SIGSTOP``, a frozen VM; or
    its intent's commit is that slow) until past the attempt's deadline. Meanwhile another host
    judges the attempt over, its check finds nothing, and it runs the call. The paused worker,
    once it goes on, knows its time is up before it touches the world: it never calls the tool.
    Effects are counted as tickets written."""
    tickets = tmp_path / "tickets"
    tickets.mkdir()

    # Long enough for the other host's attempt to reach the tool after its intent on a loaded
    # host (past it, that attempt is not started either).
    @tl.tool(effect="non_idempotent", timeout=2.0)
    def create_ticket(title: str) -> str:
        (tickets / str(time.monotonic_ns())).write_text(title)
        return "made"

    @create_ticket.check
    def _(title: str) -> str | None:
        return "made" if any(tickets.iterdir()) else None

    from toolledger import _crash
    from toolledger.testing import elsewhere

    first: list[int] = []
    paused, resumed = threading.Event(), threading.Event()

    def pause(point: str) -> None:
        if point == "after_intent" and threading.get_ident() in first:
            paused.set()
            resumed.wait(60)

    block = tool_use("t", "create_ticket", title="x")
    answers: list[Any] = []

    def worker() -> None:
        first.append(threading.get_ident())
        answers.append(run([block], [create_ticket], ledger=store.ledger("s")))

    _crash.watchers.append(pause)
    try:
        paused_worker = threading.Thread(target=worker)
        paused_worker.start()
        assert paused.wait(30)
        first_attempt = store.ledger("s").get("t")
        assert first_attempt is not None and first_attempt.deadline is not None
        far = elsewhere(store, "host-b")
        (other,) = tl.run_tool_uses([block], [create_ticket], ledger=far.ledger("s"), wait=12.0)
        # The paused worker goes on once the other host has run the call, past its deadline.
        time.sleep(max(0.0, first_attempt.deadline - store.now()) + 0.1)
        resumed.set()
        paused_worker.join(30)
    finally:
        resumed.set()
        _crash.watchers.remove(pause)
    assert other["content"] == "made"
    assert len(list(tickets.iterdir())) == 1, "the paused worker called its tool past its deadline"
    ((late,),) = answers
    assert late["is_error"] and "not started" in late["content"]
    record = store.ledger("s").get("t")
    assert record is not None and record.status is Status.SUCCEEDED and record.attempt == 2


def test_a_tool_whose_time_ran_out_before_it_was_called_fails_having_done_nothing(
    store: tl.Store, run: Runner
) -> None:
    """Alone, such an attempt is a failure that did nothing (answered for ever, as any
    failure is): never a call in doubt, never a call run past its deadline."""
    counter = Counter()

    @tl.tool(effect="non_idempotent", timeout=0.2)
    def send(to: str) -> str:
        counter.hit("send")
        return "sent"

    from toolledger import _crash

    def pause(point: str) -> None:
        if point == "after_intent":
            time.sleep(0.4)

    block = tool_use("t", "send", to="a")
    _crash.watchers.append(pause)
    try:
        (result,) = run([block], [send], ledger=store.ledger("s"))
    finally:
        _crash.watchers.remove(pause)
    assert result["is_error"] and "not started" in result["content"]
    assert counter["send"] == 0
    record = store.ledger("s").get("t")
    assert record is not None and record.status is Status.FAILED
    (again,) = run([block], [send], ledger=store.ledger("s"))
    assert again["content"] == result["content"] and counter["send"] == 0


def test_a_call_in_flight_elsewhere_in_this_process_is_waited_for(store: tl.Store) -> None:
    counter, entered, release = Counter(), threading.Event(), threading.Event()
    send = _blocking(counter, entered, release)
    block = tool_use("t", "send", to="x")
    first = threading.Thread(
        target=tl.run_tool_uses, args=([block], [send]), kwargs={"ledger": store.ledger("s")}
    )
    first.start()
    assert entered.wait(30)
    threading.Timer(0.2, release.set).start()
    (result,) = tl.run_tool_uses([block], [send], ledger=store.ledger("s"), wait=10)
    first.join(30)
    assert result["content"] == '{"sent_to": "x"}' and counter["send"] == 1


@pytest.mark.parametrize("spelling", ["sqlite", "postgresql"])
def test_a_call_running_through_one_spelling_of_a_store_is_running_through_another(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, spelling: str
) -> None:
    """One process opens one database twice, by two spellings of its URL (an absolute and a
    relative path; a PostgreSQL URL with and without an option). While a call runs through the
    first, the second sees it running: not listed in doubt, not resolved without ``force``, not
    run again — and the tool runs once."""
    if spelling == "sqlite":
        monkeypatch.chdir(tmp_path)
        first, second = f"sqlite:///{tmp_path / 'one.db'}", "sqlite:///one.db"
    else:
        from .conftest import with_params

        url = with_params(
            request.getfixturevalue("postgres_url"),
            schema=request.getfixturevalue("postgres_schema"),
        )
        first, second = url, f"{url}&op_timeout=9"
    counter, entered, release = Counter(), threading.Event(), threading.Event()
    send = _blocking(counter, entered, release)
    block = tool_use("t", "send", to="x")
    with tl.open_store(first) as worker, tl.open_store(second) as other:
        running = threading.Thread(
            target=tl.run_tool_uses, args=([block], [send]), kwargs={"ledger": worker.ledger("s")}
        )
        running.start()
        try:
            assert entered.wait(30)
            assert other.ledger("s").in_doubt() == [] and other.in_doubt() == []
            with pytest.raises(tl.EffectInProgressError):
                other.ledger("s").resolve("t", happened=False, by="ana")
            with pytest.raises(tl.EffectInProgressError):
                tl.run_tool_uses([block], [send], ledger=other.ledger("s"))
        finally:
            release.set()
            running.join(30)
        (again,) = tl.run_tool_uses([block], [send], ledger=other.ledger("s"))
    assert again["content"] == '{"sent_to": "x"}'
    assert counter["send"] == 1, "the tool ran once"


@pytest.mark.parametrize("then", ["store back", "store still gone"])
def test_a_later_call_whose_read_fails_never_drops_an_earlier_calls_outcome(
    tmp_path: Any, then: str
) -> None:
    """A message of two calls: the first runs; deciding the second needs the session's lease
    (its record is ``started`` under a lease), and that read fails — the store went away. The
    error goes up, but not before the first call's outcome is written (or, when the store is
    still gone, alerted): never left ``started`` for a person, as if its process had died."""
    counter = Counter()
    alerts: list[tl.LedgerWriteError] = []

    @tl.tool(effect="non_idempotent")
    def send_email(to: str) -> str:
        counter.hit(to)
        return f"sent to {to}"

    class Flaky(SpyBackend):
        down = False

        def read_lease(self, session_id: str) -> Any:
            self.down = True  # from now on, with "store still gone", commits fail too
            raise StoreUnavailableError("injected: the network went away", url=self.url)

    with tl.open_store(f"sqlite:///{tmp_path / 'l.db'}") as real:
        running = replace(
            make_record("s", "toolu_2", status=Status.STARTED), tool="send_email", lease_token=1
        )
        running = replace(running, input_hash=input_hash({"to": "b@c"}))
        real.backend.apply("s", [InsertEffect(running)])
        gone = then == "store still gone"
        flaky = Flaky(real.backend, fail_when=lambda ops: gone and flaky.down)  # type: ignore[arg-type]
        store = tl.Store(flaky, clock=real.clock, worker_id=real.worker_id)
        calls = [
            tool_use("toolu_1", "send_email", to="a@b"),
            tool_use("toolu_2", "send_email", to="b@c"),
        ]
        with pytest.raises(StoreUnavailableError):
            tl.run_tool_uses(calls, [send_email], ledger=store.ledger("s"), on_alert=alerts.append)
        assert counter["a@b"] == 1 and counter["b@c"] == 0
        record = real.ledger("s").get("toolu_1")
        assert record is not None
        if gone:
            assert [a.tool_use_id for a in alerts] == ["toolu_1"]  # a person is told
        else:
            assert record.status is Status.SUCCEEDED and alerts == []


@pytest.mark.parametrize("store_kind", ["sqlite", "memory"], indirect=True)
def test_a_later_call_that_raises_never_drops_an_earlier_calls_outcome(
    ledger: tl.Ledger,
) -> None:
    """A message of two calls: the first runs; the second is being run by another thread at
    that moment, so deciding it raises ``EffectInProgressError``. The first call's outcome is
    written before the error goes up — not left ``started`` for a person to settle — and the
    next run answers it from the ledger without running it again."""
    counter = Counter()
    inside, release = threading.Event(), threading.Event()

    @tl.tool(effect="non_idempotent")
    def send_email(to: str) -> str:
        counter.hit(f"send_email {to}")
        if to == "slow@b":
            inside.set()
            assert release.wait(30)
        return f"sent to {to}"

    first, second = (
        tool_use("toolu_1", "send_email", to="a@b"),
        tool_use("toolu_2", "send_email", to="slow@b"),
    )
    other = threading.Thread(
        target=tl.run_tool_uses, args=([second], [send_email]), kwargs={"ledger": ledger}
    )
    other.start()
    try:
        assert inside.wait(30)
        with pytest.raises(tl.EffectInProgressError):
            tl.run_tool_uses([first, second], [send_email], ledger=ledger)
        record = ledger.get("toolu_1")
        assert record is not None and record.status is Status.SUCCEEDED
        assert json.loads(record.result or "null") == "sent to a@b"
    finally:
        release.set()
        other.join(30)
    results = tl.run_tool_uses([first, second], [send_email], ledger=ledger)
    assert [r["content"] for r in results] == ["sent to a@b", "sent to slow@b"]
    assert counter["send_email a@b"] == 1 and counter["send_email slow@b"] == 1


def tl_update(new: Any, old: Any) -> UpdateEffect:
    """Move ``old`` on to ``new`` as another worker would (compare-and-set)."""
    return UpdateEffect(
        new, expect_status=old.status, expect_attempt=old.attempt, expect_at=old.updated_at
    )


def _stepped(store: tl.Store, step: float, read_ago: float = 0.0) -> None:
    """``store``'s reading of the PostgreSQL server's clock, taken ``read_ago`` seconds ago and
    off by ``step`` (the server's clock stepped by ``-step`` since): as it is carried forward
    until the next reading. Its pool's connections are open first, so none opens later and
    reads the clock afresh."""
    store.backend._pool.wait()  # type: ignore[attr-defined]
    clock = store.backend.server_clock  # type: ignore[attr-defined]
    epoch, at = clock._base
    clock._base = (epoch + step - read_ago, at - read_ago)


def _held_ticket_tool(tickets: Any) -> tuple[tl.Tool[Any, Any], threading.Event, threading.Event]:
    """A ticket tool (60 s timeout, with a check) whose first call waits in the tool until
    ``go`` is set, once ``entered`` is; each call writes one ticket into ``tickets``."""
    tickets.mkdir()
    entered, go = threading.Event(), threading.Event()

    @tl.tool(effect="non_idempotent", timeout=60)
    def create_ticket(title: str) -> str:
        if not entered.is_set():
            entered.set()
            assert go.wait(30)
        (tickets / str(time.monotonic_ns())).write_text(title)
        return "made"

    @create_ticket.check
    def _(title: str) -> str | None:
        return "made" if any(tickets.iterdir()) else None

    return create_ticket, entered, go


@pytest.mark.parametrize(
    ("straight", "is_async"),
    [(True, False), (False, False), (True, True)],
    ids=["straight", "general", "asyncio"],
)
def test_a_server_clock_step_never_ends_a_running_attempt_early(
    tmp_path: Any,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    straight: bool,
    is_async: bool,
) -> None:
    """The PostgreSQL server's clock steps forward 120 s (NTP after a boot, a VM restored)
    after the worker's last reading of it. The worker, alive and well within its tool's
    timeout (60 s), writes its intent's deadline on its reading; a worker of another host,
    reading the server's clock afresh, must not judge the attempt over and run the call again.
    Effects are counted as tickets written. (The server refuses the intent set on the stale
    reading; the worker reads the clock again and sends it anew: on either path.)"""
    monkeypatch.setattr(switches, "STRAIGHT", straight)
    tickets = tmp_path / "tickets"
    create_ticket, entered, go = _held_ticket_tool(tickets)

    from toolledger.testing import elsewhere

    url = request.getfixturevalue("postgres_store_url")
    block = tool_use("t", "create_ticket", title="x")
    with tl.open_store(url) as worker, tl.open_store(url) as fresh:
        _stepped(worker, -120)  # its reading predates the step
        ledger = worker.ledger("s")
        running = threading.Thread(
            target=(
                (lambda: asyncio.run(tl.arun_tool_uses([block], [create_ticket], ledger=ledger)))
                if is_async
                else (lambda: tl.run_tool_uses([block], [create_ticket], ledger=ledger))
            )
        )
        running.start()
        try:
            assert entered.wait(30)
            stored = fresh.backend.read_effects("s")["t"]
            assert stored.deadline is not None
            assert stored.deadline > fresh.backend.fresh_now() + 50  # on the server's clock
            with contextlib.suppress(tl.EffectInProgressError):
                tl.run_tool_uses([block], [create_ticket], ledger=elsewhere(fresh).ledger("s"))
        finally:
            go.set()
            running.join(30)
    assert len(list(tickets.iterdir())) == 1, "a live attempt was judged over and run again"


def test_a_server_clock_stepped_back_never_ends_a_running_attempt_early(
    tmp_path: Any, request: pytest.FixtureRequest
) -> None:
    """The server's clock steps back 120 s after a worker of another host last read it: that
    worker's reading runs ahead of the server. Judging a live attempt (deadline 60 s away on
    the server's clock) on it, it would call the attempt over and run the call again; it reads
    the clock afresh before it acts on such a judgement, and neither runs it nor lists it in
    doubt."""
    tickets = tmp_path / "tickets"
    create_ticket, entered, go = _held_ticket_tool(tickets)

    from toolledger.testing import elsewhere

    url = request.getfixturevalue("postgres_store_url")
    block = tool_use("t", "create_ticket", title="x")
    with tl.open_store(url) as worker, tl.open_store(url) as ahead:
        _stepped(ahead, 120, read_ago=5)  # read before the step back
        running = threading.Thread(
            target=tl.run_tool_uses,
            args=([block], [create_ticket]),
            kwargs={"ledger": worker.ledger("s")},
        )
        running.start()
        try:
            assert entered.wait(30)
            other = elsewhere(ahead)
            assert other.in_doubt() == []
            with pytest.raises(tl.EffectInProgressError):
                tl.run_tool_uses([block], [create_ticket], ledger=other.ledger("s"))
        finally:
            go.set()
            running.join(30)
    assert len(list(tickets.iterdir())) == 1, "a live attempt was judged over and run again"


def test_a_write_set_on_a_stale_reading_of_the_server_clock_is_refused_whole(
    request: pytest.FixtureRequest,
) -> None:
    """The server checks an intent's deadline against its own clock as it is written: a batch
    whose intent was set on a reading 120 s off lands nothing (the other write of its batch
    neither), raises ``ClockMovedError`` saying so, and has the clock read again; alone (one
    statement, autocommit) or in a batch, inserted or moved on. Written on a good reading, it
    lands."""
    url = request.getfixturevalue("postgres_store_url")
    with tl.open_store(url) as store:
        backend = store.backend
        backend._pool.wait()  # type: ignore[attr-defined]  # no connection opens later
        now = store.now()
        plain = make_record("s", "a", status=Status.SUCCEEDED, at=now)
        stale = make_record("s", "b", at=now, deadline=now - 120 + 60)
        for batch in (
            [InsertEffect(stale, at=(now - 120, time.monotonic()))],
            [InsertEffect(plain), InsertEffect(stale, at=(now - 120, time.monotonic()))],
        ):
            with pytest.raises(ClockMovedError, match="Nothing was written") as caught:
                store.apply("s", batch)
            assert "clock" in str(caught.value)
            assert backend.read_effects("s") == {}
            assert backend.server_clock.estimate() is None  # type: ignore[attr-defined]
            store.now()
        now = store.now()
        intent = make_record("s", "b", at=now, deadline=now + 60)
        assert store.apply("s", [InsertEffect(intent, at=(now, time.monotonic()))]) == [True]
        moved = replace(intent, attempt=2, updated_at=now + 1, deadline=now - 60)
        update = UpdateEffect(
            moved, Status.STARTED, 1, expect_at=now, at=(now - 120, time.monotonic())
        )
        with pytest.raises(ClockMovedError):
            store.apply("s", [update])
        assert backend.read_effects("s")["b"] == intent
        store.now()
        update = replace(update, at=(store.now() - 0.5, time.monotonic()))
        assert store.apply("s", [update]) == [True]


def test_a_lease_set_on_a_stale_reading_of_the_server_clock_is_written_on_the_server_clock(
    request: pytest.FixtureRequest,
) -> None:
    """A worker whose reading of the server's clock predates a 120 s step forward takes a
    session's lease (30 s) and renews it: both expiries land as the server's clock sets them,
    not 90 s in the past, so a worker of another host does not find the live worker's session
    free. A worker whose reading predates a step back judges that lease held, not expired."""
    from toolledger.records import Lease
    from toolledger.testing import elsewhere

    url = request.getfixturevalue("postgres_store_url")
    with tl.open_store(url) as worker, tl.open_store(url) as fresh, tl.open_store(url) as ahead:
        _stepped(worker, -120, read_ago=5)  # read before the step forward
        _stepped(ahead, 120, read_ago=5)  # read before the step back
        stale_now = worker.now()
        lease = Lease(
            session_id="s", owner="w", token=1, expires_at=stale_now + 30, holder=None, ttl=30
        )
        assert worker.apply("s", [TakeLease(lease, expect_token=0)]) == [True]
        taken = fresh.lease("s")
        assert taken is not None and taken.expires_at > fresh.backend.fresh_now() + 25
        assert isinstance(elsewhere(fresh).lease_state(taken), Running)
        assert isinstance(elsewhere(ahead).lease_state(taken), Running)
        assert worker.apply("s", [HoldLease("s", 1, worker.now() + 30)]) == [True]
        renewed = fresh.lease("s")
        assert renewed is not None and renewed.renewals == 1
        assert renewed.expires_at > fresh.backend.fresh_now() + 25
        # A reading that agrees with the server's clock writes the expiry it sent, exactly.
        sent = fresh.now() + 30
        assert fresh.apply("s", [HoldLease("s", 1, sent)]) == [True]
        again = fresh.lease("s")
        assert again is not None and again.expires_at == sent


def test_an_agent_turn_on_a_stale_reading_of_the_server_clock_keeps_its_call_in_progress(
    tmp_path: Any, request: pytest.FixtureRequest
) -> None:
    """An agent's turn whose worker last read the server's clock before a 120 s step forward:
    the intent rides checkpoint A and the lease's renewal in one commit, which the server
    refuses for its deadline and the worker sends anew. While the tool runs, a worker of another
    host finds the call in progress (not in doubt) and the session's lease held; the ticket is
    made once."""
    from toolledger.testing import elsewhere
    from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

    tickets = tmp_path / "tickets"
    tickets.mkdir()
    entered, go = threading.Event(), threading.Event()

    @tl.tool(effect="non_idempotent", timeout=60)
    def create_ticket(title: str) -> str:
        entered.set()
        assert go.wait(30)
        (tickets / str(time.monotonic_ns())).write_text(title)
        return "made"

    url = request.getfixturevalue("postgres_store_url")
    errors: list[BaseException] = []
    uses = [ToolUse("create_ticket", {"title": "x"}, id="t1")]
    with (
        tl.open_store(url) as worker,
        tl.open_store(url) as fresh,
        ScriptedModel([Reply(tool_uses=uses), Reply(text="done")]) as model,
    ):
        agent = tl.Agent(client=model.client(), model="m", tools=[create_ticket], store=worker)
        _stepped(worker, -120, read_ago=5)  # read before the step

        def run() -> None:
            try:
                agent.run(session="s", prompt="make one")
            except BaseException as exc:
                errors.append(exc)

        running = threading.Thread(target=run)
        running.start()
        try:
            assert entered.wait(30)
            other = elsewhere(fresh)
            stored = fresh.backend.read_effects("s")["t1"]
            assert stored.deadline is not None
            assert stored.deadline > fresh.backend.fresh_now() + 50
            assert other.in_doubt() == []
            assert isinstance(other.lease_state(fresh.lease("s")), Running)
        finally:
            go.set()
            running.join(30)
    assert errors == []
    assert len(list(tickets.iterdir())) == 1


def test_only_a_verdict_the_clock_decided_reads_the_server_clock_again(
    request: pytest.FixtureRequest,
) -> None:
    """An attempt its worker gave up is over whatever any clock says: judging it reads no
    clock afresh. One whose deadline passed on this process's reading is judged again on a
    fresh one (one round trip), and found over on it too."""
    url = request.getfixturevalue("postgres_store_url")
    with tl.open_store(url) as store:
        reads: list[float] = []
        fresh = store._fresh_now
        assert fresh is not None

        def counted() -> float:
            reads.append(1.0)
            return fresh()

        store._fresh_now = counted
        now = store.now()
        given_up = make_record("s", "a", at=now, deadline=now + 60)
        verdict = store.judge(given_up)
        assert isinstance(verdict, tl_liveness.Over) and not verdict.clocked and reads == []
        elsewhere_holder = Holder.unknown(7)
        passed = make_record("s", "b", at=now - 120, holder=elsewhere_holder, deadline=now - 60)
        from toolledger.testing import elsewhere

        other = elsewhere(store)
        other._fresh_now = counted
        verdict = other.judge(passed)
        assert isinstance(verdict, tl_liveness.Over) and verdict.clocked and reads == [1.0]
