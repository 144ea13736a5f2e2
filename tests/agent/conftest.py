"""Fixtures of the agent tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..conftest import url_for


@pytest.fixture(params=["sqlite", "json", "postgres"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store that several processes open: every durable backend."""
    if request.param == "postgres":
        return str(request.getfixturevalue("postgres_store_url"))
    return url_for(str(request.param), tmp_path)
