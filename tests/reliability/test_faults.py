"""Fault injection: the store fails under a running agent, for real where a test can make it so.

* disk full (ENOSPC) — real: the store on a 256 KiB tmpfs, filled up;
* EIO on write and on fsync (json) — simulated: the json backend's ``os.write`` / ``os.fsync``
  raise ``OSError(EIO)``;
* ``database is locked`` (sqlite) — real: a second connection holds ``BEGIN EXCLUSIVE``;
* made read-only mid-run — real: ``chattr +i`` (root ignores mode bits) on the sqlite database
  and its WAL (SQLite then says "disk I/O error"), or on the json directory;
* deleted mid-run — real: the json directory, the json ledger file, the PostgreSQL schema;
* a connection dropped mid-transaction — real: ``pg_terminate_backend`` while the write waits on
  a lock the test holds.

Each fault strikes at one of two moments. *Before the intent* (armed as the commit holding it
is sent: its own, or checkpoint A's): the unsafe call's intent cannot be written, so nothing runs,
and the run ends in a clear ``StoreError`` or tells the model the call did not run and is safe to
retry; once the fault is gone the call has run at most once. *After the effect*:
the tool trips it after its effect happened — the outcome cannot be recorded, so the run raises an
alert (``on_alert`` and the ``toolledger`` logger) and a ``StoreError``; the process keeps the
outcome (the call stays in progress here, never in doubt, never run again) and writes it once the
store takes writes again, so the next run goes on from the ledger. Nothing is silent, nothing is
done twice. (A SQLite database file deleted under a running process: ``test_deleted_database.py``.)
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import sqlite3
import subprocess
import threading
import time
import types
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
from toolledger._verify import verify
from toolledger.ops import InsertEffect, Op
from toolledger.records import Status
from toolledger.stores.jsonfile import _files
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

from ..conftest import drop_schema, with_params
from ..helpers import spy_store

# -- faults -------------------------------------------------------------------------------------


class Fault:
    """Something that breaks the store when armed and stops breaking it when disarmed."""

    def arm(self) -> None:
        raise NotImplementedError

    def disarm(self) -> None:
        raise NotImplementedError


class DiskFull(Fault):
    def __init__(self, mount: Path) -> None:
        self.filler = mount / "filler"

    def arm(self) -> None:
        with open(self.filler, "wb", buffering=0) as fh:
            while _write_or_full(fh):
                pass

    def disarm(self) -> None:
        self.filler.unlink(missing_ok=True)


def _write_or_full(fh: Any) -> bool:
    """Write a block; ``False`` once the disk is full (and only then)."""
    try:
        fh.write(b"\0" * 4096)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        return False
    return True


class JSONOSError(Fault):
    """The json backend's ``os.<call>`` raises ``OSError(EIO)``: simulated, no device needed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, call: str) -> None:
        self.monkeypatch = monkeypatch
        self.call = call

    def arm(self) -> None:
        def broken(*args: Any) -> Any:
            raise OSError(errno.EIO, f"Input/output error (injected into os.{self.call})")

        failing = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os) if k[0] != "_"})
        setattr(failing, self.call, broken)
        self.monkeypatch.setattr(_files, "os", failing)

    def disarm(self) -> None:
        self.monkeypatch.setattr(_files, "os", os)


