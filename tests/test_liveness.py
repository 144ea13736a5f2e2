"""Is an attempt (or a lease holder) still alive? ``toolledger._liveness``, against real processes
(alive, ended, a zombie, a reused pid, this process) and against process tables that lie or hide
(``FakeProc``: no ``/proc``, a ``/proc`` of another PID namespace, hidden entries, time
namespaces), clocks that step, and leases watched on a monotonic clock this test drives.

The rule under test (docs/design.md, rule 18): alive, ended or *unknown* — and unknown is never
ended.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

import toolledger as tl
from toolledger._liveness import (
    LEGACY_TIMEOUT,
    Over,
    Running,
    Runtime,
    Watch,
    flight_key,
    judge,
    lease_state,
    this_process,
)
from toolledger._liveness._identity import TICKS, evidence, identify
from toolledger.codec import input_hash
from toolledger.ops import InsertEffect
from toolledger.records import EffectRecord, Holder, Lease, Status
from toolledger.testing import elsewhere

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
    """A process of this process table, named as a worker of this release names itself."""
    shown = _start_of(pid) if start is None else start
    return replace(ME.holder, pid=pid, start=shown - ME.identity.offset)


def started(
    holder: Holder | None,
    *,
    deadline: float | None,
    at: float | None = None,
    lease_token: int | None = None,
    boot_deadline: str | None = None,
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
        boot_deadline=boot_deadline,
    )


def verdict(
    record: EffectRecord,
    *,
    lease: Lease | None = None,
    now: float | None = None,
    runtime: Runtime = ME,
    shared_clock: bool = True,
) -> object:
    return judge(
        record,
        now=time.time() if now is None else now,
        lease=lease,
        runtime=runtime,
        url=URL,
        shared_clock=shared_clock,
    )


# -- a process table that lies or hides -----------------------------------------------------------


@dataclass
class FakeProc:
    """A process's view of a made-up machine: ``entries`` are ``/proc/PID/stat``'s (state,
    start as shown to this process), ``hidden`` pids exist but cannot be read."""

    pid: int = 500
    self_link: str | None = "500"
    boot: str | None = "boot-a"
    pidns: str | None = "pid:[4026531836]"
    timens: str | None = "time:[4026531834]"
    timens_children: str | None = None
    offsets: str | None = "monotonic 0 0\nboottime 0 0"
    entries: dict[int, tuple[str, int]] = field(default_factory=lambda: {500: ("R", 1000)})
    hidden: set[int] = field(default_factory=set)
    booted: float | None = 1_000.0

    def getpid(self) -> int:
        return self.pid

    def read(self, path: str) -> str | None:
        if path == "/proc/sys/kernel/random/boot_id":
            return self.boot
        if path == "/proc/self/timens_offsets":
            return self.offsets
        pid_text = path.split("/")[2]
        pid = self.pid if pid_text == "self" else int(pid_text)
        if pid in self.hidden or pid not in self.entries:
            return None
        state, start = self.entries[pid]
        return f"{pid} (py) {state}" + " 0" * 18 + f" {start}"

    def readlink(self, path: str) -> str | None:
        return {
            "/proc/self": self.self_link,
            "/proc/self/ns/pid": self.pidns,
            "/proc/self/ns/time": self.timens,
            "/proc/self/ns/time_for_children": self.timens_children or self.timens,
        }.get(path)

    def signal0(self, pid: int) -> bool | None:
        return pid in self.entries or pid in self.hidden

    def host_id(self) -> str | None:
        return None

    def boottime(self) -> float | None:
        return self.booted


class Ticker:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


# -- who this process is ------------------------------------------------------------------------


def test_this_process_knows_who_it_is() -> None:
    me = ME.holder
    assert me.known and ME.identity.why is None
    assert me.pid == os.getpid() and me.start == _start_of(os.getpid()) - ME.identity.offset
    with open("/proc/sys/kernel/random/boot_id") as fh:
        boot = fh.read().strip()
    assert me.boot == boot and me.host == os.environ.get("TOOLLEDGER_HOST_ID", boot)
    assert me.pidns == os.readlink("/proc/self/ns/pid").partition("[")[2].rstrip("]")
    assert me.timens == os.readlink("/proc/self/ns/time").partition("[")[2].rstrip("]")
    assert Holder.parse(me.text()) == me


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"self_link": None}, "no /proc can be read"),
        ({"self_link": "91234"}, "another PID namespace's"),
        ({"entries": {}}, "own /proc entry cannot be read"),
        ({"pidns": None}, "PID namespace cannot be read"),
        ({"boot": None}, "boot id cannot be read"),
        ({"offsets": None}, "time namespace offsets cannot be read"),
        ({"timens_children": "time:[4026599999]"}, "time namespace offsets cannot be read"),
    ],
)
def test_a_process_that_cannot_prove_its_table_has_an_unknown_identity(
    change: dict[str, object], why: str
) -> None:
    found = identify(FakeProc(**change))  # type: ignore[arg-type]
    assert not found.holder.known and found.holder.pid == 500
    assert found.why is not None and why in found.why
    assert found.holder == Holder.unknown(500)


def test_a_kernel_without_time_namespaces_names_none() -> None:
    found = identify(FakeProc(timens=None, offsets=None))
    assert found.holder.known and found.holder.timens == "" and found.holder.start == 1000


def test_start_times_are_normalised_by_the_time_namespace() -> None:
    """In a namespace whose boot time runs 50 s ahead, /proc shows 5000 ticks more; the holder
    names its start as the initial namespace would."""
    shown = 1000 + 50 * TICKS
    inside = FakeProc(
        timens="time:[4026532174]",
        offsets="monotonic 50 0\nboottime 50 0",
        entries={500: ("R", shown)},
    )
    found = identify(inside)
    assert found.holder.start == 1000 and found.offset == 50 * TICKS


# -- stored forms -------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [None, "", "host:12:abc", "a/b/c", "h/ns/x/1", "v2;b/ns/1/2"])
def test_an_unreadable_holder_is_no_holder(text: str | None) -> None:
    assert Holder.parse(text) is None


def test_every_holder_round_trips_and_reads_safely_in_older_releases() -> None:
    full = Holder(host="b", pidns="4", pid=7, start=9, boot="b", timens="3")
    named = replace(full, host="rack-1")  # TOOLLEDGER_HOST_ID
    unknown = Holder.unknown(7)
    legacy = Holder(host="b", pidns="4", pid=7, start=9)
    for h in (full, named, unknown, legacy):
        assert Holder.parse(h.text()) == h
    assert unknown.text() == "//7/0"
    # What an earlier release's parser (rsplit into four) makes of them: never a holder of its
    # own process table (host and PID namespace both equal to its own), so it judges them by
    # lease and deadline — and never "no holder" (its "released").
    for h in (full, named, unknown):
        old_host, old_pidns, pid, start = h.text().rsplit("/", 3)
        assert pid.isdigit() and start.isdigit()
        assert (old_host, old_pidns) != ("b", "4")


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
        assert isinstance(other_store, Over), "registered per store (its place)"
    finally:
        ME.in_flight.discard(key)
    assert isinstance(verdict(record), Over)


def test_another_pid_namespace_of_this_host_is_judged_as_another_host() -> None:
    """A container of this kernel (same boot id, other PID namespace): its pid means nothing
    in our process table — its attempt runs until its deadline."""
    container = replace(ME.holder, pidns="4026599999", pid=os.getpid())
    assert isinstance(verdict(started(container, deadline=time.time() + 60)), Running)
    assert isinstance(verdict(started(container, deadline=time.time() - 1)), Over)


# -- what a table that hides or lies can prove ------------------------------------------------


def _me(proc: FakeProc) -> tuple[FakeProc, Holder]:
    found = identify(proc)
    assert found.holder.known
    return proc, found.holder


def test_an_entry_hidden_from_this_uid_is_unknown_not_ended() -> None:
    proc, me = _me(FakeProc(hidden={600}))
    other = replace(me, pid=600, start=2000)
    assert evidence(proc, identify(proc), other) is None
    runtime = Runtime(proc)
    # Unknown: judged by its deadline (no lease), not "its process has ended".
    assert isinstance(verdict(started(other, deadline=time.time() + 60), runtime=runtime), Running)


def test_a_pid_nobody_has_is_ended_even_without_reading_proc() -> None:
    proc, me = _me(FakeProc())
    assert evidence(proc, identify(proc), replace(me, pid=601, start=2000)) is False


def test_a_reused_pid_is_ended_only_where_start_times_compare() -> None:
    proc, me = _me(FakeProc(entries={500: ("R", 1000), 600: ("S", 3000)}))
    mine = identify(proc)
    same_ns = replace(me, pid=600, start=2000)
    other_ns = replace(same_ns, timens="4026532174")
    legacy = Holder(host=me.host, pidns=me.pidns, pid=600, start=2000)
    assert evidence(proc, mine, same_ns) is False
    assert evidence(proc, mine, other_ns) is None  # another time namespace: cannot compare
    assert evidence(proc, mine, legacy) is None  # written before starts were normalised
    assert evidence(proc, mine, replace(legacy, start=3000)) is True
    assert evidence(proc, mine, replace(same_ns, start=3000)) is True


def test_a_holder_of_another_time_namespace_is_recognised_alive() -> None:
    """The same process, read from a time namespace 50 s ahead: its start shows 5000 ticks
    later there, and still names it."""
    shown_inside = 2000 + 50 * TICKS
    proc = FakeProc(
        timens="time:[4026532174]",
        offsets="monotonic 50 0\nboottime 50 0",
        entries={500: ("R", 1000 + 50 * TICKS), 600: ("S", shown_inside)},
    )
    mine = identify(proc)
    holder_outside = replace(mine.holder, pid=600, start=2000, timens="4026531834")
    assert evidence(proc, mine, holder_outside) is True


def test_an_unknown_holder_is_never_judged_by_a_process_table() -> None:
    proc, _ = _me(FakeProc(entries={500: ("R", 1000)}))
    unknown = Holder.unknown(600)  # pid 600 does not exist here — it says nothing
    assert evidence(proc, identify(proc), unknown) is None
    runtime = Runtime(proc)
    assert isinstance(
        verdict(started(unknown, deadline=time.time() + 60), runtime=runtime), Running
    )
    assert isinstance(verdict(started(unknown, deadline=time.time() - 1), runtime=runtime), Over)
    # …and an unknown process is never "me" either: not over because it is not in flight here.
    me_unknown = Runtime(FakeProc(self_link=None))
    assert isinstance(
        verdict(started(me_unknown.holder, deadline=time.time() + 60), runtime=me_unknown),
        Running,
    )


# -- deadlines and clocks -----------------------------------------------------------------------


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


def test_a_deadline_on_this_machine_s_boot_clock_ignores_the_wall_clock() -> None:
    """Containers of one kernel share its boot clock: a deadline written on it is judged on it,
    whether the wall clock stepped forward (past the wall deadline) or back."""
    proc = FakeProc(booted=1_000.0)
    runtime = Runtime(proc)
    far = Holder(host="boot-a", pidns="4026599999", pid=7, start=1)  # another container
    wall = 5_000_000.0
    record = started(far, deadline=wall + 30, at=wall, boot_deadline="boot-a/1030.000")
    stepped_ahead = verdict(record, now=wall + 600, runtime=runtime, shared_clock=False)
    assert isinstance(stepped_ahead, Running) and "boot clock" in stepped_ahead.why
    proc.booted = 1_031.0
    stepped_back = verdict(record, now=wall - 600, runtime=runtime, shared_clock=False)
    assert isinstance(stepped_back, Over)
    # Another kernel's boot clock says nothing here: for a call run without a lease, the
    # deadline alone, on a wall clock that may have stepped — so it is watched for its timeout.
    ticker = Ticker()
    runtime = Runtime(proc, monotonic=ticker)
    other = replace(record, boot_deadline="boot-z/99999.000")
    first = verdict(other, now=wall + 600, runtime=runtime, shared_clock=False)
    assert isinstance(first, Running) and first.watch == 30.0
    ticker.t += 30.0
    assert isinstance(verdict(other, now=wall + 600, runtime=runtime, shared_clock=False), Over)


def test_a_deadline_a_stepped_back_clock_pushes_away_is_believed_for_one_timeout() -> None:
    """No boot clock to compare (another machine, macOS), and the worker's lease gone: the
    wall-clock deadline — but once this process has watched the attempt for its whole timeout
    (its deadline less its time), it is over, however far back the clock stepped."""
    ticker = Ticker()
    runtime = Runtime(FakeProc(booted=None), monotonic=ticker)
    far = Holder(host="far", pidns="1", pid=7, start=1)
    record = started(far, deadline=1_000_030.0, at=1_000_000.0, lease_token=4)
    back = 1_000_000.0 - 600  # the clock stepped back 600 s since the intent
    first = verdict(record, now=back, runtime=runtime, shared_clock=False)
    assert isinstance(first, Running) and first.watch == 30.0
    ticker.t += 29.0
    assert isinstance(verdict(record, now=back + 29, runtime=runtime, shared_clock=False), Running)
    ticker.t += 1.0
    got = verdict(record, now=back + 30, runtime=runtime, shared_clock=False)
    assert isinstance(got, Over) and "stepped back" in got.why
    # On a server's clock (PostgreSQL), the deadline is the deadline.
    assert isinstance(verdict(record, now=back + 30, runtime=runtime, shared_clock=True), Running)


@pytest.mark.parametrize("step", [-600.0, 0.0, 600.0])
def test_a_call_run_without_a_lease_and_no_boot_clock_is_watched_for_its_timeout(
    step: float,
) -> None:
    """``run_tool_uses`` on macOS: no lease to watch, no boot clock to read — the deadline is
    all there is, on a wall clock that may have stepped. However the clock stepped, the call is
    in progress until this process has watched it for its whole timeout, and over then."""
    ticker = Ticker()
    runtime = Runtime(FakeProc(self_link=None, booted=None), monotonic=ticker)
    record = started(Holder.unknown(77), deadline=1_000_030.0, at=1_000_000.0)
    now = 1_000_001.0 + step
    got = verdict(record, now=now, runtime=runtime, shared_clock=False)
    assert isinstance(got, Running) and got.watch == 30.0 and "no lease" in got.why
    ticker.t += 29.9
    assert isinstance(verdict(record, now=now, runtime=runtime, shared_clock=False), Running)
    ticker.t += 0.1
    assert isinstance(verdict(record, now=now, runtime=runtime, shared_clock=False), Over)


def test_a_released_attempt_is_over_at_once() -> None:
    record = started(None, deadline=time.time() + 3600)
    assert record.released and isinstance(verdict(record), Over)


def test_an_attempt_written_by_toolledger_0_1_runs_for_the_old_claim_timeout() -> None:
    now = time.time()
    legacy = replace(started(None, deadline=None, at=now - 10), worker=f"host:{os.getpid()}:x")
    assert isinstance(verdict(legacy, now=now), Running)
    assert isinstance(verdict(legacy, now=now - 10 + LEGACY_TIMEOUT + 1), Over)


def test_a_lease_written_by_toolledger_0_1_is_judged_by_its_renewals_not_its_pid() -> None:
    """0.1 named a lease's owner ``host:pid`` only. A pid of this hostname that this process
    table lacks may be a live worker of another PID namespace sharing the hostname (a container
    on the host's network): unknown, not ended — the lease holds until it expires on a
    server's clock, or is watched unrenewed for its time to live."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    now = time.time()
    legacy = Lease(
        session_id="s",
        owner=f"{socket.gethostname()}:{gone.pid}:0123abcd",
        token=3,
        expires_at=now + 30,
        holder=None,
    )
    assert isinstance(lease_state(legacy, now=now, runtime=ME, shared_clock=True), Running)
    assert isinstance(lease_state(legacy, now=now + 31, runtime=ME, shared_clock=True), Over)
    runtime = Runtime(ME.proc)
    held = lease_state(legacy, now=now, runtime=runtime, url=URL, shared_clock=False)
    assert isinstance(held, Running) and held.watch is not None and held.watch > 0


# -- leases ------------------------------------------------------------------------------------


def _far_lease(now: float, **changes: object) -> Lease:
    lease = Lease(
        session_id="s",
        owner="far",
        token=1,
        expires_at=now + 5,
        holder=Holder(host="far", pidns="1", pid=1, start=1),
        ttl=5.0,
    )
    return replace(lease, **changes)  # type: ignore[arg-type]


def test_lease_states_on_a_server_s_clock() -> None:
    now = time.time()
    far = _far_lease(now)
    assert isinstance(lease_state(None, now=now, runtime=ME, shared_clock=True), Over)
    assert isinstance(lease_state(far, now=now, runtime=ME, shared_clock=True), Running)
    assert isinstance(lease_state(far, now=now + 6, runtime=ME, shared_clock=True), Over)
    given_back = replace(far, expires_at=0.0)
    assert isinstance(lease_state(given_back, now=now, runtime=ME, shared_clock=True), Over)
    mine = replace(far, owner="me/run", holder=ME.holder, expires_at=now - 5)
    assert isinstance(lease_state(mine, now=now, runtime=ME), Over), "no run of ours holds it"
    ME.live_runs.add("me/run")
    try:
        assert isinstance(lease_state(mine, now=now, runtime=ME), Running), "past expiry"
    finally:
        ME.live_runs.discard("me/run")


@pytest.mark.parametrize("step", [-600.0, -40.0, 0.0, 40.0, 600.0])
def test_a_lease_on_a_machine_s_own_clock_is_judged_by_watching_its_renewals(step: float) -> None:
    """Whatever the wall clock says (``step``), the lease is free exactly when this process has
    seen it go unrenewed for its whole time to live, and busy the moment it sees a renewal."""
    ticker = Ticker()
    runtime = Runtime(FakeProc(), monotonic=ticker)
    now = 1_000_000.0
    far = _far_lease(now)
    seen = now + step

    def state(lease: Lease) -> object:
        return lease_state(lease, now=seen, runtime=runtime, url=URL, shared_clock=False)

    first = state(far)
    assert isinstance(first, Running) and first.watch == 5.0 and not first.renewed
    ticker.t += 4.9
    assert isinstance(state(far), Running)
    renewed = replace(far, renewals=1, expires_at=far.expires_at + 1)
    got = state(renewed)
    assert isinstance(got, Running) and got.renewed, "seen renewed: its holder lives"
    ticker.t += 4.9
    assert isinstance(state(renewed), Running)
    ticker.t += 0.1
    gone = state(renewed)
    assert isinstance(gone, Over) and "not renewed for 5.0s" in gone.why
    # A take-over (a new token) is another lease: watched from the start again.
    assert isinstance(state(replace(renewed, token=2, renewals=0)), Running)


def test_a_renewal_that_writes_the_same_expiry_still_counts() -> None:
    """A frozen or stepped clock can write the expiry already there: the count moves."""
    ticker = Ticker()
    runtime = Runtime(FakeProc(), monotonic=ticker)
    far = _far_lease(1_000.0)
    lease_state(far, now=1_000.0, runtime=runtime, url=URL, shared_clock=False)
    ticker.t += 4.0
    again = lease_state(
        replace(far, renewals=1), now=1_000.0, runtime=runtime, url=URL, shared_clock=False
    )
    assert isinstance(again, Running) and again.renewed


def test_a_lease_without_a_recorded_ttl_is_watched_at_least_the_default() -> None:
    ticker = Ticker()
    runtime = Runtime(FakeProc(), monotonic=ticker)
    old = _far_lease(1_000.0, ttl=None, expires_at=900.0)  # long expired by the wall clock
    got = lease_state(old, now=1_000.0, runtime=runtime, url=URL, shared_clock=False)
    assert isinstance(got, Running) and got.watch == 30.0


def test_the_watch_forgets_the_oldest_leases_past_its_bound() -> None:
    watch = Watch(Ticker())
    watch.MAX = 10
    for n in range(25):
        watch.look(("u", f"s{n}"), (1,))
    assert len(watch._seen) <= 10


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
    assert info.value.holder == "w" and info.value.until is not None
    assert abs(info.value.until - (record.deadline or 0)) < 5  # its deadline, or its timeout
    slept: list[float] = []
    with pytest.raises(tl.EffectInProgressError, match="look again once its attempt is over"):
        store.ledger("s").resolve("t", happened=False, by="ana", watch=30, sleep=slept.append)
    # 60 s from its deadline: 30 s of watching could not tell it over, so none was spent.
    assert slept == []
    assert store.ledger("s").in_doubt() == []
    ((listed, state),) = store.started()
    assert listed == record and isinstance(state, Running)
    forced = store.ledger("s").resolve("t", happened=False, by="ana", force=True)
    assert forced.status is Status.NOT_HAPPENED and "forced while attempt 1" in (forced.error or "")


def test_resolve_watches_an_attempt_whose_deadline_passes_within_the_watch(
    tmp_path: Path,
) -> None:
    """Another host's attempt, run under a session lease that is gone now: its deadline, on
    this file store's clock, is 1 s away, though its 300 s timeout has not been watched from
    here. Watching for 10 s tells it over when the deadline passes: resolve settles it, not
    refuses it at once for the timeout it could not watch whole."""
    store = tl.open_store(f"sqlite:///{tmp_path / 'w.db'}")
    far = elsewhere(store, "host-far")
    now = store.now()
    record = replace(
        started(far.runtime.holder, deadline=now + 1.0, at=now - 299.0, lease_token=3),
        session_id="s",
    )
    store.backend.apply("s", [InsertEffect(record)])
    settled = store.ledger("s").resolve("t", happened=False, by="ana", watch=10)
    assert settled.status is Status.NOT_HAPPENED
    assert "forced" not in (settled.error or "")
    assert store.ledger("s").get("t") == settled
    store.close()


def test_a_runtime_of_another_host_sees_only_its_own_process_table() -> None:
    there = elsewhere(tl.open_store("memory://x"), "host-z").runtime
    assert there.holder.known and there.holder.host == "host-z"
    assert there.evidence(ME.holder) is None
    assert ME.evidence(there.holder) is None


def test_an_intent_s_boot_deadline_is_never_before_its_attempt_s_time_is_up() -> None:
    """The boot-clock deadline an intent records is kept to the millisecond, rounded up: while
    the attempt's own time is not up, a settler on the same machine finds it running — at
    every instant up to the deadline, not half a millisecond short of it (the simulation's
    seed 623018 settled an attempt 0.3 ms early when it was rounded to the nearest)."""
    proc = FakeProc(booted=1_002.2364461)
    store = tl.Store(tl.open_store("memory://").backend, runtime=Runtime(proc))
    seen: list[tuple[EffectRecord | None, object]] = []

    # A settler in another container of the same kernel: it cannot see the worker's process,
    # and shares its boot clock — 0.4 ms before the attempt's two seconds are up.
    settler = FakeProc(
        pid=900, self_link="900", pidns="pid:[4026599999]", entries={900: ("R", 1000)}
    )
    settler.booted = 1_004.2364

    @tl.tool(effect="non_idempotent", timeout=2.0)
    def create_ticket(title: str) -> str:
        record = store.ledger("s").get("t")
        judged = None
        if record is not None:
            judged = verdict(record, now=store.now(), runtime=Runtime(settler), shared_clock=False)
        seen.append((record, judged))
        return "T-1"

    tl.run_tool_uses(
        [tool_use("t", "create_ticket", title="x")], [create_ticket], ledger=store.ledger("s")
    )
    ((intent, judged),) = seen
    assert intent is not None and intent.boot_deadline == "boot-a/1004.237"
    assert isinstance(judged, Running), judged
    record = store.ledger("s").get("t")
    assert record is not None and record.status is Status.SUCCEEDED
