"""The store contract, part one: the effects ledger — insert-if-absent, compare-and-set, sessions
kept apart, values kept exactly, durable and shared, resolving in-doubt calls, and a repeated
tool_use_id run once end to end. Run through ``StoreConformance``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from .._tool_uses import run_tool_uses
from ..errors import ConfigurationError, InvalidSessionIdError, ToolLedgerError
from ..ops import HoldLease, InsertEffect, TakeLease, UpdateEffect
from ..records import Holder, Lease, Status
from ..stores import Store, open_store
from ..tools import ToolSet, tool
from ._samples import WEIRD_SESSION_IDS, make_record
from .fakes import Counter

__all__ = ["LedgerContract"]


class LedgerContract:
    """The ledger half of ``StoreConformance``."""

    durable = True

    # -- reading what is not there ---------------------------------------------------------------

    def test_missing_session_is_an_empty_ledger(self, store: Store) -> None:
        ledger = store.ledger("never-written")
        assert ledger.get("toolu_x") is None
        assert ledger.records() == []
        assert store.sessions() == []

    # -- insert-if-absent -----------------------------------------------------------------------

    def test_insert_then_read_back_every_field(self, store: Store) -> None:
        record = make_record(result={"id": 7, "text": "naïve ✓", "n": [1.5, None, True]})
        assert store.apply("s", [InsertEffect(record)]) == [True]
        assert store.ledger("s").get("toolu_1") == record
        assert store.ledger("s").records() == [record]

    def test_insert_is_ignored_when_the_record_exists(self, store: Store) -> None:
        first = make_record(status=Status.STARTED)
        second = make_record(status=Status.SUCCEEDED, result="other")
        assert store.apply("s", [InsertEffect(first)]) == [True]
        assert store.apply("s", [InsertEffect(second)]) == [False]
        assert store.ledger("s").get("toolu_1") == first

    # -- compare-and-set ------------------------------------------------------------------------

    def test_update_applies_only_from_the_expected_state(self, store: Store) -> None:
        started = make_record(status=Status.STARTED, attempt=1)
        store.apply("s", [InsertEffect(started)])
        done = replace(started, status=Status.SUCCEEDED, result='"ok"', updated_at=2e9)
        wrong_status = UpdateEffect(done, expect_status=Status.FAILED, expect_attempt=1)
        wrong_attempt = UpdateEffect(done, expect_status=Status.STARTED, expect_attempt=2)
        assert store.apply("s", [wrong_status]) == [False]
        assert store.apply("s", [wrong_attempt]) == [False]
        assert store.ledger("s").get("toolu_1") == started
        right = UpdateEffect(done, expect_status=Status.STARTED, expect_attempt=1)
        assert store.apply("s", [right]) == [True]
        assert store.ledger("s").get("toolu_1") == done
        # The same transition again finds the record moved on: a re-sent write is harmless.
        assert store.apply("s", [right]) == [False]
        assert store.ledger("s").get("toolu_1") == done

    def test_update_naming_a_worker_applies_only_to_that_worker_s_version(
        self, store: Store
    ) -> None:
        """Two workers' intents of one attempt, written at the same instant, differ only by
        their worker: a clean-up naming its own worker leaves the other's intent be — written
        alone, in a batch, and behind the session's lease."""
        theirs = replace(make_record(status=Status.STARTED, attempt=1), worker="host:2:b")
        store.apply("s", [InsertEffect(theirs)])
        lease = Lease(session_id="s", owner="host:1:a", token=1, expires_at=4e9)
        assert store.apply("s", [TakeLease(lease, expect_token=0)]) == [True]
        never = replace(theirs, status=Status.NOT_HAPPENED, updated_at=theirs.updated_at + 1)

        def mine(worker: str) -> UpdateEffect:
            return UpdateEffect(
                replace(never, worker=worker),
                Status.STARTED,
                1,
                expect_at=theirs.updated_at,
                expect_worker=worker,
            )

        other = make_record(tool_use_id="other")
        assert store.apply("s", [mine("host:1:a")]) == [False]
        assert store.apply("s", [mine("host:1:a"), InsertEffect(other)]) == [False, True]
        assert store.apply("s", [HoldLease("s", 1, None), mine("host:1:a")]) == [True, False]
        assert store.ledger("s").get("toolu_1") == theirs
        assert store.apply("s", [HoldLease("s", 1, None), mine("host:2:b")]) == [True, True]
        assert store.ledger("s").get("toolu_1") == never

    def test_update_naming_a_worker_applies_only_to_that_process_s_version(
        self, store: Store
    ) -> None:
        """Two processes given one worker id: their intents of one attempt, written at the
        same instant, differ only by their holder — a clean-up naming its own leaves the
        other's intent be, whatever form the holder was written in."""
        b = Holder(host="boot-b", pidns="4026531836", pid=2, start=7, boot="boot-b", timens="")
        theirs = replace(make_record(status=Status.STARTED, attempt=1), worker="shared", holder=b)
        store.apply("s", [InsertEffect(theirs)])
        never = replace(theirs, status=Status.NOT_HAPPENED, updated_at=theirs.updated_at + 1)

        def by(holder: Holder | None) -> UpdateEffect:
            return UpdateEffect(
                replace(never, holder=holder),
                Status.STARTED,
                1,
                expect_at=theirs.updated_at,
                expect_worker="shared",
                expect_holder=holder,
            )

        a = replace(b, pid=1, start=5)
        assert store.apply("s", [by(a)]) == [False]
        assert store.apply("s", [by(None)]) == [False]
        assert store.apply("s", [by(Holder.unknown(2))]) == [False]
        other = make_record(tool_use_id="other")
        assert store.apply("s", [by(a), InsertEffect(other)]) == [False, True]
        lease = Lease(session_id="s", owner="shared/1", token=1, expires_at=4e9)
        assert store.apply("s", [TakeLease(lease, expect_token=0)]) == [True]
        assert store.apply("s", [HoldLease("s", 1, None), by(a)]) == [True, False]
        assert store.ledger("s").get("toolu_1") == theirs
        assert store.apply("s", [HoldLease("s", 1, None), by(b)]) == [True, True]
        assert store.ledger("s").get("toolu_1") == never

    def test_update_of_a_missing_record_applies_nothing(self, store: Store) -> None:
        ghost = make_record(status=Status.SUCCEEDED)
        op = UpdateEffect(ghost, expect_status=Status.STARTED, expect_attempt=1)
        assert store.apply("s", [op]) == [False]
        assert store.ledger("s").get("toolu_1") is None

    def test_one_batch_reports_each_operation(self, store: Store) -> None:
        a = make_record(tool_use_id="a")
        b = make_record(tool_use_id="b")
        store.apply("s", [InsertEffect(a)])
        a_done = replace(a, status=Status.SUCCEEDED, result='"A"')
        flags = store.apply(
            "s",
            [
                UpdateEffect(a_done, expect_status=Status.STARTED, expect_attempt=1),
                InsertEffect(b),
                InsertEffect(a),  # exists: ignored
            ],
        )
        assert flags == [True, True, False]
        assert store.ledger("s").get("a") == a_done
        assert store.ledger("s").get("b") == b

    def test_empty_batch_is_a_no_op(self, store: Store) -> None:
        assert store.apply("s", []) == []
        assert store.sessions() == []

    # -- sessions -------------------------------------------------------------------------------

    def test_sessions_are_isolated(self, store: Store) -> None:
        one = make_record("one", result="from one", status=Status.SUCCEEDED)
        two = make_record("two", result="from two", status=Status.SUCCEEDED)
        store.apply("one", [InsertEffect(one)])
        store.apply("two", [InsertEffect(two)])
        assert store.ledger("one").get("toolu_1") == one
        assert store.ledger("two").get("toolu_1") == two
        assert store.sessions() == ["one", "two"]

    def test_record_ids_are_read_alone_and_kept_apart(self, store: Store) -> None:
        assert store.backend.read_effect_ids("s") == []
        ids = ["toolu_b", "toolu_a", "toolu_'; DROP TABLE effects; --"]
        store.apply("s", [InsertEffect(make_record("s", i)) for i in ids])
        store.apply("other", [InsertEffect(make_record("other", "toolu_z"))])
        assert sorted(store.backend.read_effect_ids("s")) == sorted(ids)
        assert sorted(store.backend.read_effect_ids("s")) == sorted(
            r.tool_use_id for r in store.ledger("s").records()
        )
        assert store.backend.read_effect_ids("other") == ["toolu_z"]
        assert store.backend.read_effect_ids("never-written") == []

    def test_record_ids_are_read_alone_through_the_async_contract(self, store: Store) -> None:
        store.apply("s", [InsertEffect(make_record("s", i)) for i in ("toolu_1", "toolu_2")])

        async def read() -> tuple[list[str], list[str]]:
            backend = store.async_backend
            return await backend.read_effect_ids("s"), await backend.read_effect_ids("none")

        found, none = asyncio.run(read())
        assert sorted(found) == ["toolu_1", "toolu_2"]
        assert none == []

    @pytest.mark.parametrize("session_id", WEIRD_SESSION_IDS)
    def test_any_session_id_is_stored_safely(self, store: Store, session_id: str) -> None:
        record = make_record(session_id, result="ok", status=Status.SUCCEEDED)
        store.apply(session_id, [InsertEffect(record)])
        assert store.ledger(session_id).get("toolu_1") == record
        assert store.sessions() == [session_id]

    @pytest.mark.parametrize("bad", ["", "x" * 257, "nul\x00byte", "new\nline", 42])
    def test_unusable_session_ids_are_refused(self, store: Store, bad: Any) -> None:
        with pytest.raises(InvalidSessionIdError):
            store.ledger(bad)

    @pytest.mark.parametrize("bad", ["nul\x00byte", "new\nline", "\u202eevil", 42])
    def test_a_worker_id_no_store_can_keep_is_refused_at_open(
        self, store_url: str, bad: Any
    ) -> None:
        # Written on every record: a NUL failed every write on PostgreSQL, after the open.
        # Refused before the store is opened: nothing is made, no connection is left open.
        with pytest.raises(ConfigurationError, match="worker_id"):
            open_store(store_url, worker_id=bad).close()
        if store_url.startswith(("sqlite:///", "json:///")):
            assert not Path(store_url.split(":///", 1)[1]).exists(), "a store was made"

    def test_sql_metacharacters_in_ids_are_data(self, store: Store) -> None:
        tid = "toolu_'; DELETE FROM effects; --"
        record = make_record(tool_use_id=tid, result="x", status=Status.SUCCEEDED)
        store.apply("s", [InsertEffect(record)])
        store.apply("s", [InsertEffect(make_record(tool_use_id="other"))])
        assert store.ledger("s").get(tid) == record
        assert len(store.ledger("s").records()) == 2

    # -- values ---------------------------------------------------------------------------------

    @pytest.mark.parametrize(
        "value",
        [
            "plain text",
            {"nested": {"list": [1, 2, {"k": None}]}, "float": 0.1, "big": 2**70},
            "lone surrogate \ud800 survives",
            "x" * 1_000_000,
        ],
        ids=["text", "nested", "surrogate", "1MB"],
    )
    def test_results_round_trip_exactly(self, store: Store, value: Any) -> None:
        record = make_record(result=value, status=Status.SUCCEEDED)
        store.apply("s", [InsertEffect(record)])
        got = store.ledger("s").get("toolu_1")
        assert got is not None and got.result == record.result
        assert got.result is not None and json.loads(got.result) == value

    # -- durability and sharing -----------------------------------------------------------------

    def test_records_survive_reopening(self, store: Store, store_url: str) -> None:
        record = make_record(result="kept", status=Status.SUCCEEDED)
        store.apply("s", [InsertEffect(record)])
        store.close()
        reopened = open_store(store_url)
        try:
            assert reopened.ledger("s").get("toolu_1") == record
        finally:
            reopened.close()

    def test_a_result_whose_keys_collide_as_text_survives_reopening(
        self, store: Store, store_url: str
    ) -> None:
        # ``{1: "a", "1": "b"}`` is written ``{"1": "a", "1": "b"}``: the text the model was
        # sent. A replay after a reopen must send the same text, not a parse of it.
        record = make_record(result={1: "a", "1": "b"}, status=Status.SUCCEEDED)
        assert record.result == '{"1": "a", "1": "b"}'
        store.apply("s", [InsertEffect(record)])
        store.close()
        reopened = open_store(store_url)
        try:
            got = reopened.ledger("s").get("toolu_1")
            assert got is not None and got.result == record.result
            assert got == record
        finally:
            reopened.close()

    def test_records_written_by_another_process_are_read(
        self, store: Store, store_url: str
    ) -> None:
        if not self.durable:
            pytest.skip("this backend keeps nothing beyond its process, by design")
        script = (
            "import sys; from toolledger import open_store; "
            "from toolledger.ops import InsertEffect; "
            "from toolledger.testing.conformance import make_record; "
            "from toolledger.records import Status; "
            "s = open_store(sys.argv[1]); "
            "s.apply('s', [InsertEffect(make_record(result='child', "
            "status=Status.SUCCEEDED))]); "
            "import os; os._exit(0)"  # no close(), no flush: what a crash would leave
        )
        subprocess.run([sys.executable, "-c", script, store_url], check=True, timeout=60)
        got = store.ledger("s").get("toolu_1")
        assert got == make_record(result="child", status=Status.SUCCEEDED)

    def test_two_handles_see_each_others_writes(self, store: Store, store_url: str) -> None:
        other = open_store(store_url)
        try:
            a = make_record(tool_use_id="a")
            b = make_record(tool_use_id="b")
            assert store.apply("s", [InsertEffect(a)]) == [True]
            assert other.apply("s", [InsertEffect(b), InsertEffect(a)]) == [True, False]
            if self.durable:
                assert {r.tool_use_id for r in store.ledger("s").records()} == {"a", "b"}
                assert {r.tool_use_id for r in other.ledger("s").records()} == {"a", "b"}
        finally:
            other.close()

    def test_records_are_listed_oldest_first(self, store: Store) -> None:
        for i, tid in enumerate(["c", "a", "b"]):
            store.apply("s", [InsertEffect(make_record(tool_use_id=tid, at=100.0 + i))])
        assert [r.tool_use_id for r in store.ledger("s").records()] == ["c", "a", "b"]

    # -- resolving in-doubt calls ---------------------------------------------------------------

    def test_resolve_happened_records_success(self, store: Store) -> None:
        store.apply("s", [InsertEffect(make_record())])
        ledger = store.ledger("s")
        assert [r.tool_use_id for r in ledger.in_doubt()] == ["toolu_1"]
        resolved = ledger.resolve("toolu_1", happened=True, result={"id": 9}, by="ana")
        assert resolved.status is Status.SUCCEEDED
        assert ledger.get("toolu_1") == resolved
        assert resolved.result is not None and json.loads(resolved.result) == {"id": 9}
        assert ledger.in_doubt() == []

    def test_resolve_not_happened_lets_it_run_again(self, store: Store) -> None:
        store.apply("s", [InsertEffect(make_record())])
        resolved = store.ledger("s").resolve("toolu_1", happened=False, by="ana")
        assert resolved.status is Status.NOT_HAPPENED
        assert store.ledger("s").get("toolu_1") == resolved

    def test_only_in_doubt_calls_can_be_resolved(self, store: Store) -> None:
        store.apply("s", [InsertEffect(make_record(status=Status.SUCCEEDED, result=1))])
        with pytest.raises(ToolLedgerError, match="only an in-doubt"):
            store.ledger("s").resolve("toolu_1", happened=False)
        with pytest.raises(ToolLedgerError, match="has no record"):
            store.ledger("s").resolve("toolu_missing", happened=True)

    # -- end to end through run_tool_uses -------------------------------------------------------

    def test_a_repeated_tool_use_id_executes_once(self, store: Store, store_url: str) -> None:
        counter = Counter()

        @tool
        def create_ticket(title: str) -> dict[str, Any]:
            return {"ticket": counter.hit("create_ticket"), "title": title}

        tools = ToolSet([create_ticket])
        block = {
            "type": "tool_use",
            "id": "toolu_1",
            "name": "create_ticket",
            "input": {"title": "t"},
        }
        first = run_tool_uses([block], tools, ledger=store.ledger("s"))
        store.close()
        reopened = open_store(store_url)
        try:
            second = run_tool_uses([block], tools, ledger=reopened.ledger("s"))
        finally:
            reopened.close()
        assert first == [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": '{"ticket": 1, "title": "t"}',
            }
        ]
        if self.durable:
            assert second == first
            assert counter["create_ticket"] == 1
