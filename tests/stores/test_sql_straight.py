"""A checkpoint's statements built straight (``writes.straight``) are the ones its plan yields,
and every outcome but the common one is decided by the plan (``plans.drive``, told what ran).

The statements are compared with the plan's for each shape of checkpoint a turn commits. Then
each way a checkpoint stops being common — a version moved, the lease taken over, a seq taken,
a record already there or moved on, a statement that fails — is committed on two identical
SQLite stores, once straight and once on the general path, and everything is compared: the
flags or the error, every statement SQLite ran, and every row left behind.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
from toolledger import _switches as switches
from toolledger.ops import (
    AppendMessages,
    HoldLease,
    InsertEffect,
    Op,
    PutApproval,
    PutSession,
    TakeLease,
    UpdateEffect,
)
from toolledger.records import Lease, Status, StoredMessage
from toolledger.stores._sql import plans, writes
from toolledger.stores._sql.plans import Outcome, Step
from toolledger.testing._samples import make_approval, make_message, make_record, make_state

TOKEN = 1


def _moved(messages: tuple[StoredMessage, ...], counted: bool) -> PutSession:
    """The session moved from version 1 (two messages) on by ``messages``: only its counters
    (``counted``: the new state's ``updated_at`` is its one message's time, as the agent
    writes it) or not."""
    state = make_state(version=2, messages=2 + len(messages))
    if counted:
        state = replace(state, updated_at=messages[-1].created_at)
    return PutSession(state, expect_version=1, counters_only=counted)


def _a(*calls: str, counted: bool = False) -> list[Op]:
    """Checkpoint A: the model's message, the session moved on, one intent per call."""
    message = (make_message(2, "assistant", [{"type": "text", "text": "a"}]),)
    return [
        HoldLease("s", TOKEN, None),
        AppendMessages(message),
        _moved(message, counted),
        *(InsertEffect(make_record("s", c)) for c in calls),
    ]


def _b(*results: str, messages: int = 1, guard: bool = True, counted: bool = False) -> list[Op]:
    """Checkpoint B: the outcomes (guards, as the engine writes them), the results'
    message(s), the session moved on."""
    done = [
        UpdateEffect(
            make_record("s", c, status=Status.SUCCEEDED, result="ok"),
            expect_status=Status.STARTED,
            expect_attempt=1,
            guard=guard,
        )
        for c in results
    ]
    appended = tuple(make_message(2 + i) for i in range(messages))
    return [HoldLease("s", TOKEN, None), *done, AppendMessages(appended), _moved(appended, counted)]


SHAPES: dict[str, Callable[[], list[Op]]] = {
    "A, one call": lambda: _a("toolu_1"),
    "A, two calls": lambda: _a("toolu_1", "toolu_2"),
    "A, no call": _a,
    "B, one result": lambda: _b("toolu_0"),
    "B, three messages": lambda: _b("toolu_0", messages=3),
    "B, an outcome that is not a guard": lambda: _b("toolu_0", guard=False),
    "A that moves only counters, one call": lambda: _a("toolu_1", counted=True),
    "A that moves only counters, no call": lambda: _a(counted=True),
    "B that moves only counters": lambda: _b("toolu_0", counted=True),
    "B that moves only counters, its outcome no guard": lambda: _b(
        "toolu_0", guard=False, counted=True
    ),
}


def test_only_a_checkpoint_that_moves_only_counters_and_counts_its_one_message_rides_it() -> None:
    """The session's counters ride the message's insert — no UPDATE of the session's row —
    only when the ``PutSession`` says so and counts exactly the one message appended at its
    time; any other says how the session's row is written."""
    for name, ops in SHAPES.items():
        counted = "only counters" in name
        planned = [s.sql for s in _planned(ops())]
        inserts = [sql for sql in planned if sql.startswith("INSERT INTO messages")]
        assert ("version, turns" in inserts[0]) == counted
        assert any(sql.startswith("UPDATE sessions") for sql in planned) != counted
    b = _b("toolu_0", messages=2, counted=True)  # two messages: only the last would carry them
    assert any("UPDATE sessions" in s.sql for s in _planned(b))
    put = _a(counted=True)[2]
    assert isinstance(put, PutSession)
    late = replace(put, state=replace(put.state, updated_at=put.state.updated_at + 1))
    assert any("UPDATE sessions" in s.sql for s in _planned([*_a()[:2], late]))


def _planned(ops: Sequence[Op]) -> list[Step]:
    """What the plan yields for ``ops`` when every write changes its row."""
    seen: list[Step] = []

    def execute(step: Step) -> Outcome:
        seen.append(step)
        return Outcome(len(step.params) if step.many else 1, [])

    flags = plans.drive(writes.apply("s", ops, ride=True), execute)
    assert flags == [True] * len(ops)
    return seen


