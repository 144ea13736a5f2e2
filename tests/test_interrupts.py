"""A run stopped from outside — a task cancelled, a ``KeyboardInterrupt`` (a signal raises one
where a function is entered or returns), a store closed under it — leaves this process able to
go on: no effect runs twice, no session stays held, no call stays in flight for ever."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import toolledger as tl
import toolledger._crash
from toolledger import _switches as switches
from toolledger._liveness._runtime import Runtime
from toolledger.codec import input_hash
from toolledger.engine import _straight as straight
from toolledger.ops import InsertEffect
from toolledger.stores.contract import OP_BUDGET
from toolledger.testing.conformance import make_record
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

from .conftest import tool_use


class CancelledAsItCommits:
    """An async backend whose task is cancelled as the commit of an intent comes back: the
    intent landed (or was refused), and the run never hears which."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def apply(self, session_id: str, ops: Any) -> list[bool]:
        done: list[bool] = await self.inner.apply(session_id, ops)
        if any(isinstance(op, InsertEffect) for op in ops):
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(0)  # the cancellation is delivered here
        return done


def test_a_cancelled_run_waits_for_its_plain_tool_so_a_retry_never_runs_it_again(
    tmp_path: Path,
) -> None:
    """A plain function runs in a worker thread, which a cancellation cannot stop. The run
    ends only once it returned — its attempt in flight until then — and a retry in the same
    process settles the call by its check: the effect happened once."""
    store = tl.open_store(f"sqlite:///{tmp_path / 'c.db'}")
    ledger = store.ledger("s")
    effects: list[str] = []
    entered, go = threading.Event(), threading.Event()

    @tl.tool
    def send(to: str) -> str:
        first = not entered.is_set()
        entered.set()
        if first:
            go.wait(10)  # a slow downstream service
        effects.append(to)
        return "sent"

    @send.check
    def _sent(to: str) -> str | None:
        return "sent" if effects else None

    block = tool_use("toolu_1", "send", to="bob")

    async def main() -> Any:
        first = asyncio.create_task(tl.arun_tool_uses([block], [send], ledger=ledger))
        while not entered.is_set():
            await asyncio.sleep(0.01)
        first.cancel()
        asyncio.get_running_loop().call_later(0.2, go.set)  # the tool returns meanwhile
        with pytest.raises(asyncio.CancelledError):
            await first
        assert effects == ["bob"], "the cancelled run ended once its tool had returned"
        (again,) = await tl.arun_tool_uses([block], [send], ledger=ledger)
        return again

    again = asyncio.run(main())
    assert effects == ["bob"], "the retry did not run the tool again"
    assert again["content"] == "sent" and not again.get("is_error")
    store.close()


