"""The store contract, as one pytest class that runs against every backend.

Subclass ``StoreConformance`` in a test module and provide a ``store_url`` fixture returning a
fresh, empty location for each test (``open_store`` on the same URL must reopen it). Set
``durable = False`` for a backend whose contents do not outlive its handles.

A backend is done when it passes every test here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from ..codec import encode_result, input_hash
from ..errors import (
    InvalidSessionIdError,
    LeaseLostError,
    SessionBusyError,
    SessionConflictError,
    ToolLedgerError,
)
from ..ops import (
    AppendMessages,
    DropLease,
    HoldLease,
    InsertEffect,
    Op,
    PutApproval,
    PutSession,
    TakeLease,
    UpdateEffect,
)
from ..records import (
    ApprovalRecord,
    ApprovalStatus,
    EffectRecord,
    Holder,
    Lease,
    RunStatus,
    SessionState,
    Status,
    StoredMessage,
)
from ..runner import run_tool_uses
from ..stores import Store, open_store
from ..tools import ToolSet, tool
from .fakes import Counter

__all__ = ["StoreConformance", "make_approval", "make_record", "make_state"]

WEIRD_SESSION_IDS = [
    "../../etc/passwd",
    "a/b\\c",
    "Robert'); DROP TABLE effects;--",
    'quote " and %s and ? and $1',
    "ünïcødé 会话 🚀",
    ".hidden",
    "x" * 256,
]


def make_record(
    session_id: str = "s",
    tool_use_id: str = "toolu_1",
    *,
    status: Status = Status.STARTED,
    attempt: int = 1,
    result: Any = None,
    error: str | None = None,
    at: float = 1_700_000_000.0,
    holder: Holder | None = None,
    deadline: float | None = None,
) -> EffectRecord:
    """A record as a worker writes it. A ``started`` one is, unless ``holder`` or ``deadline``
    say otherwise, an attempt its worker gave up (no holder, a deadline): in doubt at once."""
    if status is Status.STARTED and holder is None and deadline is None:
        deadline = at
    return EffectRecord(
        session_id=session_id,
        tool_use_id=tool_use_id,
        tool="create_ticket",
        input_hash=input_hash({"title": "t"}),
        status=status,
        attempt=attempt,
        result=None if result is None else encode_result(result).stored,
        error=error,
        created_at=at,
        updated_at=at,
        approved_by=None,
        worker="w1",
        holder=holder,
        deadline=deadline,
    )


def make_state(
    session_id: str = "s",
    *,
    version: int = 1,
    messages: int = 0,
    status: RunStatus = RunStatus.RUNNING,
) -> SessionState:
    return SessionState(
        session_id=session_id,
        status=status,
        reason=None,
        version=version,
        turns=version - 1,
        input_tokens=10 * version,
        output_tokens=version,
        messages=messages,
        created_at=1_700_000_000.0,
        updated_at=1_700_000_000.0 + version,
    )


def make_message(seq: int, role: str = "user", content: Any = None) -> StoredMessage:
    return StoredMessage(
        seq=seq,
        role=role,
        content=content if content is not None else f"message {seq}",
        created_at=1_700_000_000.0 + seq,
    )


def make_approval(
    session_id: str = "s",
    tool_use_id: str = "toolu_1",
    *,
    status: ApprovalStatus = ApprovalStatus.PENDING,
    by: str | None = None,
) -> ApprovalRecord:
    return ApprovalRecord(
        session_id=session_id,
        tool_use_id=tool_use_id,
        tool="send_email",
        input_hash=input_hash({"to": "a@b"}),
        input={"to": "a@b"},
        in_doubt=False,
        reason="'send_email' is high-impact",
        status=status,
        requested_at=1_700_000_000.0,
        decided_at=None if by is None else 1_700_000_100.0,
        decided_by=by,
    )


class StoreConformance:
    """Every store passes these. Tests speak the public API plus the backend primitives."""

    durable = True

    @pytest.fixture
    def store_url(self) -> str:
        raise NotImplementedError("subclasses provide a store_url fixture")

    @pytest.fixture
    def store(self, store_url: str) -> Iterator[Store]:
        store = open_store(store_url)
        yield store
        store.close()

    # -- reading what is not there ---------------------------------------------------------------

    def test_missing_session_is_an_empty_ledger(self, store: Store) -> None:
        ledger = store.ledger("never-written")
        assert ledger.get("toolu_x") is None
        assert ledger.records() == []
        assert store.sessions() == []

    # -- insert-if-absent -----------------------------------------------------------------------

    def test_insert_then_read_back_every_field(self, store: Store) -> None:
        record = make_record(result={"id": 7, "text": "naïve ✓", "n": [1.5, None, True]})
        assert store.backend.apply("s", [InsertEffect(record)]) == [True]
        assert store.ledger("s").get("toolu_1") == record
        assert store.ledger("s").records() == [record]

    def test_insert_is_ignored_when_the_record_exists(self, store: Store) -> None:
        first = make_record(status=Status.STARTED)
        second = make_record(status=Status.SUCCEEDED, result="other")
        assert store.backend.apply("s", [InsertEffect(first)]) == [True]
        assert store.backend.apply("s", [InsertEffect(second)]) == [False]
        assert store.ledger("s").get("toolu_1") == first

    # -- compare-and-set ------------------------------------------------------------------------

    def test_update_applies_only_from_the_expected_state(self, store: Store) -> None:
        started = make_record(status=Status.STARTED, attempt=1)
        store.backend.apply("s", [InsertEffect(started)])
        done = replace(started, status=Status.SUCCEEDED, result='"ok"', updated_at=2e9)
        wrong_status = UpdateEffect(done, expect_status=Status.FAILED, expect_attempt=1)
        wrong_attempt = UpdateEffect(done, expect_status=Status.STARTED, expect_attempt=2)
        assert store.backend.apply("s", [wrong_status]) == [False]
        assert store.backend.apply("s", [wrong_attempt]) == [False]
        assert store.ledger("s").get("toolu_1") == started
        right = UpdateEffect(done, expect_status=Status.STARTED, expect_attempt=1)
        assert store.backend.apply("s", [right]) == [True]
        assert store.ledger("s").get("toolu_1") == done
        # The same transition again finds the record moved on: a re-sent write is harmless.
        assert store.backend.apply("s", [right]) == [False]
        assert store.ledger("s").get("toolu_1") == done

    def test_update_of_a_missing_record_applies_nothing(self, store: Store) -> None:
        ghost = make_record(status=Status.SUCCEEDED)
        op = UpdateEffect(ghost, expect_status=Status.STARTED, expect_attempt=1)
        assert store.backend.apply("s", [op]) == [False]
        assert store.ledger("s").get("toolu_1") is None

    def test_one_batch_reports_each_operation(self, store: Store) -> None:
        a = make_record(tool_use_id="a")
        b = make_record(tool_use_id="b")
        store.backend.apply("s", [InsertEffect(a)])
        a_done = replace(a, status=Status.SUCCEEDED, result='"A"')
        flags = store.backend.apply(
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
        assert store.backend.apply("s", []) == []
        assert store.sessions() == []

    # -- sessions -------------------------------------------------------------------------------

    def test_sessions_are_isolated(self, store: Store) -> None:
        one = make_record("one", result="from one", status=Status.SUCCEEDED)
        two = make_record("two", result="from two", status=Status.SUCCEEDED)
        store.backend.apply("one", [InsertEffect(one)])
        store.backend.apply("two", [InsertEffect(two)])
        assert store.ledger("one").get("toolu_1") == one
        assert store.ledger("two").get("toolu_1") == two
        assert store.sessions() == ["one", "two"]

    @pytest.mark.parametrize("session_id", WEIRD_SESSION_IDS)
    def test_any_session_id_is_stored_safely(self, store: Store, session_id: str) -> None:
        record = make_record(session_id, result="ok", status=Status.SUCCEEDED)
        store.backend.apply(session_id, [InsertEffect(record)])
        assert store.ledger(session_id).get("toolu_1") == record
        assert store.sessions() == [session_id]

    @pytest.mark.parametrize("bad", ["", "x" * 257, "nul\x00byte", "new\nline", 42])
    def test_unusable_session_ids_are_refused(self, store: Store, bad: Any) -> None:
        with pytest.raises(InvalidSessionIdError):
            store.ledger(bad)

    def test_sql_metacharacters_in_ids_are_data(self, store: Store) -> None:
        tid = "toolu_'; DELETE FROM effects; --"
        record = make_record(tool_use_id=tid, result="x", status=Status.SUCCEEDED)
        store.backend.apply("s", [InsertEffect(record)])
        store.backend.apply("s", [InsertEffect(make_record(tool_use_id="other"))])
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
        store.backend.apply("s", [InsertEffect(record)])
        got = store.ledger("s").get("toolu_1")
        assert got is not None and got.result == record.result
        assert got.result is not None and json.loads(got.result) == value

    # -- durability and sharing -----------------------------------------------------------------

    def test_records_survive_reopening(self, store: Store, store_url: str) -> None:
        record = make_record(result="kept", status=Status.SUCCEEDED)
        store.backend.apply("s", [InsertEffect(record)])
        store.close()
        reopened = open_store(store_url)
        try:
            assert reopened.ledger("s").get("toolu_1") == record
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
            "s.backend.apply('s', [InsertEffect(make_record(result='child', "
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
            assert store.backend.apply("s", [InsertEffect(a)]) == [True]
            assert other.backend.apply("s", [InsertEffect(b), InsertEffect(a)]) == [True, False]
            if self.durable:
                assert {r.tool_use_id for r in store.ledger("s").records()} == {"a", "b"}
                assert {r.tool_use_id for r in other.ledger("s").records()} == {"a", "b"}
        finally:
            other.close()

    def test_records_are_listed_oldest_first(self, store: Store) -> None:
        for i, tid in enumerate(["c", "a", "b"]):
            store.backend.apply("s", [InsertEffect(make_record(tool_use_id=tid, at=100.0 + i))])
        assert [r.tool_use_id for r in store.ledger("s").records()] == ["c", "a", "b"]

    # -- resolving in-doubt calls ---------------------------------------------------------------

    def test_resolve_happened_records_success(self, store: Store) -> None:
        store.backend.apply("s", [InsertEffect(make_record())])
        ledger = store.ledger("s")
        assert [r.tool_use_id for r in ledger.in_doubt()] == ["toolu_1"]
        resolved = ledger.resolve("toolu_1", happened=True, result={"id": 9}, by="ana")
        assert resolved.status is Status.SUCCEEDED
        assert ledger.get("toolu_1") == resolved
        assert resolved.result is not None and json.loads(resolved.result) == {"id": 9}
        assert ledger.in_doubt() == []

    def test_resolve_not_happened_lets_it_run_again(self, store: Store) -> None:
        store.backend.apply("s", [InsertEffect(make_record())])
        resolved = store.ledger("s").resolve("toolu_1", happened=False, by="ana")
        assert resolved.status is Status.NOT_HAPPENED
        assert store.ledger("s").get("toolu_1") == resolved

    def test_only_in_doubt_calls_can_be_resolved(self, store: Store) -> None:
        store.backend.apply("s", [InsertEffect(make_record(status=Status.SUCCEEDED, result=1))])
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

    # -- agent sessions: state, transcript, approvals -------------------------------------------

    def test_a_session_is_created_once(self, store: Store) -> None:
        backend = store.backend
        assert backend.read_session("s") is None
        first = make_state(version=1, messages=1)
        assert backend.apply("s", [PutSession(first, None), AppendMessages((make_message(0),))])
        assert backend.read_session("s") == first
        with pytest.raises(SessionConflictError) as info:
            backend.apply("s", [PutSession(make_state(version=9), None)])
        assert info.value.session_id == "s"
        assert backend.read_session("s") == first
        assert [s.session_id for s in backend.list_sessions()] == ["s"]
        assert store.sessions() == ["s"]

    def test_a_checkpoint_is_all_or_nothing(self, store: Store) -> None:
        backend = store.backend
        backend.apply(
            "s",
            [
                PutSession(make_state(version=1, messages=1), None),
                AppendMessages((make_message(0),)),
            ],
        )
        effect = make_record(status=Status.SUCCEEDED, result="done")
        stale: list[Op] = [
            InsertEffect(effect),
            AppendMessages((make_message(1, "assistant"),)),
            PutSession(make_state(version=2, messages=2), expect_version=7),  # stale worker
        ]
        with pytest.raises(SessionConflictError):
            backend.apply("s", stale)
        assert backend.read_session("s") == make_state(version=1, messages=1)
        assert [m.seq for m in backend.read_messages("s")] == [0]
        assert store.ledger("s").get("toolu_1") is None, "the effect rolled back with the rest"
        fresh = [*stale[:2], PutSession(make_state(version=2, messages=2), expect_version=1)]
        assert backend.apply("s", fresh) == [True, True, True]
        assert backend.read_session("s") == make_state(version=2, messages=2)
        assert store.ledger("s").get("toolu_1") == effect

    def test_transcripts_are_append_only_and_ordered(self, store: Store, store_url: str) -> None:
        backend = store.backend
        content = [
            {"type": "text", "text": "naïve ✓ \ud800"},
            {"type": "tool_use", "id": "t", "name": "x", "input": {"deep": [1, {"k": None}]}},
        ]
        messages = (make_message(0), make_message(1, "assistant", content), make_message(2))
        backend.apply("s", [PutSession(make_state(messages=3), None), AppendMessages(messages)])
        assert backend.read_messages("s") == list(messages)
        assert backend.read_messages("s", since=2) == [messages[2]]
        with pytest.raises(SessionConflictError):
            backend.apply("s", [AppendMessages((make_message(1),))])  # seq 1 is taken
        with pytest.raises(SessionConflictError):
            backend.apply("s", [AppendMessages((make_message(5),))])  # a gap
        store.close()
        reopened = open_store(store_url)
        try:
            assert reopened.backend.read_messages("s") == list(messages)
        finally:
            reopened.close()

    def test_read_messages_returns_copies(self, store: Store) -> None:
        store.backend.apply("s", [AppendMessages((make_message(0, content=[{"a": 1}]),))])
        got = store.backend.read_messages("s")
        got[0].content[0]["a"] = 2
        assert store.backend.read_messages("s")[0].content == [{"a": 1}]

    def test_approvals_are_created_once_and_move_by_compare_and_set(self, store: Store) -> None:
        backend = store.backend
        pending = make_approval()
        assert backend.apply("s", [PutApproval(pending, None)]) == [True]
        assert backend.apply("s", [PutApproval(make_approval(by="x"), None)]) == [False]
        approved = make_approval(status=ApprovalStatus.APPROVED, by="ana")
        wrong = PutApproval(approved, expect_status=ApprovalStatus.APPROVED)
        assert backend.apply("s", [wrong]) == [False]
        right = PutApproval(approved, expect_status=ApprovalStatus.PENDING)
        assert backend.apply("s", [right]) == [True]
        assert backend.read_approvals("s") == [approved]
        assert backend.read_approvals() == [approved]
        backend.apply("t", [PutApproval(make_approval("t"), None)])
        assert len(backend.read_approvals()) == 2
        assert backend.read_approvals("nobody") == []

    def test_in_doubt_lists_started_records_of_every_session(self, store: Store) -> None:
        store.backend.apply("a", [InsertEffect(make_record("a", "t1"))])
        store.backend.apply(
            "b", [InsertEffect(make_record("b", "t2", status=Status.SUCCEEDED, result=1))]
        )
        store.backend.apply("c", [InsertEffect(make_record("c", "t3"))])
        assert sorted((r.session_id, r.tool_use_id) for r in store.in_doubt()) == [
            ("a", "t1"),
            ("c", "t3"),
        ]

    # -- session leases ---------------------------------------------------------------------------

    def test_a_lease_is_taken_once_and_fences_every_write(self, store: Store) -> None:
        backend = store.backend
        assert backend.read_lease("s") is None
        mine = Lease(session_id="s", owner="host:1:a", token=1, expires_at=100.0)
        assert backend.apply("s", [TakeLease(mine, expect_token=0)]) == [True]
        assert backend.read_lease("s") == mine
        theirs = Lease(session_id="s", owner="host:2:b", token=1, expires_at=200.0)
        with pytest.raises(SessionBusyError) as info:
            backend.apply("s", [TakeLease(theirs, expect_token=0)])
        assert info.value.owner == "host:1:a"
        # The fence renews and lets the batch through…
        effect = make_record()
        assert backend.apply("s", [HoldLease("s", 1, 150.0), InsertEffect(effect)]) == [True, True]
        assert backend.read_lease("s") == Lease(
            session_id="s", owner="host:1:a", token=1, expires_at=150.0
        )
        # …until someone takes the lease over: then the whole batch is refused.
        takeover = Lease(session_id="s", owner="host:2:b", token=2, expires_at=300.0)
        assert backend.apply("s", [TakeLease(takeover, expect_token=1)]) == [True]
        stale: list[Op] = [HoldLease("s", 1, 400.0), InsertEffect(make_record(tool_use_id="t2"))]
        with pytest.raises(LeaseLostError):
            backend.apply("s", stale)
        assert store.ledger("s").get("t2") is None
        assert backend.read_lease("s") == takeover
        with pytest.raises(SessionBusyError):  # expect_token 1 is stale now
            backend.apply("s", [TakeLease(theirs, expect_token=1)])

    def test_a_dropped_lease_expires_now_and_keeps_its_token(self, store: Store) -> None:
        backend = store.backend
        backend.apply(
            "s",
            [
                TakeLease(
                    Lease(session_id="s", owner="o", token=1, expires_at=100.0), expect_token=0
                )
            ],
        )
        assert backend.apply("s", [DropLease("s", 7)]) == [False]
        assert backend.apply("s", [DropLease("s", 1)]) == [True]
        dropped = backend.read_lease("s")
        assert dropped is not None and dropped.expires_at == 0.0 and dropped.token == 1
        again = Lease(session_id="s", owner="p", token=2, expires_at=50.0)
        assert backend.apply("s", [TakeLease(again, expect_token=1)]) == [True]
