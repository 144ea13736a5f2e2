"""The fleet kill test: agent sessions as DBOS workflows on three worker processes over one
PostgreSQL, workers ``SIGKILL``ed at random instants (and at toolledger's crash points) and
restarted under their executor ids, so DBOS recovers their workflows and runs them again from the
start. The ledger must keep every tool effect once: the world holds exactly one ticket per call,
counted as files, never from the ledger.

Each session's script opens three tickets: a plain one (non-idempotent, no check: in doubt after a
kill, a person decides), a checked one (its check finds the ticket) and a keyed one (it forwards
its idempotency key). Sessions that stop for a person are resolved as a person would — look for
the ticket in the world, ``ledger.resolve`` — and enqueued again.

``TOOLLEDGER_TORTURE_SEED`` replays a schedule of kills (the timing still varies).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

import toolledger as tl
from toolledger._harness._invariants import Checks, Evidence, check_session
from toolledger.adapters.anthropic import read_tool_uses
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse
from toolledger.testing.world import World

from .conftest import require

require("dbos", "dbos")

from dbos import DBOSClient  # noqa: E402

from toolledger.integrations import dbos as tl_dbos  # noqa: E402

from .dbos_fleet_worker import APP  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 3
SESSIONS = 50
MAX_KILLS = 20  # the chaos stops after this many kills (crash points included); then it drains
FIRST_CRASHES = ["after_intent:1", "before_record:1", None]
TIME_LIMIT = 150.0  # seconds for every session to finish; far more means it is stuck


def seed() -> int:
    fixed = os.environ.get("TOOLLEDGER_TORTURE_SEED")
    return int(fixed) if fixed else random.SystemRandom().randrange(2**32)


# -- the script: three tickets per session, titled after it -----------------------------------


def session_of(body: dict[str, Any]) -> str:
    first = body["messages"][0]["content"]
    text = first if isinstance(first, str) else first[0]["text"]
    return str(text).removeprefix("open the tickets of ")


def titles(sid: str) -> list[str]:
    return [f"{sid}/plain", f"{sid}/checked", f"{sid}/keyed"]


def thinking() -> None:
    """A model takes its time, so that kills land while sessions are under way."""
    time.sleep(random.uniform(0.1, 0.6))


def turn_1(body: dict[str, Any]) -> Reply:
    thinking()
    plain, checked, _ = titles(session_of(body))
    return Reply(
        tool_uses=[
            ToolUse("create_ticket", {"title": plain}),
            ToolUse("create_ticket_checked", {"title": checked}),
        ]
    )


def turn_2(body: dict[str, Any]) -> Reply:
    thinking()
    return Reply(tool_uses=[ToolUse("create_ticket_keyed", {"title": titles(session_of(body))[2]})])


def turn_3(body: dict[str, Any]) -> Reply:
    thinking()
    return Reply(text=f"{session_of(body)} done")


# -- PostgreSQL: the store's schema and DBOS's system database, both dropped afterwards ----------


@pytest.fixture
def system_database(postgres_url: str) -> Iterator[str]:
    """A database of its own for DBOS's system tables, dropped afterwards."""
    import psycopg
    from psycopg import sql

    name = f"tl_dbos_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    parts = urlsplit(postgres_url)
    yield urlunsplit(parts._replace(path=f"/{name}"))
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


# -- the fleet ---------------------------------------------------------------------------------


def worker_argv(system_database: str, store_url: str, model_url: str, world: World) -> list[str]:
    """The command of a worker process (its executor id is appended when it starts)."""
    module = "tests.integrations.dbos_fleet_worker"
    return [sys.executable, "-m", module, system_database, store_url, model_url, str(world.path)]


def logs_in(tmp_path: Path) -> Path:
    logs = tmp_path / "logs"
    logs.mkdir()
    return logs


