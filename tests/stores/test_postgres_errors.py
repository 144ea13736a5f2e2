"""What a PostgreSQL error is translated into: the message must say what to grant."""

from __future__ import annotations

import pytest

psycopg = pytest.importorskip("psycopg")

from toolledger.stores.postgres.errors import translate  # noqa: E402


def test_permission_denied_names_every_privilege_the_store_uses() -> None:
    """A rewind deletes the abandoned messages and a prune deletes whole sessions: a role with
    only SELECT, INSERT and UPDATE is refused both, so the advice must name DELETE too."""
    refused = psycopg.errors.InsufficientPrivilege("permission denied for table messages")
    said = str(translate(refused, url="postgresql://app@db/x", action="writing the ledger"))
    assert "SELECT, INSERT, UPDATE and DELETE" in said, said
