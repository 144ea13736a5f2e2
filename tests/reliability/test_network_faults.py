"""Network faults between a worker and PostgreSQL: a lost reply never hangs a worker, starves a
lease or repeats an effect.

Every store URL goes through ``faultproxy.FaultProxy``. Each fault strikes at one moment of a
call — the commit of its intent, the commit of its outcome (with checkpoint B), the take of the
session's lease, a renewal of it while a long tool runs, its give-back — aimed from toolledger's
named crash points (the take from just before the run, the renewal from inside the tool), and
always at *the commit* of that moment: the proxy recognises it on the wire. The kinds of fault:

* ``drop_reply`` — the commit reaches the server, its answer never comes back (that connection
  goes silent: no FIN, no RST);
* ``black_hole`` — a partition: from the commit on nothing gets through either way, on any
  connection; the worker gives up (its store is closed) before the network comes back, so what
  it kept unwritten is left for the resume to settle;
* ``reset`` — the commit reaches the server and a RST comes back instead of its answer;
* ``latency`` — from the commit on, every byte on every connection takes longer than
  ``op_timeout`` each way; the network then heals while the worker lives on;
* ``slow_request`` — the commit's connection alone is that slow: the commit lands after the
  worker has given up on it and read it back on a fresh connection.

After each case the network heals and the session is resumed until it completes; an in-doubt call
is settled as a person would, from the world's evidence (``Ledger.resolve``). Then, counted in the
world (ticket files): no effect twice; every effect has its ``succeeded`` record, written by the
attempt that made it or alerted; no false alert (the store did not hold the outcome when the
alert was raised — unless the network was too slow to read it back, which is counted apart);
``verify`` clean; and no run waited on the store longer than a few operation deadlines. A last
test runs sessions in one process, some cut off from the server while a healthy one's long tool
keeps its lease alive: the healthy one is never taken over.

Only ``op_timeout`` is set: it bounds the wait for a new connection too
(``test_network_found_connection_wait.py``).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
import toolledger._crash
from toolledger._verify import verify
from toolledger.records import Status
from toolledger.testing import elsewhere
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

from ..conftest import with_params
from .faultproxy import BLACK_HOLE, COMMIT, PASS, Fault, FaultProxy, Matcher, Request, statement

pytestmark = pytest.mark.postgres

OP_TIMEOUT = 1.0
LEASE_TTL = 1.5
LATENCY = OP_TIMEOUT + 0.5  # each way: no operation that meets it finishes in time
HOLD = 2.0  # the long tool: more than a lease's life, so only renewals keep the lease
MAX_STORE_OPS = 6  # a run that fails in a partition still tries a few operations first
MAX_BLOCKED = MAX_STORE_OPS * OP_TIMEOUT + 2.0
RESUME_WITHIN = 30.0
PROMPT = "Checkout is down."


def store_url(proxy: FaultProxy, postgres_url: str, schema: str) -> str:
    return with_params(
        proxy.url(postgres_url),
        schema=schema,
        op_timeout=f"{OP_TIMEOUT:g}",
        connect_timeout="2",  # libpq's least: the pool's own attempts give up sooner
    )


# -- the world ------------------------------------------------------------------------------------


class Tickets:
    """A ticket system in a directory: one file per ticket, named after the call that made it.
    What really happened is counted here, never in the ledger."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True)
        self.entered: Callable[[str, tl.ToolContext], None] = lambda name, ctx: None
        self._in_tools: defaultdict[int, float] = defaultdict(float)
        self._lock = threading.Lock()

    def in_tools(self) -> float:
        """Seconds this thread has spent inside tools (not waiting on the store)."""
        with self._lock:
            return self._in_tools[threading.get_ident()]

    def made(self) -> Counter[str]:
        """Tickets per call."""
        return Counter(p.name.split(".")[0] for p in self.path.glob("*.json"))

    def _open(self, ctx: tl.ToolContext, title: str, hold: float, name: str) -> dict[str, Any]:
        started = time.monotonic()
        try:
            time.sleep(hold)
            ticket = {"id": f"{ctx.tool_use_id}.{name}", "title": title, "key": ctx.idempotency_key}
            path = self.path / f"{ticket['id']}.json"
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:  # a key seen before: the receiver answers with that ticket
                found: dict[str, Any] = json.loads(path.read_text())
                return found
            with os.fdopen(fd, "w") as fh:
                fh.write(json.dumps(ticket))
            return ticket
        finally:
            with self._lock:
                self._in_tools[threading.get_ident()] += time.monotonic() - started

    def toolset(self) -> tl.ToolSet:
        """A plain non-idempotent tool, one with a check, one that forwards its key."""
        world = self

        @tl.tool(effect="non_idempotent", timeout=60)
        def create_ticket(title: str, ctx: tl.ToolContext, hold: float = 0.0) -> dict[str, Any]:
            """Open a ticket (every call opens a new one)."""
            world.entered("create_ticket", ctx)
            return world._open(ctx, title, hold, uuid.uuid4().hex[:8])

        @tl.tool(effect="non_idempotent", timeout=60)
        def create_ticket_checked(
            title: str, ctx: tl.ToolContext, hold: float = 0.0
        ) -> dict[str, Any]:
            """Open a ticket that can be found again by the call's key."""
            world.entered("create_ticket_checked", ctx)
            return world._open(ctx, title, hold, uuid.uuid4().hex[:8])

        @create_ticket_checked.check
        def _(title: str, ctx: tl.ToolContext, hold: float = 0.0) -> dict[str, Any] | None:
            for p in world.path.glob(f"{ctx.tool_use_id}.*.json"):
                found: dict[str, Any] = json.loads(p.read_text())
                if found["key"] == ctx.idempotency_key:
                    return found
            return None

        @tl.tool(effect="non_idempotent", forwards_idempotency_key=True, timeout=60)
        def create_ticket_keyed(
            title: str, ctx: tl.ToolContext, hold: float = 0.0
        ) -> dict[str, Any]:
            """Open a ticket through an API that honours Idempotency-Key."""
            world.entered("create_ticket_keyed", ctx)
            return world._open(ctx, title, hold, "keyed")

        return tl.ToolSet([create_ticket, create_ticket_checked, create_ticket_keyed])


