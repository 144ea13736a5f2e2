"""The sqlite:/// store: its files, its pragmas, its migrations, and a damaged database."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

import pytest

import toolledger as tl
from toolledger.stores._sql.schema import SQLITE_MIGRATIONS as MIGRATIONS

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
    with pytest.raises(tl.SchemaVersionError, match="Upgrade toolledger"):
        tl.open_store(f"sqlite:///{db}")


def test_a_file_that_is_not_a_database_is_corrupt_not_empty(tmp_path: Path) -> None:
    db = tmp_path / "garbage.db"
    db.write_bytes(b"this is not sqlite" * 300)
    with pytest.raises(tl.CorruptLedgerError, match="not read as empty"):
        tl.open_store(f"sqlite:///{db}")


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
    two statements, each a transaction of its own."""
    runs: list[str] = []

    @tl.tool(effect="non_idempotent")
    def send(to: str) -> str:
        runs.append(to)
        return "sent"

    with tl.open_store(f"sqlite:///{tmp_path / 'l.db'}") as store:
        ledger = store.ledger("s")
        seen = _statements(store)
        out = tl.run_tool_uses([tool_use("toolu_1", "send", to="a")], [send], ledger=ledger)
        assert [s.split()[0] for s in seen] == ["INSERT", "UPDATE"]
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
        assert [s.split()[0] for s in seen][:3] == ["SELECT", "SELECT", "INSERT"]
