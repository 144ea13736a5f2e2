"""Session leases: one worker per session, stale workers fenced off, crashed ones replaced."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
from toolledger._liveness import this_process
from toolledger.ops import HoldLease, TakeLease
from toolledger.records import Holder, Lease, Status
from toolledger.testing import elsewhere
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse
from toolledger.testing.world import World

from ..helpers import held_elsewhere
from .test_takeover import SHORT_TIMEOUT

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


def _stalled_heartbeats(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's lease heartbeat stops renewing: the worker stalls as a paused one does."""
    from toolledger.engine import _background as background

    monkeypatch.setattr(background.Heartbeats, "_renew", lambda self, io: None)


def _past_lease_and_deadline(store: tl.Store, session_id: str) -> None:
    """Sleep until the session's lease and every deadline its intents recorded have passed, on
    the store's clock: how long after its intent a worker reached its tool varies with load."""
    lease = store.backend.read_lease(session_id)
    assert lease is not None
    ends = [
        lease.expires_at,
        *(r.deadline for r in store.ledger(session_id).records() if r.deadline),
    ]
    time.sleep(max(0.0, max(ends) - store.now()) + 0.1)


@pytest.mark.parametrize("timeout", [300.0, SHORT_TIMEOUT])
def test_a_taken_over_worker_s_call_is_never_run_twice(
    store: tl.Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timeout: float
) -> None:
    """Worker A stalls inside a tool past its lease; B, on another host, takes the session over.
    B finds A's call in progress (A's deadline has not passed) or, past the deadline, in doubt —
    never runs it. A's outcome is refused by the fence for its checkpoint but still lands in the
    record (a compare-and-set needs no fence), so the next run answers from the ledger."""
    world = World(tmp_path / "w")
    release, entered = threading.Event(), threading.Event()

    @tl.tool(timeout=timeout)
    def slow_send(to: str, ctx: tl.ToolContext) -> str:
        """Send, slowly."""
        world.log_execution("slow_send", ctx)
        entered.set()
        assert release.wait(30)
        return "sent"

    alerts: list[tl.LedgerWriteError] = []
    _stalled_heartbeats(monkeypatch)
    with ScriptedModel([Reply(tool_uses=[CALL]), Reply(text="done")]) as m:
        a = tl.Agent(
            client=m.client(),
            model="x",
            tools=[slow_send],
            store=store,
            on_alert=alerts.append,
            lease_ttl=0.3,
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
        if timeout > SHORT_TIMEOUT:
            time.sleep(0.4)  # past the lease (never renewed), far short of the deadline
        else:
            _past_lease_and_deadline(store, "s")
        b = tl.Agent(
            client=m.client(), model="x", tools=[slow_send], store=elsewhere(store, skew=3600)
        )
        if timeout > SHORT_TIMEOUT:
            with pytest.raises(tl.EffectInProgressError) as info:
                b.run(session="s")
            assert info.value.until is not None
        else:
            run_b = b.run(session="s")
            assert run_b.status is tl.RunStatus.NEEDS_ATTENTION, "in doubt: A is past it"
        release.set()
        worker.join()
        (exc,) = outcome
        assert isinstance(exc, tl.LeaseLostError)
        assert alerts == [], "A's outcome was recorded after all"
        record = store.ledger("s").get(world.executions()[0]["tool_use_id"])
        assert record is not None and record.status is Status.SUCCEEDED
        again = b.run(session="s")
    assert again.status is tl.RunStatus.COMPLETED
    assert len(world.executions("slow_send")) == 1


def test_a_live_worker_s_lease_is_not_taken_by_a_skewed_clock(store: tl.Store) -> None:
    """A worker on another host whose clock is an hour ahead comes for a session whose holder,
    elsewhere, keeps renewing: on a server's clock the lease has not expired; on a file store
    (each machine's own clock) it is seen renewed. Busy either way — never taken."""
    with ScriptedModel([Reply(text="hi")]) as m:
        agent = tl.Agent(client=m.client(), model="x", tools=[], store=store, lease_ttl=30)
        ahead = tl.Agent(client=m.client(), model="x", tools=[], store=elsewhere(store, skew=3600))
        with held_elsewhere(store, "s", ttl=1.5, every=0.5):
            until = time.monotonic() + 2.0  # past its first expiry, across several renewals
            while time.monotonic() < until:
                with pytest.raises(tl.SessionBusyError):
                    ahead.run(session="s", prompt="go")
                with pytest.raises(tl.SessionBusyError):
                    agent.run(session="s", prompt="go")
    lease = store.backend.read_lease("s")
    assert lease is not None and lease.token == 1 and lease.renewals >= 3


def test_an_unrenewed_lease_is_taken_over(store: tl.Store) -> None:
    """A holder elsewhere that stopped renewing. On a server's clock its lease is free once it
    expires; on a file store, once this worker has watched it go a whole time to live without a
    renewal — which ``Agent.run`` waits for — whatever the expiry written says."""
    foreign = Lease(
        session_id="s",
        owner="elsewhere:4242:x",
        token=5,
        expires_at=store.now() + 0.3,
        holder=Holder(host="host-far", pidns="1", pid=4242, start=1),
        ttl=0.3,
    )
    store.backend.apply("s", [TakeLease(foreign, expect_token=0)])
    with ScriptedModel([Reply(text="hi")]) as m:
        agent = tl.Agent(client=m.client(), model="x", tools=[], store=store)
        began = time.monotonic()
        if store.shared_clock:
            with pytest.raises(tl.SessionBusyError, match="elsewhere:4242"):
                agent.run(session="s", prompt="go")
            time.sleep(0.4)
        run = agent.run(session="s", prompt="go")
        assert time.monotonic() - began >= 0.3, "never before a whole TTL without a renewal"
    assert run.status is tl.RunStatus.COMPLETED
    lease = store.backend.read_lease("s")
    assert lease is not None and lease.token == 6


def test_a_lease_expired_by_the_clock_but_renewed_is_not_taken_on_a_file_store(
    tmp_path: Path,
) -> None:
    """The wall-clock expiry a holder wrote says nothing on a file store: one an hour in the
    past, renewed while watched, keeps its session."""
    with tl.open_store(f"sqlite:///{tmp_path / 's.db'}") as store:
        stale_looking = Lease(
            session_id="s",
            owner="far:1:x/run",
            token=1,
            expires_at=store.now() - 3600,
            holder=Holder(host="host-far", pidns="1", pid=1, start=1),
            ttl=1.0,
        )
        store.backend.apply("s", [TakeLease(stale_looking, expect_token=0)])

        def renew() -> None:  # the holder's clock is an hour behind: so is what it writes
            store.backend.apply("s", [HoldLease("s", 1, store.now() - 3600)])

        with ScriptedModel([Reply(text="hi")]) as m:
            agent = tl.Agent(client=m.client(), model="x", tools=[], store=store, lease_ttl=1)
            timer = threading.Timer(0.3, renew)
            timer.start()
            with pytest.raises(tl.SessionBusyError, match="renewed"):
                agent.run(session="s", prompt="go")
            timer.join()
        lease = store.lease("s")
        assert lease is not None and (lease.token, lease.renewals) == (1, 1)


def _holder_of(pid: int) -> Holder:
    me = this_process().holder
    assert me is not None
    with open(f"/proc/{pid}/stat") as fh:
        start = int(fh.read().rsplit(")", 1)[1].split()[19])
    return Holder(host=me.host, pidns=me.pidns, pid=pid, start=start)


@pytest.mark.parametrize("how", ["exited", "zombie"])
def test_a_dead_local_holder_is_replaced_at_once(store: tl.Store, how: str) -> None:
    """A holder process of this host that has ended — reaped, or a zombie nobody reaped yet
    (``timeout -s KILL``, a container without an init) — frees the lease at once."""
    child = subprocess.Popen(["sleep", "60"])
    holder = _holder_of(child.pid)
    child.kill()
    if how == "exited":
        child.wait()
    else:
        deadline = time.time() + 10
        while _state(child.pid) != "Z" and time.time() < deadline:
            time.sleep(0.01)
        assert _state(child.pid) == "Z"
    dead = Lease(
        session_id="s",
        owner=f"{socket.gethostname()}:{child.pid}:x",
        token=1,
        expires_at=time.time() + 3600,
        holder=holder,
    )
    store.backend.apply("s", [TakeLease(dead, expect_token=0)])
    try:
        with ScriptedModel([Reply(text="hi")]) as m:
            run = tl.Agent(client=m.client(), model="x", tools=[], store=store).run(
                session="s", prompt="go"
            )
        assert run.status is tl.RunStatus.COMPLETED
    finally:
        child.wait()


def test_a_live_local_holder_keeps_its_session_past_the_expiry(store: tl.Store) -> None:
    """A paused worker on this host is known alive: nobody takes its session, expired or not."""
    child = subprocess.Popen(["sleep", "60"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        paused = Lease(
            session_id="s",
            owner=f"{socket.gethostname()}:{child.pid}:x",
            token=1,
            expires_at=time.time() - 10,
            holder=_holder_of(child.pid),
        )
        store.backend.apply("s", [TakeLease(paused, expect_token=0)])
        with ScriptedModel([Reply(text="hi")]) as m:
            agent = tl.Agent(client=m.client(), model="x", tools=[], store=store)
            with pytest.raises(tl.SessionBusyError, match="is alive"):
                agent.run(session="s", prompt="go")
    finally:
        child.kill()
        child.wait()


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


def test_the_heartbeat_keeps_a_long_tool_s_lease(store: tl.Store, tmp_path: Path) -> None:
    seen: list[Lease | None] = []
    read_at: list[float] = []

    @tl.tool(effect="read_only")
    def slow_read() -> str:
        """Read slowly."""
        first = store.backend.read_lease("s")
        # Long enough for the lease to expire twice over; then until the heartbeat renewed it
        # (a loaded machine may give its thread a late turn), within a bound.
        time.sleep(0.6)
        later = store.backend.read_lease("s")
        deadline = time.monotonic() + 10
        while (
            first is not None
            and later is not None
            and later.expires_at <= first.expires_at
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
            later = store.backend.read_lease("s")
        read_at.append(time.time())
        seen.extend([first, later])
        return "ok"

    with ScriptedModel([Reply(tool_uses=[ToolUse("slow_read")]), Reply(text="done")]) as m:
        agent = tl.Agent(
            client=m.client(), model="x", tools=[slow_read], store=store, lease_ttl=0.3
        )
        assert agent.run(session="s", prompt="go").status is tl.RunStatus.COMPLETED
    before, after = seen
    assert before is not None and after is not None
    assert after.token == before.token and after.expires_at > before.expires_at
    assert after.renewals > before.renewals
    # Live when it was read, inside the tool: measured then, not after the run's last model
    # call and its end, which a loaded machine can stretch past the lease's 0.3 s.
    assert after.expires_at > read_at[0] - 0.1, "renewed while the tool ran"


def test_a_run_that_could_not_give_its_lease_back_does_not_block_the_next(
    store: tl.Store,
) -> None:
    """A run of this process whose store failed at the end kept its lease; it is over, so the
    next run here takes the session at once instead of waiting the lease out."""
    with ScriptedModel([Reply(text="hi"), Reply(text="again")]) as m:
        agent = tl.Agent(client=m.client(), model="x", tools=[], store=store)
        owner = f"{store.worker_id}/ended"
        stuck = Lease(
            session_id="s",
            owner=owner,
            token=1,
            expires_at=time.time() + 3600,
            holder=this_process().holder,
        )
        store.backend.apply("s", [TakeLease(stuck, expect_token=0)])
        assert owner not in store.runtime.live_runs
        run = agent.run(session="s", prompt="go")
    assert run.status is tl.RunStatus.COMPLETED


def test_a_run_stuck_on_the_store_stops_renewing_its_lease(store: tl.Store) -> None:
    """Only a worker that makes progress keeps its lease: a run whose own store operation has
    hung for more than a third of the lease's life is not renewed, so another worker can take
    the session over once it expires (and the fence refuses whatever the stuck run writes)."""
    from toolledger.engine import _background as background
    from toolledger.engine._drivers import Fence, IOContext

    io = IOContext(store=store, session_id="s")
    lease = Lease(
        session_id="s",
        owner="me/run",
        token=1,
        expires_at=store.now() + 0.3,
        holder=this_process().holder,
    )
    store.backend.apply("s", [TakeLease(lease, expect_token=0)])
    io.fence = Fence(lease, 0.3)
    beats = background.Heartbeats()
    beats._renew(io)
    renewed = store.backend.read_lease("s")
    assert renewed is not None and renewed.expires_at > lease.expires_at
    io.busy_since = time.monotonic() - 1.0  # its store call has hung for a second
    beats._renew(io)
    after = store.backend.read_lease("s")
    assert after == renewed, "not renewed while stuck"


def test_a_renewal_never_revives_a_lease_given_back(store: tl.Store) -> None:
    from toolledger.ops import DropLease, HoldLease

    lease = Lease(session_id="s", owner="o", token=1, expires_at=store.now() + 30)
    store.backend.apply("s", [TakeLease(lease, expect_token=0)])
    store.backend.apply("s", [DropLease("s", 1)])
    with pytest.raises(tl.LeaseLostError):
        store.backend.apply("s", [HoldLease("s", 1, store.now() + 30)])
    given_back = store.backend.read_lease("s")
    assert given_back is not None and given_back.expires_at == 0.0


def test_a_commit_renews_the_lease_only_once_a_third_of_it_has_passed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every commit is fenced; while the run's last renewal is younger than a third of the ttl
    (on this process's monotonic clock) the fence only checks the token. A heartbeat always
    renews. A wall clock that steps changes none of it. A run taken over meanwhile is refused
    either way."""
    from toolledger.engine._io import IOContext
    from toolledger.engine._io import hold as _hold
    from toolledger.engine._requests import Fence
    from toolledger.ops import HoldLease, InsertEffect
    from toolledger.testing.conformance import make_record

    clock = [1000.0]  # the store's (wall) clock
    ticks = [50.0]  # this process's monotonic clock
    with tl.open_store("memory://") as store:
        monkeypatch.setattr(store.backend, "now", lambda: clock[0])
        monkeypatch.setattr(store.runtime, "monotonic", lambda: ticks[0])
        lease = Lease(session_id="s", owner="o", token=1, expires_at=1030.0)
        store.apply("s", [TakeLease(lease, expect_token=0)])
        io = IOContext(store=store, session_id="s")
        _hold(io, Fence(lease, 30.0))

        def commit(tool_use_id: str) -> HoldLease:
            ops = io.fenced([InsertEffect(make_record(tool_use_id=tool_use_id))])
            assert store.apply("s", ops) == [True, True]
            io.landed(ops)
            fence = ops[0]
            assert isinstance(fence, HoldLease) and fence.token == 1
            return fence

        ticks[0], clock[0] = 59.0, 1009.0  # 9 s of 30 since the lease was taken: only checked
        assert commit("t1").expires_at is None
        assert store.lease("s") == lease
        ticks[0], clock[0] = 61.0, 1011.0  # past a third: this commit renews
        assert commit("t2").expires_at == 1041.0
        renewed = Lease(session_id="s", owner="o", token=1, expires_at=1041.0, renewals=1)
        assert store.lease("s") == renewed
        ticks[0], clock[0] = 62.0, 1612.0  # the wall clock stepped 10 minutes ahead: not a renewal
        assert commit("t3").expires_at is None
        ticks[0], clock[0] = 63.0, 413.0  # …nor back: still 2 s since the last renewal
        assert commit("t3b").expires_at is None
        beat = io.fenced([])  # a heartbeat renews whatever the age
        assert beat == [HoldLease("s", 1, 443.0)]
        store.apply("s", beat)
        io.landed(beat)
        ticks[0], clock[0] = 72.0, 422.0  # 9 s after the heartbeat's renewal
        assert commit("t4").expires_at is None

        # Taken over (as a run paused past its lease is): refused, renewing or not.
        theirs = Lease(session_id="s", owner="p", token=2, expires_at=2000.0)
        store.apply("s", [TakeLease(theirs, expect_token=1)])
        for at in (82.0, 600.0):
            ticks[0] = at
            ops = io.fenced([InsertEffect(make_record(tool_use_id=f"late-{at}"))])
            with pytest.raises(tl.LeaseLostError):
                store.apply("s", ops)
            assert store.ledger("s").get(f"late-{at}") is None
        assert store.lease("s") == theirs


def test_a_run_bounds_its_store_operations_by_a_third_of_its_lease(store: tl.Store) -> None:
    """While a run holds its lease, no store operation of it may outlast a third of the lease's
    time to live (the store's own deadline applies outside runs)."""
    from toolledger.stores.contract import OP_BUDGET

    seen: list[float | None] = []

    @tl.tool(effect="read_only")
    def look() -> str:
        """Look."""
        seen.append(OP_BUDGET.get())
        return "ok"

    script = [Reply(tool_uses=[ToolUse("look", {})]), Reply(text="done")]
    with ScriptedModel(script) as m:
        agent = tl.Agent(client=m.client(), model="x", tools=[look], store=store, lease_ttl=0.9)
        assert agent.run(session="s", prompt="go").status is tl.RunStatus.COMPLETED
    assert seen == [pytest.approx(0.3)]
    assert OP_BUDGET.get() is None, "nothing left behind once the run is over"


def test_a_thread_that_reads_the_lease_just_taken_by_another_finds_it_held(
    store: tl.Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two threads of one process run one session. The first has just committed its lease and
    not yet gone on (descheduled between the take and its first read): the second must find
    the session busy (``SessionBusyError``), not judge the lease left by an ended run of this
    process and take it over — which would fail the first with ``LeaseLostError``."""
    from toolledger.engine import _drivers

    taken, go = threading.Event(), threading.Event()
    real = _drivers.hold

    def paused(io: Any, fence: Any) -> None:
        if not taken.is_set():
            taken.set()
            assert go.wait(30)
        real(io, fence)

    monkeypatch.setattr(_drivers, "hold", paused)
    world = World(tmp_path / "w")
    tool = blocking_tool(world, threading.Event(), threading.Event())
    with ScriptedModel([Reply(text="done")]) as m:
        agent = tl.Agent(client=m.client(), model="x", tools=[tool], store=store)
        first: list[object] = []

        def run() -> None:
            try:
                first.append(agent.run(session="s", prompt="go"))
            except BaseException as exc:
                first.append(exc)

        worker = threading.Thread(target=run)
        worker.start()
        try:
            assert taken.wait(30)
            with pytest.raises(tl.SessionBusyError):
                agent.run(session="s", prompt="go")
        finally:
            go.set()
            worker.join(30)
    (ran,) = first
    assert isinstance(ran, tl.Run) and ran.status is tl.RunStatus.COMPLETED, ran


@pytest.mark.parametrize("where", ["commit", "hold"])
def test_a_take_an_interrupt_cut_off_is_given_back_for_this_host_s_other_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Ctrl-C lands as the lease take commits (its reply never read) or just after, before the
    driver held it: no run of this process holds the lease, but this host's other processes
    judge it by its holder — this process, alive — and would find the session busy for as long
    as this process lives (a notebook, a server). The take is given back in the background,
    and another process then takes the session at once."""
    from toolledger.engine import _drivers

    url = f"sqlite:///{tmp_path / 'l.db'}"
    fired: list[bool] = []
    if where == "commit":
        real_commit = _drivers.commit_now

        def cut(io: Any, ops: list[Any], **kw: Any) -> Any:
            answer = real_commit(io, ops, **kw)
            if isinstance(ops[0], TakeLease) and not fired:
                fired.append(True)
                raise KeyboardInterrupt  # landed; its answer never reaches the run
            return answer

        monkeypatch.setattr(_drivers, "commit_now", cut)
    else:
        real_hold = _drivers.hold

        def interrupted(io: Any, fence: Any) -> None:
            if not fired:
                fired.append(True)
                raise KeyboardInterrupt
            real_hold(io, fence)

        monkeypatch.setattr(_drivers, "hold", interrupted)
    with tl.open_store(url) as store, ScriptedModel([Reply(text="done")]) as m:
        agent = tl.Agent(client=m.client(), model="x", tools=[], store=store, lease_ttl=60)
        with pytest.raises(KeyboardInterrupt):
            agent.run(session="s", prompt="go")
        assert fired
        deadline = time.monotonic() + 15
        while (lease := store.lease("s")) is not None and lease.expires_at > 0:
            assert time.monotonic() < deadline, f"the take is still held: {lease}"
            time.sleep(0.1)
        assert lease is not None and lease.holder is not None  # it landed, and was given back
    verdict = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, toolledger as tl\n"
            "with tl.open_store(sys.argv[1]) as s:\n"
            "    print(type(s.lease_state(s.lease('s'))).__name__)",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert verdict.stdout.strip() == "Over", verdict


def test_an_interrupt_between_the_take_and_its_hold_leaves_no_run_registered(
    store: tl.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C lands after the lease take committed and before the driver held it (a notebook,
    a server that survives it): the run is not left registered as this process's live one,
    so once the lease's time to live has passed the session runs again here."""
    from toolledger.engine import _drivers

    real = _drivers.hold
    fired: list[bool] = []

    def interrupted(io: Any, fence: Any) -> None:
        if not fired:
            fired.append(True)
            raise KeyboardInterrupt
        real(io, fence)

    monkeypatch.setattr(_drivers, "hold", interrupted)
    with ScriptedModel([Reply(text="done")]) as m:
        agent = tl.Agent(client=m.client(), model="x", tools=[], store=store, lease_ttl=1.0)
        with pytest.raises(KeyboardInterrupt):
            agent.run(session="s", prompt="go")
        taken = store.lease("s")
        assert fired and taken is not None  # the take landed; its run is not this process's
        assert taken.owner not in store.runtime.live_runs
        time.sleep(1.5)  # past the lease's time to live
        run = agent.run(session="s", prompt="go")
    assert run.status is tl.RunStatus.COMPLETED