# -- aiming a fault at a moment -------------------------------------------------------------------


def _take(request: Request) -> bool:
    return statement("INSERT INTO leases")(request) or statement("UPDATE leases SET owner")(request)


# HOLD_LEASE as PostgreSQL sends it on its own (its expiry as the server's clock would set it)
RENEWAL = statement("UPDATE leases SET expires_at = CASE WHEN ttl IS NULL")
GIVE_BACK = statement("UPDATE leases SET expires_at = 0")


@dataclass(frozen=True)
class Moment:
    """Where a fault strikes: at crash point ``point`` (its ``hit``-th time), at the start of
    the long tool (``"tool"``) or just before the run (``"run"``); then at the next request
    ``on`` matches."""

    point: str
    hit: int
    on: Matcher


# Turn one calls [keyed, unsafe A, unsafe B]. The keyed call needs no intent: its outcome rides
# in A's intent commit. A's outcome rides in B's intent commit; B's in checkpoint B.
MOMENTS = {
    "intent": Moment("after_checkpoint_a", 1, COMMIT),  # A's intent (+ the keyed outcome)
    "outcome": Moment("before_record", 3, COMMIT),  # B's outcome + checkpoint B
    "take": Moment("run", 1, _take),
    "renewal": Moment("tool", 1, RENEWAL),  # while B runs for longer than a lease lives
    "give_back": Moment("after_checkpoint_a", 2, GIVE_BACK),  # after the final turn
}
KINDS = [Fault.DROP_REPLY, Fault.BLACK_HOLE, Fault.RESET, Fault.LATENCY, Fault.SLOW_REQUEST]


