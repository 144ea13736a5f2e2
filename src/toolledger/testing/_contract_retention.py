"""The store contract, part three: removing a session (``DropSession``, ``Store.prune``) takes
all of it or nothing, and never a session with a call in progress or in doubt, a pending approval
or a held lease. Run through ``StoreConformance``."""

from __future__ import annotations

from dataclasses import replace

import pytest

from .._tool_uses import run_tool_uses
from ..errors import ConfigurationError, SessionConflictError
from ..ops import AppendMessages, DropSession, InsertEffect, Op, PutApproval, PutSession, TakeLease
from ..records import ApprovalStatus, Lease, RunStatus, Status
from ..stores import Store, open_store
from ..tools import tool
from ._contract_sessions import counted_checkpoint
from ._samples import make_approval, make_message, make_record, make_state

__all__ = ["RetentionContract"]

DAY = 86_400.0
OLD = 1_700_000_000.0  # what ``make_record`` stamps: long ago


def _ended(store: Store, sid: str, status: RunStatus = RunStatus.COMPLETED) -> None:
    """A session as an agent leaves it: state, three messages, a settled call, a decided
    approval, a lease given back."""
    ops: list[Op] = [
        PutSession(make_state(sid, version=3, messages=3, status=status), None),
        AppendMessages(
            tuple(make_message(i, "user" if i % 2 == 0 else "assistant") for i in (0, 1, 2))
        ),
        InsertEffect(make_record(sid, "toolu_a", status=Status.SUCCEEDED, result="ok")),
        PutApproval(make_approval(sid, "toolu_a", status=ApprovalStatus.APPROVED, by="ann"), None),
        TakeLease(Lease(session_id=sid, owner="h:1:a", token=1, expires_at=5.0), expect_token=0),
    ]
    assert store.apply(sid, ops) == [True] * len(ops)


def _whole(store: Store, sid: str) -> tuple[object, ...]:
    return (
        store.session(sid),
        store.messages(sid),
        store.ledger(sid).records(),
        store.approvals(sid),
        store.lease(sid),
    )


def _gone(store: Store, sid: str) -> None:
    assert _whole(store, sid) == (None, [], [], [], None)
    assert sid not in store.sessions()
    assert sid not in [s.session_id for s in store.session_states()]


