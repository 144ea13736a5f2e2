"""The store contract, part two: what the agent keeps — a session created once, a checkpoint all
or nothing, append-only transcripts, approvals and session leases moved by compare-and-set. Run
through ``StoreConformance``."""

from __future__ import annotations

from dataclasses import replace

import pytest

from .._lineage import Branch, BranchKind
from ..errors import LeaseLostError, SessionBusyError, SessionConflictError
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
from ..records import ApprovalStatus, Lease, RunStatus, SessionState, Status
from ..stores import Store, open_store
from ._samples import make_approval, make_message, make_record, make_state

__all__ = ["SessionContract", "counted_checkpoint"]


_LINEAGE = (
    Branch(kind=BranchKind.FORK, source="parent", turn=1, at=1_700_000_001.0, cut=1, note_seq=None),
)


def counted_checkpoint(state: SessionState, seq: int) -> tuple[SessionState, list[Op]]:
    """The session after one message (``seq``) appended to ``state``, a turn counted, and the
    batch that writes it as the agent's checkpoints of a turn that goes on do: only the
    counters move (``PutSession.counters_only``)."""
    message = make_message(seq, "assistant" if seq % 2 else "user")
    new = replace(
        state,
        version=state.version + 1,
        turns=state.turns + 1,
        input_tokens=state.input_tokens + 7,
        output_tokens=state.output_tokens + 3,
        messages=seq + 1,
        updated_at=message.created_at,
    )
    put = PutSession(new, expect_version=state.version, counters_only=True)
    return new, [AppendMessages((message,)), put]