class Aim:
    """Arms the proxy once, when the first run of a case reaches its moment."""

    def __init__(self, proxy: FaultProxy, moment: Moment, kind: Fault) -> None:
        self.proxy, self.moment, self.kind = proxy, moment, kind
        self.hits: Counter[str] = Counter()
        self.armed = False

    def arm(self) -> None:
        if not self.armed:
            self.armed = True
            self.proxy.arm(self.kind, on=self.moment.on, latency=LATENCY)

    def reached(self, point: str) -> None:
        self.hits[point] += 1
        if point == self.moment.point and self.hits[point] == self.moment.hit:
            self.arm()


@pytest.fixture
def aims(monkeypatch: pytest.MonkeyPatch) -> list[Aim]:
    """The named crash points of the agent, an attempt and the outcomes call these aims."""
    found: list[Aim] = []

    def hook(point: str) -> None:
        for aim in found:
            aim.reached(point)

    monkeypatch.setattr(toolledger._crash, "watchers", [hook])
    return found


@pytest.fixture
def proxies() -> Iterator[Callable[[], FaultProxy]]:
    started: list[FaultProxy] = []

    def start() -> FaultProxy:
        proxy = FaultProxy()
        proxy.start()
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        FIGURES.faults.update(proxy.fired)
        proxy.stop()


# -- the figures ----------------------------------------------------------------------------------


@dataclass
class Figures:
    cases: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    calls: int = 0
    effects: int = 0
    alerts: int = 0
    unconfirmed: int = 0  # alerts for an outcome that had landed, while the store was too slow
    by_person: int = 0
    by_check: int = 0
    runs: int = 0
    longest_blocked: float = 0.0
    longest_case: str = ""
    takeovers_refused: int = 0
    first_runs: Counter[tuple[str, str]] = field(default_factory=Counter)  # (fault, how it ended)
    violations: list[str] = field(default_factory=list)

    def summary(self) -> str:
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items()))
        return (
            f"network faults: {self.cases} cases; faults struck: {faults}; {self.calls} calls, "
            f"{self.effects} effects counted in the world; {self.alerts} alerts "
            f"({self.unconfirmed} for an outcome that had landed but could not be read back in "
            f"time); in-doubt calls settled by a person {self.by_person}, by their check "
            f"{self.by_check}; {self.runs} runs, the longest blocked on the store "
            f"{self.longest_blocked:.2f}s ({self.longest_case}); take-overs of a healthy "
            f"session refused {self.takeovers_refused}; violations {len(self.violations)}"
            + "\n  the run the fault struck: "
            + ", ".join(f"{k}: {how} {n}" for (k, how), n in sorted(self.first_runs.items()))
            + "".join(f"\n  - {v}" for v in self.violations)
        )


FIGURES = Figures()


@pytest.fixture(scope="module", autouse=True)
def figures(request: pytest.FixtureRequest) -> Iterator[Figures]:
    """Prints the figures once the module is done (past the output capture)."""
    yield FIGURES
    plugins = request.config.pluginmanager
    terminal, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if FIGURES.runs and terminal is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            terminal.write_line("")
            terminal.write_line(FIGURES.summary())


# -- one session under fault ----------------------------------------------------------------------


@dataclass
class Alerted:
    alert: tl.LedgerWriteError
    durable: bool  # the store held the outcome when the alert was raised
    degraded: bool  # the whole network was faulted then: the worker could not read it back