@pytest.mark.parametrize("path", ["straight", "general"])
def test_an_async_tool_cancelled_by_its_caller_stays_running_until_its_deadline(
    tmp_path: Path, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ``async def`` tool hands its effect to a thread (``asyncio.to_thread``, a blocking
    client) and its run is cancelled by the caller (``asyncio.wait_for``) long before the tool's
    deadline. The thread cannot be stopped and may still take effect: until the deadline the
    process judges the call running — not listed in doubt, not run again — and after it a retry
    settles the call by its check. The effect happened once."""
    store = tl.open_store(f"sqlite:///{tmp_path / 'c.db'}")
    ledger = store.ledger("s")
    effects: list[str] = []

    def blocking_send(to: str) -> None:
        time.sleep(0.5)
        effects.append(to)

    @tl.tool(effect="non_idempotent", timeout=1.5)
    async def send(to: str) -> str:
        await asyncio.to_thread(blocking_send, to)
        return "sent"

    @send.check
    def _sent(to: str) -> str | None:
        return "sent" if effects else None

    block = tool_use("toolu_1", "send", to="bob")
    tools: list[Any] = [send]
    taken = _on_path(path, store, monkeypatch)

    async def main() -> Any:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(tl.arun_tool_uses([block], tools, ledger=ledger), 0.1)
        assert ledger.in_doubt() == [], "its thread may still take effect"
        # Held in this store alone: another database's call of the same session and id, its
        # attempt released long ago, is in doubt there.
        with tl.open_store(f"sqlite:///{tmp_path / 'other.db'}") as other:
            gone = replace(
                make_record("s", "toolu_1", status=tl.Status.STARTED),
                tool="send",
                input_hash=input_hash({"to": "bob"}),
                deadline=other.now() - 5,
            )
            assert other.apply("s", [InsertEffect(gone)]) == [True]
            assert [r.tool_use_id for r in other.ledger("s").in_doubt()] == ["toolu_1"]
        with pytest.raises(tl.EffectInProgressError):
            await tl.arun_tool_uses([block], tools, ledger=ledger)
        (again,) = await tl.arun_tool_uses([block], tools, ledger=ledger, wait=10)
        return again

    again = asyncio.run(main())
    assert effects == ["bob"], "the tool's effect happened once"
    assert again["content"] == "sent" and not again.get("is_error")
    assert bool(taken) is (path == "straight")
    store.close()


def _on_path(path: str, store: tl.Store, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Send session ``s``'s common call down ``path`` ("straight" or "general"); the list
    returned names each call the straight path took, to assert that it was the path meant. A
    session's first call that could be claimed for a branch reads whether it is one first, on
    the general path: read up front here, as it is after the session's first call."""
    monkeypatch.setattr(switches, "STRAIGHT", path == "straight")
    taken: list[str] = []
    run, call = straight.run, straight.call

    def counted_now(p: straight.Plan, *args: Any, **kwargs: Any) -> Any:
        taken.append(p.call.tool_use_id)
        return run(p, *args, **kwargs)

    def counted(p: straight.Plan, *args: Any, **kwargs: Any) -> Any:
        taken.append(p.call.tool_use_id)
        return (yield from call(p, *args, **kwargs))

    monkeypatch.setattr(straight, "run", counted_now)
    monkeypatch.setattr(straight, "call", counted)
    assert store.lineage_root("s") is None
    return taken


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_interrupt_as_a_run_ends_leaves_its_session_free(tmp_path: Path, mode: str) -> None:
    """Interrupted as it lets go of its lease (where ``drop_lease`` is entered), a run still
    stops counting as this process's: once the lease expires, the next run goes on — it is not
    told for ever that a run of this process holds the session."""
    store = tl.open_store(f"sqlite:///{tmp_path / 'l.db'}")
    fired: list[bool] = []

    def interrupt(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "call" and frame.f_code.co_name == "drop_lease" and not fired:
            fired.append(True)
            raise KeyboardInterrupt
        return None

    def run(model: ScriptedModel, prompt: str) -> tl.Run:
        client = model.async_client() if mode == "async" else model.client()
        agent = tl.Agent(client=client, model="x", tools=[], store=store, lease_ttl=1)
        if mode == "async":
            return asyncio.run(agent.arun(session="s", prompt=prompt))
        return agent.run(session="s", prompt=prompt)

    with ScriptedModel([Reply(text="hi"), Reply(text="again")]) as model:
        sys.settrace(interrupt)
        try:
            with pytest.raises(KeyboardInterrupt):
                run(model, "go")
        finally:
            sys.settrace(None)
        assert fired
        # Nor does its lease's budget (a third of its 1 s) bound this thread's later store
        # operations: a write of another store here would be cut at 0.33 s.
        assert OP_BUDGET.get() is None
        time.sleep(1.2)  # the lease it could not give back expires
        assert run(model, "go on").status is tl.RunStatus.COMPLETED
    store.close()


def test_a_write_kept_for_a_store_closed_already_is_tried_once_and_lets_the_call_go(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The store is closed while a call runs: its outcome cannot be written and is kept for
    the background writer — whose last try comes at once, the store's close being over. The
    call is not held in flight for ever: opened again, the store answers for it. The log says
    the outcome was never written, and why — not that it will be tried again."""
    url = f"sqlite:///{tmp_path / 'k.db'}"
    store = tl.open_store(url)

    @tl.tool(effect="non_idempotent")
    async def send(n: int) -> str:
        store.close()  # the application shuts the store down meanwhile
        return f"sent {n}"

    block = tool_use("toolu_1", "send", n=1)
    with pytest.raises(tl.ToolLedgerError), caplog.at_level(logging.WARNING, "toolledger"):
        asyncio.run(tl.arun_tool_uses([block], [send], ledger=store.ledger("s"), raise_alerts=True))
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "retrying" in m], said
    (never,) = [m for m in said if "never written" in m]
    assert "toolu_1" in never and "closed" in never, never
    with tl.open_store(url) as reopened:
        assert (reopened.place, "s", "toolu_1") not in reopened.runtime.in_flight
        record = reopened.ledger("s").get("toolu_1")
        assert record is not None and record.status is tl.Status.STARTED  # in doubt, for a person


def test_a_cancelled_run_stays_cancelled_when_its_plain_tool_then_raises(tmp_path: Path) -> None:
    """The tool raises after its run was cancelled: the run still ends cancelled — it does not
    go on as if the tool had failed — and the failure, which is known, is recorded."""
    store = tl.open_store(f"sqlite:///{tmp_path / 'r.db'}")
    ledger = store.ledger("s")
    entered, go = threading.Event(), threading.Event()

    @tl.tool
    def send(to: str) -> str:
        entered.set()
        go.wait(10)
        raise ValueError("the service said no")

    async def main() -> None:
        run = asyncio.create_task(
            tl.arun_tool_uses([tool_use("toolu_1", "send", to="bob")], [send], ledger=ledger)
        )
        while not entered.is_set():
            await asyncio.sleep(0.01)
        run.cancel()
        asyncio.get_running_loop().call_later(0.1, go.set)
        with pytest.raises(asyncio.CancelledError):
            await run

    asyncio.run(main())
    record = ledger.get("toolu_1")
    assert record is not None and record.status is tl.Status.FAILED, record
    assert record.error is not None and "the service said no" in record.error
    store.close()


@pytest.mark.parametrize("how", ["cancel", "wait_for", "timeout", "task_group"])
def test_a_plain_tool_that_returns_after_its_run_was_cancelled_has_its_outcome_recorded(
    tmp_path: Path, how: str
) -> None:
    """``asyncio.wait_for`` (or a cancel) ends a run while its plain tool runs in its thread.
    The run waits for the tool, and what it returned is known: it is recorded before the run
    ends cancelled. The next run answers from the record — the call is neither run again nor
    left in doubt for a person to settle."""
    url = f"sqlite:///{tmp_path / 'w.db'}"
    store = tl.open_store(url)
    ledger = store.ledger("s")
    effects: list[str] = []
    entered, go = threading.Event(), threading.Event()

    @tl.tool
    def send(to: str) -> str:
        entered.set()
        go.wait(10)
        effects.append(to)
        return f"sent to {to}"

    block = tool_use("toolu_1", "send", to="bob")

    async def fail_soon() -> None:
        await asyncio.sleep(0.1)
        raise ValueError("a sibling failed")

    async def in_group(run: Any) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(fail_soon())
            await run

    async def main() -> Any:
        run = tl.arun_tool_uses([block], [send], ledger=ledger)
        loop = asyncio.get_running_loop()
        if how == "wait_for":
            loop.call_later(0.3, go.set)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(run, 0.1)
        elif how == "timeout":  # knows the cancellation by its exact type on Python 3.11
            loop.call_later(0.3, go.set)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.1):
                    await run
            assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
        elif how == "task_group":  # a sibling's failure cancels the run
            loop.call_later(0.3, go.set)
            with pytest.raises(ExceptionGroup) as raised:
                await in_group(run)
            assert [type(e) for e in raised.value.exceptions] == [ValueError]
        else:
            task = asyncio.create_task(run)
            while not entered.is_set():
                await asyncio.sleep(0.01)
            task.cancel()
            loop.call_later(0.1, go.set)
            with pytest.raises(asyncio.CancelledError):
                await task
        return ledger.get("toolu_1")

    record = asyncio.run(main())
    assert effects == ["bob"]
    assert record is not None and record.status is tl.Status.SUCCEEDED, record
    assert record.result == '"sent to bob"'
    with tl.open_store(url) as again:  # another process, as after a restart
        (answer,) = tl.run_tool_uses([block], [send], ledger=again.ledger("s"))
        assert again.in_doubt() == []
    assert answer["content"] == "sent to bob" and not answer.get("is_error")
    assert effects == ["bob"], "answered from the record, not run again"
    store.close()


def test_a_run_left_running_as_asyncio_run_ends_waits_for_its_plain_tool(tmp_path: Path) -> None:
    """``asyncio.run`` ends with the run still going (a task the program forgot): its shutdown
    cancels every task, the run's included. The run still ends only once its tool returned,
    and records what it returned."""
    store = tl.open_store(f"sqlite:///{tmp_path / 'e.db'}")
    ledger = store.ledger("s")
    said: list[str] = []
    entered = threading.Event()

    @tl.tool
    def send(to: str) -> str:
        entered.set()
        time.sleep(0.5)
        said.append("tool returned")
        return "sent"

    async def run() -> None:
        try:
            await tl.arun_tool_uses([tool_use("toolu_1", "send", to="bob")], [send], ledger=ledger)
        except asyncio.CancelledError:
            said.append("run ended cancelled")
            raise

    async def main() -> None:
        asyncio.get_running_loop().create_task(run())
        while not entered.is_set():
            await asyncio.sleep(0.01)

    asyncio.run(main())
    assert said == ["tool returned", "run ended cancelled"]
    record = ledger.get("toolu_1")
    assert record is not None and record.status is tl.Status.SUCCEEDED, record
    store.close()


def test_an_agent_cancelled_while_its_plain_tool_runs_resumes_from_the_recorded_outcome(
    tmp_path: Path,
) -> None:
    """The agent's turn is cancelled while its tool runs (checkpoint A written, B not): the
    outcome the tool then returned is recorded, and the resumed run hands it to the model
    without running the tool again."""
    store = tl.open_store(f"sqlite:///{tmp_path / 'a.db'}")
    effects: list[int] = []
    entered, go = threading.Event(), threading.Event()

    @tl.tool
    def charge(cents: int) -> str:
        entered.set()
        go.wait(10)
        effects.append(cents)
        return f"charged {cents}"

    script = [Reply(tool_uses=[ToolUse("charge", {"cents": 500})]), Reply(text="done")]
    with ScriptedModel(script) as model:
        agent = tl.Agent(client=model.async_client(), model="x", tools=[charge], store=store)

        async def main() -> None:
            task = asyncio.create_task(agent.arun(session="s", prompt="charge it"))
            while not entered.is_set():
                await asyncio.sleep(0.01)
            task.cancel()
            asyncio.get_running_loop().call_later(0.1, go.set)
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(main())
        assert effects == [500]
        # A new client: the first one's connections belong to the event loop that ended.
        agent = tl.Agent(client=model.async_client(), model="x", tools=[charge], store=store)
        resumed = asyncio.run(agent.arun(session="s"))
        assert resumed.status is tl.RunStatus.COMPLETED
        assert effects == [500], "the resumed run answered from the record"
        sent = json.dumps(model.requests[-1]["messages"][-1])
        assert "charged 500" in sent, sent
    store.close()


def test_a_cancelled_run_does_not_wait_for_a_person_to_answer(tmp_path: Path) -> None:
    """A plain approver runs in a worker thread too, but a person may take hours: a run
    cancelled while it asks ends at once."""
    store = tl.open_store(f"sqlite:///{tmp_path / 'a.db'}")
    answered = threading.Event()
    asked = threading.Event()

    @tl.tool(effect="non_idempotent", high_impact=True)
    def pay(amount: int) -> str:
        return f"paid {amount}"

    def person(request: Any) -> bool:
        asked.set()
        answered.wait(10)
        return False

    async def main() -> bool:
        run = asyncio.create_task(
            tl.arun_tool_uses(
                [tool_use("toolu_1", "pay", amount=5)],
                [pay],
                ledger=store.ledger("s"),
                approve=person,
            )
        )
        while not asked.is_set():
            await asyncio.sleep(0.01)
        run.cancel()
        await asyncio.wait({run}, timeout=5)
        ended = run.done()
        answered.set()  # (the person answers at last: the loop's worker thread ends)
        return ended

    assert asyncio.run(main()), "the cancelled run waited for the person"
    store.close()


def test_an_async_tool_cancelled_by_its_caller_is_over_past_its_deadline_for_its_neighbours(
    tmp_path: Path,
) -> None:
    """As above, seen from another process of this host (the same process table): once the
    deadline has passed, and the thread with it, the attempt is over here — and for the
    neighbour too, although the process that started it lives on (a server whose request was
    cancelled). It is not in progress for as long as that process lives."""
    url = f"sqlite:///{tmp_path / 'c.db'}"
    store = tl.open_store(url)
    ledger = store.ledger("s")
    effects: list[str] = []
    entered = threading.Event()

    def blocking_send(to: str) -> None:
        entered.set()
        time.sleep(0.3)
        effects.append(to)

    @tl.tool(effect="non_idempotent", timeout=0.8)
    async def send(to: str) -> str:
        await asyncio.to_thread(blocking_send, to)
        return "sent"

    block = tool_use("toolu_1", "send", to="bob")

    async def main() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(tl.arun_tool_uses([block], [send], ledger=ledger), 0.1)

    asyncio.run(main())
    assert entered.is_set()
    time.sleep(2.0)  # past the deadline, the thread long done
    assert effects == ["bob"]
    assert [r.tool_use_id for r in ledger.in_doubt()] == ["toolu_1"], "over, here"
    assert _in_doubt_for_a_neighbour(url) == ["toolu_1"], "over for a neighbour of this host too"
    store.close()


def _in_doubt_for_a_neighbour(url: str, wait: float = 10.0) -> list[str]:
    """What another process of this host (the same process table) lists in doubt in session
    ``s``, once it lists something or ``wait`` seconds have passed (a release is written in
    the background)."""
    neighbour = (
        "import json, time, toolledger as tl\n"
        f"s = tl.open_store({url!r})\n"
        f"until = time.monotonic() + {wait!r}\n"
        "while not (found := s.ledger('s').in_doubt()) and time.monotonic() < until:\n"
        "    time.sleep(0.05)\n"
        "print(json.dumps([r.tool_use_id for r in found]))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run(
        [sys.executable, "-c", neighbour],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    found: list[str] = json.loads(done.stdout)
    return found


@pytest.mark.parametrize("where", ["straight", "general"])
def test_an_interrupted_tool_is_over_for_its_neighbours_while_its_process_lives_on(
    tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``KeyboardInterrupt`` (Ctrl-C in a notebook or a REPL, a server that catches it) ends
    a plain tool in the middle: its outcome is unknown, and the process goes on. The attempt is
    in doubt here at once — and for another process of this host, which would otherwise judge
    it by this process, alive, and call it in progress for as long as this process lives."""
    url = f"sqlite:///{tmp_path / 'c.db'}"
    store = tl.open_store(url)
    ledger = store.ledger("s")

    @tl.tool(effect="non_idempotent")
    def send(to: str) -> str:
        raise KeyboardInterrupt  # Ctrl-C while it ran

    block = tool_use("toolu_1", "send", to="bob")
    taken = _on_path(where, store, monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        tl.run_tool_uses([block], [send], ledger=ledger)
    assert taken == (["toolu_1"] if where == "straight" else [])
    assert [r.tool_use_id for r in ledger.in_doubt()] == ["toolu_1"], "over, here"
    assert _in_doubt_for_a_neighbour(url) == ["toolu_1"], "over for a neighbour of this host too"
    store.close()


def test_an_interrupted_tool_is_released_while_another_thread_races_on_its_call(
    tmp_path: Path,
) -> None:
    """Ctrl-C ends a plain tool while another thread of this process races on the same call
    (registered in flight, its intent refused behind this one's): the interrupted attempt is
    released all the same — only a hold (an ``async def`` tool's work that may run on) keeps
    it. Kept, it would stay in progress for every worker of this host once that thread let go,
    for as long as this process lives."""
    from toolledger._liveness._runtime import flight_key

    url = f"sqlite:///{tmp_path / 'r.db'}"
    store = tl.open_store(url)
    ledger = store.ledger("s")
    key = flight_key(store.place, "s", "toolu_1")

    @tl.tool(effect="non_idempotent")
    def send(to: str) -> str:
        store.runtime.in_flight.add(key)  # the other thread, as it registers for this call
        raise KeyboardInterrupt  # Ctrl-C while it ran

    with pytest.raises(KeyboardInterrupt):
        tl.run_tool_uses([tool_use("toolu_1", "send", to="bob")], [send], ledger=ledger)
    store.runtime.in_flight.discard(key)  # that thread's intent was refused: it let go
    assert _in_doubt_for_a_neighbour(url) == ["toolu_1"], "over for a neighbour of this host"
    assert [r.tool_use_id for r in ledger.in_doubt()] == ["toolu_1"], "and here"
    store.close()


def test_an_interrupted_async_tool_whose_thread_runs_on_is_over_only_once_its_time_is_up(
    tmp_path: Path,
) -> None:
    """Ctrl-C ends ``asyncio.run`` inside ``run_tool_uses`` while an ``async def`` tool's own
    thread still works (``asyncio.run`` waits for its executor's threads, not for others): nothing
    stops that thread. The attempt stays in progress — here and for another process of this
    host — until its deadline, as for a live worker; released at once, a check or a person
    could run it again while it still takes effect. Past its deadline it is in doubt for both."""
    url = f"sqlite:///{tmp_path / 'a.db'}"
    store = tl.open_store(url)
    ledger = store.ledger("s")
    going_on = threading.Event()
    done = threading.Event()

    def blocking() -> None:
        going_on.set()
        done.wait(30)

    @tl.tool(effect="non_idempotent", timeout=3)
    async def send(to: str) -> str:
        threading.Thread(target=blocking, daemon=True).start()
        while not going_on.is_set():
            await asyncio.sleep(0.01)
        signal.raise_signal(signal.SIGINT)  # Ctrl-C while its thread works
        await asyncio.sleep(30)
        return "sent"

    try:
        with pytest.raises(KeyboardInterrupt):
            tl.run_tool_uses([tool_use("toolu_1", "send", to="bob")], [send], ledger=ledger)
        assert ledger.in_doubt() == [], "in progress here while its time runs"
        assert _in_doubt_for_a_neighbour(url, wait=0.5) == [], "and for a neighbour"
        assert _in_doubt_for_a_neighbour(url, wait=15) == ["toolu_1"], "over once it is up"
        assert [r.tool_use_id for r in ledger.in_doubt()] == ["toolu_1"]
    finally:
        done.set()
        store.close()


@pytest.mark.parametrize("where", ["straight", "general"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_run_stopped_between_its_intent_and_its_tool_leaves_a_call_that_did_not_happen(
    tmp_path: Path, where: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C (a ``KeyboardInterrupt``) or a task's cancellation lands after a call's intent
    committed and before its tool was called. Nothing ran, and this process knows it: the call
    did not happen — not in doubt, here or for a neighbour, waiting for a person — and the next
    run runs it, once. Async, the cancellation is real: delivered to the task as the intent's
    commit returns (a PostgreSQL commit awaited on the network, cancelled by a timeout)."""
    url = f"sqlite:///{tmp_path / 'n.db'}"
    store = tl.open_store(url)
    ledger = store.ledger("s")
    effects: list[str] = []

    @tl.tool(effect="non_idempotent")
    def send(to: str) -> str:
        effects.append(to)
        return "sent"

    block = tool_use("toolu_1", "send", to="bob")
    taken = _on_path(where, store, monkeypatch)
    if mode == "sync":

        def interrupt(point: str) -> None:
            if point == "after_intent":
                raise KeyboardInterrupt  # Ctrl-C, right there

        monkeypatch.setattr(toolledger._crash, "watchers", [interrupt])
        with pytest.raises(KeyboardInterrupt):
            tl.run_tool_uses([block], [send], ledger=ledger)
        monkeypatch.setattr(toolledger._crash, "watchers", [])
    else:
        inner = store.async_backend
        monkeypatch.setattr(store, "async_backend", CancelledAsItCommits(inner))
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(tl.arun_tool_uses([block], [send], ledger=ledger))
        monkeypatch.setattr(store, "async_backend", inner)
    assert effects == [], "the tool was never called"
    assert taken == (["toolu_1"] if where == "straight" else [])
    record = _settled(ledger, "toolu_1")
    assert record.status is tl.Status.NOT_HAPPENED, record
    assert "did not run" in (record.error or ""), record.error
    assert ledger.in_doubt() == [], "nothing for a person to decide"
    assert _in_doubt_for_a_neighbour(url, wait=0.3) == [], "nor for a neighbour"
    (again,) = tl.run_tool_uses([block], [send], ledger=ledger)
    assert again["content"] == "sent" and not again.get("is_error")
    assert effects == ["bob"], "run once, on the next run"
    store.close()


def _settled(ledger: tl.Ledger, tool_use_id: str, wait: float = 10.0) -> tl.EffectRecord:
    """The record of ``tool_use_id`` once it is no longer the intent its run left (what a run
    that stopped leaves is written in the background), or as it is after ``wait`` seconds."""
    until = time.monotonic() + wait
    while True:
        record = ledger.get(tool_use_id)
        assert record is not None
        if record.status is not tl.Status.STARTED or record.holder is None:
            return record
        if time.monotonic() > until:
            return record
        time.sleep(0.02)


@pytest.mark.parametrize("where", ["straight", "general"])
def test_a_re_run_stopped_before_its_tool_leaves_its_call_in_doubt(
    tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The re-run of a call in doubt (its check found nothing) is stopped between its intent
    and its tool. Its own tool did not run, but the attempt before it may have taken effect:
    the call stays in doubt — it is not said not to have happened."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    store = tl.open_store(url)
    ledger = store.ledger("s")
    calls: list[str] = []

    @tl.tool(effect="non_idempotent")
    def send(to: str) -> str:
        calls.append(to)
        if len(calls) == 1:
            raise KeyboardInterrupt  # Ctrl-C while it ran: its outcome is unknown
        return "sent"

    @send.check
    def _sent(to: str) -> str | None:
        return None  # nothing found: a re-run is allowed

    block = tool_use("toolu_1", "send", to="bob")
    taken = _on_path(where, store, monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        tl.run_tool_uses([block], [send], ledger=ledger)
    assert [r.tool_use_id for r in ledger.in_doubt()] == ["toolu_1"]

    def interrupt(point: str) -> None:
        if point == "after_intent":
            raise KeyboardInterrupt  # Ctrl-C between the re-run's intent and its tool

    monkeypatch.setattr(toolledger._crash, "watchers", [interrupt])
    with pytest.raises(KeyboardInterrupt):
        tl.run_tool_uses([block], [send], ledger=ledger)
    monkeypatch.setattr(toolledger._crash, "watchers", [])
    assert calls == ["bob"], "the re-run's tool was never called"
    assert bool(taken) is (where == "straight")  # its intent met the record: the general path
    record = _settled(ledger, "toolu_1")
    assert record.status is tl.Status.STARTED and record.attempt == 2, record
    assert [r.tool_use_id for r in ledger.in_doubt()] == ["toolu_1"], "still in doubt"
    store.close()


def test_an_interrupted_async_tool_s_time_is_counted_on_the_monotonic_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, with this machine's wall clock stepped forward an hour while the tool's
    thread works (an NTP correction, a VM restored): its attempt still has its whole time on
    the monotonic clock, which its tool counts down on. It stays in progress — here and for
    another process of this host — until then, not released at once as if its deadline had
    passed."""
    url = f"sqlite:///{tmp_path / 'a.db'}"
    store = tl.open_store(url)
    ledger = store.ledger("s")
    going_on = threading.Event()
    done = threading.Event()
    real_time = time.time

    def blocking() -> None:
        going_on.set()
        done.wait(30)

    @tl.tool(effect="non_idempotent", timeout=3)
    async def send(to: str) -> str:
        threading.Thread(target=blocking, daemon=True).start()
        while not going_on.is_set():
            await asyncio.sleep(0.01)
        monkeypatch.setattr(time, "time", lambda: real_time() + 3600.0)  # the clock steps
        signal.raise_signal(signal.SIGINT)  # Ctrl-C while its thread works
        await asyncio.sleep(30)
        return "sent"

    try:
        with pytest.raises(KeyboardInterrupt):
            tl.run_tool_uses([tool_use("toolu_1", "send", to="bob")], [send], ledger=ledger)
        assert ledger.in_doubt() == [], "in progress here while its time runs"
        assert _in_doubt_for_a_neighbour(url, wait=0.5) == [], "and for a neighbour"
        assert _in_doubt_for_a_neighbour(url, wait=15) == ["toolu_1"], "over once it is up"
        assert [r.tool_use_id for r in ledger.in_doubt()] == ["toolu_1"]
    finally:
        done.set()
        store.close()


@pytest.mark.parametrize("where", ["straight", "general"])
def test_a_run_stopped_before_its_tool_is_not_in_doubt_for_the_next_run_of_its_process(
    tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C lands between a call's intent and its tool, and the process runs the message
    again at once (a server that caught it, a notebook's next cell). Its record still names
    this process until the background write says the call did not happen: the next run waits
    for that write and runs the call — it is never told that the call may already have
    happened, for a person to resolve, while the ledger then says it did not."""
    store = tl.open_store(f"sqlite:///{tmp_path / 'a.db'}")
    ledger = store.ledger("s")
    effects: list[str] = []

    @tl.tool(effect="non_idempotent")
    def send(to: str) -> str:
        effects.append(to)
        return "sent"

    def interrupt(point: str) -> None:
        if point == "after_intent":
            raise KeyboardInterrupt  # Ctrl-C, right there

    block = tool_use("toolu_1", "send", to="bob")
    _on_path(where, store, monkeypatch)
    monkeypatch.setattr(toolledger._crash, "watchers", [interrupt])
    with pytest.raises(KeyboardInterrupt):
        tl.run_tool_uses([block], [send], ledger=ledger)
    monkeypatch.setattr(toolledger._crash, "watchers", [])
    assert effects == [], "the tool was never called"
    (again,) = tl.run_tool_uses([block], [send], ledger=ledger, wait=5.0)
    assert again["content"] == "sent" and not again.get("is_error"), again
    assert effects == ["bob"], "run once, by the next run"
    record = ledger.get("toolu_1")
    assert record is not None and record.status is tl.Status.SUCCEEDED, record
    store.close()


def test_a_racer_stopped_before_its_tool_never_says_the_winner_s_call_did_not_happen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs of this process race on one call; the second's intent is refused behind the
    first's, whose tool is running, and the second is cancelled as that refusal comes back.
    Its own tool never ran, but the intent in the ledger is the first's: with a clock too
    coarse to tell the two intents apart (a wall clock that ticks every 15 ms), a "did not
    happen" written for the second lands on the first's — and the next run sends it again."""
    store = tl.open_store(f"sqlite:///{tmp_path / 'w.db'}", clock=lambda: 1_000_000.0)
    ledger = store.ledger("s")
    effects: list[str] = []
    entered, go = threading.Event(), threading.Event()

    @tl.tool(effect="non_idempotent")
    def send(to: str) -> str:
        effects.append(to)
        entered.set()
        go.wait(10)  # a slow downstream service
        return "sent"

    block = tool_use("toolu_1", "send", to="bob")
    assert store.lineage_root("s") is None
    first = threading.Thread(
        target=tl.run_tool_uses, args=([block], [send]), kwargs={"ledger": ledger}
    )
    first.start()
    try:
        assert entered.wait(10)
        inner = store.async_backend
        monkeypatch.setattr(store, "async_backend", CancelledAsItCommits(inner))
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(tl.arun_tool_uses([block], [send], ledger=ledger))
        monkeypatch.setattr(store, "async_backend", inner)
        time.sleep(1.5)  # what a stopped run leaves is written in the background
        record = ledger.get("toolu_1")
        assert record is not None and record.status is tl.Status.STARTED, record
        with pytest.raises(tl.EffectInProgressError):
            tl.run_tool_uses([block], [send], ledger=ledger)
    finally:
        go.set()
        first.join(10)
    assert effects == ["bob"], "sent once"
    store.close()


def test_a_racer_of_another_worker_stopped_before_its_tool_leaves_the_winner_s_intent_be(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same race between two workers (two processes; here two stores on one database, each
    with its own view of the process, so neither sees the other's attempts in flight): the
    second's intent is refused behind the first's while its tool runs, and the second is
    cancelled as that refusal comes back. Its clean-up — "did not happen" — must not land on the
    first's intent, which a clock too coarse to tell them apart gives the same ``updated_at``:
    the next run would send the call again."""
    url = f"sqlite:///{tmp_path / 'w.db'}"
    winner = tl.open_store(url, clock=lambda: 1_000_000.0)
    loser = tl.open_store(url, clock=lambda: 1_000_000.0)
    loser.runtime = Runtime()  # another process: none of the winner's attempts in flight
    assert loser.worker_id != winner.worker_id
    effects: list[str] = []
    entered, go = threading.Event(), threading.Event()

    @tl.tool(effect="non_idempotent")
    def send(to: str) -> str:
        effects.append(to)
        entered.set()
        go.wait(10)  # a slow downstream service
        return "sent"

    block = tool_use("toolu_1", "send", to="bob")
    first = threading.Thread(
        target=tl.run_tool_uses, args=([block], [send]), kwargs={"ledger": winner.ledger("s")}
    )
    first.start()
    try:
        assert entered.wait(10)
        inner = loser.async_backend
        monkeypatch.setattr(loser, "async_backend", CancelledAsItCommits(inner))
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(tl.arun_tool_uses([block], [send], ledger=loser.ledger("s")))
        monkeypatch.setattr(loser, "async_backend", inner)
        time.sleep(1.5)  # what a stopped run leaves is written in the background
        record = winner.ledger("s").get("toolu_1")
        assert record is not None and record.status is tl.Status.STARTED, record
        assert record.worker == winner.worker_id, record.worker
        assert record.holder is not None, "not released: its tool runs"
    finally:
        go.set()
        first.join(10)
    record = winner.ledger("s").get("toolu_1")
    assert record is not None and record.status is tl.Status.SUCCEEDED, record
    again = tl.run_tool_uses([block], [send], ledger=loser.ledger("s"))
    assert effects == ["bob"], "sent once"
    assert "sent" in json.dumps(again)
    loser.close()
    winner.close()


_SAME_ID_WINNER = """
import sys, time
from pathlib import Path
import toolledger as tl

url, world = sys.argv[1], Path(sys.argv[2])

@tl.tool(effect="non_idempotent")
def send(to: str) -> str:
    with open(world / "sent", "a") as fh:
        fh.write(to + "\\n")
    (world / "entered").touch()
    until = time.monotonic() + 20
    while not (world / "go").exists() and time.monotonic() < until:
        time.sleep(0.01)  # a slow downstream service
    return "sent"

store = tl.open_store(url, clock=lambda: 1_000_000.0, worker_id="worker")
block = {"type": "tool_use", "id": "toolu_1", "name": "send", "input": {"to": "bob"}}
tl.run_tool_uses([block], [send], ledger=store.ledger("s"))
store.close()
"""


def test_a_racer_with_the_same_worker_id_leaves_the_other_process_s_intent_be(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes given one ``worker_id`` (``open_store(worker_id=)``: one name for every
    replica of a service) race on one call; the second's intent is refused behind the first's
    while the first's tool runs, and the second is cancelled as that refusal comes back. Its
    clean-up — "did not happen" — names its intent by attempt, time and worker, all of which
    the first's shares under a coarse clock: it must still not land on the first's intent (the
    next run would send the call again), because another process holds it."""
    url = f"sqlite:///{tmp_path / 'w.db'}"
    tl.open_store(url).close()  # created before either races on it
    sent = tmp_path / "sent"

    @tl.tool(effect="non_idempotent")
    def send(to: str) -> str:
        with open(sent, "a") as fh:
            fh.write(to + "\n")
        return "sent"

    block = tool_use("toolu_1", "send", to="bob")
    first = subprocess.Popen(
        [sys.executable, "-c", _SAME_ID_WINNER, url, str(tmp_path)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    loser = tl.open_store(url, clock=lambda: 1_000_000.0, worker_id="worker")
    try:
        until = time.monotonic() + 30
        while not (tmp_path / "entered").exists():
            assert time.monotonic() < until and first.poll() is None, "never entered its tool"
            time.sleep(0.01)
        inner = loser.async_backend
        monkeypatch.setattr(loser, "async_backend", CancelledAsItCommits(inner))
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(tl.arun_tool_uses([block], [send], ledger=loser.ledger("s")))
        monkeypatch.setattr(loser, "async_backend", inner)
        time.sleep(1.5)  # what a stopped run leaves is written in the background
        record = loser.ledger("s").get("toolu_1")
        assert record is not None and record.status is tl.Status.STARTED, record
        assert record.holder is not None and record.holder.pid == first.pid, record.holder
        with pytest.raises(tl.EffectInProgressError):
            tl.run_tool_uses([block], [send], ledger=loser.ledger("s"))
    finally:
        (tmp_path / "go").touch()
        assert first.wait(30) == 0
    record = loser.ledger("s").get("toolu_1")
    assert record is not None and record.status is tl.Status.SUCCEEDED, record
    again = tl.run_tool_uses([block], [send], ledger=loser.ledger("s"))
    assert "sent" in json.dumps(again)
    assert sent.read_text() == "bob\n", "sent once"
    loser.close()
