"""The postgresql:// store beyond the conformance suite: migrations under a crowd, schemas as
tenants, dropped connections, the native async backend, and the runner end to end.

Tests that touch a database use the server named by TOOLLEDGER_TEST_POSTGRES_URL
(``postgres_url`` in conftest.py: skipped loudly without one, failed under CI=true).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

try:
    import psycopg
    from psycopg import sql
except ImportError:  # the conformance suite's TestPostgres still fails under CI=true
    pytest.skip(
        "POSTGRESQL BACKEND NOT TESTED: psycopg is missing (pip install 'toolledger[postgres]')",
        allow_module_level=True,
    )

import toolledger as tl
from toolledger.ops import AbandonMessages, AppendMessages, InsertEffect, PutSession, UpdateEffect
from toolledger.records import Status, StoredMessage
from toolledger.stores._sql import writes
from toolledger.stores._sql.schema import POSTGRES_MIGRATIONS, TABLES
from toolledger.stores.postgres import AsyncPostgresBackend, PostgresBackend, guards
from toolledger.stores.postgres import errors as pg_store_errors
from toolledger.stores.postgres.call import drive
from toolledger.stores.postgres.settings import parse_url
from toolledger.testing import Counter
from toolledger.testing.conformance import make_record, make_state

from ..conftest import drop_schema, tool_use, with_params

pytestmark = pytest.mark.postgres

VERSION = len(POSTGRES_MIGRATIONS)
Admin = psycopg.Connection[tuple[Any, ...]]


@pytest.fixture
def admin(postgres_url: str) -> Iterator[Admin]:
    """A connection of the test's own, outside any store."""
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def new_schema(postgres_url: str) -> Iterator[Callable[[str], str]]:
    """``new_schema(name)`` → a store URL on that schema; every one is dropped afterwards."""
    made: list[str] = []

    def make(name: str) -> str:
        made.append(name)
        return with_params(postgres_url, schema=name)

    yield make
    for name in made:
        drop_schema(postgres_url, name)


def pg_backend(store: tl.Store) -> PostgresBackend:
    assert isinstance(store.backend, PostgresBackend)
    return store.backend


def in_schema(admin: Admin, schema: str, query: str, params: tuple[Any, ...] = ()) -> list[Any]:
    admin.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
    cur = admin.execute(query, params)
    return cur.fetchall() if cur.description is not None else []


def backends_named(admin: Admin, app: str) -> list[int]:
    rows = admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app,)
    ).fetchall()
    return [r[0] for r in rows]


def terminate(admin: Admin, app: str) -> int:
    """Kill every server process serving ``app`` and wait until they are gone."""
    pids = backends_named(admin, app)
    for pid in pids:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    deadline = time.monotonic() + 10
    while set(pids) & set(backends_named(admin, app)):
        assert time.monotonic() < deadline, "terminated backends did not exit"
        time.sleep(0.02)
    return len(pids)


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


# -- migrations ---------------------------------------------------------------------------------


@pytest.mark.parametrize("crowd", ["threads", "processes"])
def test_a_crowd_opening_a_fresh_schema_migrates_it_once(
    crowd: str, postgres_store_url: str, postgres_schema: str, admin: Admin
) -> None:
    url = postgres_store_url
    if crowd == "threads":
        barrier = threading.Barrier(8)
        versions: list[int] = []
        errors: list[BaseException] = []

        def open_one() -> None:
            barrier.wait()
            try:
                with tl.open_store(url) as store:
                    versions.append(pg_backend(store).schema_version)
                    assert store.sessions() == []
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=open_one) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert errors == []
    else:
        script = (
            "import sys, time; from toolledger import open_store; "
            "time.sleep(max(0.0, float(sys.argv[2]) - time.time())); "
            "s = open_store(sys.argv[1]); print(s.backend.schema_version); s.close()"
        )
        start = str(time.time() + 2.0)  # past every child's import: they open at one instant
        children = [
            subprocess.Popen(
                [sys.executable, "-c", script, url, start],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(8)
        ]
        outputs = [child.communicate(timeout=60) for child in children]
        assert [c.returncode for c in children] == [0] * 8, [err for _, err in outputs]
        versions = [int(out) for out, _ in outputs]
    assert versions == [VERSION] * 8
    recorded = in_schema(admin, postgres_schema, "SELECT version FROM toolledger_schema")
    assert sorted(recorded) == [(v,) for v in range(1, VERSION + 1)]
    tables = admin.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
        (postgres_schema,),
    ).fetchall()
    assert sorted(t for (t,) in tables) == sorted([*TABLES, "toolledger_schema"])


def test_reopening_runs_no_migration_again(
    postgres_store_url: str, postgres_schema: str, admin: Admin
) -> None:
    for _ in range(3):
        with tl.open_store(postgres_store_url) as store:
            assert pg_backend(store).integrity_check() == []
    rows = in_schema(admin, postgres_schema, "SELECT count(*) FROM toolledger_schema")
    assert rows == [(VERSION,)]


def test_a_schema_newer_than_the_code_is_refused(
    postgres_store_url: str, postgres_schema: str, admin: Admin
) -> None:
    with tl.open_store(postgres_store_url) as store:
        store.backend.apply("s", [InsertEffect(make_record())])
    newer = (VERSION + 5,)
    in_schema(admin, postgres_schema, "INSERT INTO toolledger_schema (version) VALUES (%s)", newer)
    with pytest.raises(
        tl.SchemaVersionError, match="written by a newer toolledger — upgrade"
    ) as info:
        tl.open_store(postgres_store_url)
    assert info.value.url is not None and postgres_schema in info.value.url
    rows = in_schema(admin, postgres_schema, "SELECT tool_use_id FROM effects")
    assert rows == [("toolu_1",)], "nothing was touched"


# -- schemas as tenants ---------------------------------------------------------------------------


def test_schemas_keep_stores_apart(new_schema: Callable[[str], str], admin: Admin) -> None:
    odd = f'tl_test Tenant "B"; DROP SCHEMA public -- {uuid.uuid4().hex[:8]}'
    url_a = new_schema(f"tl_test_a_{uuid.uuid4().hex[:12]}")
    url_b = new_schema(odd)
    with tl.open_store(url_a) as a, tl.open_store(url_b) as b:
        rec_a = make_record(result="from a", status=Status.SUCCEEDED)
        rec_b = make_record(result="from b", status=Status.SUCCEEDED)
        assert a.backend.apply("s", [InsertEffect(rec_a)]) == [True]
        assert b.backend.apply("s", [InsertEffect(rec_b)]) == [True], "same id, other schema"
        assert a.ledger("s").records() == [rec_a]
        assert b.ledger("s").records() == [rec_b]
        b.backend.apply("only-b", [InsertEffect(make_record("only-b"))])
        assert a.sessions() == ["s"]
        assert b.sessions() == ["only-b", "s"]
        assert [r.session_id for r in a.in_doubt()] == []
        assert [r.session_id for r in b.in_doubt()] == ["only-b"]
    in_odd = admin.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s", (odd,)
    ).fetchone()
    assert in_odd == (len(TABLES) + 1,)
    assert admin.execute("SELECT to_regnamespace('public') IS NOT NULL").fetchone() == (True,)


