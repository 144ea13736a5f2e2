"""Removing a session while a call of it is being recorded: on PostgreSQL, where a statement
sees only what committed before it began, the removal never takes a record it did not check.

An intent is inserted and left uncommitted on a connection of its own; the session is removed
meanwhile (its guard cannot see the intent); then the intent commits. The record must still be
there: the removal's own condition skips ``started`` records, whatever its snapshot."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

import toolledger as tl
from toolledger.ops import AppendMessages, DropSession, InsertEffect, PutSession
from toolledger.records import RunStatus, Status
from toolledger.stores._sql.rows import insert_params
from toolledger.stores._sql.statements import INSERT_EFFECT, format_style
from toolledger.testing.conformance import make_message, make_record, make_state

pytestmark = pytest.mark.postgres


def test_an_intent_landing_during_a_removal_survives_it(
    postgres_url: str, postgres_store_url: str, postgres_schema: str
) -> None:
    with tl.open_store(postgres_store_url) as store:
        state = make_state("s", version=1, messages=1, status=RunStatus.COMPLETED)
        store.apply("s", [PutSession(state, None), AppendMessages((make_message(0),))])
        store.apply("s", [InsertEffect(make_record("s", "toolu_old", status=Status.SUCCEEDED))])
        intent = make_record("s", "toolu_new", status=Status.STARTED)
        with psycopg.connect(postgres_url) as racer:
            racer.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(postgres_schema)))
            racer.execute(format_style(INSERT_EFFECT), insert_params(InsertEffect(intent)))
            # Not committed yet: the removal's guard does not see it, and goes ahead.
            assert store.apply("s", [DropSession("s", 1, store.now())]) == [True]
            racer.commit()
        assert store.session("s") is None and store.messages("s") == []
        records = {r.tool_use_id: r.status for r in store.ledger("s").records()}
        assert records == {"toolu_new": Status.STARTED}  # the settled one went; this one stays
        # And a prune now keeps what is left: a call with no outcome.
        (kept,) = store.prune(older_than=0).kept
        assert kept.session_id == "s" and "toolu_new" in kept.why