class SessionContract:
    """The agent-session half of ``StoreConformance``."""

    durable: bool

    # -- agent sessions: state, transcript, approvals -------------------------------------------

    def test_a_session_is_created_once(self, store: Store) -> None:
        assert store.session("s") is None
        first = make_state(version=1, messages=1)
        assert store.apply("s", [PutSession(first, None), AppendMessages((make_message(0),))])
        assert store.session("s") == first
        with pytest.raises(SessionConflictError) as info:
            store.apply("s", [PutSession(make_state(version=9), None)])
        assert info.value.session_id == "s"
        assert store.session("s") == first
        assert [s.session_id for s in store.session_states()] == ["s"]
        assert store.sessions() == ["s"]

    def test_a_checkpoint_is_all_or_nothing(self, store: Store) -> None:
        store.apply(
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
            store.apply("s", stale)
        assert store.session("s") == make_state(version=1, messages=1)
        assert [m.seq for m in store.messages("s")] == [0]
        assert store.ledger("s").get("toolu_1") is None, "the effect rolled back with the rest"
        fresh = [*stale[:2], PutSession(make_state(version=2, messages=2), expect_version=1)]
        assert store.apply("s", fresh) == [True, True, True]
        assert store.session("s") == make_state(version=2, messages=2)
        assert store.ledger("s").get("toolu_1") == effect

    def test_checkpoints_that_move_only_counters_read_as_the_states_they_wrote(
        self, store: Store, store_url: str
    ) -> None:
        """``PutSession(counters_only=True)``, as the agent's checkpoints of a turn that goes on
        write it: every read gives the state written — the session, every session's, after a
        reopen — and every compare-and-set compares the version as it stands, however the
        store keeps it (SQLite keeps it in the message's row)."""
        state = make_state(version=1, messages=1)
        store.apply("s", [PutSession(state, None), AppendMessages((make_message(0),))])
        for seq in range(1, 5):
            state, ops = counted_checkpoint(state, seq)
            assert store.apply("s", ops) == [True, True]
            assert store.session("s") == state
            assert store.session_states() == [state]
        assert [m.seq for m in store.messages("s")] == [0, 1, 2, 3, 4]
        # A worker that read an older version is refused, whichever way it writes.
        _, stale = counted_checkpoint(make_state(version=3, messages=5), 5)
        with pytest.raises(SessionConflictError, match="changed since it was read"):
            store.apply("s", stale)
        older = replace(state, status=RunStatus.NEEDS_ATTENTION, version=9)
        for version in (1, 2, 4):
            with pytest.raises(SessionConflictError, match="changed since it was read"):
                store.apply("s", [PutSession(older, expect_version=version)])
        _, taken = counted_checkpoint(state, 4)  # seq 4 is taken
        with pytest.raises(SessionConflictError, match="changed since it was read"):
            store.apply("s", taken)
        assert store.session("s") == state
        assert len(store.messages("s")) == 5, "nothing of a refused checkpoint landed"
        if self.durable:
            store.close()
            with open_store(store_url) as again:
                assert again.session("s") == state
                assert again.session_states() == [state]
                ended = replace(state, status=RunStatus.COMPLETED, version=6, updated_at=2e9)
                assert again.apply("s", [PutSession(ended, expect_version=5)]) == [True]
                assert again.session("s") == ended
                # Moved on whole: a counters-only checkpoint from the state before is refused.
                with pytest.raises(SessionConflictError, match="changed since it was read"):
                    again.apply("s", counted_checkpoint(state, 5)[1])
                assert again.session("s") == ended

    @pytest.mark.parametrize("case", ["fewer messages", "more messages", "not only counters"])
    def test_a_state_that_does_not_follow_its_transcript_reads_as_written(
        self, store: Store, case: str
    ) -> None:
        """The store keeps whatever state it is given, however it keeps a session's counters:
        a state that counts fewer messages than its transcript holds (written after
        checkpoints that moved only counters), or more, and a ``counters_only`` write whose
        state changes more than the counters — each reads back exactly as written, and a
        writer that read an older version is refused."""
        state = make_state(version=1, messages=1)
        store.apply("s", [PutSession(state, None), AppendMessages((make_message(0),))])
        state, ops = counted_checkpoint(state, 1)
        store.apply("s", ops)
        if case == "fewer messages":
            new = make_state(version=3, messages=0, status=RunStatus.NEEDS_ATTENTION)
            assert store.apply("s", [PutSession(new, expect_version=2)]) == [True]
        elif case == "more messages":
            new = replace(state, version=3, messages=9, updated_at=2e9)
            assert store.apply("s", [PutSession(new, expect_version=2)]) == [True]
            # The next counters-only checkpoint appends message 2 to a state counting 9.
            new, ops = counted_checkpoint(new, 2)
            assert store.apply("s", ops) == [True, True]
        else:
            new, ops = counted_checkpoint(state, 2)
            new = replace(new, status=RunStatus.COMPLETED, reason="done", lineage=_LINEAGE)
            put = PutSession(new, expect_version=state.version, counters_only=True)
            assert store.apply("s", [ops[0], put]) == [True, True]
        assert store.session("s") == new
        assert store.session_states() == [new]
        for version in (2, 3):
            if version != new.version:
                with pytest.raises(SessionConflictError, match="changed since it was read"):
                    store.apply("s", [PutSession(replace(new, version=9), version)])
        assert store.session("s") == new
        moved = replace(new, version=new.version + 1, updated_at=3e9)
        assert store.apply("s", [PutSession(moved, new.version)]) == [True]
        assert store.session("s") == moved

    def test_transcripts_are_append_only_and_ordered(self, store: Store, store_url: str) -> None:
        content = [
            {"type": "text", "text": "naïve ✓ \ud800"},
            {"type": "tool_use", "id": "t", "name": "x", "input": {"deep": [1, {"k": None}]}},
        ]
        messages = (make_message(0), make_message(1, "assistant", content), make_message(2))
        store.apply("s", [PutSession(make_state(messages=3), None), AppendMessages(messages)])
        assert store.messages("s") == list(messages)
        assert store.messages("s", since=2) == [messages[2]]
        with pytest.raises(SessionConflictError):
            store.apply("s", [AppendMessages((make_message(1),))])  # seq 1 is taken
        with pytest.raises(SessionConflictError):
            store.apply("s", [AppendMessages((make_message(5),))])  # a gap
        store.close()
        reopened = open_store(store_url)
        try:
            assert reopened.messages("s") == list(messages)
        finally:
            reopened.close()

    def test_read_messages_returns_copies(self, store: Store) -> None:
        store.apply("s", [AppendMessages((make_message(0, content=[{"a": 1}]),))])
        got = store.messages("s")
        got[0].content[0]["a"] = 2
        assert store.messages("s")[0].content == [{"a": 1}]

    def test_approvals_are_created_once_and_move_by_compare_and_set(self, store: Store) -> None:
        pending = make_approval()
        assert store.apply("s", [PutApproval(pending, None)]) == [True]
        assert store.apply("s", [PutApproval(make_approval(by="x"), None)]) == [False]
        approved = make_approval(status=ApprovalStatus.APPROVED, by="ana")
        wrong = PutApproval(approved, expect_status=ApprovalStatus.APPROVED)
        assert store.apply("s", [wrong]) == [False]
        right = PutApproval(approved, expect_status=ApprovalStatus.PENDING)
        assert store.apply("s", [right]) == [True]
        assert store.approvals("s") == [approved]
        assert store.approvals() == [approved]
        store.apply("t", [PutApproval(make_approval("t"), None)])
        assert len(store.approvals()) == 2
        assert store.approvals("nobody") == []

    def test_a_nul_in_free_text_is_kept_as_backslash_x00_by_every_store(self, store: Store) -> None:
        """Free text comes from outside (a model API error's message, an exception's, an
        approver's name, a person's ``by=``) and may hold a NUL, which PostgreSQL's text
        refuses: every store keeps it written ``\\x00`` — nothing is refused, nothing lost,
        and every backend reads back the same text."""
        nul = "proxy said \x00 then hung up"
        kept = "proxy said \\x00 then hung up"
        failed = replace(make_state(status=RunStatus.FAILED), reason=f"model API error: {nul}")
        store.apply("s", [PutSession(failed, None)])
        state = store.session("s")
        assert state is not None and state.reason == f"model API error: {kept}"
        effect = replace(
            make_record(status=Status.FAILED), error=f"resolved by {nul}", approved_by=nul
        )
        store.apply("s", [InsertEffect(effect)])
        got = store.ledger("s").get("toolu_1")
        assert got is not None
        assert (got.error, got.approved_by) == (f"resolved by {kept}", kept)
        asked = replace(make_approval(), reason=nul)
        store.apply("s", [PutApproval(asked, None)])
        decided = replace(asked, status=ApprovalStatus.DENIED, decided_at=2.0, decided_by=nul)
        assert store.apply("s", [PutApproval(decided, ApprovalStatus.PENDING)]) == [True]
        (approval,) = store.approvals("s")
        assert (approval.reason, approval.decided_by) == (kept, kept)

    def test_in_doubt_lists_started_records_of_every_session(self, store: Store) -> None:
        store.apply("a", [InsertEffect(make_record("a", "t1"))])
        store.apply("b", [InsertEffect(make_record("b", "t2", status=Status.SUCCEEDED, result=1))])
        store.apply("c", [InsertEffect(make_record("c", "t3"))])
        assert sorted((r.session_id, r.tool_use_id) for r in store.in_doubt()) == [
            ("a", "t1"),
            ("c", "t3"),
        ]

    # -- session leases ---------------------------------------------------------------------------

    def test_a_lease_is_taken_once_and_fences_every_write(self, store: Store) -> None:
        assert store.lease("s") is None
        mine = Lease(session_id="s", owner="host:1:a", token=1, expires_at=100.0)
        assert store.apply("s", [TakeLease(mine, expect_token=0)]) == [True]
        assert store.lease("s") == mine
        theirs = Lease(session_id="s", owner="host:2:b", token=1, expires_at=200.0)
        with pytest.raises(SessionBusyError) as info:
            store.apply("s", [TakeLease(theirs, expect_token=0)])
        assert info.value.owner == "host:1:a"
        # The fence renews and lets the batch through…
        effect = make_record()
        assert store.apply("s", [HoldLease("s", 1, 150.0), InsertEffect(effect)]) == [True, True]
        assert store.lease("s") == Lease(
            session_id="s", owner="host:1:a", token=1, expires_at=150.0, renewals=1
        )
        # …until someone takes the lease over: then the whole batch is refused.
        takeover = Lease(session_id="s", owner="host:2:b", token=2, expires_at=300.0)
        assert store.apply("s", [TakeLease(takeover, expect_token=1)]) == [True]
        stale: list[Op] = [HoldLease("s", 1, 400.0), InsertEffect(make_record(tool_use_id="t2"))]
        with pytest.raises(LeaseLostError):
            store.apply("s", stale)
        assert store.ledger("s").get("t2") is None
        assert store.lease("s") == takeover
        with pytest.raises(SessionBusyError):  # expect_token 1 is stale now
            store.apply("s", [TakeLease(theirs, expect_token=1)])

    def test_renewals_are_counted_and_a_take_over_compares_the_count(self, store: Store) -> None:
        """A worker that cannot judge a lease's holder watches its renewal count; the count
        moves with every renewal (never with a fence that only checks), a take-over starts it
        at 0 with the taker's time to live, and a take-over judged on a count that moved since
        is refused — even when the expiry written is the same (a clock that stood still).
        Expiries are set from the store's clock, as a worker sets them: a store whose clock every
        worker shares writes one set far from it as that clock would set it."""
        ends = store.now() + 30
        mine = Lease(session_id="s", owner="host:1:a", token=1, expires_at=ends, ttl=30.0)
        store.apply("s", [TakeLease(mine, expect_token=0)])
        assert store.lease("s") == mine
        store.apply("s", [HoldLease("s", 1, ends)])  # renewed, to the same expiry
        store.apply("s", [HoldLease("s", 1, None)])  # only checked
        seen = store.lease("s")
        assert seen is not None and (seen.renewals, seen.expires_at, seen.ttl) == (1, ends, 30.0)
        store.apply("s", [HoldLease("s", 1, ends)])
        theirs = Lease(
            session_id="s", owner="host:2:b", token=2, expires_at=store.now() + 5, ttl=5.0
        )
        stale = TakeLease(theirs, expect_token=1, expect_expires_at=ends, expect_renewals=1)
        with pytest.raises(SessionBusyError):
            store.apply("s", [stale])
        now = TakeLease(theirs, expect_token=1, expect_expires_at=ends, expect_renewals=2)
        assert store.apply("s", [now]) == [True]
        assert store.lease("s") == theirs  # renewals 0 again, and the taker's ttl

    def test_a_fence_that_only_checks_leaves_the_expiry_and_refuses_a_stale_token(
        self, store: Store
    ) -> None:
        mine = Lease(session_id="s", owner="host:1:a", token=1, expires_at=100.0)
        store.apply("s", [TakeLease(mine, expect_token=0)])
        check = HoldLease("s", 1, None)
        first = make_state(version=1, messages=1)
        store.apply("s", [PutSession(first, None), AppendMessages((make_message(0),))])
        # A checkpoint and an intent go through; the lease is not renewed.
        checkpoint: list[Op] = [
            check,
            AppendMessages((make_message(1, "assistant"),)),
            PutSession(make_state(version=2, messages=2), expect_version=1),
        ]
        assert store.apply("s", checkpoint) == [True, True, True]
        assert store.apply("s", [check, InsertEffect(make_record())]) == [True, True]
        assert store.lease("s") == mine
        # A record that exists is the op's own refusal, not a lost lease.
        assert store.apply("s", [check, InsertEffect(make_record(result=2))]) == [True, False]
        done = make_record(status=Status.SUCCEEDED, result=1)
        assert store.apply("s", [check, UpdateEffect(done, Status.STARTED, 2)]) == [True, False]
        # A stale session version is the checkpoint's own conflict, the lease being held.
        stale_version: list[Op] = [
            check,
            PutSession(make_state(version=3, messages=2), expect_version=7),
        ]
        with pytest.raises(SessionConflictError) as conflict:
            store.apply("s", stale_version)
        assert not isinstance(conflict.value, LeaseLostError)
        # Taken over: every batch behind the old token is refused whole.
        theirs = Lease(session_id="s", owner="host:2:b", token=2, expires_at=300.0)
        store.apply("s", [TakeLease(theirs, expect_token=1)])
        with pytest.raises(LeaseLostError):
            store.apply("s", [check, InsertEffect(make_record(tool_use_id="t2"))])
        with pytest.raises(LeaseLostError):
            store.apply("s", [check, InsertEffect(make_record())])  # exists, and lost
        with pytest.raises(LeaseLostError):
            store.apply(
                "s",
                [
                    check,
                    AppendMessages((make_message(2),)),
                    PutSession(make_state(version=3, messages=3), expect_version=2),
                ],
            )
        with pytest.raises(LeaseLostError):
            store.apply(
                "s", [check, PutSession(make_state(version=3, messages=2), expect_version=7)]
            )
        with pytest.raises(LeaseLostError):
            store.apply("s", [check, UpdateEffect(done, Status.STARTED, 1)])
        with pytest.raises(LeaseLostError):
            store.apply("s", [check, UpdateEffect(done, Status.STARTED, 1, guard=True)])
        assert store.ledger("s").get("t2") is None
        assert store.ledger("s").get("toolu_1") == make_record()
        assert len(store.messages("s")) == 2 and store.session("s") == make_state(
            version=2, messages=2
        )
        assert store.lease("s") == theirs
        # Given back: refused too.
        store.apply("s", [DropLease("s", 2)])
        with pytest.raises(LeaseLostError):
            store.apply("s", [HoldLease("s", 2, None), InsertEffect(make_record(tool_use_id="t3"))])
        assert store.ledger("s").get("t3") is None

    def test_a_dropped_lease_expires_now_and_keeps_its_token(self, store: Store) -> None:
        store.apply(
            "s",
            [
                TakeLease(
                    Lease(session_id="s", owner="o", token=1, expires_at=100.0), expect_token=0
                )
            ],
        )
        assert store.apply("s", [DropLease("s", 7)]) == [False]
        # Another owner's give-back of the same token (a take from the same reading that did
        # not land) leaves the lease held.
        assert store.apply("s", [DropLease("s", 1, "other")]) == [False]
        assert store.lease("s").expires_at == 100.0  # type: ignore[union-attr]
        assert store.apply("s", [DropLease("s", 1, "o")]) == [True]
        dropped = store.lease("s")
        assert dropped is not None and dropped.expires_at == 0.0 and dropped.token == 1
        again = Lease(session_id="s", owner="p", token=2, expires_at=50.0)
        assert store.apply("s", [TakeLease(again, expect_token=1)]) == [True]
