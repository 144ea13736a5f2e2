"""The store contract, part four: branches (``toolledger._lineage``) — a session's lineage kept
with its state, a rewind's abandoned messages moved out of the transcript whole or not at all,
and a session created with the records a fork copies, in one piece. Run through
``StoreConformance``."""

from __future__ import annotations

from dataclasses import replace

import pytest

from .._lineage import Branch, BranchKind, ForkedEffect
from ..errors import SessionConflictError
from ..ops import AbandonMessages, AppendMessages, DropSession, InsertEffect, Op, PutSession
from ..records import RunStatus, SessionState, Status
from ..stores import Store, open_store
from ._contract_sessions import counted_checkpoint
from ._samples import make_message, make_record, make_state

__all__ = ["BranchContract"]


def _lineage() -> tuple[Branch, ...]:
    """A fork then a rewind, each with effects: every field of both set (unicode, a nested
    input, a result of JSON text, a call in progress)."""
    sent = ForkedEffect(
        session_id="parent",
        tool_use_id="toolu_a",
        tool="send_email",
        input={"to": "ana@example.com", "body": ["naïve ✓", {"n": 1.5}]},
        state="succeeded",
        result='{"id":7}',
        at=1_700_000_010.25,
    )
    charging = ForkedEffect(
        session_id="s",
        tool_use_id="toolu_b",
        tool="charge",
        input={"cents": 1200},
        state="in_progress",
        result=None,
        at=1_700_000_020.5,
    )
    fork = Branch(
        kind=BranchKind.FORK, source="parent", turn=2, at=1_700_000_030.0, cut=4, note_seq=4,
        effects=(sent,), root="grandparent ✓",
    )  # fmt: skip
    rewind = Branch(
        kind=BranchKind.REWIND, source="s", turn=3, at=1_700_000_040.0, cut=6, note_seq=None,
        effects=(sent, charging), branch=1, abandoned_calls=("toolu_b",), by="ana 会话",
    )  # fmt: skip
    return (fork, rewind)


def _messages(store: Store, sid: str, n: int) -> SessionState:
    """A session with ``n`` messages (seqs 0 … n-1), at version 1."""
    state = make_state(sid, version=1, messages=n)
    batch: list[Op] = [PutSession(state, None)]
    if n:
        batch.append(AppendMessages(tuple(make_message(i) for i in range(n))))
    store.apply(sid, batch)
    return state


def _whole(store: Store, sid: str) -> tuple[object, ...]:
    return (
        store.session(sid),
        store.messages(sid),
        store.abandoned(sid),
        store.ledger(sid).records(),
    )