def _shape(step: Step) -> tuple[Any, ...]:
    return (step.sql, tuple(step.params), step.many, step.guard, step.duplicate is None)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_checkpoint_s_straight_statements_are_the_ones_its_plan_yields(shape: str) -> None:
    ops = SHAPES[shape]()
    built = writes.straight("s", ops)
    assert built is not None
    assert [_shape(s) for s in built] == [_shape(s) for s in _planned(ops)]


def _not_common() -> dict[str, list[Op]]:
    a = _a("toolu_1")
    hold, append, put, intent = a
    guarded = UpdateEffect(
        make_record("s", "toolu_0", status=Status.SUCCEEDED),
        expect_status=Status.STARTED,
        expect_attempt=1,
        guard=True,
    )
    gap = AppendMessages((make_message(2), make_message(4)))
    return {
        "a fence that renews": [HoldLease("s", TOKEN, 99.0), append, put, intent],
        "no fence": [append, put, intent],
        "no session moved on": [hold, append, intent],
        "a session created": [hold, append, PutSession(make_state(), None), intent],
        "a guarded update after the session's": [hold, append, put, guarded],
        "seqs with a gap": [hold, gap, put],
        "two appends": [hold, append, append, put],
        "an approval": [hold, append, put, PutApproval(make_approval(), None)],
        "too short": [hold, put],
    }


@pytest.mark.parametrize("case", list(_not_common()))
def test_a_batch_that_is_not_a_common_checkpoint_is_not_built_straight(case: str) -> None:
    assert writes.straight("s", _not_common()[case]) is None


# -- the two paths on real stores ---------------------------------------------------------------


def _open(path: Path) -> tl.Store:
    """A store holding session ``s`` at version 1 with two messages, leased with ``TOKEN``, and
    call ``toolu_0`` started."""
    store = tl.open_store(f"sqlite:///{path}")
    lease = Lease(session_id="s", owner="me", token=TOKEN, expires_at=4_000_000_000.0)
    store.backend.apply("s", [TakeLease(lease, expect_token=0)])
    store.backend.apply(
        "s",
        [
            PutSession(make_state(version=1, messages=2), None),
            AppendMessages((make_message(0), make_message(1, "assistant"))),
            InsertEffect(make_record("s", "toolu_0", holder=None, deadline=None)),
        ],
    )
    return store


