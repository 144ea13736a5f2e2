"""Is an attempt (or a lease holder) still alive? ``toolledger.liveness``, against real
processes: alive, ended, a zombie, a reused pid, this process, another host, a released attempt,
an attempt written by toolledger 0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import replace

import pytest

import toolledger as tl
from toolledger.codec import input_hash
from toolledger.liveness import (
    LEGACY_TIMEOUT,
    Over,
    Running,
    flight_key,
    judge,
    lease_state,
    this_process,
)
from toolledger.ops import InsertEffect
from toolledger.records import EffectRecord, Holder, Lease, Status
from toolledger.testing import elsewhere
from toolledger.testing.elsewhere import Elsewhere

from .conftest import tool_use

ME = this_process()
URL = "memory://liveness"


def _start_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[19])


def _state_of(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


def local(pid: int, start: int | None = None) -> Holder:
    me = ME.holder
    assert me is not None
    return Holder(
        host=me.host, pidns=me.pidns, pid=pid, start=_start_of(pid) if start is None else start
    )


def started(
    holder: Holder | None,
    *,
    deadline: float | None,
    at: float | None = None,
    lease_token: int | None = None,
) -> EffectRecord:
    at = time.time() if at is None else at
    return EffectRecord(
        session_id="s",
        tool_use_id="t",
        tool="send",
        input_hash=input_hash({"to": "a"}),
        status=Status.STARTED,
        attempt=1,
        created_at=at,
        updated_at=at,
        worker="w",
        holder=holder,
        lease_token=lease_token,
        deadline=deadline,
    )


def verdict(
    record: EffectRecord, *, lease: Lease | None = None, now: float | None = None
) -> object:
    return judge(record, now=time.time() if now is None else now, lease=lease, runtime=ME, url=URL)


# -- who this process is ------------------------------------------------------------------------


def test_this_process_knows_who_it_is() -> None:
    me = ME.holder
    assert me is not None
    assert me.pid == os.getpid() and me.start == _start_of(os.getpid())
    with open("/proc/sys/kernel/random/boot_id") as fh:
        assert me.host == os.environ.get("TOOLLEDGER_HOST_ID", fh.read().strip())
    assert me.pidns == os.readlink("/proc/self/ns/pid").partition("[")[2].rstrip("]")
    assert Holder.parse(me.text()) == me


@pytest.mark.parametrize("text", [None, "", "host:12:abc", "a/b/c", "h/ns/x/1"])
def test_an_unreadable_holder_is_no_holder(text: str | None) -> None:
    assert Holder.parse(text) is None


# -- processes of this process table ---------------------------------------------------------


def test_a_live_process_of_this_host_is_running_even_past_its_deadline() -> None:
    child = subprocess.Popen(["sleep", "60"])
    try:
        record = started(local(child.pid), deadline=time.time() - 3600)
        got = verdict(record)
        assert isinstance(got, Running) and "alive" in got.why
        os.kill(child.pid, signal.SIGSTOP)  # paused: still alive, still its attempt
        assert isinstance(verdict(record), Running)
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("how", ["reaped", "zombie", "reused pid"])
def test_an_ended_process_of_this_host_is_over_at_once(how: str) -> None:
    child = subprocess.Popen(["sleep", "60"])
    holder = local(child.pid)
    if how == "reused pid":
        holder = replace(holder, start=holder.start - 1)  # the pid now names another process
    else:
        child.kill()
        if how == "reaped":
            child.wait()
        else:
            deadline = time.time() + 10
            while _state_of(child.pid) != "Z" and time.time() < deadline:
                time.sleep(0.01)
            assert _state_of(child.pid) == "Z"
    try:
        got = verdict(started(holder, deadline=time.time() + 3600))
        assert isinstance(got, Over) and "ended" in got.why
    finally:
        child.kill()
        child.wait()


def test_this_process_runs_an_attempt_exactly_while_it_is_registered() -> None:
    record = started(ME.holder, deadline=time.time() + 3600)
    key = flight_key(URL, "s", "t")
    assert isinstance(verdict(record), Over), "started here, not running here"
    ME.in_flight.add(key)
    try:
        assert isinstance(verdict(record), Running)
        other_store = judge(record, now=time.time(), lease=None, runtime=ME, url="memory://x")
        assert isinstance(other_store, Over), "registered per store"
    finally:
        ME.in_flight.discard(key)
    assert isinstance(verdict(record), Over)


def test_another_pid_namespace_of_this_host_is_judged_as_another_host() -> None:
    """A container of this kernel (same boot id, other PID namespace): its pid means nothing
    in our process table — its attempt runs until its deadline."""
    me = ME.holder
    assert me is not None
    container = Holder(host=me.host, pidns="4026599999", pid=os.getpid(), start=me.start)
    assert isinstance(verdict(started(container, deadline=time.time() + 60)), Running)
    assert isinstance(verdict(started(container, deadline=time.time() - 1)), Over)


# -- other hosts: lease and deadline on the store's clock -----------------------------------------


def test_another_host_runs_while_its_lease_is_held_or_until_its_deadline() -> None:
    far = Holder(host="far-away", pidns="1", pid=12, start=5)
    now = 1_000_000.0
    lease = Lease(session_id="s", owner="far:12:x/r", token=3, expires_at=now + 10, holder=far)
    held = started(far, deadline=now - 100, lease_token=3)
    assert isinstance(verdict(held, lease=lease, now=now), Running)
    assert isinstance(verdict(held, lease=replace(lease, token=4), now=now), Over)
    assert isinstance(verdict(held, lease=replace(lease, expires_at=now - 1), now=now), Over)
    fresh = started(far, deadline=now + 5)
    got = verdict(fresh, now=now)
    assert isinstance(got, Running) and got.until == now + 5
    assert isinstance(verdict(fresh, now=now + 5), Over)


def test_a_released_attempt_is_over_at_once() -> None:
    record = started(None, deadline=time.time() + 3600)
    assert record.released and isinstance(verdict(record), Over)


def test_an_attempt_written_by_toolledger_0_1_runs_for_the_old_claim_timeout() -> None:
    now = time.time()
    legacy = replace(started(None, deadline=None, at=now - 10), worker=f"host:{os.getpid()}:x")
    assert isinstance(verdict(legacy, now=now), Running)
    assert isinstance(verdict(legacy, now=now - 10 + LEGACY_TIMEOUT + 1), Over)


# -- leases ------------------------------------------------------------------------------------


def test_lease_states() -> None:
    now = time.time()
    far = Lease(
        session_id="s",
        owner="far",
        token=1,
        expires_at=now + 5,
        holder=Holder(host="far", pidns="1", pid=1, start=1),
    )
    assert isinstance(lease_state(None, now=now, runtime=ME), Over)
    assert isinstance(lease_state(far, now=now, runtime=ME), Running)
    assert isinstance(lease_state(far, now=now + 6, runtime=ME), Over)
    assert isinstance(lease_state(replace(far, expires_at=0.0), now=now, runtime=ME), Over)
    mine = replace(far, owner="me/run", holder=ME.holder, expires_at=now - 5)
    assert isinstance(lease_state(mine, now=now, runtime=ME), Over), "no run of ours holds it"
    ME.live_runs.add("me/run")
    try:
        assert isinstance(lease_state(mine, now=now, runtime=ME), Running), "past expiry"
    finally:
        ME.live_runs.discard("me/run")


# -- every path says "in progress" --------------------------------------------------------------


def test_run_tool_uses_refuses_a_call_another_host_is_running(store: tl.Store) -> None:
    far = elsewhere(store, "host-far")
    holder = far.runtime.holder
    record = replace(started(holder, deadline=store.now() + 60), session_id="s")
    store.backend.apply("s", [InsertEffect(record)])

    @tl.tool
    def send(to: str) -> str:
        raise AssertionError("must not run")

    with pytest.raises(tl.EffectInProgressError) as info:
        tl.run_tool_uses([tool_use("t", "send", to="a")], [send], ledger=store.ledger("s"))
    assert info.value.holder == "w" and info.value.until == record.deadline
    with pytest.raises(tl.EffectInProgressError, match="--force"):
        store.ledger("s").resolve("t", happened=False, by="ana")
    assert store.ledger("s").in_doubt() == []
    ((listed, state),) = store.started()
    assert listed == record and isinstance(state, Running)
    forced = store.ledger("s").resolve("t", happened=False, by="ana", force=True)
    assert forced.status is Status.NOT_HAPPENED and "forced while attempt 1" in (forced.error or "")


def test_a_runtime_of_another_host_sees_only_its_own_process_table() -> None:
    there = Elsewhere("host-z")
    assert there.holder is not None
    assert there.shares_process_table(there.holder)
    mine = ME.holder
    assert mine is not None and not there.shares_process_table(mine)
