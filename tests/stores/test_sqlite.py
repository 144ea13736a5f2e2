"""The sqlite:/// store: its files, its pragmas, its migrations, and a damaged database."""

from __future__ import annotations

import itertools
import sqlite3
import stat
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
from toolledger import _switches as switches
from toolledger.ops import (
    AbandonMessages,
    AppendMessages,
    HoldLease,
    InsertEffect,
    PutSession,
    TakeLease,
)
from toolledger.records import Lease
from toolledger.stores._sql.schema import SQLITE_MIGRATIONS as MIGRATIONS
from toolledger.stores._sql.schema import sqlite_versioned
from toolledger.testing._contract_sessions import counted_checkpoint
from toolledger.testing.conformance import make_message, make_record, make_state

from ..conftest import tool_use


@tl.tool
def create_ticket(title: str) -> str:
    return f"ticket {title}"


def test_database_is_owner_only_and_in_wal_mode(tmp_path: Path) -> None:
    db = tmp_path / "new-dir" / "agent.db"
    with tl.open_store(f"sqlite:///{db}") as store:
        tl.run_tool_uses(
            [tool_use("t1", "create_ticket", title="x")], [create_ticket], ledger=store.ledger("s")
        )
        assert stat.S_IMODE(db.stat().st_mode) == 0o600
        assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700
        wal = db.with_name("agent.db-wal")
        assert wal.exists() and stat.S_IMODE(wal.stat().st_mode) == 0o600
    raw = sqlite3.connect(db)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert raw.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    rows = raw.execute(
        "SELECT session_id, tool_use_id, tool, status, result FROM effects"
    ).fetchall()
    assert rows == [("s", "t1", "create_ticket", "succeeded", '"ticket x"')]


def test_relative_and_absolute_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with tl.open_store("sqlite:///rel.db"):
        pass
    assert (tmp_path / "rel.db").exists()
    with tl.open_store(f"sqlite:////{str(tmp_path / 'abs.db').lstrip('/')}"):
        pass
    assert (tmp_path / "abs.db").exists()


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "future.db"
    raw = sqlite3.connect(db)
    raw.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 5}")
    raw.close()
    with pytest.raises(tl.SchemaVersionError, match="written by a newer toolledger — upgrade"):
        tl.open_store(f"sqlite:///{db}")


def _upgrade(db: Path, version: int) -> None:
    """What a newer release's migration runner leaves: both records of the version."""
    with sqlite3.connect(db) as conn:
        for statement in sqlite_versioned(version):
            conn.execute(statement)


def test_a_new_store_records_its_schema_version_twice(tmp_path: Path) -> None:
    with tl.open_store(f"sqlite:///{tmp_path / 'l.db'}"):
        pass
    raw = sqlite3.connect(tmp_path / "l.db")
    assert raw.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    assert raw.execute("SELECT one, version FROM schema_version").fetchall() == [
        (1, len(MIGRATIONS))
    ]


