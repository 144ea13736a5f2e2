"""Torn and corrupt state: damaged files never give a wrong answer, and ``verify`` finds a ledger
and a checkpoint that disagree.

The json ledger file (``*.effects.json``) cut at every byte and with every byte flipped is covered
by ``tests/stores/test_jsonfile.py``; this module does the same to the json session log, runs the
SQLite engine's own integrity check through ``verify``, and takes records out of (and puts stray
ones into) sqlite, json and PostgreSQL stores behind the agent's back.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
from toolledger._verify import Severity, verify
from toolledger.ops import InsertEffect
from toolledger.records import SessionState, StoredMessage
from toolledger.testing.conformance import make_record
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

from ..conftest import url_for, with_params


@tl.tool
def create_ticket(title: str) -> str:
    """Open a ticket."""
    return f"ticket {title}"


SCRIPT = [
    Reply(tool_uses=[ToolUse("create_ticket", {"title": "a"})]),
    Reply(text="One more.", tool_uses=[ToolUse("create_ticket", {"title": "b"})]),
    Reply(text="Both open."),
]


def completed_session(url: str) -> list[str]:
    """A finished two-ticket session in ``url``; returns its tool_use ids."""
    with ScriptedModel(SCRIPT) as model, tl.open_store(url) as store:
        agent = tl.Agent(client=model.client(), model="m", tools=[create_ticket], store=store)
        assert agent.run(session="s", prompt="go").status is tl.RunStatus.COMPLETED
        assert verify(store) == []
        return [r.tool_use_id for r in store.ledger("s").records()]


State = tuple[SessionState | None, list[StoredMessage]]


def read_state(url: str) -> State:
    with tl.open_store(url) as store:
        return store.backend.read_session("s"), store.backend.read_messages("s")


# -- the json session log -----------------------------------------------------------------------


@pytest.fixture
def json_log(tmp_path: Path) -> tuple[str, Path, list[State]]:
    """A finished session's log, and the state after each of its commits (its lines)."""
    url = f"json:///{tmp_path / 'l'}"
    completed_session(url)
    log = tmp_path / "l" / "s.session.jsonl"
    whole = log.read_bytes()
    lines = whole.split(b"\n")[:-1]
    prefixes = []
    for k in range(len(lines) + 1):
        log.write_bytes(b"".join(line + b"\n" for line in lines[:k]))
        prefixes.append(read_state(url))
    log.write_bytes(whole)
    return url, log, prefixes


def test_a_session_log_cut_at_any_byte_reads_as_the_commits_before_the_cut(
    json_log: tuple[str, Path, list[State]],
) -> None:
    """Every line is one commit, and a commit is its line *and* newline: a log cut anywhere
    reads as exactly the commits whose lines survived whole — what a crash would have left —
    and never as anything else."""
    url, log, prefixes = json_log
    whole = log.read_bytes()
    ends = [i + 1 for i, byte in enumerate(whole) if byte == ord("\n")]
    for cut in range(len(whole) + 1):
        log.write_bytes(whole[:cut])
        complete = sum(1 for end in ends if end <= cut)
        assert read_state(url) == prefixes[complete], f"cut at byte {cut}"
        with tl.open_store(url) as store:
            verify(store)  # may report the ledger ahead of the log; never raises


def test_every_flipped_byte_of_a_session_log_is_detected_or_harmless(
    json_log: tuple[str, Path, list[State]],
) -> None:
    """Flip one bit in each byte (but the final newline, which marks the last commit complete):
    either the log is refused with CorruptLedgerError or it reads exactly as before."""
    url, log, prefixes = json_log
    whole = log.read_bytes()
    original = prefixes[-1]
    refused = 0
    for i in range(len(whole) - 1):
        for bit in (0x01, 0x20):
            damaged = bytearray(whole)
            damaged[i] ^= bit
            log.write_bytes(bytes(damaged))
            try:
                got = read_state(url)
            except tl.CorruptLedgerError as exc:
                refusal = exc
            else:
                assert got == original, f"byte {i} bit {bit:#x} changed the session silently"
                continue
            assert refusal.path == str(log) and "not read as empty" in str(refusal)
            refused += 1
    assert refused > 2 * (len(whole) - 1) * 0.9