class Case:
    """One session: its runs (timed), its alerts, and the invariants checked at its end."""

    def __init__(
        self,
        name: str,
        *,
        world: Tickets,
        direct: tl.Store,
        model: ScriptedModel,
        proxy: FaultProxy,
    ) -> None:
        self.name = name
        self.world = world
        self.direct = direct  # straight to the server, past the proxy: what the store holds
        self.model = model
        self.proxy = proxy
        self.alerts: list[Alerted] = []
        self.errors: list[str] = []
        self.violations: list[str] = []

    def on_alert(self, alert: tl.LedgerWriteError) -> None:
        tid = alert.tool_use_id or ""
        record = self.direct.backend.read_effects(alert.session_id or "", [tid]).get(tid)
        durable = record is not None and record.status.terminal
        self.alerts.append(Alerted(alert, durable, self.proxy.mode != (PASS, PASS)))

    def agent(self, store: tl.Store) -> tl.Agent:
        return tl.Agent(
            client=self.model.client(),
            model="claude-test",
            tools=self.world.toolset(),
            store=store,
            on_alert=self.on_alert,
            lease_ttl=LEASE_TTL,
        )

    def run(self, store: tl.Store, session: str) -> tl.Run | None:
        """One ``Agent.run``, timed: ``None`` when it raised (the error is kept)."""
        agent = self.agent(store)
        in_tools = self.world.in_tools()
        started = time.monotonic()
        try:
            return agent.run(session=session, prompt=PROMPT)
        except tl.ToolLedgerError as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
            return None
        finally:
            blocked = time.monotonic() - started - (self.world.in_tools() - in_tools)
            FIGURES.runs += 1
            if blocked > FIGURES.longest_blocked:
                FIGURES.longest_blocked, FIGURES.longest_case = blocked, self.name
            if blocked > MAX_BLOCKED:
                self.violations.append(f"a run was blocked {blocked:.1f}s > {MAX_BLOCKED:g}s")

    def finish(self, store: tl.Store, session: str) -> None:
        """Resume ``session`` until it completes, settling in-doubt calls from the world."""
        deadline = time.monotonic() + RESUME_WITHIN
        while True:
            assert time.monotonic() < deadline, f"{self.name} never completed: {self.errors}"
            run = self.run(store, session)
            if run is not None and run.status is tl.RunStatus.COMPLETED:
                return
            if run is not None:
                assert run.status is tl.RunStatus.NEEDS_ATTENTION, f"{self.name}: {run.reason}"
                self.settle(store, session)
            else:
                time.sleep(0.2)  # a call held by this process's kept write; a busy lease

    def settle(self, store: tl.Store, session: str) -> None:
        """What a person does: look in the world, and say whether each in-doubt call happened."""
        ledger = store.ledger(session)
        made = self.world.made()
        for record in ledger.in_doubt():
            happened = made[record.tool_use_id] > 0
            ledger.resolve(record.tool_use_id, happened=happened, by="a person who looked")
            FIGURES.by_person += 1

    def check(self, store: tl.Store, session: str) -> None:
        """The invariants, counted in the world."""
        v = self.violations
        records = {r.tool_use_id: r for r in store.ledger(session).records()}
        calls = [
            block["id"]
            for m in store.backend.read_messages(session)
            if m.role == "assistant"
            for block in m.content
            if isinstance(block, dict) and block.get("type") == "tool_use"
        ]
        made = self.world.made()
        alerted = {a.alert.tool_use_id for a in self.alerts}
        FIGURES.calls += len(calls)
        FIGURES.effects += sum(made.values())
        v.extend(f"an effect no call asked for: {tid}" for tid in made if tid not in calls)
        for tid in calls:
            record = records.get(tid)
            status = record.status if record is not None else None
            note = (record.error or "") if record is not None else ""
            if made[tid] > 1:
                v.append(f"{tid} took effect {made[tid]} times")
            if made[tid] and status is not Status.SUCCEEDED:
                v.append(f"{tid} took effect but its record is {status}")
            if not made[tid] and status is Status.SUCCEEDED:
                v.append(f"{tid} is recorded succeeded but never took effect")
            if "its check found the effect" in note:
                FIGURES.by_check += 1
            settled = note.startswith("resolved by") or "its check found the effect" in note
            if made[tid] and settled and tid not in alerted:
                v.append(f"{tid}: its outcome was lost without an alert ({note})")
        for a in self.alerts:
            if a.durable and not a.degraded:
                v.append(f"false alert: {a.alert.tool_use_id} was recorded when it was raised")
            if not made[a.alert.tool_use_id or ""]:
                v.append(f"false alert: {a.alert.tool_use_id} never took effect")
        v.extend(f"verify: {p.message}" for p in verify(store))
        lease = store.backend.read_lease(session)
        if lease is None or lease.expires_at > 0:
            v.append(f"the lease was not given back at the end: {lease}")
        FIGURES.alerts += len(self.alerts)
        FIGURES.unconfirmed += sum(1 for a in self.alerts if a.durable and a.degraded)
        FIGURES.violations.extend(f"{self.name}: {x}" for x in v)


