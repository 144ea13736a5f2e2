"""toolledger.integrations.dbos in one process: DBOS on a SQLite system database, the store on
SQLite, a scripted model. What a session workflow answers, how ``enqueue`` treats a session
already queued, a busy session waited for, a session that stops for a person, and a worker that
does not know the agent. (Many workers and kills: ``test_dbos_fleet.py``.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse
from toolledger.testing.world import World

from ..helpers import held_elsewhere
from .conftest import require

require("dbos", "dbos")

from dbos import DBOS  # noqa: E402

from toolledger.integrations import dbos as tl_dbos  # noqa: E402


def slow(reply: Reply, seconds: float = 0.0) -> Any:
    def step(body: dict[str, Any]) -> Reply:
        time.sleep(seconds)
        return reply

    return step


@pytest.fixture
def launched(tmp_path: Path) -> Iterator[None]:
    """DBOS launched in this process on a SQLite system database, the queue declared."""
    DBOS(
        config={
            "name": "toolledger-test",
            "system_database_url": f"sqlite:///{tmp_path / 'dbos.sqlite'}",
            "executor_id": "test-worker",
            "log_level": "WARNING",
        }
    )
    try:
        DBOS.launch()
        tl_dbos.register_queue(worker_concurrency=4, polling_interval_sec=0.05)
        yield
    finally:
        DBOS.destroy()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tl.Store]:
    s = tl.open_store(f"sqlite:///{tmp_path / 'store.db'}")
    yield s
    s.close()


def register(model: ScriptedModel, store: tl.Store, world: World, **kwargs: Any) -> None:
    tl_dbos.register(
        lambda: tl.Agent(
            client=model.client(), model="claude-scripted", tools=world.toolset(), store=store
        ),
        retry_interval=0.1,
        max_retry_interval=0.5,
        **kwargs,
    )


def test_a_session_runs_as_a_workflow_once_per_prompt(
    launched: None, store: tl.Store, tmp_path: Path
) -> None:
    world = World(tmp_path / "world")
    script = [
        slow(Reply(tool_uses=[ToolUse("create_ticket", {"title": "outage"})]), 1.0),
        Reply(text="Opened."),
        Reply(text="Still open."),
    ]
    with ScriptedModel(script) as model:
        register(model, store, world)
        first = tl_dbos.enqueue(session="s1", prompt="Open a ticket.")
        again = tl_dbos.enqueue(session="s1", prompt="Open a ticket.")
        resume = tl_dbos.enqueue(session="s1")
        assert again.get_workflow_id() == resume.get_workflow_id() == first.get_workflow_id()
        with pytest.raises(tl_dbos.SessionQueuedError) as queued:
            tl_dbos.enqueue(session="s1", prompt="Something else.")
        assert queued.value.workflow_id == first.get_workflow_id()

        outcome = first.get_result()
        assert outcome == tl_dbos.SessionOutcome(
            session_id="s1",
            status=tl.RunStatus.COMPLETED,
            reason=None,
            final_text="Opened.",
            turns=2,
        )
        assert not outcome.needs_person
        assert [t["title"] for t in world.tickets()] == ["outage"]

        # Finished: the same prompt again is a new workflow that finds the session as it is.
        repeat = tl_dbos.enqueue(session="s1", prompt="Open a ticket.")
        assert repeat.get_workflow_id() != first.get_workflow_id()
        assert repeat.get_result().final_text == "Opened."
        later = tl_dbos.enqueue(session="s1", prompt="Is it still open?").get_result()
        assert (later.status, later.final_text) == (tl.RunStatus.COMPLETED, "Still open.")
    assert len(world.executions("create_ticket")) == 1
    status = DBOS.get_workflow_status(first.get_workflow_id())
    assert status is not None and status.status == "SUCCESS"


def test_a_session_another_worker_holds_is_waited_for(
    launched: None, store: tl.Store, tmp_path: Path
) -> None:
    world = World(tmp_path / "world")
    script = [Reply(tool_uses=[ToolUse("ensure_ticket", {"title": "t"})]), Reply(text="done")]
    # Another worker lives for 4 s, renewing its lease; then it gives the session back.
    with (
        held_elsewhere(store, "held", ttl=0.6, every=0.2, gives_back_after=4.0),
        ScriptedModel(script) as model,
    ):
        register(model, store, world)
        outcome = tl_dbos.enqueue(session="held", prompt="go").get_result()
    assert outcome.status is tl.RunStatus.COMPLETED
    assert outcome.attempts > 1 and outcome.waited > 0, outcome
    assert [t["title"] for t in world.tickets()] == ["t"]


def test_a_session_that_stops_for_a_person_ends_its_workflow_with_the_reason(
    launched: None, store: tl.Store, tmp_path: Path
) -> None:
    sent: list[str] = []

    @tl.tool
    def wire(amount: int) -> str:
        """Wire money."""
        sent.append("wire")
        raise tl.OutcomeUnknown("the bank did not answer")

    script = [Reply(tool_uses=[ToolUse("wire", {"amount": 5})]), Reply(text="Wired.")]
    with ScriptedModel(script) as model:
        tl_dbos.register(
            lambda: tl.Agent(client=model.client(), model="x", tools=[wire], store=store)
        )
        outcome = tl_dbos.enqueue(session="pay", prompt="Pay the invoice.").get_result()
        assert outcome.status is tl.RunStatus.NEEDS_ATTENTION and outcome.needs_person
        assert outcome.reason and "resolve" in outcome.reason
        (record,) = store.ledger("pay").in_doubt()
        store.ledger("pay").resolve(record.tool_use_id, happened=True, by="ana")
        done = tl_dbos.enqueue(session="pay").get_result()
    assert (done.status, done.final_text) == (tl.RunStatus.COMPLETED, "Wired.")
    assert sent == ["wire"]


def test_a_worker_without_the_agent_fails_the_workflow(launched: None) -> None:
    handle = tl_dbos.enqueue(session="s", prompt="go", agent="not-registered-here")
    with pytest.raises(tl_dbos.SessionWorkflowError) as failed:
        handle.get_result()
    assert failed.value.error == "ConfigurationError"
    assert failed.value.session_id == "s"
    assert "not-registered-here" in failed.value.message


def test_enqueue_names_a_queue_nobody_declared(launched: None) -> None:
    with pytest.raises(tl.ConfigurationError, match="register_queue"):
        tl_dbos.enqueue(session="s", prompt="go", queue="nobody-declared-it")


def test_an_async_agent_runs_in_its_own_event_loop(
    launched: None, store: tl.Store, tmp_path: Path
) -> None:
    world = World(tmp_path / "world")
    script = [Reply(tool_uses=[ToolUse("create_ticket_keyed", {"title": "a"})]), Reply(text="ok")]
    with ScriptedModel(script) as model:
        tl_dbos.register(
            tl.Agent(client=model.async_client(), model="x", tools=world.toolset(), store=store),
            name="async",
        )
        outcome = tl_dbos.enqueue(session="a", prompt="go", agent="async").get_result()
    assert (outcome.status, outcome.final_text) == (tl.RunStatus.COMPLETED, "ok")
    assert [t["title"] for t in world.tickets()] == ["a"]


def test_a_client_enqueues_from_a_process_without_dbos(
    launched: None, store: tl.Store, tmp_path: Path
) -> None:
    from dbos import DBOSClient

    world = World(tmp_path / "world")
    script = [
        slow(Reply(tool_uses=[ToolUse("create_ticket_checked", {"title": "c"})]), 1.0),
        Reply(text="done"),
    ]
    client = DBOSClient(
        system_database_url=f"sqlite:///{tmp_path / 'dbos.sqlite'}",
        application_name="toolledger-test",
    )
    try:
        with ScriptedModel(script) as model:
            register(model, store, world)
            first = tl_dbos.enqueue(session="c", prompt="go", client=client)
            again = tl_dbos.enqueue(session="c", prompt="go", client=client)
            assert again.get_workflow_id() == first.get_workflow_id()
            with pytest.raises(tl_dbos.SessionQueuedError):
                tl_dbos.enqueue(session="c", prompt="another", client=client)
            outcome = first.get_result()
    finally:
        client.destroy()
    assert (outcome.status, outcome.final_text) == (tl.RunStatus.COMPLETED, "done")
    assert [t["title"] for t in world.tickets()] == ["c"]


def test_a_workflow_past_its_timeout_is_cancelled_and_the_session_goes_on(
    launched: None, store: tl.Store, tmp_path: Path
) -> None:
    world = World(tmp_path / "world")
    script = [
        slow(Reply(tool_uses=[ToolUse("create_ticket_keyed", {"title": "k"})]), 1.5),
        Reply(text="done"),
    ]
    with ScriptedModel(script) as model:
        register(model, store, world)
        handle = tl_dbos.enqueue(session="t", prompt="go", timeout=0.5)
        with pytest.raises(Exception, match="cancel"):
            handle.get_result()
        assert handle.get_status().status == "CANCELLED"
        # The cancelled run may still be inside agent.run: the new workflow waits for its lease.
        outcome = tl_dbos.enqueue(session="t").get_result()
    assert (outcome.status, outcome.final_text) == (tl.RunStatus.COMPLETED, "done")
    assert [t["title"] for t in world.tickets()] == ["k"]