# -- sqlite: the engine's own check -------------------------------------------------------------


def test_verify_runs_the_sqlite_integrity_check(tmp_path: Path) -> None:
    """The in-doubt index is made to disagree with its table (its definition rewritten under
    it): only ``PRAGMA integrity_check`` can see that, and verify reports it."""
    db = tmp_path / "l.db"
    url = f"sqlite:///{db}"
    with tl.open_store(url) as store:
        store.backend.apply("s", [InsertEffect(make_record("s", f"t{i}")) for i in range(5)])
    raw = sqlite3.connect(db)
    raw.execute("PRAGMA writable_schema = ON")
    raw.execute(
        "UPDATE sqlite_master SET sql = replace(sql, '''started''', '''failed''') "
        "WHERE name = 'effects_in_doubt'"
    )
    raw.commit()
    raw.close()
    with tl.open_store(url) as store:
        problems = verify(store)
    errors = [p for p in problems if p.severity is Severity.ERROR and p.session_id is None]
    assert errors and any("effects_in_doubt" in p.message for p in errors), problems


# -- a ledger and a checkpoint that disagree ----------------------------------------------------


@dataclass
class Damaged:
    """A store of one kind, and a way to take a record out of it behind toolledger's back."""

    url: str
    delete: Callable[[str], None]


@pytest.fixture(params=["sqlite", "json", "postgres"])
def damaged(request: pytest.FixtureRequest, tmp_path: Path) -> Damaged:
    kind = str(request.param)
    url = url_for(kind, tmp_path) if kind != "postgres" else ""

    def delete_sqlite(tool_use_id: str) -> None:
        raw = sqlite3.connect(tmp_path / "ledger.db")
        raw.execute("DELETE FROM effects WHERE tool_use_id = ?", (tool_use_id,))
        raw.commit()
        raw.close()

    def delete_json(tool_use_id: str) -> None:
        with tl.open_store(url) as store:
            keep = [r for r in store.ledger("s").records() if r.tool_use_id != tool_use_id]
        (tmp_path / "ledger" / "s.effects.json").unlink()
        with tl.open_store(url) as store:
            store.backend.apply("s", [InsertEffect(r) for r in keep])

    if kind == "sqlite":
        return Damaged(url, delete_sqlite)
    if kind == "json":
        return Damaged(url, delete_json)
    import psycopg

    admin_url = str(request.getfixturevalue("postgres_url"))
    schema = str(request.getfixturevalue("postgres_schema"))

    def delete_postgres(tool_use_id: str) -> None:
        with psycopg.connect(admin_url, autocommit=True) as raw:
            raw.execute(f'SET search_path TO "{schema}"')
            raw.execute("DELETE FROM effects WHERE tool_use_id = %s", (tool_use_id,))

    return Damaged(with_params(admin_url, schema=schema), delete_postgres)


def test_verify_finds_a_checkpoint_whose_ledger_record_is_gone(damaged: Damaged) -> None:
    first, _ = completed_session(damaged.url)
    damaged.delete(first)
    with tl.open_store(damaged.url) as store:
        found = [p.message for p in verify(store) if p.severity is Severity.ERROR]
    assert found == [
        f"the transcript reports {first} succeeded but the ledger has no record: an effect "
        "the ledger cannot vouch for"
    ]


def test_verify_finds_a_ledger_record_no_checkpoint_knows(damaged: Damaged) -> None:
    completed_session(damaged.url)
    with tl.open_store(damaged.url) as store:
        ghost: Any = make_record("s", "toolu_ghost")
        store.backend.apply("s", [InsertEffect(ghost)])
        found = [p.message for p in verify(store) if p.severity is Severity.ERROR]
    assert found == [
        "ledger record toolu_ghost (create_ticket) matches no tool_use in the transcript"
    ]
