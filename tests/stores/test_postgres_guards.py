"""Ending orphaned server transactions, as the plan both PostgreSQL backends carry out: each
statement it sends and what it does with each answer, against a scripted server."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

psycopg = pytest.importorskip("psycopg")

from toolledger.errors import StoreUnavailableError  # noqa: E402
from toolledger.stores._sql import plans  # noqa: E402
from toolledger.stores.postgres.guards import (  # noqa: E402
    BACKEND_GONE,
    PAUSE,
    SIGNAL_BACKEND,
    Orphans,
)

IDENT = (4242, "2026-12-03 10:00:00+00")


def scripted(answers: list[Any]) -> tuple[Callable[[plans.Step], plans.Outcome], list[str]]:
    """An ``execute`` that answers each statement in turn: rows, or an exception to raise."""
    sent: list[str] = []

    def execute(step: plans.Step) -> plans.Outcome:
        sent.append(step.sql)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return plans.Outcome(1, answer)

    return execute, sent


def test_an_orphan_is_signalled_then_watched_until_it_is_gone() -> None:
    orphans = Orphans()
    orphans.add(IDENT)
    execute, sent = scripted([[(True,)], [(False,)], [("",)], [(True,)]])
    plans.drive(orphans.ending("postgresql://db", op_timeout=60), execute)
    assert sent == [SIGNAL_BACKEND, BACKEND_GONE, PAUSE, BACKEND_GONE]
    assert orphans.pending() == []


def test_an_orphan_that_does_not_go_stops_every_read_and_write() -> None:
    orphans = Orphans()
    orphans.add(IDENT)
    execute, sent = scripted([[(True,)], [(False,)]])
    with pytest.raises(StoreUnavailableError, match="still open on the server"):
        plans.drive(orphans.ending("postgresql://db", op_timeout=0), execute)
    assert sent == [SIGNAL_BACKEND, BACKEND_GONE]
    assert orphans.pending() == [IDENT], "still pending: the next operation tries again"


def test_a_role_not_allowed_to_signal_says_so_and_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    orphans = Orphans()
    orphans.add(IDENT)
    refused = psycopg.errors.InsufficientPrivilege("permission denied to terminate process")
    execute, sent = scripted([refused])
    with caplog.at_level(logging.WARNING, logger="toolledger"):
        plans.drive(orphans.ending("postgresql://db", op_timeout=60), execute)
    assert sent == [SIGNAL_BACKEND]
    assert orphans.pending() == []
    assert "grant pg_signal_backend" in caplog.text and "4242" in caplog.text


def test_any_other_failure_of_the_signal_reaches_the_operation() -> None:
    orphans = Orphans()
    orphans.add(IDENT)
    lost = psycopg.OperationalError("server closed the connection unexpectedly")
    execute, _ = scripted([lost])
    with pytest.raises(psycopg.OperationalError):
        plans.drive(orphans.ending("postgresql://db", op_timeout=60), execute)
    assert orphans.pending() == [IDENT]