@dataclass
class Fleet:
    """Worker processes by executor id; a dead one is started again under the same id."""

    argv: list[str]
    logs: Path
    rng: random.Random
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    starts: Counter[str] = field(default_factory=Counter)
    kills: int = 0  # SIGKILLs sent by the test
    crashes: int = 0  # workers that SIGKILLed themselves at an armed crash point
    armed: bool = True

    def start(self, executor_id: str, crash_at: str | None = None) -> None:
        env = {k: v for k, v in os.environ.items() if k != "TOOLLEDGER_CRASH_AT"}
        if crash_at:
            env["TOOLLEDGER_CRASH_AT"] = crash_at
        elif self.armed and self.starts[executor_id] and self.rng.random() < 0.75:
            # mostly inside a tool (its intent written, its outcome not): a plain call in doubt
            point = self.rng.choice(
                ["after_intent", "before_record", "before_record", "after_record"]
            )
            env["TOOLLEDGER_CRASH_AT"] = f"{point}:{self.rng.randint(1, 4)}"
        self.starts[executor_id] += 1
        log = open(self.logs / f"{executor_id}.{self.starts[executor_id]}.log", "wb")  # noqa: SIM115
        self.procs[executor_id] = subprocess.Popen(
            [*self.argv, executor_id], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()

    def kill_one(self) -> None:
        executor_id = self.rng.choice(sorted(self.procs))
        proc = self.procs[executor_id]
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            self.kills += 1
        self.start(executor_id)

    def replace_dead(self) -> None:
        for executor_id, proc in list(self.procs.items()):
            code = proc.poll()
            if code is None:
                continue
            assert code == -signal.SIGKILL, (
                f"worker {executor_id} exited with {code}: see {self.logs}/{executor_id}.*.log"
            )
            self.crashes += 1
            self.start(executor_id)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait()


# -- the person --------------------------------------------------------------------------------


def settle(store: tl.Store, sid: str, world: World, reruns: Counter[str]) -> int:
    """Resolve the session's in-doubt calls from the world's evidence, as a person would: is
    there a ticket with the call's title? Returns how many were resolved."""
    inputs = {c.tool_use_id: c for c in calls_of(store, sid)}
    resolved = 0
    for record in store.ledger(sid).in_doubt():
        title = str(inputs[record.tool_use_id].input["title"])
        found = [t for t in world.tickets() if t["title"] == title]
        store.ledger(sid).resolve(
            record.tool_use_id,
            happened=bool(found),
            result=found[0] if found else None,
            by="fleet test",
        )
        if not found:
            reruns[record.tool_use_id] += 1
        resolved += 1
    return resolved


def calls_of(store: tl.Store, sid: str) -> list[tl.ToolCall]:
    """The tool calls of the session's transcript, in order."""
    return [
        c for m in store.messages(sid) if m.role == "assistant" for c in read_tool_uses(m.content)
    ]


# -- the test ----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.postgres
def test_a_dbos_fleet_killed_at_random_does_every_effect_once(
    postgres_store_url: str, system_database: str, tmp_path: Path
) -> None:
    schedule = seed()
    rng = random.Random(schedule)
    world = World(tmp_path / "world")
    tl.open_store(postgres_store_url).close()  # created (and migrated) before the workers start
    sids = [f"fleet-{n:02d}" for n in range(SESSIONS)]
    started = time.monotonic()
    with ScriptedModel([turn_1, turn_2, turn_3]) as model:
        argv = worker_argv(system_database, postgres_store_url, model.url, world)
        fleet = Fleet(argv=argv, logs=logs_in(tmp_path), rng=rng)
        executor_ids = [f"worker-{n}" for n in range(WORKERS)]
        # The first workers die at the first call they run — a plain one, its session's first:
        # in doubt before it ran, and after. A person settles both.
        for executor_id, crash_at in zip(executor_ids, FIRST_CRASHES, strict=True):
            fleet.start(executor_id, crash_at)
        client = DBOSClient(system_database_url=system_database, application_name=APP)
        store = tl.open_store(postgres_store_url)
        reruns: Counter[str] = Counter()
        outcomes: dict[str, tl_dbos.SessionOutcome] = {}
        stops_for_a_person = resolved = enqueues = 0
        try:
            while not all((world.path / f"ready-{e}").exists() for e in executor_ids):
                fleet.replace_dead()
                assert time.monotonic() - started < 60, f"workers did not start: see {fleet.logs}"
                time.sleep(0.1)
            handles = {}
            for sid in sids:
                handles[sid] = tl_dbos.enqueue(
                    session=sid, prompt=f"open the tickets of {sid}", client=client
                )
                enqueues += 1
            next_kill = time.monotonic() + rng.uniform(0.5, 2.0)
            while handles:
                elapsed = time.monotonic() - started
                assert elapsed < TIME_LIMIT, (
                    f"seed {schedule}: {len(handles)} sessions unfinished after {elapsed:.0f}s: "
                    f"{sorted(handles)[:5]} (worker logs in {fleet.logs})"
                )
                fleet.replace_dead()
                if fleet.kills + fleet.crashes >= MAX_KILLS:
                    fleet.armed = False
                elif time.monotonic() >= next_kill:
                    fleet.kill_one()
                    next_kill = time.monotonic() + rng.uniform(0.5, 2.0)
                for sid, handle in list(handles.items()):
                    status = handle.get_status().status
                    if status in ("PENDING", "ENQUEUED"):
                        continue
                    assert status == "SUCCESS", (
                        f"seed {schedule}: workflow of {sid} ended {status}: "
                        f"{handle.get_status().error!r}"
                    )
                    outcome = handle.get_result()
                    assert outcome.session_id == sid
                    if outcome.status is tl.RunStatus.COMPLETED:
                        outcomes[sid] = outcome
                        del handles[sid]
                        continue
                    assert outcome.needs_person and outcome.reason, outcome
                    stops_for_a_person += 1
                    resolved += settle(store, sid, world, reruns)
                    handles[sid] = tl_dbos.enqueue(session=sid, client=client)
                    enqueues += 1
                time.sleep(0.2)
        finally:
            fleet.stop()
            client.destroy()
        wall = time.monotonic() - started
        rejected = list(model.rejected)

        # What happened, read from the world and the store as any reader sees them.
        checks = Checks()
        tickets = Counter(t["title"] for t in world.tickets())
        plain_runs = Counter(e["tool_use_id"] for e in world.executions("create_ticket"))
        problems = [p.message for p in tl.verify(store)]
        effects = 0
        for sid in sids:
            state = store.session(sid)
            evidence = Evidence(
                status=state.status if state else None,
                messages=store.messages(sid),
                records={r.tool_use_id: r for r in store.ledger(sid).records()},
                verify_problems=[],
                tickets=Counter({t: n for t, n in tickets.items() if t.startswith(f"{sid}/")}),
                plain_runs=Counter(
                    {
                        t: n
                        for t, n in plain_runs.items()
                        if t in {c.tool_use_id for c in calls_of(store, sid)}
                    }
                ),
            )
            effects += check_session(
                evidence, script_titles=titles(sid), reruns_allowed=reruns, checks=checks
            ).effects
            checks.expect(outcomes[sid].final_text == f"{sid} done", f"{sid}: {outcomes[sid]}")
        store.close()
    violations = [*checks.failed, *problems, *rejected]
    print(
        f"\nDBOS fleet (dbos {_dbos_version()}, seed {schedule}): {WORKERS} workers, "
        f"{fleet.kills} SIGKILLs + {fleet.crashes} crash points, {sum(fleet.starts.values())} "
        f"worker starts; {SESSIONS} sessions, {enqueues} enqueues, {stops_for_a_person} stops "
        f"for a person, {resolved} in-doubt calls resolved ({sum(reruns.values())} did not "
        f"happen); {sum(tickets.values())} tickets for {effects} calls; {checks.count} checks, "
        f"{len(violations)} violations; {wall:.1f}s"
    )
    assert not violations, f"seed {schedule}: " + "\n".join(violations[:20])
    assert sum(tickets.values()) == effects == 3 * SESSIONS
    assert fleet.kills > 0 and fleet.crashes > 0, "the chaos happened"
    assert resolved > 0, f"seed {schedule}: no call was left in doubt for a person to settle"


def _dbos_version() -> str:
    from importlib.metadata import version

    return version("dbos")


@pytest.mark.slow
@pytest.mark.postgres
def test_a_workflow_dbos_runs_twice_at_once_does_its_effects_once(
    postgres_store_url: str, system_database: str, tmp_path: Path
) -> None:
    """A worker frozen (``SIGSTOP``) in the middle of sessions, its workflows resumed on another
    worker while it is frozen, then thawed: DBOS runs those workflows twice at once. The lease
    keeps one run of a session at a time (the copy waits: the frozen holder is alive), the
    ledger keeps every effect once."""
    world = World(tmp_path / "world")
    tl.open_store(postgres_store_url).close()
    sids = [f"twice-{n}" for n in range(8)]
    with ScriptedModel([turn_1, turn_2, turn_3]) as model:
        argv = worker_argv(system_database, postgres_store_url, model.url, world)
        fleet = Fleet(argv=argv, logs=logs_in(tmp_path), rng=random.Random(0), armed=False)
        client = DBOSClient(system_database_url=system_database, application_name=APP)
        store = tl.open_store(postgres_store_url)
        try:
            fleet.start("frozen")
            frozen = fleet.procs["frozen"]
            deadline = time.monotonic() + 60
            while not (world.path / "ready-frozen").exists():
                assert frozen.poll() is None and time.monotonic() < deadline, f"see {fleet.logs}"
                time.sleep(0.1)
            handles = {
                sid: tl_dbos.enqueue(
                    session=sid, prompt=f"open the tickets of {sid}", client=client
                )
                for sid in sids
            }
            held = wait_for_a_lease(store, sids, frozen.pid)
            frozen.send_signal(signal.SIGSTOP)
            pending = client.list_workflows(
                status="PENDING", executor_id="frozen", load_input=False, load_output=False
            )
            ids = [w.workflow_id for w in pending]
            assert handles[held].get_workflow_id() in ids
            fleet.start("thawed")  # the second worker, which runs the resumed copies
            client.resume_workflows(ids, queue_name=tl_dbos.QUEUE)
            time.sleep(3.0)  # the copies wait for the frozen holder's lease
            lease = store.lease(held)
            assert lease is not None and lease.holder is not None
            assert lease.holder.pid == frozen.pid, "a live holder's session was not taken"
            frozen.send_signal(signal.SIGCONT)
            outcomes = {sid: h.get_result() for sid, h in handles.items()}
            deadline = time.monotonic() + 60
            while client.list_workflows(status=["PENDING", "ENQUEUED"], load_input=False):
                assert time.monotonic() < deadline, "the resumed copies did not finish"
                time.sleep(0.2)
        finally:
            fleet.stop()
            client.destroy()
        tickets = Counter(t["title"] for t in world.tickets())
        problems = [p.message for p in tl.verify(store)]
        states = {sid: store.session(sid) for sid in sids}
        store.close()
        rejected = list(model.rejected)
    assert all(o.status is tl.RunStatus.COMPLETED for o in outcomes.values()), outcomes
    assert all(s is not None and s.status is tl.RunStatus.COMPLETED for s in states.values())
    assert tickets == Counter({t: 1 for sid in sids for t in titles(sid)}), tickets
    assert problems == [] and rejected == []
    print(f"\nDBOS ran {len(ids)} workflows twice at once; {sum(tickets.values())} tickets")


def wait_for_a_lease(store: tl.Store, sids: list[str], pid: int) -> str:
    """A session whose lease ``pid`` holds now (it is in the middle of its run)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = store.now()
        for sid in sids:
            lease = store.lease(sid)
            if lease and lease.expires_at > now and lease.holder and lease.holder.pid == pid:
                return sid
        time.sleep(0.05)
    raise AssertionError("the worker never held a session's lease")
