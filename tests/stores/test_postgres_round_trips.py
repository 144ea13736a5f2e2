"""Round trips per store operation on PostgreSQL, counted on the wire: a read is one, a commit
is one — a one-statement write in autocommit, a batch of several in one transaction sent ahead
of its answers — and nothing else (the search path, the clock, the deadline) adds one.

Counted from libpq's own trace of what a connection sends (``F``) and reads (``B``), in order:
a round trip is a run of messages sent, so a message sent after one was read — the client
waited for an answer — starts the next. Each store here has one pooled connection, traced.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest

psycopg = pytest.importorskip("psycopg")

import toolledger as tl  # noqa: E402
from toolledger.ops import (  # noqa: E402
    AbandonMessages,
    AppendMessages,
    DropLease,
    HoldLease,
    InsertEffect,
    PutApproval,
    PutSession,
    TakeLease,
    UpdateEffect,
)
from toolledger.records import ApprovalStatus, Lease, Status  # noqa: E402
from toolledger.stores.postgres import AsyncPostgresBackend, PostgresBackend  # noqa: E402
from toolledger.testing.conformance import (  # noqa: E402
    make_approval,
    make_message,
    make_record,
    make_state,
)

from ..conftest import with_params  # noqa: E402

pytestmark = pytest.mark.postgres

LEASE = Lease(session_id="s", owner="w1", token=1, expires_at=2e9, holder=None)


def round_trips(trace: Path) -> int:
    """Runs of sent messages in a libpq trace."""
    runs, sending = 0, False
    for line in trace.read_text().splitlines():
        sent = line.startswith("F")
        runs += sent and not sending
        sending = sent
    return runs


class Wire:
    """Traces the one connection of a store's pool, operation by operation."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.traces = 0

    @contextmanager
    def tracing(self, conn: Any) -> Iterator[Path]:
        self.traces += 1
        path = self.directory / f"trace-{self.traces}.txt"
        with path.open("wb") as out:
            conn.pgconn.trace(out.fileno())
            conn.pgconn.set_trace_flags(
                psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE
            )
            yield path
            conn.pgconn.untrace()  # flushes the trace

    def count(self, backend: PostgresBackend, operation: Callable[[], Any]) -> int:
        return self.run(backend, operation)[0]

    def run(self, backend: PostgresBackend, operation: Callable[[], Any]) -> tuple[int, Any]:
        """``operation``'s round trips, and what it returned."""
        with backend._pool.connection() as conn:
            traced = conn
        with self.tracing(traced) as path:
            result = operation()
            with backend._pool.connection() as conn:
                assert conn is traced, "the pool's connection was replaced"
        return round_trips(path), result


@pytest.fixture
def store(postgres_url: str, postgres_schema: str) -> Iterator[tl.Store]:
    url = with_params(postgres_url, schema=postgres_schema, pool_min="1", pool_max="1")
    with tl.open_store(url) as opened:
        yield opened


@pytest.fixture
def wire(tmp_path: Path) -> Wire:
    return Wire(tmp_path)


def pg(store: tl.Store) -> PostgresBackend:
    assert isinstance(store.backend, PostgresBackend)
    return store.backend


def test_every_read_is_one_round_trip(store: tl.Store, wire: Wire) -> None:
    backend = pg(store)
    record = make_record("s", "toolu_1")
    state = make_state("s", messages=1)
    backend.apply("s", [PutSession(state, None), AppendMessages((make_message(0),))])
    backend.apply("s", [InsertEffect(record), PutApproval(make_approval("s"), None)])
    backend.apply("s", [TakeLease(LEASE, expect_token=0)])
    reads: dict[str, tuple[Callable[[], Any], Any]] = {
        "effects": (lambda: backend.read_effects("s"), {"toolu_1": record}),
        "some effects": (lambda: backend.read_effects("s", ["toolu_1", "x"]), {"toolu_1": record}),
        "session": (lambda: backend.read_session("s"), state),
        "transcript": (lambda: backend.read_messages("s"), [make_message(0)]),
        "approvals": (lambda: backend.read_approvals("s"), [make_approval("s")]),
        "lease": (lambda: backend.read_lease("s"), LEASE),
        "sessions": (backend.list_sessions, [state]),
        "session ids": (lambda: sorted(backend.session_ids()), ["s"]),
        "in doubt": (backend.in_doubt, [record]),
    }
    for name, (read, expected) in reads.items():
        assert wire.run(backend, read) == (1, expected), name


