"""Shared fixtures: store URLs for every backend (PostgreSQL when a server answers), sync and
async runners."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl

EMBEDDED = ["memory", "json", "sqlite"]

# Modules whose tests share a module-scoped server, browser or summary: under pytest-xdist
# (`make pytest`, --dist loadgroup) each stays on one worker, so it is set up once.
SHARED = {
    "tests/console/test_browser.py": "browser",
    "tests/console/test_security.py": "console-security",
    "tests/reliability/test_network_faults.py": "network-faults",
    "tests/cli/test_widths.py": "cli-widths",
    "tests/cli/test_window.py": "cli-window",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        group = SHARED.get(item.nodeid.split("::", 1)[0])
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


BACKENDS = [*EMBEDDED, "postgres"]


def url_for(kind: str, tmp_path: Path) -> str:
    if kind == "memory":
        return f"memory://{uuid.uuid4().hex}"
    if kind == "json":
        return f"json:///{tmp_path / 'ledger'}"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    raise AssertionError(kind)


@pytest.fixture(params=BACKENDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_url(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A fresh store of every backend; PostgreSQL's in a schema of its own, dropped after."""
    if store_kind == "postgres":
        return str(request.getfixturevalue("postgres_store_url"))
    return url_for(store_kind, tmp_path)


@pytest.fixture
def store(store_url: str) -> Iterator[tl.Store]:
    s = tl.open_store(store_url)
    yield s
    s.close()


@pytest.fixture
def ledger(store: tl.Store) -> tl.Ledger:
    return store.ledger("session-1")


Runner = Callable[..., list[dict[str, Any]]]


@pytest.fixture(params=["sync", "async"])
def run(request: pytest.FixtureRequest) -> Runner:
    """``run(content, tools, ledger=…, approve=…)`` through run_tool_uses or arun_tool_uses."""
    if request.param == "sync":
        return tl.run_tool_uses

    def run_async(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        return asyncio.run(tl.arun_tool_uses(*args, **kwargs))

    return run_async


def tool_use(tool_use_id: str, name: str, **input: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_use_id, "name": name, "input": input}


# -- PostgreSQL ---------------------------------------------------------------------------------

POSTGRES_URL_ENV = "TOOLLEDGER_TEST_POSTGRES_URL"
DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The server every PostgreSQL test uses (``TOOLLEDGER_TEST_POSTGRES_URL``).

    When none answers the tests are skipped with a loud reason — except under ``CI=true``, where
    they fail: a backend nobody exercised must not pass for green.
    """
    url = os.environ.get(POSTGRES_URL_ENV, DEFAULT_POSTGRES_URL)
    try:
        import psycopg

        with psycopg.connect(url, connect_timeout=3):
            pass
    except Exception as exc:
        reason = (
            f"POSTGRESQL BACKEND NOT TESTED: no server answers at {url} "
            f"({type(exc).__name__}: {str(exc).strip()}). Start one or set {POSTGRES_URL_ENV}."
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason} Under CI=true a skipped backend is a failure.")
        pytest.skip(reason)
    return url


def with_params(url: str, **params: str) -> str:
    from urllib.parse import quote

    extra = "&".join(f"{k}={quote(v, safe='')}" for k, v in params.items())
    return f"{url}{'&' if '?' in url else '?'}{extra}"


def drop_schema(admin_url: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def postgres_schema(postgres_url: str) -> Iterator[str]:
    """A fresh schema name for one test, dropped afterwards."""
    schema = f"tl_test_{uuid.uuid4().hex[:16]}"
    yield schema
    drop_schema(postgres_url, schema)


@pytest.fixture
def postgres_store_url(postgres_url: str, postgres_schema: str) -> str:
    """A store URL of its own for one test: a fresh ``?schema=``, dropped afterwards."""
    return with_params(postgres_url, schema=postgres_schema)