def _script(unsafe: list[str], hold: float) -> list[Reply]:
    return [
        Reply(
            tool_uses=[
                ToolUse("create_ticket_keyed", {"title": "status page"}),
                ToolUse(unsafe[0], {"title": "page on-call"}),
                ToolUse(unsafe[1], {"title": "open incident", "hold": hold}),
            ]
        ),
        Reply(text="Done."),
    ]


# -- the matrix -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS, ids=[k.value for k in KINDS])
@pytest.mark.parametrize("moment", list(MOMENTS))
def test_a_fault_at_any_moment_repeats_nothing_and_loses_nothing(
    moment: str,
    kind: Fault,
    postgres_url: str,
    postgres_schema: str,
    proxies: Callable[[], FaultProxy],
    aims: list[Aim],
    tmp_path: Path,
) -> None:
    """The fault strikes the commit of ``moment`` in the first run; the network heals; the
    session is resumed (and settled) until it completes; then the invariants."""
    at = MOMENTS[moment]
    proxy = proxies()
    url = store_url(proxy, postgres_url, postgres_schema)
    world = Tickets(tmp_path / "tickets")
    # The plain and the checked tool take turns at A and B, so that each meets the faults that
    # lose an outcome (at the outcome and at the renewal) at least once.
    unsafe = ["create_ticket", "create_ticket_checked"]
    if (list(MOMENTS).index(moment) // 2 + KINDS.index(kind)) % 2:
        unsafe.reverse()
    aim = Aim(proxy, at, kind)
    aims.append(aim)
    if at.point == "tool":
        world.entered = lambda name, ctx: aim.arm() if name == unsafe[1] else None
    session = f"net-{moment}-{kind.value}"
    with (
        tl.open_store(with_params(postgres_url, schema=postgres_schema)) as direct,
        ScriptedModel(_script(unsafe, HOLD if moment == "renewal" else 0.0)) as model,
    ):
        case = Case(f"{moment}/{kind.value}", world=world, direct=direct, model=model, proxy=proxy)
        store = tl.open_store(url)
        try:
            if at.point == "run":
                aim.arm()
            first = case.run(store, session)
            FIGURES.first_runs[kind.value, first.status.value if first else "raised"] += 1
            aims.remove(aim)  # the first run only
            assert not proxy.disarm(), f"{case.name}: the fault never struck"
            if kind is Fault.BLACK_HOLE:
                store.close()  # the worker gives up while cut off, and its kept writes with it
                proxy.heal()
                store = tl.open_store(url)
            else:
                proxy.heal()
            lease = direct.backend.read_lease(session)
            if lease is not None and lease.expires_at > direct.now() + LEASE_TTL:
                case.violations.append("a run that ended holds its lease past a lease's life")
            case.finish(store, session)
            case.check(store, session)
        finally:
            store.close()
    FIGURES.cases += 1
    assert case.violations == [], "\n".join(case.violations + case.errors)


# -- a stalled session next to a healthy one ------------------------------------------------------


def test_a_session_cut_off_from_the_store_does_not_starve_a_healthy_one(
    postgres_url: str,
    postgres_schema: str,
    proxies: Callable[[], FaultProxy],
    tmp_path: Path,
) -> None:
    """Two sessions in one process, each with a tool that runs for longer than a lease lives:
    one's store goes silent (a black hole) while its tool runs; the healthy one's heartbeat goes
    on renewing. Its lease never lapses and a worker on another host is refused it, while the
    stalled one stops being renewed; then both finish with every effect once. (A dozen stalled
    sessions: ``test_network_found_renewal_starvation.py``.)"""
    stalled = 1
    cut_proxy, healthy_proxy = proxies(), proxies()
    inside = threading.Barrier(stalled + 2)  # every tool, and this thread
    script = [
        Reply(
            tool_uses=[ToolUse("create_ticket_checked", {"title": "incident", "hold": 2 * HOLD})]
        ),
        Reply(text="Done."),
    ]
    with (
        tl.open_store(with_params(postgres_url, schema=postgres_schema)) as direct,
        ScriptedModel(script) as model,
        tl.open_store(store_url(cut_proxy, postgres_url, postgres_schema)) as cut_store,
        tl.open_store(store_url(healthy_proxy, postgres_url, postgres_schema)) as healthy_store,
    ):
        sessions = {f"stalled-{n}": (cut_store, cut_proxy) for n in range(stalled)}
        sessions["healthy"] = (healthy_store, healthy_proxy)
        cases = {
            sid: Case(
                f"sessions/{sid}",
                world=Tickets(tmp_path / sid),
                direct=direct,
                model=model,
                proxy=p,
            )
            for sid, (_, p) in sessions.items()
        }
        for case in cases.values():
            case.world.entered = lambda name, ctx: inside.wait(10)
        firsts: dict[str, tl.Run | None] = {}

        def first_run(sid: str) -> None:
            firsts[sid] = cases[sid].run(sessions[sid][0], sid)

        threads = [threading.Thread(target=first_run, args=(sid,)) for sid in sessions]
        for t in threads:
            t.start()
        try:
            inside.wait(10)
            cut_proxy.set_mode("both", BLACK_HOLE)
            cut_at = time.monotonic()
            far = cases["healthy"].agent(elsewhere(direct, "host-b"))
            lapses: list[float] = []
            tried = False
            while time.monotonic() - cut_at < 2 * HOLD - 0.3:
                lease = direct.backend.read_lease("healthy")
                assert lease is not None
                if lease.expires_at <= direct.now():
                    lapses.append(round(time.monotonic() - cut_at, 2))
                if not tried and time.monotonic() - cut_at > LEASE_TTL + 0.5:
                    tried = True  # a whole lease life after the other store went silent
                    with pytest.raises(tl.SessionBusyError, match="has not expired"):
                        far.run(session="healthy", prompt=PROMPT)
                    FIGURES.takeovers_refused += 1
                time.sleep(0.05)
            for n in range(stalled):
                lease = direct.backend.read_lease(f"stalled-{n}")
                assert lease is not None and lease.expires_at <= direct.now(), (
                    "a session cut off from its store is not renewed"
                )
        finally:
            for t in threads:
                t.join(30)
            for case in cases.values():
                case.world.entered = lambda name, ctx: None
        assert lapses == [], f"the healthy session's lease lapsed at {lapses}"
        assert tried
        healthy = firsts["healthy"]
        assert healthy is not None and healthy.status is tl.RunStatus.COMPLETED
        assert all(firsts[sid] is None for sid in sessions if sid != "healthy"), (
            "a stalled run ends in a store error"
        )
        cut_proxy.heal()
        for sid, case in cases.items():
            case.finish(sessions[sid][0], sid)
            case.check(sessions[sid][0], sid)
    violations = [v for case in cases.values() for v in case.violations]
    assert violations == [], "\n".join(violations)
