"""Session leases: one worker per session, stale workers fenced off, crashed ones replaced."""

from __future__ import annotations

import multiprocessing
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
from toolledger.records import Lease, Status
from toolledger.stores.base import TakeLease
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse
from toolledger.testing.world import World

CALL = ToolUse("slow_send", {"to": "a@b"})


def blocking_tool(
    world: World, release: threading.Event, entered: threading.Event
) -> tl.Tool[Any, Any]:
    @tl.tool
    def slow_send(to: str, ctx: tl.ToolContext) -> str:
        """Send, slowly."""
        world.log_execution("slow_send", ctx)
        entered.set()
        assert release.wait(30)
        return "sent"

    return slow_send


def test_a_second_worker_is_refused_while_the_first_runs(store: tl.Store, tmp_path: Path) -> None:
    world = World(tmp_path / "w")
    release, entered = threading.Event(), threading.Event()
    tool = blocking_tool(world, release, entered)
    with ScriptedModel([Reply(tool_uses=[CALL]), Reply(text="done")]) as m:
        agent = tl.Agent(client=m.client(), model="x", tools=[tool], store=store)
        first: list[tl.Run] = []
        worker = threading.Thread(target=lambda: first.append(agent.run(session="s", prompt="go")))
        worker.start()
        assert entered.wait(30)
        with pytest.raises(tl.SessionBusyError) as info:
            agent.run(session="s", prompt="go")
        assert store.worker_id in info.value.owner
        release.set()
        worker.join()
    assert first[0].status is tl.RunStatus.COMPLETED
    assert len(world.executions("slow_send")) == 1
    lease = store.backend.read_lease("s")
    assert lease is not None and lease.expires_at == 0.0, "given back at the end of the run"


def test_a_taken_over_worker_has_its_writes_refused(store: tl.Store, tmp_path: Path) -> None:
    """Worker A stalls inside a tool past its lease; B takes the session over. A's outcome is
    refused by the fence (an alert: the effect happened) and B never re-runs the call."""
    world = World(tmp_path / "w")
    release, entered = threading.Event(), threading.Event()
    tool = blocking_tool(world, release, entered)
    alerts: list[tl.LedgerWriteError] = []
    script = [Reply(tool_uses=[CALL]), Reply(text="done")]
    with ScriptedModel(script) as m:
        a = tl.Agent(
            client=m.client(),
            model="x",
            tools=[tool],
            store=store,
            on_alert=alerts.append,
            lease_ttl=3600,
        )
        outcome: list[BaseException] = []

        def run_a() -> None:
            try:
                a.run(session="s", prompt="go")
            except BaseException as exc:
                outcome.append(exc)

        worker = threading.Thread(target=run_a)
        worker.start()
        assert entered.wait(30)
        # B's clock is an hour and a minute ahead: A's lease has expired as far as B can tell.
        later = tl.Store(store.backend, clock=lambda: time.time() + 3660, worker_id="b:1:x")
        b = tl.Agent(client=m.client(), model="x", tools=[tool], store=later)
        run_b = b.run(session="s")
        release.set()
        worker.join()
    assert run_b.status is tl.RunStatus.NEEDS_ATTENTION, "B found A's call in doubt"
    (exc,) = outcome
    assert isinstance(exc, tl.LeaseLostError)
    (alert,) = alerts
    assert alert.tool == "slow_send" and isinstance(alert.cause, tl.LeaseLostError)
    assert len(world.executions("slow_send")) == 1
    (doubt,) = store.ledger("s").in_doubt()
    assert doubt.status is Status.STARTED


def test_an_expired_lease_is_taken_over(store: tl.Store) -> None:
    foreign = Lease(session_id="s", owner="elsewhere:4242:x", token=5, expires_at=time.time() + 30)
    store.backend.apply("s", [TakeLease(foreign, expect_token=0)])
    with ScriptedModel([Reply(text="hi")]) as m:
        agent = tl.Agent(client=m.client(), model="x", tools=[], store=store)
        with pytest.raises(tl.SessionBusyError, match="elsewhere:4242"):
            agent.run(session="s", prompt="go")
        later = tl.Store(store.backend, clock=lambda: time.time() + 31)
        run = tl.Agent(client=m.client(), model="x", tools=[], store=later).run(
            session="s", prompt="go"
        )
    assert run.status is tl.RunStatus.COMPLETED
    lease = store.backend.read_lease("s")
    assert lease is not None and lease.token == 6


def test_a_dead_local_holder_is_replaced_at_once(store: tl.Store) -> None:
    child = multiprocessing.get_context("fork").Process(target=os._exit, args=(0,))
    child.start()
    child.join()
    dead = Lease(
        session_id="s",
        owner=f"{socket.gethostname()}:{child.pid}:x",
        token=1,
        expires_at=time.time() + 3600,
    )
    store.backend.apply("s", [TakeLease(dead, expect_token=0)])
    with ScriptedModel([Reply(text="hi")]) as m:
        run = tl.Agent(client=m.client(), model="x", tools=[], store=store).run(
            session="s", prompt="go"
        )
    assert run.status is tl.RunStatus.COMPLETED


def test_the_heartbeat_keeps_a_long_tool_s_lease(store: tl.Store, tmp_path: Path) -> None:
    seen: list[Lease | None] = []

    @tl.tool(effect="read_only")
    def slow_read() -> str:
        """Read slowly."""
        first = store.backend.read_lease("s")
        time.sleep(0.6)
        seen.extend([first, store.backend.read_lease("s")])
        return "ok"

    with ScriptedModel([Reply(tool_uses=[ToolUse("slow_read")]), Reply(text="done")]) as m:
        agent = tl.Agent(
            client=m.client(), model="x", tools=[slow_read], store=store, lease_ttl=0.3
        )
        assert agent.run(session="s", prompt="go").status is tl.RunStatus.COMPLETED
    before, after = seen
    assert before is not None and after is not None
    assert after.token == before.token and after.expires_at > before.expires_at
    assert after.expires_at > time.time() - 0.1, "renewed while the tool ran"


def test_a_run_that_could_not_give_its_lease_back_does_not_block_the_next(
    store: tl.Store,
) -> None:
    """A run of this process whose store failed at the end kept its lease; it is over, so the
    next run here takes the session at once instead of waiting the lease out."""
    from toolledger import leases

    with ScriptedModel([Reply(text="hi"), Reply(text="again")]) as m:
        agent = tl.Agent(client=m.client(), model="x", tools=[], store=store)
        owner = f"{store.worker_id}/ended"
        stuck = Lease(session_id="s", owner=owner, token=1, expires_at=time.time() + 3600)
        store.backend.apply("s", [TakeLease(stuck, expect_token=0)])
        assert owner not in leases.live_runs
        run = agent.run(session="s", prompt="go")
    assert run.status is tl.RunStatus.COMPLETED
