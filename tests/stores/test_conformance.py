"""The one conformance suite, run against every backend."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from toolledger.testing.conformance import StoreConformance


class TestMemory(StoreConformance):
    durable = False

    @pytest.fixture
    def store_url(self) -> str:
        return f"memory://{uuid.uuid4().hex}"


class TestJSON(StoreConformance):
    @pytest.fixture
    def store_url(self, tmp_path: Path) -> str:
        return f"json:///{tmp_path / 'ledger'}"


class TestSQLite(StoreConformance):
    @pytest.fixture
    def store_url(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.mark.postgres
class TestPostgres(StoreConformance):
    """Each test gets a schema of its own (``?schema=tl_test_…``), dropped afterwards. No server:
    skipped loudly, or failed under ``CI=true`` (see ``postgres_url`` in conftest.py)."""

    @pytest.fixture
    def store_url(self, postgres_store_url: str) -> str:
        return postgres_store_url
