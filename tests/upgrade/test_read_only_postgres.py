"""A command that only looks never migrates a PostgreSQL store: 0.1.0's schema, opened
read-only, is refused with a message saying how to migrate it, and stays at its version; opened
by a worker it migrates, and then reads read-only."""

from __future__ import annotations

import uuid

import pytest

import toolledger as tl

from ..conftest import drop_schema, with_params
from .test_v0_1_0 import HERE, load_dump


def version(url: str, schema: str) -> int:
    import psycopg
    from psycopg import sql

    with psycopg.connect(url) as conn:
        query = sql.SQL("SELECT max(version) FROM {}.toolledger_schema").format(
            sql.Identifier(schema)
        )
        row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.postgres
def test_a_read_only_open_does_not_migrate_an_older_schema(postgres_url: str) -> None:
    schema = f"tl_ro_{uuid.uuid4().hex[:12]}"
    load_dump(postgres_url, (HERE / "v0_1_0_postgres.sql").read_text(), schema)
    try:
        url = with_params(postgres_url, schema=schema)
        before = version(postgres_url, schema)
        with pytest.raises(tl.StoreUnavailableError, match="does not migrate"):
            tl.open_store(url, read_only=True)
        assert version(postgres_url, schema) == before
        with tl.open_store(url):  # a worker's open: migrates
            pass
        assert version(postgres_url, schema) > before
        with tl.open_store(url, read_only=True) as store:
            assert "completed" in {s.session_id for s in store.session_states()}
    finally:
        drop_schema(postgres_url, schema)


@pytest.mark.postgres
@pytest.mark.parametrize("holder", ["a long reader of the ledger", "another opener migrating"])
def test_a_migration_that_cannot_get_its_lock_gives_up_within_op_timeout(
    postgres_url: str, holder: str
) -> None:
    """Migrating takes locks: the schema's migration lock, which a second opener queues on, and
    each table's, which a transaction on it (a ``pg_dump``, a report left open) holds back —
    while every other statement on that table queues behind the waiting migration. Opening
    gives up after ``op_timeout``, saying what it waited for; nothing is migrated, the store's
    other users go on, and the next open, once the lock is free, migrates."""
    import threading
    import time

    import psycopg
    from psycopg import sql

    schema = f"tl_lock_{uuid.uuid4().hex[:12]}"
    load_dump(postgres_url, (HERE / "v0_1_0_postgres.sql").read_text(), schema)
    effects = sql.SQL("SELECT count(*) FROM {}.effects").format(sql.Identifier(schema))
    url = with_params(postgres_url, schema=schema, op_timeout="1")
    blocker = psycopg.connect(postgres_url)
    outcome: list[BaseException | str] = []

    def open_it() -> None:
        try:
            tl.open_store(url).close()
            outcome.append("opened")
        except BaseException as exc:  # handed to the test's thread
            outcome.append(exc)

    opener = threading.Thread(target=open_it, daemon=True)
    try:
        if holder == "a long reader of the ledger":
            blocker.execute(effects)
        else:  # as an opener of this schema does while it migrates a step
            blocker.execute("SELECT pg_advisory_xact_lock(29804, hashtext(%s))", (schema,))
        before = version(postgres_url, schema)
        began = time.monotonic()
        opener.start()
        # A table's lock is waited for op_timeout; the migration lock, which openers starting
        # together queue on, ten times that.
        queued = holder != "a long reader of the ledger"
        opener.join(15 if queued else 6)
        waited = time.monotonic() - began
        assert outcome, f"opening waited {waited:.1f}s past its bound"
        (error,) = outcome
        assert isinstance(error, tl.StoreUnavailableError), error
        said = "waited 10s (10 x op_timeout)" if queued else "waited 1s (op_timeout)"
        assert said in str(error) and "lock" in str(error), error
        assert f"schema is whole at version {before}" in str(error)
        assert version(postgres_url, schema) == before
        with psycopg.connect(postgres_url, options="-c statement_timeout=2000") as other:
            assert other.execute(effects).fetchone() is not None  # not queued behind it
        blocker.rollback()
        with tl.open_store(url) as store:
            assert "completed" in {s.session_id for s in store.session_states()}
        assert version(postgres_url, schema) > before
    finally:
        blocker.rollback()
        blocker.close()
        opener.join(30)
        drop_schema(postgres_url, schema)