def test_a_straight_write_checks_the_schema_itself_and_a_migration_cannot_slip_in_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No separate read comes before a straight commit's write: the write checks the version
    row in its own statement. A newer release's migration that lands after the store was last
    checked refuses the write — the intent is not written and the tool never runs — and the
    error says why; a write in the common case costs no check of its own."""
    db = tmp_path / "l.db"
    runs: list[str] = []
    probes: list[int] = []

    @tl.tool(effect="non_idempotent")
    def send(to: str) -> str:
        runs.append(to)
        return "sent"

    with tl.open_store(f"sqlite:///{db}") as store:
        backend: Any = store.backend
        checked = backend._check_schema
        monkeypatch.setattr(backend, "_check_schema", lambda: probes.append(1) or checked())
        ledger = store.ledger("s")
        tl.run_tool_uses([tool_use("toolu_1", "send", to="a")], [send], ledger=ledger)
        assert runs == ["a"]
        assert len(probes) == (0 if switches.STRAIGHT else 2)  # the intent, the outcome
        probes.clear()
        _upgrade(db, len(MIGRATIONS) + 1)
        # Neither the intent nor the answer "not executed" can be written to a newer schema:
        # the worker must be upgraded, and nothing is answered.
        with pytest.raises(tl.SchemaVersionError, match="written by a newer toolledger"):
            tl.run_tool_uses([tool_use("toolu_2", "send", to="b")], [send], ledger=ledger)
        # Straight, the one read of the version comes after each refused write (the intent,
        # then the answer), to say why.
        assert len(probes) == 2
    assert runs == ["a"]
    rows = sqlite3.connect(db).execute("SELECT tool_use_id FROM effects").fetchall()
    assert rows == [("toolu_1",)]


def test_a_file_that_is_not_a_database_is_corrupt_not_empty(tmp_path: Path) -> None:
    db = tmp_path / "garbage.db"
    db.write_bytes(b"this is not sqlite" * 300)
    with pytest.raises(tl.CorruptLedgerError, match="not read as empty"):
        tl.open_store(f"sqlite:///{db}")


def _foreign(db: Path, *statements: str) -> bytes:
    """Another application's database, made of ``statements``; its bytes."""
    with sqlite3.connect(db) as raw:
        for statement in statements:
            raw.execute(statement)
    raw.close()
    return db.read_bytes()


@pytest.mark.parametrize(
    "statements",
    [
        ("CREATE TABLE notes (body TEXT)",),
        # A user_version of its own is not one of our schema versions: neither migrated on
        # from 3 nor called "written by a newer toolledger".
        ("CREATE TABLE notes (body TEXT)", "PRAGMA user_version = 3"),
        ("CREATE TABLE notes (body TEXT)", f"PRAGMA user_version = {len(MIGRATIONS) + 5}"),
        # A table of its own that happens to share a name with one of ours.
        ("CREATE TABLE effects (what TEXT)",),
    ],
    ids=["tables", "own-user-version", "high-user-version", "own-effects-table"],
)
def test_another_application_s_database_is_refused_and_left_as_it_was(
    tmp_path: Path, statements: tuple[str, ...]
) -> None:
    """A file holding tables and no toolledger schema is somebody else's database: opening it,
    to write or only to look, is an error that names it — never a migration that adds our
    tables to it, nor an empty ledger. Not a byte of it changes, and no WAL appears beside
    it. An empty file, or a database with no tables, still becomes a store."""
    db = tmp_path / "app.db"
    before = _foreign(db, *statements)
    for options in ({}, {"create": False}, {"read_only": True}):
        with pytest.raises(tl.StoreUnavailableError, match="is not a toolledger store") as err:
            tl.open_store(f"sqlite:///{db}", **options)
        assert str(db) in str(err.value) and "Nothing was written to it" in str(err.value)
        assert "--store" in str(err.value)
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]
    empty = tmp_path / "empty.db"
    empty.touch()
    bare = tmp_path / "bare.db"
    _foreign(bare, "PRAGMA journal_mode = WAL")
    for path in (empty, bare):
        with tl.open_store(f"sqlite:///{path}") as store:
            assert store.sessions() == []
        version = sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0]
        assert version == len(MIGRATIONS)