class RetentionContract:
    """The retention third of ``StoreConformance``."""

    durable: bool

    def test_a_session_moved_on_by_its_counters_is_removed_by_the_version_it_is_at(
        self, store: Store
    ) -> None:
        """A ready session whose last checkpoint moved only its counters
        (``PutSession.counters_only``): a removal that read it before that checkpoint is
        refused, one that read it after removes it whole."""
        state = replace(make_state(version=1, messages=1), status=RunStatus.READY)
        store.apply("s", [PutSession(state, None), AppendMessages((make_message(0),))])
        read_before = 1
        state, ops = counted_checkpoint(state, 1)
        assert store.apply("s", ops) == [True, True]
        with pytest.raises(SessionConflictError):
            store.apply("s", [DropSession("s", expect_version=read_before, now=2e9)])
        assert store.session("s") == state and len(store.messages("s")) == 2
        drop = DropSession("s", expect_version=state.version, now=2e9)
        assert store.apply("s", [drop]) == [True]
        _gone(store, "s")

    def test_a_removed_session_is_gone_whole_and_others_stay(
        self, store: Store, store_url: str
    ) -> None:
        _ended(store, "old")
        _ended(store, "other")
        kept = _whole(store, "other")
        now = store.now()
        assert store.apply("old", [DropSession("old", 3, now)]) == [True]
        _gone(store, "old")
        assert _whole(store, "other") == kept
        if self.durable:
            with open_store(store_url) as again:
                _gone(again, "old")
                assert _whole(again, "other") == kept

    def test_a_session_of_records_alone_is_removed(self, store: Store) -> None:
        store.apply("bare", [InsertEffect(make_record("bare", status=Status.SUCCEEDED))])
        with pytest.raises(SessionConflictError):  # it has no state: a version cannot match
            store.apply("bare", [DropSession("bare", 1, store.now())])
        assert store.apply("bare", [DropSession("bare", None, store.now())]) == [True]
        _gone(store, "bare")

    @pytest.mark.parametrize(
        "change",
        [
            "stale version",
            "has state",
            "running",
            "needs_attention",
            "awaiting_approval",
            "started call",
            "pending approval",
            "held lease",
        ],
    )
    def test_what_holds_a_session_keeps_all_of_it(self, store: Store, change: str) -> None:
        status = RunStatus(change) if change in {s.value for s in RunStatus} else None
        _ended(store, "s", status or RunStatus.COMPLETED)
        now = store.now()
        version: int | None = 3
        if change == "stale version":
            version = 2
        elif change == "has state":
            version = None
        elif change == "started call":
            store.apply("s", [InsertEffect(make_record("s", "toolu_b", status=Status.STARTED))])
        elif change == "pending approval":
            store.apply("s", [PutApproval(make_approval("s", "toolu_b"), None)])
        elif change == "held lease":
            held = Lease(session_id="s", owner="h:2:b", token=2, expires_at=now + DAY)
            taken = TakeLease(held, expect_token=1, expect_expires_at=None)
            assert store.apply("s", [taken]) == [True]
        before = _whole(store, "s")
        with pytest.raises(SessionConflictError) as info:
            store.apply("s", [DropSession("s", version, now)])
        assert info.value.session_id == "s"
        assert _whole(store, "s") == before

    def test_a_removal_is_a_batch_of_its_own(self, store: Store) -> None:
        _ended(store, "s")
        before = _whole(store, "s")
        with pytest.raises(ConfigurationError):
            store.apply(
                "s",
                [
                    InsertEffect(make_record("s", "toolu_z", status=Status.SUCCEEDED)),
                    DropSession("s", 3, store.now()),
                ],
            )
        assert _whole(store, "s") == before

    def test_prune_removes_what_ended_long_ago_and_says_what_it_kept(self, store: Store) -> None:
        _ended(store, "done")
        _ended(store, "budget", RunStatus.MAX_TURNS)
        _ended(store, "doubt")
        store.apply("doubt", [InsertEffect(make_record("doubt", "toolu_b", status=Status.STARTED))])
        _ended(store, "asking", RunStatus.AWAITING_APPROVAL)
        store.apply("bare", [InsertEffect(make_record("bare", status=Status.SUCCEEDED))])
        recent = replace(make_state("fresh", version=1), updated_at=store.now())
        store.apply("fresh", [PutSession(recent, None)])

        dry = store.prune(older_than=30 * DAY, dry_run=True)
        assert dry.dry_run and sorted(p.session_id for p in dry.removed) == [
            "bare",
            "budget",
            "done",
        ]
        assert len(store.sessions()) == 6  # a dry run removes nothing

        only = store.prune(older_than=30 * DAY, status="max_turns")
        assert [p.session_id for p in only.removed] == ["budget"]
        _gone(store, "budget")

        report = store.prune(older_than=30 * DAY)
        removed = {p.session_id: p for p in report.removed}
        assert sorted(removed) == ["bare", "done"]
        done = removed["done"]
        assert (done.status, done.messages, done.records, done.approvals) == (
            RunStatus.COMPLETED,
            3,
            1,
            1,
        )
        assert removed["bare"].status is None and removed["bare"].records == 1
        kept = {k.session_id: k.why for k in report.kept}
        assert sorted(kept) == ["asking", "doubt"]
        assert "in progress or in doubt (toolu_b)" in kept["doubt"]
        assert "awaiting_approval" in kept["asking"]
        assert store.sessions() == ["asking", "doubt", "fresh"]
        with pytest.raises(ConfigurationError, match="cannot be pruned"):
            store.prune(older_than=0, status="running")

    @pytest.mark.parametrize("written", ["a record", "a record stamped earlier", "an approval"])
    def test_a_session_written_since_its_remover_read_it_is_kept(
        self, store: Store, written: str
    ) -> None:
        """A removal that carries what its remover read of the session — the latest stamp of
        its records and approvals, how many records it has — is refused when anything of the
        session was written since: a call that ran and settled between the read and the removal
        keeps its record (removed, its id would run again). Unchanged, the session goes."""
        settled = make_record("bare", "toolu_a", status=Status.SUCCEEDED, result="ok")
        store.apply("bare", [InsertEffect(settled)])
        store.apply("same", [InsertEffect(replace(settled, session_id="same"))])
        now = store.now()
        match written:
            case "a record":
                later = make_record("bare", "toolu_b", status=Status.SUCCEEDED, at=store.now())
                store.apply("bare", [InsertEffect(later)])
            case "a record stamped earlier":  # its writer's clock behind: told by the count
                earlier = make_record("bare", "toolu_b", status=Status.SUCCEEDED, at=OLD - 1)
                store.apply("bare", [InsertEffect(earlier)])
            case "an approval":
                asked = replace(
                    make_approval("bare", "toolu_b", status=ApprovalStatus.DENIED, by="ann"),
                    requested_at=store.now(),
                    decided_at=store.now(),
                )
                store.apply("bare", [PutApproval(asked, None)])
        before = _whole(store, "bare")
        with pytest.raises(SessionConflictError):
            store.apply("bare", [DropSession("bare", None, now, last_activity=OLD, records=1)])
        assert _whole(store, "bare") == before
        drop = DropSession("same", None, now, last_activity=OLD, records=1)
        assert store.apply("same", [drop]) == [True]
        _gone(store, "same")

    def test_a_session_with_state_written_since_its_remover_read_it_is_kept(
        self, store: Store
    ) -> None:
        """Records written to an ended session without a checkpoint (``run_tool_uses`` on it)
        leave its version as it was: what the remover read tells them."""
        _ended(store, "s")
        late = make_record("s", "toolu_b", status=Status.SUCCEEDED, at=store.now())
        store.apply("s", [InsertEffect(late)])
        before = _whole(store, "s")
        drop = DropSession("s", 3, store.now(), last_activity=OLD + 100, records=1)
        with pytest.raises(SessionConflictError):
            store.apply("s", [drop])
        assert _whole(store, "s") == before

    def test_prune_keeps_what_a_call_wrote_after_prune_read_it(
        self, store: Store, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A session of records alone, idle long enough; a call runs on it and settles after
        ``prune`` read the session and before it removes it. The session stays, whole, and the
        call's id is answered from its record, never run again."""
        store.apply("s", [InsertEffect(make_record("s", "toolu_old", status=Status.SUCCEEDED))])
        sent: list[str] = []

        @tool(effect="non_idempotent")
        def send(to: str) -> str:
            """Send a message."""
            sent.append(to)
            return "sent"

        content = [{"type": "tool_use", "id": "toolu_new", "name": "send", "input": {"to": "a"}}]
        read_lease = store.lease

        def meanwhile(session_id: str) -> Lease | None:  # prune reads it after the records
            if not sent:
                run_tool_uses(content, [send], ledger=store.ledger("s"))
            return read_lease(session_id)

        monkeypatch.setattr(store, "lease", meanwhile)
        report = store.prune(older_than=30 * DAY)
        monkeypatch.undo()
        assert report.removed == [] and [k.session_id for k in report.kept] == ["s"]
        assert "changed" in report.kept[0].why
        ids = sorted(r.tool_use_id for r in store.ledger("s").records())
        assert ids == ["toolu_new", "toolu_old"]
        run_tool_uses(content, [send], ledger=store.ledger("s"))
        assert sent == ["a"]