class BranchContract:
    """The branches quarter of ``StoreConformance``."""

    durable: bool

    def test_a_lineage_is_kept_with_the_state(self, store: Store, store_url: str) -> None:
        lineage = _lineage()
        created = replace(make_state(version=1), lineage=lineage)
        assert store.apply("s", [PutSession(created, None)]) == [True]
        assert store.session("s") == created
        # A compare-and-set writes the lineage it carries: one more branch, then none.
        grown = replace(make_state(version=2), lineage=(*lineage, lineage[0]))
        assert store.apply("s", [PutSession(grown, expect_version=1)]) == [True]
        assert store.session("s") == grown
        assert store.apply("plain", [PutSession(make_state("plain"), None)]) == [True]
        assert store.session("plain") is not None
        assert store.session("plain").lineage == ()  # type: ignore[union-attr]
        assert {s.session_id: s for s in store.session_states()}["s"] == grown
        if self.durable:
            with open_store(store_url) as again:
                assert again.session("s") == grown
                assert again.session("plain") == make_state("plain")
        cleared = make_state(version=3)
        assert store.apply("s", [PutSession(cleared, expect_version=2)]) == [True]
        assert store.session("s") == cleared

    def test_a_rewind_moves_the_tail_and_the_transcript_goes_on(
        self, store: Store, store_url: str
    ) -> None:
        _messages(store, "s", 5)
        original = store.messages("s")
        fresh = make_message(3, "user", "after the rewind")
        rewind: list[Op] = [
            AbandonMessages(from_seq=3, branch=1),
            AppendMessages((fresh,)),
            PutSession(make_state(version=2, messages=4), expect_version=1),
        ]
        assert store.apply("s", rewind) == [True, True, True]
        assert store.messages("s") == [*original[:3], fresh]
        assert store.abandoned("s") == {1: original[3:]}
        assert [m.seq for m in store.abandoned("s")[1]] == [3, 4]  # the seqs they had
        # A second rewind, further back, is branch 2; the first stays as it was.
        assert store.apply(
            "s",
            [
                AbandonMessages(from_seq=1, branch=2),
                PutSession(make_state(version=3, messages=1), expect_version=2),
            ],
        ) == [True, True]
        assert store.messages("s") == original[:1]
        assert store.abandoned("s") == {1: original[3:], 2: [original[1], original[2], fresh]}
        assert store.abandoned("other") == {}
        if self.durable:
            with open_store(store_url) as again:
                assert again.messages("s") == original[:1]
                assert again.abandoned("s") == store.abandoned("s")

    @pytest.mark.parametrize("back_to", [1, 2, 3, 4])
    def test_a_rewind_after_checkpoints_that_moved_only_counters(
        self, store: Store, back_to: int
    ) -> None:
        """The tail a rewind takes out may hold the messages that carry the session's counters
        (``PutSession.counters_only``): the rewind still compares the version as it stood, and
        the session reads as the rewind wrote it; a rewind by a worker that read an older
        version changes nothing."""
        state = _messages(store, "s", 1)
        for seq in range(1, 5):
            state, ops = counted_checkpoint(state, seq)
            store.apply("s", ops)
        original = store.messages("s")
        before = _whole(store, "s")
        note = make_message(back_to, "user", "after the rewind")
        rewound = replace(state, version=6, messages=back_to + 1, updated_at=2e9)
        for stale in (1, 4):
            batch: list[Op] = [
                AbandonMessages(from_seq=back_to, branch=1),
                AppendMessages((note,)),
                PutSession(rewound, expect_version=stale),
            ]
            with pytest.raises(SessionConflictError, match="changed since it was read"):
                store.apply("s", batch)
            assert _whole(store, "s") == before
        rewind = [*batch[:2], PutSession(rewound, expect_version=5)]
        assert store.apply("s", rewind) == [True, True, True]
        assert store.session("s") == rewound
        assert store.messages("s") == [*original[:back_to], note]
        assert store.abandoned("s") == {1: original[back_to:]}
        # The transcript goes on from the rewind, counters only again.
        after, ops = counted_checkpoint(rewound, back_to + 1)
        assert store.apply("s", ops) == [True, True]
        assert store.session("s") == after
        assert store.session_states() == [after]

    def test_a_rewind_to_the_end_keeps_an_empty_branch(self, store: Store) -> None:
        _messages(store, "s", 2)
        assert store.apply("s", [AbandonMessages(from_seq=2, branch=1)]) == [True]
        assert store.abandoned("s") == {1: []}
        assert len(store.messages("s")) == 2
        with pytest.raises(SessionConflictError):  # its number is taken all the same
            store.apply("s", [AbandonMessages(from_seq=1, branch=1)])
        assert store.abandoned("s") == {1: []}

    @pytest.mark.parametrize(
        "refusal", ["past the end", "before the start", "branch taken", "stale"]
    )
    def test_a_refused_rewind_changes_nothing(self, store: Store, refusal: str) -> None:
        _messages(store, "s", 4)
        assert store.apply(
            "s",
            [
                AbandonMessages(from_seq=3, branch=1),
                PutSession(make_state(version=2, messages=3), expect_version=1),
            ],
        ) == [True, True]
        before = _whole(store, "s")
        from_seq, branch, version = 1, 2, 2
        if refusal == "past the end":
            from_seq = 4  # three messages left: seq 3 is the next, 4 is past it
        elif refusal == "before the start":
            from_seq = -1
        elif refusal == "branch taken":
            branch = 1
        else:
            version = 1  # a worker that read the session before the first rewind
        batch: list[Op] = [
            InsertEffect(make_record(status=Status.SUCCEEDED, result="x")),
            AbandonMessages(from_seq=from_seq, branch=branch),
            AppendMessages((make_message(from_seq, "user", "new"),)),
            PutSession(make_state(version=3, messages=from_seq + 1), expect_version=version),
        ]
        with pytest.raises(SessionConflictError) as info:
            store.apply("s", batch)
        assert info.value.session_id == "s"
        assert _whole(store, "s") == before

    def test_removing_a_session_removes_its_abandoned_branches(self, store: Store) -> None:
        _messages(store, "s", 3)
        done = make_state(version=2, messages=1, status=RunStatus.COMPLETED)
        rewind: list[Op] = [AbandonMessages(1, 1), PutSession(done, expect_version=1)]
        assert store.apply("s", rewind) == [True, True]
        _messages(store, "kept", 2)
        assert store.apply("kept", [AbandonMessages(0, 1)]) == [True]
        assert len(store.abandoned("s")[1]) == 2
        assert store.apply("s", [DropSession("s", 2, store.now())]) == [True]
        assert store.abandoned("s") == {}
        assert store.messages("s") == [] and store.session("s") is None
        assert store.abandoned("kept") == {1: [make_message(0), make_message(1)]}
        # A session of the same id starts with no branch: number 1 is free again.
        _messages(store, "s", 1)
        assert store.apply("s", [AbandonMessages(0, 1)]) == [True]
        assert store.abandoned("s") == {1: [make_message(0)]}

    def test_a_session_created_with_records_lands_whole(self, store: Store, store_url: str) -> None:
        """What a fork writes: the new session's state, its transcript and the records it keeps,
        in one batch."""
        records = [
            make_record("fork", f"toolu_{i}", status=Status.SUCCEEDED, result={"n": i})
            for i in range(3)
        ]
        state = replace(make_state("fork", version=1, messages=2), lineage=_lineage()[:1])
        batch: list[Op] = [
            PutSession(state, None),
            AppendMessages((make_message(0), make_message(1, "assistant"))),
            *(InsertEffect(r) for r in records),
        ]
        assert store.apply("fork", batch) == [True] * len(batch)

        def whole(s: Store) -> None:
            assert s.session("fork") == state
            assert s.messages("fork") == [make_message(0), make_message(1, "assistant")]
            assert sorted(s.ledger("fork").records(), key=lambda r: r.tool_use_id) == records

        whole(store)
        # Created once: a second creation is refused whole, its records with it.
        again: list[Op] = [PutSession(state, None), InsertEffect(make_record("fork", "toolu_9"))]
        with pytest.raises(SessionConflictError):
            store.apply("fork", again)
        assert store.ledger("fork").get("toolu_9") is None
        if self.durable:
            with open_store(store_url) as reopened:
                whole(reopened)
