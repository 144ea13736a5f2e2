"""A store written by a newer toolledger is refused with "written by a newer toolledger —
upgrade", typed (``SchemaVersionError``), never called corrupt — on opening, and by a worker that
meets the upgrade mid-run (a newer release migrated the store while it ran): the run stops with
that error, the tool that ran ran once, and the store is not written further."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

import toolledger as tl
from toolledger.ops import InsertEffect
from toolledger.stores._sql.schema import VERSION, sqlite_versioned
from toolledger.stores.jsonfile._format import FORMAT, FORMAT_FILE
from toolledger.testing.conformance import make_record
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

NEWER = "written by a newer toolledger — upgrade"


def upgrade(kind: str, where: Path) -> None:
    """What a newer release's migration leaves behind."""
    if kind == "json":
        (where / FORMAT_FILE).write_text(json.dumps({"format": FORMAT + 1}))
    else:
        with sqlite3.connect(where / "l.db") as conn:  # as its migration runner does
            for statement in sqlite_versioned(VERSION + 1):
                conn.execute(statement)


def url_of(kind: str, where: Path) -> str:
    return f"json:///{where}" if kind == "json" else f"sqlite:///{where / 'l.db'}"


@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_a_newer_store_is_refused_on_opening(tmp_path: Path, kind: str) -> None:
    with tl.open_store(url_of(kind, tmp_path)) as store:
        store.ledger("s")
    upgrade(kind, tmp_path)
    for read_only in (False, True):
        with pytest.raises(tl.SchemaVersionError, match=NEWER) as info:
            tl.open_store(url_of(kind, tmp_path), read_only=read_only)
        assert not isinstance(info.value, tl.CorruptLedgerError)
        assert "corrupt" not in str(info.value).lower()


def test_the_json_store_writes_its_format(tmp_path: Path) -> None:
    with tl.open_store(f"json:///{tmp_path}"):
        pass
    written = json.loads((tmp_path / FORMAT_FILE).read_text())
    assert written["format"] == FORMAT and written["written_by"].startswith("toolledger ")
    assert tl.open_store(f"json:///{tmp_path}").session_states() == []


@pytest.mark.parametrize("damage", [b"", b'{"format": 3, "written_by": "toolledger 9', b"[3]"])
def test_a_damaged_json_format_file_is_refused_not_written_over(
    tmp_path: Path, damage: bytes
) -> None:
    """The format file is what tells a newer release's directory: one that cannot be read as a
    format is not taken for a pre-0.2 store's missing one (and written over with this release's
    format, the newer store then written by this one). Opening, or a store open already, stops
    with an error naming the file; the file and the ledger are left as they were."""
    url = f"json:///{tmp_path}"
    with tl.open_store(url) as store:
        store.ledger("s")
        (tmp_path / FORMAT_FILE).write_bytes(damage)
        before = sorted(p.name for p in tmp_path.iterdir())
        with pytest.raises(tl.CorruptLedgerError, match="format file") as info:
            store.apply("s", [InsertEffect(make_record("s", "toolu_1"))])
        assert info.value.path == str(tmp_path / FORMAT_FILE)
    with pytest.raises(tl.CorruptLedgerError, match="remove it: the next open writes it again"):
        tl.open_store(url)
    assert (tmp_path / FORMAT_FILE).read_bytes() == damage
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_line_a_newer_release_wrote_is_not_called_corrupt(tmp_path: Path) -> None:
    """A newer release wrote a line this one cannot parse, and said so in the format file:
    reading it is ``SchemaVersionError``, not ``CorruptLedgerError`` with advice to move it
    aside."""
    url = f"json:///{tmp_path}"

    @tl.tool(effect="read_only")
    def look(q: str) -> str:
        return "seen"

    script = [Reply(tool_uses=[ToolUse("look", {"q": "a"})]), Reply(text="done")]
    with ScriptedModel(script) as model, tl.open_store(url) as store:
        tl.Agent(client=model.client(), model="x", tools=[look], store=store).run(
            session="s", prompt="go"
        )
    log = next(tmp_path.glob("*.session.jsonl"))
    with open(log, "ab") as fh:
        fh.write(b'{"format": 3, "a shape": "this release does not know"}\n')
    with tl.open_store(url) as store, pytest.raises(tl.CorruptLedgerError):
        store.session("s")  # the format says 2: a line that does not check out is damage
    upgrade("json", tmp_path)
    with pytest.raises(tl.SchemaVersionError, match=NEWER):
        tl.open_store(url)


@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_a_worker_meeting_a_newer_schema_mid_run_stops_typed(tmp_path: Path, kind: str) -> None:
    """The tool runs while a newer release upgrades the store: the worker's next write is
    refused with ``SchemaVersionError`` and the run stops with it; the tool ran once."""
    url = url_of(kind, tmp_path)
    ran: list[str] = []

    @tl.tool(effect="non_idempotent")
    def send(to: str) -> str:
        ran.append(to)
        upgrade(kind, tmp_path)
        return "sent"

    script = [Reply(tool_uses=[ToolUse("send", {"to": "a@b"})]), Reply(text="done")]
    alerts: list[BaseException] = []
    with ScriptedModel(script) as model, tl.open_store(url) as store:
        agent = tl.Agent(
            client=model.client(), model="x", tools=[send], store=store, on_alert=alerts.append
        )
        with pytest.raises(tl.SchemaVersionError, match=NEWER):
            agent.run(session="s", prompt="go")
    assert ran == ["a@b"]
    # The tool's outcome could not be recorded: a person is told, with the reason.
    assert [type(a) for a in alerts] == [tl.LedgerWriteError], alerts
    assert NEWER in str(alerts[0])