def test_looking_at_a_schema_never_creates_it(
    new_schema: Callable[[str], str], admin: Admin, capsys: pytest.CaptureFixture[str]
) -> None:
    """``toolledger sessions --store …?schema=typo`` says there is no store there and leaves
    the database as it was; once the store exists the same command reads it."""
    from toolledger.cli.app import main

    name = f"tl_test_look_{uuid.uuid4().hex[:12]}"
    url = new_schema(name)
    exists = "SELECT to_regnamespace(%s) IS NOT NULL"
    with pytest.raises(tl.StoreUnavailableError, match="no store at"):
        tl.open_store(url, create=False)
    for command in (["sessions"], ["in-doubt"], ["show", "s"], ["approve", "s", "t"]):
        assert main([*command, "--store", url]) == 1
        assert "no store at" in capsys.readouterr().err
    assert admin.execute(exists, (name,)).fetchone() == (False,), "looking created the schema"
    tl.open_store(url).close()
    assert admin.execute(exists, (name,)).fetchone() == (True,)
    assert main(["sessions", "--store", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"sessions": [], "ledger_only": []}


# -- connections that die -------------------------------------------------------------------------


def test_killed_idle_connections_are_replaced_transparently(
    postgres_url: str, postgres_schema: str, admin: Admin
) -> None:
    app = f"tl_victim_{uuid.uuid4().hex[:8]}"
    url = with_params(postgres_url, schema=postgres_schema, application_name=app, pool_min="2")
    with tl.open_store(url) as store:
        kept = make_record("s", "kept", result="committed", status=Status.SUCCEEDED)
        assert store.backend.apply("s", [InsertEffect(kept)]) == [True]
        wait_until(lambda: len(backends_named(admin, app)) >= 2, "the pool is filled")
        assert terminate(admin, app) >= 2
        assert store.ledger("s").get("kept") == kept  # a read after the kill
        assert terminate(admin, app) >= 1
        late = make_record("s", "late")
        assert store.backend.apply("s", [InsertEffect(late)]) == [True]  # a write after it
        assert {r.tool_use_id for r in store.ledger("s").records()} == {"kept", "late"}
    rows = in_schema(admin, postgres_schema, "SELECT tool_use_id FROM effects ORDER BY 1")
    assert rows == [("kept",), ("late",)]


def test_a_connection_killed_inside_a_transaction_loses_nothing(
    postgres_url: str, postgres_schema: str, admin: Admin
) -> None:
    """The write is stopped half-way (its UPDATE waits on a row lock the test holds), its server
    process is killed, then the lock released. Either the write comes through whole — retried on
    a fresh connection, since nothing was committed — or it raises a StoreError and leaves
    nothing; a record committed before is never lost."""
    app = f"tl_victim_{uuid.uuid4().hex[:8]}"
    url = with_params(postgres_url, schema=postgres_schema, application_name=app)
    with tl.open_store(url) as store, psycopg.connect(postgres_url) as locker:
        first = make_record("s", "a")
        store.backend.apply("s", [InsertEffect(first)])
        locker.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(postgres_schema)))
        locker.execute("SELECT * FROM effects WHERE tool_use_id = 'a' FOR UPDATE")  # holds it

        a_done = replace(first, status=Status.SUCCEEDED, result='"A"', updated_at=2e9)
        second = make_record("s", "b")
        ops = [InsertEffect(second), UpdateEffect(a_done, Status.STARTED, 1)]
        outcome: list[Any] = []
        writer = threading.Thread(target=lambda: outcome.append(_try(store, ops)))
        writer.start()

        def blocked() -> bool:
            row = admin.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE application_name = %s AND wait_event_type = 'Lock'",
                (app,),
            ).fetchone()
            return row is not None and row[0] > 0

        wait_until(blocked, "the write waits on the row lock")
        assert terminate(admin, app) >= 1
        wait_until(lambda: blocked() or not writer.is_alive(), "the write is retried or gives up")
        locker.rollback()  # release the row
        writer.join(timeout=30)
        assert not writer.is_alive()

        records = store.ledger("s").records()
        result = outcome[0]
        if isinstance(result, tl.StoreError):
            assert records == [first], "a failed write left nothing behind"
        else:
            assert result == [True, True]
            assert records == [a_done, second]
        assert result == [True, True], "nothing was committed, so it was retried transparently"


def test_a_connection_cut_mid_write_is_ended_before_the_store_reads_again(
    postgres_url: str, postgres_schema: str, admin: Admin
) -> None:
    """A connection cut in the middle of a write leaves its transaction open on the server, its
    COMMIT perhaps still on the network. Before the store reads anything else it ends that
    server backend, so a read-back cannot be overtaken by the commit it is looking for. Here
    the orphan is made by hand: a transaction on one of the pool's own connections, written and
    left open, handed to the store as cut."""
    url = with_params(postgres_url, schema=postgres_schema, op_timeout="30")
    with tl.open_store(url) as store:
        backend = pg_backend(store)
        late = make_record("s", "late")
        with backend._pool.connection() as conn:
            ident = guards.identity[conn]
            assert ident[0] == conn.info.backend_pid
            conn.execute("BEGIN")
            drive(conn, writes.apply("s", [InsertEffect(late)]))
            backend.orphans.add(ident)  # as _run does when the watchdog cuts a write
            assert store.ledger("s").get("late") is None  # read on another connection...
            alive = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (ident[0],)
            ).fetchone()
            assert alive == (0,), "...after the open transaction's backend was ended"
            assert backend.orphans.pending() == []
            with pytest.raises(psycopg.OperationalError):
                conn.execute("COMMIT")  # the late commit can never land now
        assert store.backend.apply("s", [InsertEffect(late)]) == [True]
    assert in_schema(admin, postgres_schema, "SELECT tool_use_id FROM effects") == [("late",)]


