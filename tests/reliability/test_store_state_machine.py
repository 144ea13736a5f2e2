"""The store contract as a state machine (hypothesis ``RuleBasedStateMachine``).

Hypothesis interleaves intents, outcomes, resolutions, approvals, checkpoints (some with a stale
version, which must roll back their whole batch; some moving only the session's counters, which
SQLite keeps in the message's row), rewinds (some refused: a stale version, a seq
past the transcript's end, a branch number taken) and reopenings, each through one of two
handles open on the same store at once. After every step, both handles must read back exactly
what a plain-Python model of the contract says: every record, every in-doubt call, every
approval, every session state (its lineage with it), transcript and abandoned branch.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import toolledger as tl
from toolledger._lineage import Branch, BranchKind
from toolledger.codec import encode_result
from toolledger.ops import (
    AbandonMessages,
    AppendMessages,
    InsertEffect,
    Op,
    PutApproval,
    PutSession,
    UpdateEffect,
)
from toolledger.records import (
    ApprovalRecord,
    ApprovalStatus,
    EffectRecord,
    SessionState,
    Status,
    StoredMessage,
)
from toolledger.testing.conformance import make_approval, make_message, make_record, make_state

from ..conftest import drop_schema, with_params

SESSIONS = ["s1", "s/2 '; --"]
CALLS = ["toolu_a", "toolu_b", "toolu_c"]
HANDLES = st.integers(0, 1)
STATUSES = st.sampled_from(list(Status))
Key = tuple[str, str]


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def machine_for(open_url: Callable[[], tuple[str, Callable[[], None]]]) -> type[Any]:
    """A state machine class over fresh stores made by ``open_url`` (url, cleanup)."""

    class StoreMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.url, self.cleanup = open_url()
            self.clock = Clock()
            self.handles = [self.open(), self.open()]
            self.effects: dict[Key, EffectRecord] = {}
            self.approvals: dict[Key, ApprovalRecord] = {}
            self.states: dict[str, SessionState] = {}
            self.messages: dict[str, list[StoredMessage]] = {s: [] for s in SESSIONS}
            self.abandoned: dict[str, dict[int, list[StoredMessage]]] = {s: {} for s in SESSIONS}

        def open(self) -> tl.Store:
            return tl.open_store(self.url, clock=self.clock)

        def teardown(self) -> None:
            for h in self.handles:
                h.close()
            self.cleanup()

        # -- effects ----------------------------------------------------------------------------

        @rule(h=HANDLES, sid=st.sampled_from(SESSIONS), tid=st.sampled_from(CALLS))
        def intent(self, h: int, sid: str, tid: str) -> None:
            """Insert-if-absent of a ``started`` record (the intent)."""
            record = make_record(sid, tid, status=Status.STARTED, at=self.clock())
            (applied,) = self.handles[h].apply(sid, [InsertEffect(record)])
            assert applied == ((sid, tid) not in self.effects)
            if applied:
                self.effects[(sid, tid)] = record

        @rule(
            h=HANDLES,
            sid=st.sampled_from(SESSIONS),
            tid=st.sampled_from(CALLS),
            new=STATUSES,
            stale=st.booleans(),
            result=st.one_of(st.none(), st.text(max_size=20), st.integers()),
        )
        def outcome(
            self, h: int, sid: str, tid: str, new: Status, stale: bool, result: Any
        ) -> None:
            """Compare-and-set from what we believe the record is (or a stale belief)."""
            current = self.effects.get((sid, tid))
            base = current or make_record(sid, tid)
            attempt = base.attempt + (1 if stale else 0)
            record = replace(
                base,
                status=new,
                attempt=base.attempt if new is not Status.STARTED else base.attempt + 1,
                result=None if result is None else encode_result(result).stored,
                updated_at=self.clock(),
            )
            op = UpdateEffect(record, expect_status=base.status, expect_attempt=attempt)
            (applied,) = self.handles[h].apply(sid, [op])
            assert applied == (current is not None and not stale)
            if applied:
                self.effects[(sid, tid)] = record

        @rule(
            h=HANDLES,
            sid=st.sampled_from(SESSIONS),
            tid=st.sampled_from(CALLS),
            happened=st.booleans(),
        )
        def resolve(self, h: int, sid: str, tid: str, happened: bool) -> None:
            current = self.effects.get((sid, tid))
            ledger = self.handles[h].ledger(sid)
            if current is None or current.status is not Status.STARTED:
                with pytest.raises(tl.NotInDoubtError, match="only an in-doubt"):
                    ledger.resolve(tid, happened=happened, by="ana", force=True)
                return
            # force: the contract under test is the compare-and-set, not whose attempt is alive
            new = ledger.resolve(tid, happened=happened, by="ana", force=True)
            assert new.status is (Status.SUCCEEDED if happened else Status.NOT_HAPPENED)
            self.effects[(sid, tid)] = new
            # A request still pending that the settling answers is closed in the same commit:
            # one about a call in doubt, and — when it happened — any (``Ledger.resolve``).
            asked = self.approvals.get((sid, tid))
            pending = asked is not None and asked.status is ApprovalStatus.PENDING
            if asked is not None and pending and (asked.in_doubt or happened):
                (stored,) = [a for a in self.handles[h].approvals(sid) if a.tool_use_id == tid]
                settled = "happened" if happened else "did not happen"
                assert stored.status is ApprovalStatus.DENIED
                assert stored.decided_by == f"ana (resolved: {settled})"
                unchanged = replace(stored, status=asked.status, decided_at=None, decided_by=None)
                assert unchanged == asked
                self.approvals[(sid, tid)] = stored

        # -- approvals --------------------------------------------------------------------------

        @rule(h=HANDLES, sid=st.sampled_from(SESSIONS), tid=st.sampled_from(CALLS))
        def ask(self, h: int, sid: str, tid: str) -> None:
            record = replace(make_approval(sid, tid), requested_at=self.clock())
            (applied,) = self.handles[h].apply(sid, [PutApproval(record, expect_status=None)])
            assert applied == ((sid, tid) not in self.approvals)
            if applied:
                self.approvals[(sid, tid)] = record

        @rule(
            h=HANDLES,
            sid=st.sampled_from(SESSIONS),
            tid=st.sampled_from(CALLS),
            expect=st.sampled_from(list(ApprovalStatus)),
            to=st.sampled_from(list(ApprovalStatus)),
        )
        def decide(
            self, h: int, sid: str, tid: str, expect: ApprovalStatus, to: ApprovalStatus
        ) -> None:
            current = self.approvals.get((sid, tid))
            base = current or make_approval(sid, tid)
            record = replace(base, status=to, decided_at=self.clock(), decided_by="ana")
            (applied,) = self.handles[h].apply(sid, [PutApproval(record, expect_status=expect)])
            assert applied == (current is not None and current.status is expect)
            if applied:
                self.approvals[(sid, tid)] = record

        # -- checkpoints ------------------------------------------------------------------------

        @rule(
            h=HANDLES,
            sid=st.sampled_from(SESSIONS),
            stale=st.booleans(),
            n=st.integers(0, 2),
            tid=st.sampled_from(CALLS),
        )
        def checkpoint(self, h: int, sid: str, stale: bool, n: int, tid: str) -> None:
            """An outcome, messages and the state in one batch; a stale version rolls it all
            back."""
            state = self.states.get(sid)
            version = state.version if state else 0
            seen = self.messages[sid]
            new_state = replace(
                make_state(sid, version=version + 1, messages=len(seen) + n),
                updated_at=self.clock(),
            )
            appended = tuple(
                make_message(len(seen) + i, content=[{"type": "text", "text": "é"}])
                for i in range(n)
            )
            record = make_record(sid, tid, status=Status.SUCCEEDED, result="x", at=self.clock())
            expect = (version + 7 if stale else version) if state else (7 if stale else None)
            ops: list[Op] = [InsertEffect(record), AppendMessages(appended)]
            ops.append(PutSession(new_state, expect))
            if stale:
                with pytest.raises(tl.SessionConflictError):
                    self.handles[h].apply(sid, ops)
                return
            applied = self.handles[h].apply(sid, ops)
            assert applied[0] == ((sid, tid) not in self.effects)
            if applied[0]:
                self.effects[(sid, tid)] = record
            self.states[sid] = new_state
            self.messages[sid] = [*seen, *appended]

        @precondition(lambda self: bool(self.states))
        @rule(h=HANDLES, data=st.data(), behind=st.sampled_from([0, 0, 1, 2, -7]))
        def counted(self, h: int, data: st.DataObject, behind: int) -> None:
            """A checkpoint that moves only the session's counters, as the agent's of a turn
            that goes on (``PutSession.counters_only``: SQLite keeps them in the message's
            row); one that expects the version ``behind`` the session's (an older one, or one
            it never had) is refused whole."""
            sid = data.draw(st.sampled_from(sorted(self.states)))
            state = self.states[sid]
            seen = self.messages[sid]
            message = replace(make_message(len(seen), "assistant"), created_at=self.clock())
            new_state = replace(
                state,
                version=state.version + 1,
                turns=state.turns + 1,
                input_tokens=state.input_tokens + 3,
                messages=len(seen) + 1,
                updated_at=message.created_at,
            )
            put = PutSession(new_state, state.version - behind, counters_only=True)
            ops: list[Op] = [AppendMessages((message,)), put]
            if behind:
                with pytest.raises(tl.SessionConflictError):
                    self.handles[h].apply(sid, ops)
                return
            assert self.handles[h].apply(sid, ops) == [True, True]
            self.states[sid] = new_state
            self.messages[sid] = [*seen, message]

        @precondition(lambda self: bool(self.states))
        @rule(
            h=HANDLES,
            data=st.data(),
            back=st.integers(-1, 3),
            branch=st.integers(1, 3),
            n=st.integers(0, 2),
            stale=st.booleans(),
        )
        def rewind(
            self, h: int, data: st.DataObject, back: int, branch: int, n: int, stale: bool
        ) -> None:
            """The transcript taken back by ``back`` messages (its tail kept as ``branch``;
            -1 is past its end, more than it holds before its start), then going on from there,
            with the state and its lineage: all of it, or — refused — nothing."""
            sid = data.draw(st.sampled_from(sorted(self.states)))
            state = self.states[sid]
            seen = self.messages[sid]
            at = len(seen) - back
            start = max(at, 0)
            note = Branch(
                kind=BranchKind.REWIND, source=sid, turn=0, at=self.clock(), cut=at,
                note_seq=None, branch=branch,
            )  # fmt: skip
            new_state = replace(
                make_state(sid, version=state.version + 1, messages=start + n),
                updated_at=self.clock(),
                lineage=(*state.lineage, note),
            )
            appended = tuple(make_message(start + i, "assistant") for i in range(n))
            ops: list[Op] = [
                AbandonMessages(from_seq=at, branch=branch),
                AppendMessages(appended),
                PutSession(new_state, state.version + 7 if stale else state.version),
            ]
            if stale or not 0 <= at <= len(seen) or branch in self.abandoned[sid]:
                with pytest.raises(tl.SessionConflictError):
                    self.handles[h].apply(sid, ops)
                return
            assert self.handles[h].apply(sid, ops) == [True, True, True]
            self.abandoned[sid][branch] = seen[at:]
            self.messages[sid] = [*seen[:at], *appended]
            self.states[sid] = new_state

        @rule(h=HANDLES)
        def reopen(self, h: int) -> None:
            self.handles[h].close()
            self.handles[h] = self.open()

        # -- what every handle reads ------------------------------------------------------------

        @invariant()
        def both_handles_read_the_model(self) -> None:
            for store in self.handles:
                for sid in SESSIONS:
                    want = {t: r for (s, t), r in self.effects.items() if s == sid}
                    assert store.backend.read_effects(sid) == want
                    assert store.backend.read_session(sid) == self.states.get(sid)
                    assert store.backend.read_messages(sid) == self.messages[sid]
                    assert store.backend.read_abandoned(sid) == self.abandoned[sid]
                    approvals = store.backend.read_approvals(sid)
                    assert {a.tool_use_id: a for a in approvals} == {
                        t: a for (s, t), a in self.approvals.items() if s == sid
                    }
                doubts = {(r.session_id, r.tool_use_id) for r, _ in store.started()}
                assert doubts == {k for k, r in self.effects.items() if r.status is Status.STARTED}

    return StoreMachine


SETTINGS = settings(
    max_examples=40,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.parametrize("kind", ["memory", "sqlite", "json"])
def test_the_store_contract_holds_under_any_interleaving(kind: str) -> None:
    def fresh() -> tuple[str, Callable[[], None]]:
        if kind == "memory":
            return f"memory://{uuid.uuid4().hex}", lambda: None
        root = tempfile.mkdtemp(prefix="tl-sm-")
        url = {"sqlite": f"sqlite:///{root}/l.db", "json": f"json:///{root}/l"}[kind]
        return url, lambda: shutil.rmtree(root, ignore_errors=True)

    run_state_machine_as_test(machine_for(fresh), settings=SETTINGS)


@pytest.mark.postgres
def test_the_store_contract_holds_on_postgres(postgres_url: str) -> None:
    def fresh() -> tuple[str, Callable[[], None]]:
        schema = f"tl_sm_{uuid.uuid4().hex[:16]}"
        return with_params(postgres_url, schema=schema), lambda: drop_schema(postgres_url, schema)

    run_state_machine_as_test(machine_for(fresh), settings=settings(SETTINGS, max_examples=15))