def test_a_commit_of_one_statement_is_one_round_trip(store: tl.Store, wire: Wire) -> None:
    backend = pg(store)
    record = make_record("s", "toolu_1")
    done = replace(record, status=Status.SUCCEEDED, result='"ok"', updated_at=2e9)
    approval = make_approval("s")
    decided = replace(approval, status=ApprovalStatus.APPROVED, decided_by="me", decided_at=2e9)
    state = make_state("s")
    writes: dict[str, list[Any]] = {
        "intent": [InsertEffect(record)],
        "outcome": [UpdateEffect(done, Status.STARTED, 1, guard=True)],
        "new session": [PutSession(state, None)],
        "next session": [PutSession(replace(state, version=2), expect_version=1)],
        "approval": [PutApproval(approval, None)],
        "decision": [PutApproval(decided, ApprovalStatus.PENDING)],
        "take": [TakeLease(LEASE, expect_token=0)],
        "renew": [HoldLease("s", 1, 2e9 + 1)],
        "give back": [DropLease("s", 1)],
    }
    for name, ops in writes.items():
        assert wire.run(backend, partial(backend.apply, "s", ops)) == (1, [True]), name
    assert backend.read_effects("s") == {"toolu_1": done}
    assert backend.read_session("s") == replace(state, version=2)
    assert backend.read_approvals("s") == [decided]
    lease = backend.read_lease("s")
    assert lease is not None and lease.expires_at == 0


def test_a_batch_commits_in_one_round_trip(store: tl.Store, wire: Wire) -> None:
    """Several statements — a checkpoint with its transcript and its fence, an outcome with
    the next intent, an append alone (it checks its seq then writes) — one transaction."""
    backend = pg(store)
    backend.apply("s", [TakeLease(LEASE, expect_token=0)])
    first, second = make_record("s", "toolu_1"), make_record("s", "toolu_2")
    done = replace(first, status=Status.SUCCEEDED, result='"ok"', updated_at=2e9)
    state = make_state("s", messages=2)
    batches: dict[str, tuple[list[Any], list[bool]]] = {
        "checkpoint": (
            [
                PutSession(state, None),
                AppendMessages((make_message(0), make_message(1, "assistant"))),
                HoldLease("s", 1, 2e9 + 1),
            ],
            [True, True, True],
        ),
        "intent": ([InsertEffect(first), HoldLease("s", 1, 2e9 + 2)], [True, True]),
        "outcome, next intent": (
            [UpdateEffect(done, Status.STARTED, 1, guard=True), InsertEffect(second)],
            [True, True],
        ),
        "an intent already there": ([InsertEffect(second), DropLease("s", 7)], [False, False]),
        "append": ([AppendMessages((make_message(2), make_message(3)))], [True]),
    }
    for name, (ops, applied) in batches.items():
        assert wire.run(backend, partial(backend.apply, "s", ops)) == (1, applied), name
    assert backend.read_effects("s") == {"toolu_1": done, "toolu_2": second}
    assert backend.read_session("s") == state
    assert [m.seq for m in backend.read_messages("s")] == [0, 1, 2, 3]
    lease = backend.read_lease("s")
    assert lease is not None and lease.expires_at == 2e9 + 2


def test_a_refused_guard_rolls_its_batch_back_in_the_same_round_trip(
    store: tl.Store, wire: Wire
) -> None:
    """The server refuses the guard it was sent ahead of its answer: nothing of the batch
    lands, and no answer was waited for before the COMMIT was sent."""
    backend = pg(store)
    backend.apply("s", [PutSession(make_state("s"), None), TakeLease(LEASE, expect_token=0)])
    intent = make_record("s", "toolu_1")
    stale = [InsertEffect(intent), PutSession(make_state("s", version=3), expect_version=2)]
    lost = [InsertEffect(intent), HoldLease("s", 9, 2e9)]

    def refused(ops: list[Any], error: type[Exception]) -> None:
        with pytest.raises(error):
            backend.apply("s", ops)

    assert wire.count(backend, lambda: refused(stale, tl.SessionConflictError)) == 1
    assert wire.count(backend, lambda: refused(lost, tl.LeaseLostError)) == 1
    assert backend.read_effects("s") == {}, "the intent was rolled back with its batch"
    assert backend.read_session("s") == make_state("s")
    # An append whose seq is not the next one also says which is: that is read afterwards.
    gap = [InsertEffect(intent), AppendMessages((make_message(5),))]
    with pytest.raises(tl.SessionConflictError, match="the next message is 0"):
        backend.apply("s", gap)
    assert backend.read_effects("s") == {} and backend.read_messages("s") == []