def test_the_server_ends_a_transaction_whose_client_is_gone(
    postgres_url: str, postgres_schema: str, admin: Admin
) -> None:
    """Our connections ask the server to end a transaction left idle longer than one operation
    deadline: its client is gone (cut off, paused, killed), and its row locks — the lease's
    among them — must not outlive it by hours."""
    url = with_params(postgres_url, schema=postgres_schema, op_timeout="0.5")
    with tl.open_store(url) as store:
        with pg_backend(store)._pool.connection() as conn:
            setting = conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()
            assert setting == ("500ms",)
            conn.execute("BEGIN")
            conn.execute("SELECT * FROM sessions FOR UPDATE")
            pid = conn.info.backend_pid
            wait_until(
                lambda: (
                    admin.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)
                    ).fetchone()
                    == (0,)
                ),
                "the server ends the idle transaction",
            )
            with pytest.raises(psycopg.Error, match="idle-in-transaction timeout") as lost:
                conn.execute("SELECT 1")
            assert pg_store_errors.connection_lost(lost.value), "a lost connection: retried if safe"
        assert store.backend.read_session("s") is None  # the store goes on, on a new connection


def test_a_commit_sent_by_a_killed_worker_is_seen_by_the_next_store(
    postgres_store_url: str, postgres_schema: str, admin: Admin
) -> None:
    """A worker sends its commit (a COMMIT, or a one-statement write in autocommit) and is killed
    before the answer; the commit lands a moment later.
    A store opened right after the kill must not read the state from before it (the torture
    harness saw a finished call read as in doubt that way). A deferred trigger makes the commit
    take 0.7 s, so "a moment later" is wide enough to see."""
    with tl.open_store(postgres_store_url) as store:
        store.backend.apply("s", [InsertEffect(make_record())])
    in_schema(
        admin,
        postgres_schema,
        "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql "
        "AS $$ BEGIN PERFORM pg_sleep(0.7); RETURN NULL; END $$",
    )
    in_schema(
        admin,
        postgres_schema,
        "CREATE CONSTRAINT TRIGGER slow_commit AFTER UPDATE ON effects "
        "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()",
    )
    app = f"tl_dying_{uuid.uuid4().hex[:8]}"
    script = (
        "import sys; from dataclasses import replace; from toolledger import open_store; "
        "from toolledger.records import Status; "
        "from toolledger.ops import UpdateEffect; "
        "from toolledger.testing.conformance import make_record; "
        "r = make_record(); done = replace(r, status=Status.SUCCEEDED, result='1'); "
        "open_store(sys.argv[1]).backend.apply('s', [UpdateEffect(done, Status.STARTED, 1)])"
    )
    url = with_params(postgres_store_url, application_name=app)
    child = subprocess.Popen([sys.executable, "-c", script, url])
    try:

        def committing() -> bool:
            row = admin.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE application_name = %s AND state = 'active' "
                "AND (query = 'COMMIT' OR query LIKE 'UPDATE effects%%')",
                (app,),
            ).fetchone()
            return row == (1,)

        wait_until(committing, "the worker is inside its COMMIT", timeout=30)
    finally:
        child.kill()
        child.wait()
    with tl.open_store(postgres_store_url) as store:  # the next worker, at once
        got = store.ledger("s").get("toolu_1")
    assert got is not None and got.status is Status.SUCCEEDED


def _try(store: tl.Store, ops: list[Any]) -> Any:
    try:
        return store.backend.apply("s", ops)
    except tl.StoreError as exc:
        return exc


def test_a_connection_lost_during_commit_is_reported_not_retried() -> None:
    """The COMMIT may have landed: running the conditional writes again would report our own row
    as someone else's. So it is an error that says the outcome is unknown."""
    lost = psycopg.errors.AdminShutdown("terminating connection due to administrator command")
    url = "postgresql://h/db"
    assert pg_store_errors.failure(lost, url=url, action="writing", attempt=0) is None
    during = pg_store_errors.failure(lost, url=url, action="writing", attempt=0, committing=True)
    assert isinstance(during, tl.StoreUnavailableError)
    assert "may or may not have been committed" in str(during)
    gave_up = pg_store_errors.failure(
        lost, url=url, action="writing", attempt=pg_store_errors.RETRIES
    )
    assert isinstance(gave_up, tl.StoreUnavailableError) and "Nothing was written" in str(gave_up)
    assert not gave_up.outcome_unknown
    # One autocommit statement: sending it is committing it. It is sent again while retries
    # last (the resend checks whether the first landed); a loss that ends them is unknown.
    assert pg_store_errors.failure(lost, url=url, action="writing", attempt=0, single=True) is None
    sent = pg_store_errors.failure(
        lost, url=url, action="writing", attempt=pg_store_errors.RETRIES, single=True
    )
    assert isinstance(sent, tl.StoreUnavailableError) and sent.outcome_unknown
    other = pg_store_errors.failure(
        psycopg.errors.DivisionByZero("x"), url=url, action="x", attempt=0
    )
    assert type(other) is tl.StoreError


def test_an_unreachable_server_is_store_unavailable() -> None:
    with pytest.raises(tl.StoreUnavailableError, match="Check that the server is up") as info:
        tl.open_store("postgresql://postgres@127.0.0.1:1/test?connect_timeout=3")
    assert isinstance(info.value.__cause__, psycopg.OperationalError)


def test_a_server_that_refuses_the_connection_is_not_called_unreachable(
    postgres_url: str,
) -> None:
    """The server answered — no such database, no such role — so the message points at the
    URL's user, password and database, not at whether the server is up."""
    for wrong in ("toolledger_no_such_db", None):
        if wrong is None:
            if "://postgres@" not in postgres_url:
                continue  # (a server named otherwise: the database case stands alone)
            url = postgres_url.replace("://postgres@", "://toolledger_no_such_role@")
        else:
            url = postgres_url.rsplit("/", 1)[0] + f"/{wrong}"
        with pytest.raises(tl.StoreUnavailableError, match="refused the connection") as info:
            tl.open_store(url)
        assert "Check the URL's user and database" in str(info.value)


@pytest.mark.parametrize(
    "said", ["sorry, too many clients already", "the database system is shutting down"]
)
def test_a_server_busy_or_restarting_is_not_blamed_on_the_url(said: str) -> None:
    """A server that answers but is full, or starting, or shutting down, is the server's state:
    the message says to check the server, not the URL's user or database."""
    exc = psycopg.OperationalError(f"connection failed: FATAL:  {said}")
    error = pg_store_errors.translate(exc, url="postgresql://h/db", action="connecting")
    assert "refused" not in str(error) and "Check that the server is up" in str(error)


