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