class FsyncFailsOnce(Fault):
    """The json backend's ``os.fsync`` of one kind of file — a session log (``.jsonl``), a
    ledger's temporary file (``.tmp``), the directory (``dir``) — raises ``OSError(EIO)`` once,
    and succeeds from then on, as Linux does after writeback failed: the failed pages are marked
    clean, so a second fsync reports success for bytes that may never reach the disk."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
        self.monkeypatch = monkeypatch
        self.kind = kind

    def arm(self) -> None:
        failed = False

        def fsync(fd: int) -> None:
            nonlocal failed
            target = os.readlink(f"/proc/self/fd/{fd}")
            hit = os.path.isdir(target) if self.kind == "dir" else target.endswith(self.kind)
            if hit and not failed:
                failed = True
                raise OSError(errno.EIO, "Input/output error (injected into os.fsync, once)")
            os.fsync(fd)

        failing = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os) if k[0] != "_"})
        failing.fsync = fsync
        self.monkeypatch.setattr(_files, "os", failing)

    def disarm(self) -> None:
        self.monkeypatch.setattr(_files, "os", os)


class Locked(Fault):
    """Another connection holds the database's write lock."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.conn: sqlite3.Connection | None = None

    def arm(self) -> None:
        self.conn = sqlite3.connect(self.db, isolation_level=None)
        self.conn.execute("BEGIN EXCLUSIVE")

    def disarm(self) -> None:
        if self.conn is not None:
            self.conn.execute("ROLLBACK")
            self.conn.close()
            self.conn = None


class Immutable(Fault):
    """``chattr +i``: even root cannot write the files (or create files in the directory)."""

    def __init__(self, *paths: Path) -> None:
        self.paths = paths

    def arm(self) -> None:
        subprocess.run(["chattr", "+i", *map(str, self.paths)], check=True)

    def disarm(self) -> None:
        subprocess.run(["chattr", "-i", *map(str, self.paths)], check=False)


class ConnectionDropped(Fault):
    """Every write of the store's connections is stopped half-way (it waits on a table lock the
    test holds) and its server process killed, ``times`` times; then the lock is released."""

    def __init__(self, admin_url: str, schema: str, app: str, times: int) -> None:
        self.admin_url, self.schema, self.app, self.times = admin_url, schema, app, times
        self.thread: threading.Thread | None = None
        self.killed = 0

    def arm(self) -> None:
        import psycopg

        locker = psycopg.connect(self.admin_url)
        locker.execute(f'SET search_path TO "{self.schema}"')
        locker.execute("LOCK TABLE effects IN EXCLUSIVE MODE")  # reads go on, writes wait

        def drop() -> None:
            killed: set[int] = set()
            with psycopg.connect(self.admin_url, autocommit=True) as admin:
                while len(killed) < self.times:
                    fresh = _wait_for(
                        lambda: [p for p in self._blocked(admin) if p not in killed],
                        "a write waits on the lock",
                    )
                    for pid in fresh:
                        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                        killed.add(pid)
                    self.killed = len(killed)
            locker.rollback()
            locker.close()

        self.thread = threading.Thread(target=drop, daemon=True)
        self.thread.start()

    def _blocked(self, admin: Any) -> list[int]:
        rows = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s "
            "AND wait_event_type = 'Lock'",
            (self.app,),
        ).fetchall()
        return [r[0] for r in rows]

    def disarm(self) -> None:
        if self.thread is not None:
            self.thread.join(timeout=30)
            assert not self.thread.is_alive()


def _wait_for(found: Callable[[], Any], what: str, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := found()):
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)
    return value


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs: a disk that really fills up."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("ENOSPC NOT TESTED: mounting a 256 KiB tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"ENOSPC NOT TESTED: cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def needs_chattr(tmp_path: Path) -> None:
    probe = tmp_path / "chattr-probe"
    probe.write_text("x")
    ok = shutil.which("chattr") is not None and (
        subprocess.run(["chattr", "+i", str(probe)], capture_output=True, check=False).returncode
        == 0
    )
    subprocess.run(["chattr", "-i", str(probe)], capture_output=True, check=False)
    if not ok:
        pytest.skip("READ-ONLY FAULT NOT TESTED: chattr +i is not available here (root, ext4)")


@dataclass
class Setup:
    url: str
    fault: Fault


FAULTS = [
    "sqlite-disk-full",
    "json-disk-full",
    "json-eio-on-write",
    "json-eio-on-fsync",
    "json-eio-once-on-log-fsync",
    "json-eio-once-on-ledger-fsync",
    "json-eio-once-on-directory-fsync",
    "sqlite-database-locked",
    "sqlite-made-read-only",
    "json-made-read-only",
    "postgres-connection-dropped",
]