def test_a_server_that_takes_no_writes_says_so_and_runs_nothing(
    postgres_store_url: str, postgres_schema: str, tmp_path: Path
) -> None:
    """default_transaction_read_only (or a standby): the intent cannot be written, so the tool
    does not run, and the error says why and what to change — not a bare driver message."""
    tl.open_store(postgres_store_url).close()  # the schema, made while writes were taken
    read_only = with_params(postgres_store_url, options="-c default_transaction_read_only=on")
    world = tmp_path / "world"

    @tl.tool(effect="non_idempotent")
    def append(line: str) -> str:
        with world.open("a") as fh:
            fh.write(line + "\n")
        return "ok"

    with tl.open_store(read_only) as store:
        with pytest.raises(tl.StoreUnavailableError) as info:
            tl.run_tool_uses(
                [tool_use("toolu_1", "append", line="a")],
                tl.ToolSet([append]),
                ledger=store.ledger("s"),
            )
        assert "default_transaction_read_only" in str(info.value)
        assert "target_session_attrs=read-write" in str(info.value)
    assert not world.exists()
    fresh = postgres_store_url.replace(postgres_schema, postgres_schema + "_new")  # made by none
    with pytest.raises(tl.StoreUnavailableError, match="takes no writes") as opened:
        tl.open_store(with_params(fresh, options="-c default_transaction_read_only=on"))
    assert "Nothing was written" in str(opened.value)


def test_a_statement_the_server_cancels_says_which_setting_and_runs_nothing(
    postgres_store_url: str, postgres_schema: str, postgres_url: str
) -> None:
    """A statement_timeout of the server's (here in the URL's options) runs out while another
    transaction holds a lock on the ledger: the call does not run, and the error names the
    setting and what to do with it — not a bare "canceling statement"."""
    tl.open_store(postgres_store_url).close()
    url = with_params(postgres_store_url, options="-c statement_timeout=200")
    runs: list[str] = []

    @tl.tool(effect="non_idempotent")
    def append(line: str) -> str:
        runs.append(line)
        return "ok"

    with tl.open_store(url) as store, psycopg.connect(postgres_url) as blocker:
        blocker.execute(
            sql.SQL("LOCK TABLE {}.effects IN ACCESS EXCLUSIVE MODE").format(
                sql.Identifier(postgres_schema)
            )
        )
        with pytest.raises(tl.StoreUnavailableError) as info:
            tl.run_tool_uses(
                [tool_use("toolu_1", "append", line="a")],
                tl.ToolSet([append]),
                ledger=store.ledger("s"),
            )
        blocker.rollback()
        said = " ".join(str(info.value).split())
        assert "statement_timeout" in said and "op_timeout" in said, said
        assert isinstance(info.value.__cause__, psycopg.errors.QueryCanceled)
    assert runs == []
    error = pg_store_errors.translate(
        psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"),
        url="postgresql://h/db",
        action="writing the ledger",
    )
    assert isinstance(error, tl.StoreUnavailableError) and "lock_timeout" in str(error)


def test_a_closed_store_says_so(postgres_store_url: str) -> None:
    store = tl.open_store(postgres_store_url)
    store.close()
    store.close()  # idempotent
    with pytest.raises(tl.StoreError, match="closed"):
        store.ledger("s").records()


# -- threads ----------------------------------------------------------------------------------