def _rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    conn = sqlite3.connect(path)
    try:
        tables = [t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {t: sorted(map(tuple, conn.execute(f'SELECT * FROM "{t}"'))) for t in tables}
    finally:
        conn.close()


def _run(
    path: Path,
    straight: bool,
    ops: Sequence[Op],
    before: Callable[[sqlite3.Connection], None],
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[Any, list[str], dict[str, list[tuple[Any, ...]]]]:
    """Commit ``ops`` after ``before`` changed the store: the flags (or the error), every
    statement the write connection ran, and the rows."""
    with _open(path) as store:
        conn = store.backend._conn  # type: ignore[attr-defined]
        before(conn)
        ran: list[str] = []
        conn.set_trace_callback(lambda statement: ran.append(_unchecked(statement)))
        monkeypatch.setattr(switches, "STRAIGHT", straight)
        try:
            answer: Any = store.backend.apply("s", ops)
        except Exception as exc:  # compared whole: type and message
            answer = (type(exc).__name__, str(exc).replace(str(path), "<path>"))
        finally:
            conn.set_trace_callback(None)
    return answer, ran, _rows(path)


_CHECK = re.compile(r" AND \(SELECT version FROM schema_version\) = \d+")
_CHECKED_INSERT = re.compile(
    r" SELECT (.*) WHERE \(SELECT version FROM schema_version\) = \d+ ON CONFLICT"
)


def _unchecked(statement: str) -> str:
    """A statement as the plan writes it: without the schema check a straight commit's first
    statement carries (``sqlite.CHECKED``)."""
    return _CHECKED_INSERT.sub(r" VALUES (\1) ON CONFLICT", _CHECK.sub("", statement))


def _nothing(conn: sqlite3.Connection) -> None:
    pass


def _sql(statement: str) -> Callable[[sqlite3.Connection], None]:
    return lambda conn: conn.executescript(statement)


# The session's row lags behind its last message, which carries its counters: at version 1
# (the version the checkpoints expect), or at version 5.
_LAGGING_AT_1 = _sql(
    "UPDATE sessions SET version = 0, messages = 1; UPDATE messages SET version = 1, turns = 0, "
    "input_tokens = 10, output_tokens = 1 WHERE seq = 1"
)
_LAGGING_AT_5 = _sql(
    "UPDATE sessions SET version = 1, messages = 1; UPDATE messages SET version = 5, turns = 4, "
    "input_tokens = 50, output_tokens = 5 WHERE seq = 1"
)

_SEQ_2_TAKEN = _sql(
    "INSERT INTO messages (session_id, seq, role, content, created_at) "
    "VALUES ('s', 2, 'user', '\"x\"', 1.0)"
)

# Each case's batch is built both ways: as written before a checkpoint could move only the
# session's counters, and as the agent now writes a turn that goes on (``counted``).
CASES: dict[str, tuple[Callable[[bool], list[Op]], Callable[[sqlite3.Connection], None]]] = {
    "A, common": (lambda c: _a("toolu_1", counted=c), _nothing),
    "B, common": (lambda c: _b("toolu_0", counted=c), _nothing),
    "B with three messages, common": (lambda c: _b("toolu_0", messages=3, counted=c), _nothing),
    "A, the row lagging at the version expected": (
        lambda c: _a("toolu_1", counted=c),
        _LAGGING_AT_1,
    ),
    "A, the version moved in the message the row lags behind": (
        lambda c: _a("toolu_1", counted=c),
        _LAGGING_AT_5,
    ),
    "A, the version moved": (
        lambda c: _a("toolu_1", counted=c),
        _sql("UPDATE sessions SET version = 5"),
    ),
    "A, the lease taken over": (
        lambda c: _a("toolu_1", counted=c),
        _sql("UPDATE leases SET token = 2, owner = 'them'"),
    ),
    "A, the lease given back": (
        lambda c: _a("toolu_1", counted=c),
        _sql("UPDATE leases SET expires_at = 0"),
    ),
    "B, the version moved and the lease taken over": (
        lambda c: _b("toolu_0", counted=c),
        _sql("UPDATE sessions SET version = 5; UPDATE leases SET token = 2"),
    ),
    "A, the seq taken": (lambda c: _a("toolu_1", counted=c), _SEQ_2_TAKEN),
    "A, the call's record already there": (lambda c: _a("toolu_0", counted=c), _nothing),
    "A, the second call's record already there": (
        lambda c: _a("toolu_1", "toolu_0", counted=c),
        _nothing,
    ),
    "B, the record moved on": (
        lambda c: _b("toolu_0", counted=c),
        _sql("UPDATE effects SET attempt = 2"),
    ),
    "B, the record moved on, its outcome no guard": (
        lambda c: _b("toolu_0", guard=False, counted=c),
        _sql("UPDATE effects SET attempt = 2"),
    ),
    "B, the second message's seq refused": (
        lambda c: _b("toolu_0", messages=3, counted=c),
        _sql(
            "CREATE TRIGGER refuse AFTER INSERT ON messages WHEN NEW.seq = 3 "
            "BEGIN SELECT RAISE(ABORT, 'refused'); END"
        ),
    ),
    "A, the intent's statement fails": (
        lambda c: _a("toolu_1", counted=c),
        _sql(
            "CREATE TRIGGER refuse BEFORE INSERT ON effects "
            "BEGIN SELECT RAISE(FAIL, 'no room'); END"
        ),
    ),
    "A, the row's status another": (
        lambda c: _a("toolu_1", counted=c),
        _sql("UPDATE sessions SET status = 'needs_attention', reason = 'x'"),
    ),
    "B, the row counting more messages": (
        lambda c: _b("toolu_0", counted=c),
        _sql("UPDATE sessions SET messages = 7"),
    ),
    "B, the session gone": (lambda c: _b("toolu_0", counted=c), _sql("DELETE FROM sessions")),
}


@pytest.mark.parametrize("counted", [False, True], ids=["row written", "only counters"])
@pytest.mark.parametrize("case", list(CASES))
def test_each_outcome_of_a_checkpoint_is_the_same_straight_and_on_its_plan(
    case: str, counted: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build, before = CASES[case]
    ops = build(counted)
    straight = _run(tmp_path / "straight.db", True, ops, before, monkeypatch)
    general = _run(tmp_path / "general.db", False, ops, before, monkeypatch)
    assert straight[0] == general[0]
    assert straight[1] == general[1], "the same statements, in the same order"
    assert straight[2] == general[2]
    # The message carries the session's counters only when the batch moves only them and
    # appends one message (``writes._counted``), and a batch that lands with it has tried it.
    rides = writes._counted(ops) is not None
    assert rides == (counted and "three messages" not in case and "second message" not in case)
    tried = any("version, turns" in sql for sql in straight[1])
    assert tried <= rides
    if not isinstance(straight[0], tuple):
        assert tried == rides
    untouched = _run(tmp_path / "untouched.db", True, [], before, monkeypatch)[2]
    if isinstance(straight[0], tuple):  # refused: nothing of the batch landed
        assert straight[2] == untouched
    else:
        assert straight[2] != untouched
        expected = [True] * len(ops)
        if "already there" in case:
            expected[-1] = False  # that call's intent, and only it, was not written
        if "moved on" in case:
            expected[1] = False  # the outcome did not match the record
        assert straight[0] == expected


def test_a_plan_told_of_a_statement_it_does_not_yield_is_a_bug_said_loudly() -> None:
    ops = _a("toolu_1")
    wrong = Step("DELETE FROM effects", ())

    def execute(step: Step) -> Outcome:
        raise AssertionError("nothing is run")

    plan = writes.apply("s", ops, ride=True)
    with pytest.raises(AssertionError, match="disagree, which is a bug in toolledger"):
        plans.drive(plan, execute, [(wrong, Outcome(1, []))])