def test_reopening_runs_no_migration_twice(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    for _ in range(3):
        with tl.open_store(url) as store:
            assert store.sessions() == []


def test_unknown_scheme_and_bad_urls(tmp_path: Path) -> None:
    with pytest.raises(tl.ConfigurationError, match="unknown store URL"):
        tl.open_store("redis://localhost")
    with pytest.raises(tl.ConfigurationError, match="sqlite:///relative/path"):
        tl.open_store("sqlite:///")


def test_a_database_with_two_names_is_refused(tmp_path: Path) -> None:
    """A hard link to the database file: a process opening it by the other name does not see
    the WAL of the first, and would run a recorded call again. Refused at open, and at the next
    commit of a store already open when the link appears."""
    import os

    import toolledger as tl

    db = tmp_path / "ledger.db"
    with tl.open_store(f"sqlite:///{db}") as store:
        store.ledger("s")  # created
        os.link(db, tmp_path / "other-name.db")
        from toolledger.ops import InsertEffect
        from toolledger.testing.conformance import make_record

        with pytest.raises(tl.StoreUnavailableError, match="2 names"):
            store.backend.apply("s", [InsertEffect(make_record())])
    for name in ("ledger.db", "other-name.db"):
        with pytest.raises(tl.StoreUnavailableError, match="hard links"):
            tl.open_store(f"sqlite:///{tmp_path / name}")
    (tmp_path / "other-name.db").unlink()
    tl.open_store(f"sqlite:///{db}").close()


# -- what a call costs in statements (counted, not timed) ----------------------------------------


def _statements(store: tl.Store) -> list[str]:
    seen: list[str] = []
    store.backend._conn.set_trace_callback(seen.append)  # type: ignore[attr-defined]
    return seen


def test_a_lone_unsafe_call_writes_its_intent_first_without_reading(tmp_path: Path) -> None:
    """Insert-if-absent is the read: a fresh non-idempotent call costs its intent and its outcome,
    two statements, each a transaction of its own. The session's first such call in this store
    also reads, once, whether a fork made it (a branch claims its calls in its lineage's first
    session, ``toolledger.engine._claims``); an agent learns it from the state it reads anyway."""
    runs: list[str] = []

    @tl.tool(effect="non_idempotent")
    def send(to: str) -> str:
        runs.append(to)
        return "sent"

    with tl.open_store(f"sqlite:///{tmp_path / 'l.db'}") as store:
        ledger = store.ledger("s")
        seen = _statements(store)
        out = tl.run_tool_uses([tool_use("toolu_1", "send", to="a")], [send], ledger=ledger)
        assert [s.split()[0] for s in seen] == ["SELECT", "INSERT", "UPDATE"]
        assert "FROM sessions" in seen[0], seen
        assert out[0]["content"] == "sent" and runs == ["a"]

        # Recorded: the insert is refused, the record read, the answer replayed; nothing runs.
        seen.clear()
        again = tl.run_tool_uses([tool_use("toolu_1", "send", to="a")], [send], ledger=ledger)
        assert [s.split()[0] for s in seen] == ["INSERT", "SELECT"]
        assert again == out and runs == ["a"]
        record = ledger.get("toolu_1")
        assert record is not None and record.status is tl.Status.SUCCEEDED

        # Another input under the same id: refused before anything runs (rule 7).
        with pytest.raises(tl.LedgerMismatchError):
            tl.run_tool_uses([tool_use("toolu_1", "send", to="b")], [send], ledger=ledger)
        assert runs == ["a"] and ledger.get("toolu_1") == record

        # The next fresh call: its intent and its outcome, nothing read.
        seen.clear()
        tl.run_tool_uses([tool_use("toolu_2", "send", to="c")], [send], ledger=ledger)
        assert [s.split()[0] for s in seen] == ["INSERT", "UPDATE"]
        assert runs == ["a", "c"]


def test_calls_that_depend_on_their_record_read_it_first(tmp_path: Path) -> None:
    """A safe call writes only its outcome and an unknown tool writes nothing: either must read
    first (a recorded answer is replayed, not recomputed). So must several calls at once, which
    are all checked against their records before any runs (rule 7)."""

    @tl.tool(effect="read_only")
    def look(path: str) -> str:
        return path

    @tl.tool(effect="non_idempotent")
    def send(to: str) -> str:
        return "sent"

    with tl.open_store(f"sqlite:///{tmp_path / 'r.db'}") as store:
        ledger = store.ledger("s")
        seen = _statements(store)
        tl.run_tool_uses([tool_use("toolu_r", "look", path="/x")], [look], ledger=ledger)
        assert [s.split()[0] for s in seen] == ["SELECT", "INSERT"]
        seen.clear()
        tl.run_tool_uses([tool_use("toolu_u", "nope")], [look], ledger=ledger)
        assert [s.split()[0] for s in seen] == ["SELECT"]
        seen.clear()
        both = [tool_use("toolu_a", "send", to="a"), tool_use("toolu_b", "send", to="b")]
        tl.run_tool_uses(both, [send], ledger=ledger)
        # The records, then (once for the session: ``test_a_lone_unsafe_call_…``) its lineage.
        assert [s.split()[0] for s in seen][:4] == ["SELECT", "SELECT", "SELECT", "INSERT"]
        assert "FROM sessions" in seen[2], seen
        seen.clear()
        both = [tool_use("toolu_c", "send", to="c"), tool_use("toolu_d", "send", to="d")]
        tl.run_tool_uses(both, [send], ledger=ledger)
        assert [s.split()[0] for s in seen][:3] == ["SELECT", "SELECT", "INSERT"]


# -- the lease's fence, riding the writes of an agent turn ------------------------------------


def _kind(sql: str) -> str:
    """A statement as its verb and table; ``+fence`` when a write carries the lease check."""
    if sql in ("model", "tool", "approve"):
        return sql
    words = sql.split()
    verb = words[0]
    if verb in ("BEGIN", "COMMIT", "ROLLBACK"):
        return verb
    table = (
        words[1]
        if verb == "UPDATE"
        else words[words.index("INTO" if verb == "INSERT" else "FROM") + 1]
    )
    fence = "+fence" if verb != "SELECT" and "FROM leases" in sql else ""
    return f"{verb} {table}{fence}"


class _Model:
    """``messages.create``: one call of ``send`` per turn for ``turns`` turns, then the final
    answer. ``before(n)`` runs as request ``n`` arrives."""

    def __init__(self, seen: list[str], turns: int, before: Any = None) -> None:
        self.messages = self
        self.seen, self.turns, self.before, self.requests = seen, turns, before, 0

    def create(self, **kwargs: Any) -> dict[str, Any]:
        n, self.requests = self.requests, self.requests + 1
        self.seen.append("model")
        if self.before is not None:
            self.before(n)
        usage = {"input_tokens": 10, "output_tokens": 5}
        if n < self.turns:
            block = {
                "type": "tool_use",
                "id": f"toolu_{n}",
                "name": "send",
                "input": {"to": f"{n}"},
            }
            return {"content": [block], "stop_reason": "tool_use", "usage": usage}
        return {
            "content": [{"type": "text", "text": "done"}],
            "stop_reason": "end_turn",
            "usage": usage,
        }


def _take_over(store: tl.Store, session_id: str) -> None:
    """Another worker takes the session's lease over (as it may once a paused run's lease has
    expired): the token moves on."""
    current = store.lease(session_id)
    assert current is not None
    theirs = Lease(
        session_id=session_id, owner="elsewhere:1:b", token=current.token + 1, expires_at=2e9
    )
    take = TakeLease(theirs, expect_token=current.token, expect_expires_at=current.expires_at)
    assert store.apply(session_id, [take]) == [True]


def _rows(db: Path, table: str) -> int:
    with sqlite3.connect(db) as raw:
        return int(raw.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def test_an_agent_turn_carries_its_fence_in_the_writes_it_makes(tmp_path: Path) -> None:
    """Checkpoint A with the intent, then the outcome with checkpoint B: eight statements in two
    transactions. The session's row is not written: each checkpoint's message carries the
    session's counters, and its insert is the session's compare-and-set, with the fence as a
    condition (no UPDATE of the lease while it is young); A's transaction holds the intent's
    insert behind it. On the general path (``TOOLLEDGER_GENERAL_PATH=1``) the intent, one
    statement with the fence as its condition, is a transaction of its own after A. The last
    turn, which ends the run, writes the session's row."""
    runs: list[str] = []

    with tl.open_store(f"sqlite:///{tmp_path / 'a.db'}") as store:
        seen = _statements(store)

        @tl.tool(effect="non_idempotent")
        def send(to: str) -> str:
            runs.append(to)
            seen.append("tool")
            return "sent"

        agent = tl.Agent(
            client=_Model(seen, turns=2), model="m", tools=[send], store=store, lease_ttl=3600
        )
        run = agent.run(session="s", prompt="go")
    assert run.status is tl.RunStatus.COMPLETED and runs == ["0", "1"]
    kinds = [_kind(s) for s in seen]
    models = [n for n, k in enumerate(kinds) if k == "model"]
    for start, end in itertools.pairwise(models):
        a_and_intent = (
            ["INSERT effects", "COMMIT"]  # the intent, in A's transaction
            if switches.STRAIGHT
            else ["COMMIT", "INSERT effects+fence"]  # the intent, in autocommit
        )
        assert kinds[start + 1 : end] == [
            "BEGIN",  # A
            "INSERT messages+fence",
            *a_and_intent,
            "tool",
            "BEGIN",  # outcome + B
            "UPDATE effects",
            "INSERT messages+fence",
            "COMMIT",
        ]
    assert kinds[models[-1] + 1 :][:4] == [
        "BEGIN",  # the last turn's A: the run is over, the session's row written
        "INSERT messages",
        "UPDATE sessions+fence",
        "COMMIT",
    ]
    assert "UPDATE leases" not in kinds[models[0] :][:-1], "only the give-back touches the lease"


def test_a_turn_that_goes_on_keeps_the_session_s_counters_in_its_messages(
    tmp_path: Path,
) -> None:
    """On disk, mid-run: the session's row stays as the run's start wrote it, while each
    checkpoint's message holds the session's version, turns and tokens after it; the store
    reads the state the agent holds. The last turn ends the run and writes the row whole."""
    db = tmp_path / "n.db"
    seen_then: list[tuple[Any, ...]] = []
    with tl.open_store(f"sqlite:///{db}") as store:

        @tl.tool(effect="non_idempotent")
        def send(to: str) -> str:
            return "sent"

        def before(n: int) -> None:
            with sqlite3.connect(db) as raw:
                row = raw.execute(
                    "SELECT version, turns, input_tokens, messages FROM sessions"
                ).fetchone()
                counted = raw.execute(
                    "SELECT seq, version, turns, input_tokens, output_tokens FROM messages "
                    "WHERE version IS NOT NULL ORDER BY seq"
                ).fetchall()
            state = store.session("s")
            assert state is not None
            seen_then.append((row, counted, (state.version, state.turns, state.messages)))

        agent = tl.Agent(client=_Model([], turns=2, before=before), model="m", tools=[send],
                         store=store)  # fmt: skip
        run = agent.run(session="s", prompt="go")
        assert run.status is tl.RunStatus.COMPLETED
        final = store.session("s")
    start = (1, 0, 0, 1)  # the prompt: version 1, one message
    assert seen_then == [
        (start, [], (1, 0, 1)),
        (start, [(1, 2, 1, 10, 5), (2, 3, 1, 10, 5)], (3, 1, 3)),  # turn 0's A and B
        (start, [(1, 2, 1, 10, 5), (2, 3, 1, 10, 5), (3, 4, 2, 20, 10), (4, 5, 2, 20, 10)],
         (5, 2, 5)),
    ]  # fmt: skip
    with sqlite3.connect(db) as raw:
        row = raw.execute("SELECT status, version, turns, input_tokens, messages FROM sessions")
        assert row.fetchone() == ("completed", 6, 3, 30, 6)  # written whole at the run's end
    assert final is not None and (final.version, final.turns, final.messages) == (6, 3, 6)


def test_a_session_kept_by_an_older_release_reads_and_goes_on(tmp_path: Path) -> None:
    """A file of schema 8 (no counters in its messages) opens migrated; its sessions read as
    they were, and the next checkpoints keep their counters in their messages."""
    db = tmp_path / "old.db"
    raw = sqlite3.connect(db, isolation_level=None)
    for version, migration in enumerate(MIGRATIONS[:8], 1):
        raw.executescript(migration)
        for statement in sqlite_versioned(version):
            raw.execute(statement)
    state = make_state(version=1, messages=1)
    raw.execute(
        "INSERT INTO sessions (session_id, status, reason, version, turns, input_tokens, "
        "output_tokens, messages, created_at, updated_at, lineage) "
        "VALUES ('s', 'running', NULL, 1, 0, 10, 1, 1, ?, ?, NULL)",
        (state.created_at, state.updated_at),
    )
    raw.execute(
        "INSERT INTO messages VALUES ('s', 0, 'user', '\"message 0\"', ?)",
        (make_message(0).created_at,),
    )
    raw.close()
    with tl.open_store(f"sqlite:///{db}") as store:
        assert store.session("s") == state
        after, ops = counted_checkpoint(state, 1)
        assert store.apply("s", ops) == [True, True]
        assert store.session("s") == after
    with sqlite3.connect(db) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        assert raw.execute("SELECT version, messages FROM sessions").fetchone() == (1, 1)
        assert raw.execute("SELECT version FROM messages WHERE seq = 1").fetchone() == (2,)


def test_a_taken_over_run_s_intent_is_refused_and_its_tool_never_runs(tmp_path: Path) -> None:
    """The lease moves on while the approver decides: the intent that rode the fence matches no
    row, the lease read says why, nothing is written and the tool does not run."""
    db = tmp_path / "i.db"
    runs: list[str] = []
    with tl.open_store(f"sqlite:///{db}") as store:
        seen = _statements(store)

        @tl.tool(effect="non_idempotent", high_impact=True)
        def send(to: str) -> str:
            runs.append(to)
            return "sent"

        def approve(request: tl.ApprovalRequest) -> bool:
            _take_over(store, "s")
            seen.clear()
            return True

        agent = tl.Agent(
            client=_Model(seen, turns=1),
            model="m",
            tools=[send],
            store=store,
            approve=approve,
            lease_ttl=3600,
        )
        with pytest.raises(tl.LeaseLostError):
            agent.run(session="s", prompt="go")
        assert [_kind(s) for s in seen][:2] == ["INSERT effects+fence", "SELECT leases"]
        assert "BEGIN" not in [_kind(s) for s in seen]
        assert runs == []
        assert _rows(db, "effects") == 0
        lease = store.lease("s")
        assert lease is not None and lease.owner == "elsewhere:1:b"


def test_a_taken_over_run_s_checkpoint_is_refused_whole(tmp_path: Path) -> None:
    """Taken over while the model answers: checkpoint A is refused whole (its messages rolled
    back with it), and the turn's tool never runs."""
    db = tmp_path / "c.db"
    runs: list[str] = []
    with tl.open_store(f"sqlite:///{db}") as store:
        seen = _statements(store)

        @tl.tool(effect="non_idempotent")
        def send(to: str) -> str:
            runs.append(to)
            return "sent"

        def before(n: int) -> None:
            if n == 1:
                _take_over(store, "s")
                seen.clear()

        agent = tl.Agent(
            client=_Model(seen, turns=2, before=before),
            model="m",
            tools=[send],
            store=store,
            lease_ttl=3600,
        )
        with pytest.raises(tl.LeaseLostError):
            agent.run(session="s", prompt="go")
        assert [_kind(s) for s in seen][:4] == [
            "BEGIN",
            "INSERT messages+fence",  # the message carries the session's counters and the fence
            "SELECT leases",
            "ROLLBACK",
        ]
        assert runs == ["0"], "turn 0 ran; turn 1's checkpoint was refused before its tool"
        assert _rows(db, "messages") == 3  # the prompt and turn 0's A and B
        assert _rows(db, "effects") == 1
        session = store.session("s")
        assert session is not None and session.messages == 3


def test_a_fence_that_only_checks_rides_one_statement(tmp_path: Path) -> None:
    """At the store: a young lease's fence is a condition of the batch's one write — no BEGIN,
    no UPDATE of the lease; a record that exists is told apart from a lost lease by reading
    the lease, and a renewing fence is still its own UPDATE."""
    with tl.open_store(f"sqlite:///{tmp_path / 'f.db'}") as store:
        mine = Lease(session_id="s", owner="o", token=1, expires_at=store.now() + 60)
        store.apply("s", [TakeLease(mine, expect_token=0)])
        seen = _statements(store)
        intent = InsertEffect(make_record())
        assert store.apply("s", [HoldLease("s", 1, None), intent]) == [True, True]
        assert [_kind(s) for s in seen] == ["INSERT effects+fence"]
        seen.clear()
        assert store.apply("s", [HoldLease("s", 1, None), intent]) == [True, False]
        assert [_kind(s) for s in seen] == ["INSERT effects+fence", "SELECT leases"]
        assert store.lease("s") == mine, "not renewed"
        seen.clear()
        later = mine.expires_at + 30
        other = InsertEffect(make_record(tool_use_id="toolu_2"))
        assert store.apply("s", [HoldLease("s", 1, later), other]) == [True, True]
        assert [_kind(s) for s in seen] == ["BEGIN", "UPDATE leases", "INSERT effects", "COMMIT"]
        renewed = store.lease("s")
        assert renewed is not None and renewed.expires_at == later


# -- branches -----------------------------------------------------------------------------------


def test_a_rewind_is_its_three_statements_in_one_transaction(tmp_path: Path) -> None:
    """The session's row made current (the tail may hold its counters: here it does not, and
    nothing changes), the guard (the branch's row), the tail copied, the tail taken out — then
    the transcript goes on at the seq it was taken back to; a refused guard writes nothing."""
    db = tmp_path / "r.db"
    with tl.open_store(f"sqlite:///{db}") as store:
        messages = tuple(make_message(i) for i in range(4))
        store.apply("s", [PutSession(make_state(messages=4), None), AppendMessages(messages)])
        seen = _statements(store)
        rewind = [
            AbandonMessages(from_seq=2, branch=1),
            AppendMessages((make_message(2, "user", "again"),)),
            PutSession(make_state(version=2, messages=3), expect_version=1),
        ]
        assert store.apply("s", rewind) == [True, True, True]
        assert [_kind(s) for s in seen] == [
            "BEGIN",
            "UPDATE sessions",  # the fold
            "INSERT abandoned_branches",
            "INSERT abandoned_messages",
            "DELETE messages",
            "INSERT messages",
            "UPDATE sessions",
            "COMMIT",
        ]
        seen.clear()
        with pytest.raises(tl.SessionConflictError, match="from message 2 of 3 as branch 1"):
            store.apply("s", [AbandonMessages(from_seq=2, branch=1)])
        assert [_kind(s) for s in seen] == [
            "BEGIN",
            "UPDATE sessions",
            "INSERT abandoned_branches",
            "SELECT messages",
            "ROLLBACK",
        ]
    assert _rows(db, "abandoned_branches") == 1
    assert _rows(db, "abandoned_messages") == 2
    assert _rows(db, "messages") == 3


def test_a_damaged_lineage_is_a_corrupt_store_not_an_empty_lineage(tmp_path: Path) -> None:
    db = tmp_path / "d.db"
    url = f"sqlite:///{db}"
    with tl.open_store(url) as store:
        store.apply("s", [PutSession(make_state(), None)])
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE sessions SET lineage = ?", ('[{"kind": "fork"',))
    with tl.open_store(url) as store:
        with pytest.raises(tl.CorruptLedgerError, match="lineage of session 's'") as info:
            store.session("s")
        assert info.value.url == url and info.value.session_id == "s"
        with pytest.raises(tl.CorruptLedgerError):
            store.session_states()


def test_none_binds_as_null_and_an_adapter_someone_registered_is_kept() -> None:
    """The store registers an adapter for ``None`` (``_bind_none_directly``): it gives ``None``
    back, so a ``NULL`` is bound as before; where one was registered already it is left."""
    from toolledger.stores import sqlite as sqlite_store

    key = (type(None), sqlite3.PrepareProtocol)
    ours = sqlite3.adapters[key]
    assert ours(None) is None
    conn = sqlite3.connect(":memory:")
    assert conn.execute("SELECT ? IS NULL, typeof(?)", (None, None)).fetchone() == (1, "null")

    def theirs(value: None) -> str:
        return "nil"

    try:
        del sqlite3.adapters[key]
        sqlite3.register_adapter(type(None), theirs)
        sqlite_store._bind_none_directly()
        assert sqlite3.adapters[key] is theirs
        del sqlite3.adapters[key]
        sqlite_store._bind_none_directly()
        assert sqlite3.adapters[key] is not theirs and sqlite3.adapters[key](None) is None
    finally:
        sqlite3.adapters[key] = ours
    conn.close()