def test_threads_racing_for_one_record_have_one_winner(postgres_store_url: str) -> None:
    with tl.open_store(postgres_store_url) as store:
        barrier = threading.Barrier(16)
        won: list[str] = []

        def race(i: int) -> None:
            record = replace(make_record(), worker=f"w{i}")
            barrier.wait()
            if store.backend.apply("s", [InsertEffect(record)]) == [True]:
                won.append(f"w{i}")

        threads = [threading.Thread(target=race, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert len(won) == 1
        got = store.ledger("s").get("toolu_1")
        assert got is not None and got.worker == won[0]


def test_racing_checkpoints_one_wins_the_rest_conflict(postgres_store_url: str) -> None:
    handles = [tl.open_store(postgres_store_url) for _ in range(8)]
    try:
        handles[0].backend.apply("s", [PutSession(make_state(version=1), None)])
        barrier = threading.Barrier(8)
        results: list[str] = []

        def checkpoint(i: int) -> None:
            message = StoredMessage(seq=0, role="user", content=f"w{i}", created_at=1.0)
            barrier.wait()
            try:
                handles[i].backend.apply("s", [AppendMessages((message,))])
                results.append(f"w{i}")
            except tl.SessionConflictError:
                results.append("conflict")

        threads = [threading.Thread(target=checkpoint, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        winners = [r for r in results if r != "conflict"]
        assert len(winners) == 1 and len(results) == 8
        stored = handles[0].backend.read_messages("s")
        assert [(m.seq, m.content) for m in stored] == [(0, winners[0])]
    finally:
        for h in handles:
            h.close()


# -- the async backend ----------------------------------------------------------------------------


def test_the_async_backend_round_trip(
    postgres_url: str, postgres_schema: str, admin: Admin
) -> None:
    app = f"tl_async_{uuid.uuid4().hex[:8]}"
    url = with_params(postgres_url, schema=postgres_schema, application_name=app)
    store = tl.open_store(url)
    record = make_record()
    done = replace(record, status=Status.SUCCEEDED, result='"ok"', updated_at=2e9)
    cas = UpdateEffect(done, expect_status=Status.STARTED, expect_attempt=1)

    async def round_trip() -> None:
        backend = store.async_backend
        assert await backend.apply("s", [InsertEffect(record)]) == [True]
        assert await backend.apply("s", [InsertEffect(record)]) == [False]
        assert await store.ledger("s").aget("toolu_1") == record
        assert await backend.apply("s", [cas]) == [True]
        assert await backend.apply("s", [cas]) == [False], "a re-sent CAS is harmless"
        assert await backend.read_effects("s", ["toolu_1", "nope"]) == {"toolu_1": done}
        state = make_state(messages=1)
        message = StoredMessage(seq=0, role="user", content=[{"a": 1}], created_at=1.0)
        assert await backend.apply("s", [PutSession(state, None), AppendMessages((message,))])
        with pytest.raises(tl.SessionConflictError):
            await backend.apply("s", [PutSession(make_state(version=2), expect_version=5)])
        assert await backend.read_session("s") == state
        assert await backend.read_messages("s") == [message]
        assert await backend.read_approvals("s") == []

    try:
        asyncio.run(round_trip())
        assert store.ledger("s").get("toolu_1") == done, "the sync face sees the async writes"
        # asyncio.run again is a new event loop: the backend opens a pool there.
        again = asyncio.run(store.async_backend.read_effects("s"))
        assert again == {"toolu_1": done}
        asyncio.run(store.aclose())
        with pytest.raises(tl.StoreError, match="closed"):
            store.ledger("s").records()  # aclose released the sync pool too
    finally:
        store.close()
    wait_until(lambda: backends_named(admin, app) == [], "every connection is closed")


def test_arun_tool_uses_runs_a_repeated_tool_use_once(
    postgres_store_url: str, postgres_schema: str, admin: Admin
) -> None:
    counter = Counter()

    @tl.tool
    def create_ticket(title: str) -> dict[str, Any]:
        return {"ticket": counter.hit("create_ticket"), "title": title}

    block = tool_use("toolu_1", "create_ticket", title="outage")

    async def twice() -> list[list[dict[str, Any]]]:
        store = tl.open_store(postgres_store_url)
        async with store:
            first = await tl.arun_tool_uses([block], [create_ticket], ledger=store.ledger("s"))
            second = await tl.arun_tool_uses([block], [create_ticket], ledger=store.ledger("s"))
        return [first, second]

    first, second = asyncio.run(twice())
    third, _ = asyncio.run(twice())  # a new store and event loop: as after a restart
    assert counter["create_ticket"] == 1
    assert first == second == third
    assert first[0]["content"] == '{"ticket": 1, "title": "outage"}'
    rows = in_schema(admin, postgres_schema, "SELECT tool_use_id, status, attempt FROM effects")
    assert rows == [("toolu_1", "succeeded", 1)]


def test_asyncio_run_again_and_again_without_aclose(
    postgres_url: str, postgres_schema: str, admin: Admin
) -> None:
    """Scripts call ``asyncio.run`` once per step and forget ``aclose``. Each loop's pool is closed
    as that loop ends (a loop ending with the pool open could hang in its shutdown), and nothing
    is left connected once the store is closed."""
    app = f"tl_loops_{uuid.uuid4().hex[:8]}"
    url = with_params(postgres_url, schema=postgres_schema, application_name=app)
    counter = Counter()

    @tl.tool
    def send_email(to: str) -> str:
        return f"sent #{counter.hit('send_email')} to {to}"

    block = tool_use("toolu_1", "send_email", to="ana@example.com")
    results: list[Any] = []

    def script() -> None:
        store = tl.open_store(url)
        try:
            for _ in range(6):
                run = tl.arun_tool_uses([block], [send_email], ledger=store.ledger("s"))
                results.append(asyncio.run(run))
        finally:
            store.close()

    worker = threading.Thread(target=script, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "an event loop hung in its shutdown"
    assert len(results) == 6 and all(r == results[0] for r in results)
    assert counter["send_email"] == 1
    wait_until(lambda: backends_named(admin, app) == [], "every connection is closed")


def test_a_loop_that_ends_while_the_pool_grows_does_not_hang(
    postgres_url: str, postgres_schema: str
) -> None:
    """A burst of concurrent calls makes the pool open connections in the background; the loop
    ends (``asyncio.run`` returns) with some still being made. psycopg_pool's workers swallow
    that cancellation, so without closing the pool in the loop's shutdown this hangs."""
    url = with_params(postgres_url, schema=postgres_schema, pool_max="16")
    done: list[int] = []

    def bursts() -> None:
        with tl.open_store(url) as store:

            async def burst() -> None:
                reads = [store.async_backend.read_effects("s") for _ in range(16)]
                await asyncio.gather(*reads)

            for i in range(10):
                asyncio.run(burst())
                done.append(i)

    worker = threading.Thread(target=bursts, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), f"an event loop hung in its shutdown after {len(done)} bursts"
    assert len(done) == 10


def test_two_event_loops_at_once_share_one_store(
    postgres_url: str, postgres_schema: str, admin: Admin
) -> None:
    """A worker that runs one event loop per thread over one store: each loop has a pool of its
    own, so neither closes the pool the other is using, and every call is written once."""
    app = f"tl_two_loops_{uuid.uuid4().hex[:8]}"
    url = with_params(postgres_url, schema=postgres_schema, application_name=app)
    counter = Counter()

    @tl.tool
    def send_email(to: str) -> str:
        return f"sent #{counter.hit(to)} to {to}"

    store = tl.open_store(url)
    both = threading.Barrier(2)
    errors: list[BaseException] = []
    answers: dict[str, list[Any]] = {}

    def worker(name: str) -> None:
        async def calls() -> None:
            for i in range(20):
                block = tool_use(f"toolu_{name}_{i}", "send_email", to=f"{name}{i}@example.com")
                ledger = store.ledger(f"s_{name}")
                answers.setdefault(name, []).append(
                    await tl.arun_tool_uses([block], [send_email], ledger=ledger)
                )
                if i == 0:
                    await asyncio.to_thread(both.wait, 10)  # both loops now hold a pool

        try:
            asyncio.run(calls())
        except BaseException as exc:  # reported below
            errors.append(exc)

    try:
        threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in "ab"]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads), "a loop hung"
        assert errors == []
        assert {n: len(a) for n, a in answers.items()} == {"a": 20, "b": 20}
        sent = [counter[f"{n}{i}@example.com"] for n in "ab" for i in range(20)]
        assert sent == [1] * 40 and counter.total == 40, "every email sent once"
        rows = in_schema(admin, postgres_schema, "SELECT status, count(*) FROM effects GROUP BY 1")
        assert rows == [("succeeded", 40)]
    finally:
        store.close()
    wait_until(lambda: backends_named(admin, app) == [], "every connection is closed")


def test_aclose_while_other_tasks_write_never_reports_a_written_row_as_failed(
    postgres_url: str, postgres_schema: str, admin: Admin
) -> None:
    """``aclose()`` in one task while twenty others write: a write already under way on its
    connection finishes and is answered; one that had not started is told the store is closed.
    Every row in the table was reported written — none is "failed" and there."""
    url = with_params(postgres_url, schema=postgres_schema, pool_max="8")
    store = tl.open_store(url)
    written: set[str] = set()
    refused: list[BaseException] = []

    async def write(n: int) -> None:
        for k in range(100_000):  # until the store is closed
            tid = f"toolu_{n}_{k}"
            try:
                await store.async_backend.apply("s", [InsertEffect(make_record("s", tid))])
            except tl.StoreError as exc:
                refused.append(exc)
                return
            written.add(tid)

    async def main() -> None:
        writers = [asyncio.create_task(write(n)) for n in range(20)]
        await asyncio.sleep(0.3)
        await store.aclose()
        await asyncio.gather(*writers)

    try:
        asyncio.run(main())
    finally:
        store.close()
    rows = {r[0] for r in in_schema(admin, postgres_schema, "SELECT tool_use_id FROM effects")}
    assert rows - written == set(), "written, but its caller was told it failed"
    assert written - rows == set()
    assert refused and all("closed" in str(e) for e in refused), refused[:3]


def test_a_write_in_a_tasks_shutdown_leaves_no_connection_behind(
    postgres_url: str, postgres_schema: str, admin: Admin
) -> None:
    """``asyncio.run`` ends with a task still going, which writes as it is cancelled (as a run
    gives its lease back). Its pool is closed as the loop ends; the write is answered or told
    the loop is ending, and no other pool is made that nothing would close."""
    app = f"tl_end_{uuid.uuid4().hex[:8]}"
    url = with_params(postgres_url, schema=postgres_schema, application_name=app)
    store = tl.open_store(url)
    answers: list[Any] = []

    async def lingering() -> None:
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            try:
                answers.append(await store.async_backend.apply("s", [InsertEffect(make_record())]))
            except tl.StoreError as exc:
                answers.append(exc)

    async def main() -> None:
        await store.async_backend.read_effects("s")
        asyncio.get_running_loop().create_task(lingering())
        await asyncio.sleep(0)

    try:
        # What the sync side holds open: its pool's one connection (?pool_min=1), once made.
        wait_until(lambda: len(backends_named(admin, app)) == 1, "the sync pool's connection")
        before = 1
        for _ in range(3):
            asyncio.run(main())
            wait_until(lambda: len(backends_named(admin, app)) <= before, "no connection left")
        assert len(answers) == 3
        assert all(a in ([True], [False]) or "ending" in str(a) for a in answers), answers
    finally:
        store.close()
    wait_until(lambda: backends_named(admin, app) == [], "every connection is closed")


def _end_loops(*loops: asyncio.AbstractEventLoop) -> None:
    """The program's end: each loop's tasks ended, then the loop closed."""
    for loop in loops:
        loop.run_until_complete(_end_tasks())
        loop.close()


async def _end_tasks() -> None:
    """Cancel every other task of the running loop and wait for them (what ``asyncio.run``
    does as it ends)."""
    left = asyncio.all_tasks() - {asyncio.current_task()}
    for task in left:
        task.cancel()
    await asyncio.gather(*left, return_exceptions=True)


def test_loops_that_take_turns_step_by_step_do_not_pile_up_pools(
    postgres_url: str, postgres_schema: str, admin: Admin, caplog: pytest.LogCaptureFixture
) -> None:
    """Two loops, each run step by step (``run_until_complete``) in turn and never closed
    meanwhile: each one's first call in a step lets go of the other's pool, which that loop
    closes, in itself, when it runs again. However many steps, the connections do not grow,
    and the store holds only the pool of the loop it last served."""
    app = f"tl_turns_{uuid.uuid4().hex[:8]}"
    url = with_params(postgres_url, schema=postgres_schema, application_name=app)
    store = tl.open_store(url)
    loops = (asyncio.new_event_loop(), asyncio.new_event_loop())

    def steps(n: int) -> None:
        for _ in range(n):
            for loop in loops:
                loop.run_until_complete(store.async_backend.read_effects("s"))

    try:
        steps(2)
        time.sleep(0.5)
        settled = len(backends_named(admin, app))
        with caplog.at_level(logging.ERROR, "asyncio"):
            steps(12)
            gc.collect()  # a task let go while pending would be reported destroyed here
        assert not [r for r in caplog.records if "destroyed" in r.getMessage()]
        wait_until(lambda: len(backends_named(admin, app)) <= settled, "no more connections")
        assert len(store.async_backend._pools) == 1
    finally:
        store.close()
        _end_loops(*loops)
    wait_until(lambda: backends_named(admin, app) == [], "every connection is closed")


@pytest.mark.parametrize("waiting_for", ["the pool to open", "a connection"])
def test_a_call_waiting_in_a_pool_the_store_lets_go_of_goes_on_with_a_new_one(
    postgres_url: str, postgres_schema: str, waiting_for: str
) -> None:
    """A call of a loop run step by step waits — for its pool to open, or for a connection
    another call holds — when another loop's first call lets go of that pool. Run again, the
    call goes on with a new pool: answered at once, not told the server is down or the store
    closed."""
    one = "&pool_max=1&pool_min=1" if waiting_for == "a connection" else ""
    url = with_params(postgres_url, schema=postgres_schema) + one
    store = tl.open_store(url)
    first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
    backend = store.async_backend

    async def both(*tasks: asyncio.Task[Any]) -> list[Any]:
        return await asyncio.gather(*(asyncio.wait_for(t, 8) for t in tasks))

    try:
        if waiting_for == "the pool to open":
            tasks = [first.create_task(backend.read_effects("s"))]
            first.run_until_complete(asyncio.sleep(0))
            second.run_until_complete(backend.read_session("s"))
        else:
            first.run_until_complete(backend.read_effects("s"))
            with psycopg.connect(postgres_url) as lock:
                lock.execute(f'LOCK TABLE "{postgres_schema}".effects IN ACCESS EXCLUSIVE MODE')
                tasks = [first.create_task(backend.read_effects("s")) for _ in range(2)]
                first.run_until_complete(asyncio.sleep(0.3))  # one holds it, one waits
                behind = threading.Thread(
                    target=second.run_until_complete, args=(backend.read_session("s"),)
                )
                behind.start()
                behind.join(10)
        started = time.monotonic()
        assert first.run_until_complete(both(*tasks)) == [{}] * len(tasks)
        assert time.monotonic() - started < 5, "not after a timeout"
    finally:
        store.close()
        _end_loops(first, second)


def test_a_store_closed_while_another_threads_loop_opens_its_pool_ends_that_call_at_once(
    postgres_url: str, postgres_schema: str
) -> None:
    """A loop running in another thread is opening its pool (its first call waits for it) when
    the program closes the store: that call is told the store is closed at once, not after the
    pool's timeout, and nothing is left open behind it."""
    url = with_params(postgres_url, schema=postgres_schema, pool_timeout="20")
    store = tl.open_store(url)
    backend = store.async_backend
    assert isinstance(backend, AsyncPostgresBackend)
    made = backend._new_pool
    opening = threading.Event()

    def slow_to_open(loop: asyncio.AbstractEventLoop) -> Any:
        current = made(loop)
        open_pool = current.pool.open

        async def slow(**kwargs: Any) -> None:
            opening.set()
            await asyncio.sleep(15)  # a server slow to answer
            await open_pool(**kwargs)

        current.pool.open = slow
        return current

    backend._new_pool = slow_to_open  # type: ignore[method-assign]
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    try:
        call = asyncio.run_coroutine_threadsafe(backend.read_effects("s"), loop)
        assert opening.wait(10)
        started = time.monotonic()
        store.close()
        with pytest.raises(tl.StoreError, match="the store is closed"):
            call.result(timeout=8)
        assert time.monotonic() - started < 5, "not after the pool's timeout"
    finally:
        store.close()
        loop.call_soon_threadsafe(loop.stop)
        runner.join(10)
        _end_loops(loop)


def test_loops_that_hand_the_store_back_and_forth_end_their_calls(
    postgres_url: str, postgres_schema: str
) -> None:
    """Two loops take turns in steps shorter than a pool takes to open: each first call lets
    go of the other's pool, again and again. A call still ends — answered, or told after the
    pool's timeout that no connection came — instead of going round for ever."""
    url = with_params(postgres_url, schema=postgres_schema, pool_timeout="2")
    ended: list[BaseException | None] = []

    def turns() -> None:
        store = tl.open_store(url)
        loops = (asyncio.new_event_loop(), asyncio.new_event_loop())
        tasks = [loop.create_task(store.async_backend.read_effects("s")) for loop in loops]
        try:
            started = time.monotonic()
            while not all(t.done() for t in tasks) and time.monotonic() - started < 20:
                for loop in loops:
                    loop.run_until_complete(asyncio.sleep(0))
            ended.extend(t.exception() for t in tasks if t.done())
        finally:
            store.close()
            _end_loops(*loops)

    # In a thread of its own: calls going round for ever would hold the test with them.
    worker = threading.Thread(target=turns, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive() and len(ended) == 2, "a call went round for ever"
    for exc in ended:
        assert exc is None or "let go again and again" in str(exc), exc


def test_a_write_under_way_in_a_paused_loop_is_answered_when_its_loop_runs_again(
    postgres_url: str, postgres_schema: str, admin: Admin
) -> None:
    """A loop run step by step stops while its write waits on the server (a lock); another
    loop's first call meanwhile closes the stopped loop's idle connections — never the one its
    write is on. Run again, the loop gets the write's answer, and the row is there."""
    url = with_params(postgres_url, schema=postgres_schema, pool_min="1")
    answers: list[Any] = []

    def steps() -> None:
        store = tl.open_store(url)
        first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
        backend = store.async_backend

        async def write() -> None:
            answers.append(await backend.apply("s", [InsertEffect(make_record("s", "toolu_w"))]))

        try:
            first.run_until_complete(backend.read_effects("s"))
            with psycopg.connect(postgres_url) as lock:
                lock.execute(f'LOCK TABLE "{postgres_schema}".effects IN SHARE MODE')
                task = first.create_task(write())
                first.run_until_complete(asyncio.sleep(0.3))  # the write waits on the lock
                second.run_until_complete(backend.read_session("s"))  # another loop's call
            first.run_until_complete(asyncio.wait_for(task, 15))
        finally:
            store.close()
            _end_loops(first, second)

    # In a thread of its own: a write whose socket was closed under it would never be
    # answered, and the test must say so rather than wait with it.
    worker = threading.Thread(target=steps, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the write was never answered"
    assert answers == [[True]]
    rows = in_schema(admin, postgres_schema, "SELECT tool_use_id FROM effects")
    assert rows == [("toolu_w",)]


def test_the_async_backend_reports_an_unreachable_server() -> None:
    backend = AsyncPostgresBackend(
        "postgresql://postgres@127.0.0.1:1/test?pool_timeout=1&connect_timeout=1"
    )

    async def twice() -> list[BaseException]:
        errors: list[BaseException] = []
        for _ in range(2):  # a failed start does not leave the backend stuck
            try:
                await backend.read_effects("s")
            except tl.StoreError as exc:
                errors.append(exc)
        await backend.close()
        return errors

    errors = asyncio.run(twice())
    assert [type(e) for e in errors] == [tl.StoreUnavailableError] * 2
    assert "Check that the server is up" in str(errors[0])


# -- configuration -------------------------------------------------------------------------------


def test_url_parameters_are_ours_or_libpq_s() -> None:
    s = parse_url(
        "postgres://me:s3cret@db:5433/app?sslmode=disable&schema=Tenant%20A"
        "&pool_min=0&pool_max=3&pool_timeout=2.5&options=-c%20x%3D1+y"
    )
    assert s.conninfo == "postgres://me:s3cret@db:5433/app?sslmode=disable&options=-c%20x%3D1+y"
    assert s.schema == "Tenant A"
    assert (s.pool_min, s.pool_max, s.pool_timeout) == (0, 3, 2.5)
    assert "s3cret" not in s.display and s.display.startswith("postgres://me:***@db:5433/app")
    keepalives = {
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 3,
        "tcp_user_timeout": 10_000,
    }
    assert s.op_timeout == 10.0
    assert s.connect_kwargs == {
        "connect_timeout": 10,
        "application_name": "toolledger",
        **keepalives,
    }
    hidden = parse_url(
        "postgresql://db/app?password=pw&application_name=x&op_timeout=3&keepalives_idle=9"
    )
    assert "pw" not in hidden.display and hidden.op_timeout == 3.0
    assert hidden.connect_kwargs == {
        "connect_timeout": 10,
        **{k: v for k, v in keepalives.items() if k != "keepalives_idle"},
        "tcp_user_timeout": 3000,
    }
    assert "keepalives_idle=9" in hidden.conninfo and "op_timeout" not in hidden.conninfo


@pytest.mark.parametrize(
    "query",
    [
        "pool_min=-1",
        "pool_max=0",
        "pool_min=5&pool_max=2",
        "pool_timeout=0",
        "op_timeout=0",
        "op_timeout=nan",
        "op_timeout=2200000",  # 25 days: past the 32-bit milliseconds of the settings
        "schema=",
        "schema=" + "x" * 64,
    ],
)
def test_bad_url_parameters_are_configuration_errors(query: str) -> None:
    with pytest.raises(tl.ConfigurationError):
        tl.open_store(f"postgresql://postgres@127.0.0.1:5432/test?{query}")


def test_the_password_never_shows_in_the_store_url(postgres_store_url: str) -> None:
    url = postgres_store_url.replace("postgresql://postgres@", "postgresql://postgres:s3cret@")
    with tl.open_store(url) as store:
        assert "s3cret" not in store.url and "s3cret" not in repr(store)


def test_without_psycopg_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ["psycopg", "psycopg_pool"]:
        monkeypatch.setitem(sys.modules, name, None)
    for name in ["toolledger.stores.postgres", "toolledger.stores.postgres.errors"]:
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(tl.ConfigurationError, match=r"pip install 'toolledger\[postgres\]'"):
        tl.open_store("postgresql://postgres@127.0.0.1:5432/test")


def test_integrity_check_finds_a_gap_in_a_transcript(
    postgres_store_url: str, postgres_schema: str, admin: Admin
) -> None:
    with tl.open_store(postgres_store_url) as store:
        messages = tuple(
            StoredMessage(seq=i, role="user", content=i, created_at=1.0) for i in range(3)
        )
        store.backend.apply("s", [AppendMessages(messages)])
        assert pg_backend(store).integrity_check() == []
        in_schema(admin, postgres_schema, "DELETE FROM messages WHERE seq = 1")
        problems = pg_backend(store).integrity_check()
        assert problems == ["transcript of session 's' has gaps: 2 messages, last seq 2"]


def test_a_resent_one_statement_write_recognises_its_own_first_send(
    postgres_store_url: str,
) -> None:
    """After a lost connection a one-statement write is sent again; if the first send had
    landed, the re-send finds its own row and reports the write applied — and only its own."""
    from dataclasses import replace as _replace

    from toolledger.ops import PutSession, TakeLease
    from toolledger.records import Lease
    from toolledger.testing.conformance import make_state

    with tl.open_store(postgres_store_url) as store:
        mine = make_record("s", "t1", status=Status.STARTED)
        lease = Lease(session_id="s", owner="me", token=1, expires_at=10.0)
        state = make_state("s")
        sent = [InsertEffect(mine), TakeLease(lease, expect_token=0), PutSession(state, None)]
        for op in sent:
            assert store.backend.apply("s", [op]) == [True]  # the first send, which landed
        with store.backend._pool.connection() as conn:  # type: ignore[attr-defined]
            for op in sent:
                assert drive(conn, writes.apply_again("s", [op])) == [True]
            other = _replace(mine, worker="someone-else")
            assert drive(conn, writes.apply_again("s", [InsertEffect(other)])) == [False]
            theirs = TakeLease(_replace(lease, owner="them"), expect_token=0)
            with pytest.raises(tl.SessionBusyError):
                drive(conn, writes.apply_again("s", [theirs]))


# -- branches -------------------------------------------------------------------------------------


def test_a_damaged_lineage_is_a_corrupt_store_not_an_empty_lineage(
    postgres_store_url: str, postgres_schema: str, admin: Admin
) -> None:
    with tl.open_store(postgres_store_url) as store:
        store.backend.apply("s", [PutSession(make_state(), None)])
        in_schema(admin, postgres_schema, "UPDATE sessions SET lineage = '[{\"kind\": 1}]'")
        with pytest.raises(tl.CorruptLedgerError, match="lineage of session 's'") as info:
            store.session("s")
        assert info.value.url == store.backend.url and info.value.session_id == "s"
        with pytest.raises(tl.CorruptLedgerError):
            store.session_states()


def test_the_async_backend_reads_abandoned_branches(postgres_store_url: str) -> None:
    store = tl.open_store(postgres_store_url)
    messages = tuple(StoredMessage(seq=i, role="user", content=i, created_at=1.0) for i in range(3))
    rewind = [
        AbandonMessages(from_seq=1, branch=1),
        PutSession(make_state(version=2, messages=1), expect_version=1),
    ]

    async def rewound() -> dict[int, list[StoredMessage]]:
        backend = store.async_backend
        assert isinstance(backend, AsyncPostgresBackend)
        await backend.apply(
            "s", [PutSession(make_state(messages=3), None), AppendMessages(messages)]
        )
        assert await backend.apply("s", rewind) == [True, True]
        assert await backend.read_messages("s") == list(messages[:1])
        found = await backend.read_abandoned("s")
        await backend.close()
        return found

    try:
        assert asyncio.run(rewound()) == {1: list(messages[1:])}
    finally:
        store.close()


def test_a_run_s_operations_are_bounded_by_a_third_of_its_lease(
    postgres_url: str, postgres_store_url: str, postgres_schema: str
) -> None:
    """The store's operation deadline is 10 s; a run holding a 0.9 s lease must not let one of
    its operations (a renewal least of all) hang for longer than 0.3 s. Another connection
    holds the lease row locked: the renewal is cut at the run's budget, not the store's."""
    from toolledger.ops import HoldLease, TakeLease
    from toolledger.records import Lease
    from toolledger.stores.contract import operations_within

    with tl.open_store(postgres_store_url) as store:
        lease = Lease(session_id="s", owner="o", token=1, expires_at=store.now() + 1, ttl=0.9)
        store.apply("s", [TakeLease(lease, expect_token=0)])
        with psycopg.connect(postgres_url, autocommit=True) as other:
            other.execute(f'SET search_path TO "{postgres_schema}"')
            other.execute("BEGIN")
            other.execute("SELECT * FROM leases FOR UPDATE")
            began = time.monotonic()
            with operations_within(0.3), pytest.raises(tl.StoreError):
                store.apply("s", [HoldLease("s", 1, store.now() + 1)])
            took = time.monotonic() - began
            other.execute("ROLLBACK")
        assert took < 5.0, f"cut after {took:.1f}s, not at the run's budget"
        # Outside a run, the store's own deadline applies: the same write goes through now.
        assert store.apply("s", [HoldLease("s", 1, store.now() + 1)]) == [True]


def test_a_stores_place_is_the_database_however_it_is_reached(
    postgres_url: str, postgres_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``StoreCore.place`` — what the attempts this process runs are registered by — names the
    cluster, the database and the schema in use, however the URL spells them: a schema named or
    left to the server's search path, TCP or the socket; and, where the server will not tell
    its system identifier, the same for every way in (never failing the open)."""
    from toolledger.stores.postgres import schema as pg_schema

    def place_of(url: str) -> str:
        settings = parse_url(url)
        with psycopg.connect(settings.conninfo, autocommit=True) as conn:
            if settings.schema:
                conn.execute(
                    sql.SQL("SET search_path TO {}").format(sql.Identifier(settings.schema))
                )
            return pg_schema.place(conn, settings)

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(postgres_schema)))
        named = with_params(postgres_url, schema=postgres_schema)
        searched = with_params(postgres_url, options=f"-csearch_path={postgres_schema}")
        public = place_of(postgres_url)
        assert place_of(named) == place_of(searched) != public
        assert public.endswith(":public") and "None" not in public

        class Refusing:  # a server that does not grant pg_control_system()
            def __init__(self, conn: Any) -> None:
                self.conn = conn

            def transaction(self) -> Any:
                return self.conn.transaction()

            def execute(self, query: str, *args: Any) -> Any:
                if "pg_control_system" in query:
                    raise psycopg.errors.InsufficientPrivilege("permission denied")
                return self.conn.execute(query, *args)

        # Without it: the moment the store was made — not the server's start, which its
        # restart changes — the same by TCP or the socket, in any time zone.
        tl.open_store(named).close()
        settings = parse_url(named)
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(postgres_schema)))
        by_tcp = pg_schema.place(Refusing(conn), settings)  # type: ignore[arg-type]
        host = conn.execute("SHOW unix_socket_directories").fetchone()[0].split(",")[0]
        info = psycopg.conninfo.conninfo_to_dict(settings.conninfo) | {"host": host.strip()}
        for zone in ("UTC", "Asia/Kathmandu"):
            with psycopg.connect(**info, autocommit=True) as by_socket:
                by_socket.execute(f"SET TimeZone TO '{zone}'")
                by_socket.execute(
                    sql.SQL("SET search_path TO {}").format(sql.Identifier(postgres_schema))
                )
                assert pg_schema.place(Refusing(by_socket), settings) == by_tcp  # type: ignore[arg-type]
        assert by_tcp.startswith("postgresql:made ") and by_tcp.endswith(f":{postgres_schema}")
        assert "started" not in by_tcp, "not the server's start: a restart would change it"
        with tl.open_store(named) as store:
            assert store.place == place_of(named) != by_tcp