@pytest.fixture(params=FAULTS)
def setup(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Setup:
    name: str = request.param
    if name.endswith("disk-full"):
        disk: Path = request.getfixturevalue("small_disk")
        url = f"sqlite:///{disk / 'l.db'}" if name.startswith("sqlite") else f"json:///{disk / 'l'}"
        return Setup(url, DiskFull(disk))
    if name.startswith("json-eio-once"):
        kind = {"log": ".jsonl", "ledger": ".tmp", "directory": "dir"}[name.split("-")[-2]]
        return Setup(f"json:///{tmp_path / 'l'}", FsyncFailsOnce(monkeypatch, kind))
    if name.startswith("json-eio"):
        call = "write" if name.endswith("write") else "fsync"
        return Setup(f"json:///{tmp_path / 'l'}", JSONOSError(monkeypatch, call))
    if name == "sqlite-database-locked":
        monkeypatch.setattr("toolledger.stores.sqlite.BUSY_TIMEOUT_MS", 100)
        return Setup(f"sqlite:///{tmp_path / 'l.db'}", Locked(tmp_path / "l.db"))
    if name == "sqlite-made-read-only":
        needs_chattr(tmp_path)
        db = tmp_path / "l.db"
        return Setup(f"sqlite:///{db}", Immutable(db, db.with_name("l.db-wal")))
    if name == "json-made-read-only":
        needs_chattr(tmp_path)
        return Setup(f"json:///{tmp_path / 'l'}", Immutable(tmp_path / "l"))
    assert name == "postgres-connection-dropped"
    admin_url: str = request.getfixturevalue("postgres_url")
    schema: str = request.getfixturevalue("postgres_schema")  # dropped afterwards
    app = f"tl_fault_{uuid.uuid4().hex[:8]}"
    url = with_params(admin_url, schema=schema, application_name=app)
    return Setup(url, ConnectionDropped(admin_url, schema, app, times=3))


# -- the agent under fault ----------------------------------------------------------------------


class World:
    """Ticket files: what really happened."""

    def __init__(self, path: Path, fault: Fault) -> None:
        self.path = path
        path.mkdir()
        self.fault = fault
        self.trip_in: str | None = None  # "intent" or "create_ticket": when to arm

    def tickets(self) -> list[str]:
        return sorted(p.read_text() for p in self.path.iterdir())

    def tools(self) -> list[Any]:
        world = self

        @tl.tool(effect="read_only")
        def look() -> str:
            """Look around."""
            return "all quiet"

        @tl.tool(effect="non_idempotent")
        def create_ticket(title: str, ctx: tl.ToolContext) -> dict[str, str]:
            """Open a ticket."""
            (world.path / ctx.tool_use_id).write_text(title)
            if world.trip_in == "create_ticket":
                world.trip_in = None  # once
                world.fault.arm()
            return {"ticket": ctx.tool_use_id, "title": title}

        return [look, create_ticket]


SCRIPT = [
    Reply(tool_uses=[ToolUse("look"), ToolUse("create_ticket", {"title": "Outage"})]),
    Reply(text="Ticket opened."),
]


LEASE_TTL = 0.5  # a run that ended in a StoreError could not give its lease back


def run_once(
    model: ScriptedModel,
    url: str,
    world: World,
    alerts: list[Any],
    before_commit: Callable[[Sequence[Op]], None] | None = None,
) -> tl.Run:
    """One agent run on the store at ``url`` (``before_commit``: called with each commit's
    writes before the store is sent them)."""
    with tl.open_store(url) as opened:
        store = opened
        if before_commit is not None:
            store, spy = spy_store(opened)
            spy.before_commit = before_commit
        agent = tl.Agent(
            client=model.client(),
            model="claude-test",
            tools=world.tools(),
            store=store,
            on_alert=alerts.append,
            lease_ttl=LEASE_TTL,
        )
        try:
            deadline = time.monotonic() + 10 * LEASE_TTL
            while True:
                try:
                    return agent.run(session="s", prompt="Checkout is down.")
                except tl.SessionBusyError:
                    assert time.monotonic() < deadline, "the lease never came free"
                    time.sleep(LEASE_TTL / 5)
        finally:
            world.fault.disarm()


def test_a_fault_before_the_intent_runs_nothing_and_says_so(setup: Setup, tmp_path: Path) -> None:
    """The fault strikes right before the commit that holds the unsafe call's intent — its own,
    or checkpoint A's, which carries the intent of a turn's one call — so the intent cannot be
    written and the call does not run. The run then stops with a StoreError, or — when
    checkpoint B still gets through (an append on a full disk that needs no new block, a
    directory that is read-only but a file that is not) — the model is told in so many words
    that the call did not run and is safe to retry. Either way, once the store is back the call
    has run at most once, and if it has not run the model knows."""
    world = World(tmp_path / "tickets", setup.fault)

    def trip(ops: Sequence[Op]) -> None:
        intent = any(isinstance(op, InsertEffect) for op in ops)
        if intent and world.trip_in == "intent":
            world.trip_in = None  # once
            world.fault.arm()

    script = [Reply(tool_uses=[ToolUse("create_ticket", {"title": "Outage"})]), Reply(text="ok")]
    alerts: list[tl.LedgerWriteError] = []
    errors: list[tl.StoreError] = []
    with ScriptedModel(script) as model:
        world.trip_in = "intent"
        for _ in range(2):
            try:
                run = run_once(model, setup.url, world, alerts, before_commit=trip)
                break
            except tl.StoreError as exc:
                errors.append(exc)
                assert world.tickets() == [], "the call whose intent failed did not run"
            world.trip_in = None
        assert run.status is tl.RunStatus.COMPLETED, run.reason
        assert model.rejected == []
        told = model.requests[-1]["messages"][2]["content"][0]
    assert alerts == [], "nothing happened that the ledger does not know"
    assert world.tickets() in ([], ["Outage"])
    if world.tickets() == []:
        assert told["is_error"] is True
        assert told["content"].startswith(
            "not executed: the ledger could not record the intent to run 'create_ticket'"
        )
        assert "safe to retry" in told["content"]
    with tl.open_store(setup.url) as store:
        assert verify(store) == []
        assert store.in_doubt() == []


def test_an_effect_that_could_not_be_recorded_alerts_then_lands_once_the_store_is_back(
    setup: Setup, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The tool's effect happened and the store refused its outcome: the run alerts and stops.
    The process still knows the outcome and keeps it — the call is in progress here, never in
    doubt nor run again — and writes it the moment the store takes writes again (at the latest
    when the store is closed), so the next run answers from the ledger."""
    world = World(tmp_path / "tickets", setup.fault)
    alerts: list[tl.LedgerWriteError] = []
    with ScriptedModel(SCRIPT) as model:
        world.trip_in = "create_ticket"
        with (
            caplog.at_level(logging.ERROR, logger="toolledger"),
            pytest.raises(tl.StoreError) as raised,
        ):
            run_once(model, setup.url, world, alerts)
        assert len(alerts) == 1, raised.value
        (alert,) = alerts
        assert alert.tool == "create_ticket" and json.loads(alert.result)["title"] == "Outage"
        assert isinstance(alert.cause, tl.StoreError)
        assert "took effect but the ledger write failed" in caplog.text
        assert world.tickets() == ["Outage"]

        with tl.open_store(setup.url) as store:  # the fault is gone; the outcome was kept
            record = store.ledger("s").get(alert.tool_use_id)
            assert record is not None and record.status is Status.SUCCEEDED, record
            assert json.loads(record.result or "")["title"] == "Outage"
        run = run_once(model, setup.url, world, alerts)
        assert run.status is tl.RunStatus.COMPLETED, run.reason
        assert model.rejected == []
    assert world.tickets() == ["Outage"], "exactly once"
    assert len(alerts) == 1
    with tl.open_store(setup.url) as store:
        assert verify(store) == []


# -- faults that do not come back ---------------------------------------------------------------


def test_a_json_ledger_file_deleted_mid_run_alerts_and_stops_the_session(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The effects file vanishes while the tool runs: the outcome's compare-and-set finds no
    intent. What the worker knows is written back (so no resume runs the call again), the loss
    is alerted, and the session stops for a person in the same run; run again, it goes on from
    the ledger and the ticket exists once."""
    url = f"json:///{tmp_path / 'l'}"

    class DeleteLedgerFile(Fault):
        def arm(self) -> None:
            (tmp_path / "l" / "s.effects.json").unlink()

        def disarm(self) -> None:
            pass

    world = World(tmp_path / "tickets", DeleteLedgerFile())
    world.trip_in = "create_ticket"
    alerts: list[tl.LedgerWriteError] = []
    with ScriptedModel(SCRIPT) as model:
        run = run_once(model, url, world, alerts)
        (alert,) = alerts
        assert alert.tool == "create_ticket" and "changed by someone else" in alert.message
        assert "written again" in alert.message
        assert run.status is tl.RunStatus.NEEDS_ATTENTION
        assert alert.tool_use_id in (run.reason or "")
        with tl.open_store(url) as store:
            record = store.ledger("s").get(alert.tool_use_id)
            assert record is not None and record.status is Status.SUCCEEDED
        again = run_once(model, url, world, alerts)
    assert again.status is tl.RunStatus.COMPLETED, again.reason
    assert world.tickets() == ["Outage"], "never run again"
    with tl.open_store(url) as store:
        assert verify(store) == []


@pytest.mark.parametrize("kind", ["json", "postgres"])
def test_a_store_deleted_mid_run_is_an_alert_not_silence(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The whole store goes (the json directory, the PostgreSQL schema) while the tool runs.
    Nothing can be kept then; what must not happen is silence."""
    if kind == "json":
        url = f"json:///{tmp_path / 'l'}"
        remove: Callable[[], None] = lambda: shutil.rmtree(tmp_path / "l")  # noqa: E731
    else:
        admin_url: str = request.getfixturevalue("postgres_url")
        schema: str = request.getfixturevalue("postgres_schema")  # dropped afterwards
        url = with_params(admin_url, schema=schema)
        remove = lambda: drop_schema(admin_url, schema)  # noqa: E731

    class Delete(Fault):
        def arm(self) -> None:
            remove()

        def disarm(self) -> None:
            pass

    world = World(tmp_path / "tickets", Delete())
    world.trip_in = "create_ticket"
    alerts: list[tl.LedgerWriteError] = []
    with ScriptedModel(SCRIPT) as model, pytest.raises(tl.StoreError):
        run_once(model, url, world, alerts)
    (alert,) = alerts
    assert alert.tool == "create_ticket" and json.loads(alert.result)["title"] == "Outage"


def test_a_connection_dropped_once_mid_transaction_is_retried_and_loses_nothing(
    postgres_url: str, postgres_schema: str, tmp_path: Path
) -> None:
    app = f"tl_fault_{uuid.uuid4().hex[:8]}"
    url = with_params(postgres_url, schema=postgres_schema, application_name=app)
    fault = ConnectionDropped(postgres_url, postgres_schema, app, times=1)
    world = World(tmp_path / "tickets", fault)
    world.trip_in = "create_ticket"
    alerts: list[tl.LedgerWriteError] = []
    with ScriptedModel(SCRIPT) as model:
        run = run_once(model, url, world, alerts)
    assert fault.killed == 1, "the outcome's transaction was killed half-way"
    assert run.status is tl.RunStatus.COMPLETED and alerts == []
    assert world.tickets() == ["Outage"]
    with tl.open_store(url) as store:
        (record,) = [r for r in store.ledger("s").records() if r.tool == "create_ticket"]
        assert record.status is tl.Status.SUCCEEDED
        assert verify(store) == []