def test_a_plan_that_must_read_first_runs_statement_by_statement(store: tl.Store) -> None:
    """Messages that do not follow one another: the plan reads the transcript's next seq before
    it can say so, which no guess answers. It runs one statement at a time in a transaction,
    which rolls back: the intent in the same batch does not land."""
    backend = pg(store)
    intent = make_record("s", "toolu_1")
    apart = [InsertEffect(intent), AppendMessages((make_message(0), make_message(2)))]
    with pytest.raises(tl.SessionConflictError, match="the next message is 0"):
        backend.apply("s", apart)
    assert backend.read_effects("s") == {} and backend.read_messages("s") == []
    together = [InsertEffect(intent), AppendMessages((make_message(0), make_message(1)))]
    assert backend.apply("s", together) == [True, True]


def test_a_batch_sent_on_a_connection_killed_while_idle_is_sent_again(
    store: tl.Store, postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The server answers the batch with the error it ended the connection with, before
    anything of it ran: nothing was committed, so it is sent again on a fresh connection."""
    backend = pg(store)
    backend.apply("s", [InsertEffect(make_record("s", "toolu_0"))])
    with backend._pool.connection() as conn:
        pid = conn.info.backend_pid
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        while admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone() != (0,):
            pass
    batch = [InsertEffect(make_record("s", "toolu_1")), PutSession(make_state("s"), None)]
    with caplog.at_level(logging.WARNING, logger="toolledger"):
        assert backend.apply("s", batch) == [True, True]
    assert "retrying on a fresh one" in caplog.text
    assert sorted(backend.read_effects("s")) == ["toolu_0", "toolu_1"]
    with backend._pool.connection() as conn:
        assert conn.info.backend_pid != pid


def test_a_read_of_some_ids_is_planned_for_the_ids_it_reads(store: tl.Store) -> None:
    """Statements are prepared once per connection and their plans kept — but not one with an
    array parameter: a kept plan cannot know how many ids the array holds, and one made while
    the table was small filters every record of the session instead of looking each id up. One
    id is read by the whole key: that plan can be kept."""
    backend = pg(store)
    records = [make_record("s", f"toolu_{i}") for i in range(12)]
    backend.apply("s", [InsertEffect(r) for r in records])
    for first, second in zip(records[::2], records[1::2], strict=True):
        both = {first.tool_use_id: first, second.tool_use_id: second}
        assert backend.read_effects("s", list(both)) == both
        assert backend.read_effects("s", [first.tool_use_id]) == {first.tool_use_id: first}
    with backend._pool.connection() as conn:
        kept = [row[0] for row in conn.execute("SELECT statement FROM pg_prepared_statements")]
    assert [s for s in kept if s.startswith("SELECT") and "tool_use_id = $2" in s], kept
    assert not [s for s in kept if "ANY(" in s], "a read of some ids keeps its plan"


def test_a_fresh_connection_prepares_in_the_same_round_trip(
    postgres_url: str, postgres_schema: str, wire: Wire
) -> None:
    """The first use of a statement on a connection parses it there: in the same write as its
    first execution. The store's clock, the search path and the deadlines cost none either."""
    url = with_params(postgres_url, schema=postgres_schema, pool_min="1", pool_max="1")
    with tl.open_store(url) as store:
        backend = pg(store)
        assert wire.count(backend, lambda: backend.apply("s", [InsertEffect(make_record())])) == 1
        assert wire.count(backend, lambda: backend.read_effects("s")) == 1
        assert wire.count(backend, store.now) == 0, "the clock was read when the pool connected"


def test_the_async_backend_takes_as_many(store: tl.Store, wire: Wire) -> None:
    twin = store.async_backend
    assert isinstance(twin, AsyncPostgresBackend)
    record = make_record("s", "toolu_1")
    state = make_state("s", messages=1)
    checkpoint = [PutSession(state, None), AppendMessages((make_message(0),)), InsertEffect(record)]

    async def counted() -> list[int]:
        pool = (await twin._pool(asyncio.get_running_loop().time() + 10)).pool
        async with pool.connection() as conn:
            traced = conn
        counts = []
        for operation in (
            lambda: twin.apply("s", [InsertEffect(make_record("s", "toolu_0"))]),
            lambda: twin.apply("s", checkpoint),
            lambda: twin.read_effects("s", ["toolu_1"]),
            lambda: twin.read_session("s"),
        ):
            with wire.tracing(traced) as path:
                await operation()
                async with pool.connection() as conn:
                    assert conn is traced, "the pool's connection was replaced"
            counts.append(round_trips(path))
        return counts

    assert asyncio.run(counted()) == [1, 1, 1, 1]
    assert pg(store).read_effects("s", ["toolu_1"]) == {"toolu_1": record}
    assert pg(store).read_session("s") == state


def test_a_rewind_commits_in_one_round_trip(store: tl.Store, wire: Wire) -> None:
    """A rewind — its guard, the tail moved, the transcript going on, the session's
    compare-and-set, under a fence — is one transaction sent ahead; its branches are read in
    one round trip. A refused rewind lands nothing."""
    backend = pg(store)
    messages = tuple(make_message(i) for i in range(4))
    backend.apply("s", [PutSession(make_state("s", messages=4), None), AppendMessages(messages)])
    backend.apply("s", [TakeLease(LEASE, expect_token=0)])
    again = make_message(2, "user", "again")
    rewind = [
        HoldLease("s", 1, 2e9 + 1),
        AbandonMessages(from_seq=2, branch=1),
        AppendMessages((again,)),
        PutSession(make_state("s", version=2, messages=3), expect_version=1),
    ]
    assert wire.run(backend, partial(backend.apply, "s", rewind)) == (1, [True] * 4)
    assert wire.run(backend, partial(backend.read_abandoned, "s")) == (1, {1: list(messages[2:])})
    assert backend.read_messages("s") == [*messages[:2], again]
    taken = [AbandonMessages(from_seq=0, branch=1), InsertEffect(make_record("s"))]
    with pytest.raises(tl.SessionConflictError, match="from message 0 of 3 as branch 1"):
        backend.apply("s", taken)
    assert backend.read_messages("s") == [*messages[:2], again]
    assert backend.read_abandoned("s") == {1: list(messages[2:])}
    assert backend.read_effects("s") == {}


def test_an_agent_turn_is_two_round_trips_beyond_the_model_call(
    store: tl.Store, wire: Wire
) -> None:
    """A turn whose one call writes its intent: checkpoint A with the intent, then the outcome
    with checkpoint B — two round trips, nothing read. Counted over a 10-turn and a 20-turn run
    in new sessions (what a run opens and closes with cancels out); on the general path
    (``TOOLLEDGER_GENERAL_PATH=1``) A is written alone, a third."""
    from toolledger import _switches as switches
    from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

    sent: list[str] = []

    @tl.tool(effect="non_idempotent")
    def send(to: str) -> str:
        sent.append(to)
        return "sent"

    def run(turns: int) -> int:
        script = [Reply(tool_uses=[ToolUse("send", {"to": str(n)})]) for n in range(turns)]
        with ScriptedModel([*script, Reply(text="done")]) as model:
            agent = tl.Agent(
                client=model.client(), model="m", tools=[send], store=store, max_turns=turns + 1
            )
            count, done = wire.run(pg(store), lambda: agent.run(session=f"t{turns}", prompt="go"))
        assert done.status is tl.RunStatus.COMPLETED and done.turns == turns + 1
        return count

    ten, twenty = run(10), run(20)
    assert len(sent) == 30
    assert (twenty - ten) / 10 == (2 if switches.STRAIGHT else 3)
