"""Shared fixtures: store URLs for every embedded backend, sync and async runners."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl

EMBEDDED = ["memory", "json", "sqlite"]


def url_for(kind: str, tmp_path: Path) -> str:
    if kind == "memory":
        return f"memory://{uuid.uuid4().hex}"
    if kind == "json":
        return f"json:///{tmp_path / 'ledger'}"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    raise AssertionError(kind)


@pytest.fixture(params=EMBEDDED)
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store(store_kind: str, tmp_path: Path) -> Iterator[tl.Store]:
    s = tl.open_store(url_for(store_kind, tmp_path))
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
