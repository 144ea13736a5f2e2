"""The json:/// store: the brief's effects.json, atomic rewrites, and damage that is never read as
an empty ledger."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

import toolledger as tl
from toolledger.stores.jsonfile import file_stem

from ..conftest import tool_use


@tl.tool
def create_ticket(title: str) -> dict[str, object]:
    return {"id": 1, "title": title}


def written_ledger(tmp_path: Path, n: int = 2) -> tuple[str, Path]:
    url = f"json:///{tmp_path / 'ledger'}"
    with tl.open_store(url) as store:
        for i in range(n):
            tl.run_tool_uses(
                [tool_use(f"toolu_{i}", "create_ticket", title=f"t{i}")],
                [create_ticket],
                ledger=store.ledger("s"),
            )
    return url, tmp_path / "ledger" / "s.effects.json"


def test_file_is_the_briefs_format(tmp_path: Path) -> None:
    _, path = written_ledger(tmp_path, n=1)
    data = json.loads(path.read_text())
    entry = data["toolu_0"]
    assert entry["name"] == "create_ticket"
    assert entry["result"] == {"id": 1, "title": "t0"}
    assert entry["at"].endswith("+00:00") and entry["status"] == "succeeded"


def test_files_and_directory_are_owner_only(tmp_path: Path) -> None:
    _, path = written_ledger(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    leftovers = [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


def test_missing_file_is_an_empty_ledger(tmp_path: Path) -> None:
    with tl.open_store(f"json:///{tmp_path / 'nothing-here'}") as store:
        assert store.ledger("s").records() == []


def test_truncation_at_every_byte_offset_is_detected(tmp_path: Path) -> None:
    url, path = written_ledger(tmp_path)
    whole = path.read_bytes()
    for cut in range(len(whole)):
        if whole[cut:].strip() == b"":
            continue  # only trailing whitespace removed: the same ledger
        path.write_bytes(whole[:cut])
        with tl.open_store(url) as store, pytest.raises(tl.CorruptLedgerError) as info:
            store.ledger("s").records()
        assert info.value.path == str(path)
        assert "not read as empty" in str(info.value) and "backup" in str(info.value)


def test_every_flipped_byte_is_detected_or_harmless(tmp_path: Path) -> None:
    """Flip one bit in each byte. Either the file is rejected, or it still reads as exactly the
    original records (a flip inside insignificant whitespace). Never a different answer."""
    url, path = written_ledger(tmp_path)
    whole = path.read_bytes()
    with tl.open_store(url) as store:
        original = store.ledger("s").records()
    accepted = 0
    for i in range(len(whole)):
        for bit in (0x01, 0x20):
            damaged = bytearray(whole)
            damaged[i] ^= bit
            path.write_bytes(bytes(damaged))
            with tl.open_store(url) as store:
                try:
                    got = store.ledger("s").records()
                except tl.CorruptLedgerError:
                    continue
            assert got == original, f"byte {i} bit {bit:#x} changed the ledger silently"
            accepted += 1
    assert accepted < len(whole) // 4


def test_a_damaged_file_is_never_written_over(tmp_path: Path) -> None:
    url, path = written_ledger(tmp_path)
    path.write_bytes(b'{"toolu_0": {"name": ')
    with tl.open_store(url) as store, pytest.raises(tl.CorruptLedgerError):
        tl.run_tool_uses(
            [tool_use("toolu_9", "create_ticket", title="x")],
            [create_ticket],
            ledger=store.ledger("s"),
        )
    assert path.read_bytes() == b'{"toolu_0": {"name": ', "the evidence is left as it was"


def test_a_file_copied_from_another_session_is_detected(tmp_path: Path) -> None:
    url, path = written_ledger(tmp_path)
    os.link(path, path.with_name("other.effects.json"))
    with tl.open_store(url) as store, pytest.raises(tl.CorruptLedgerError, match="session 's'"):
        store.ledger("other").records()


def test_file_names_cannot_escape_the_directory() -> None:
    for session_id in ["../x", "a/b", "..", ".", "/etc/passwd", "~root"]:
        stem = file_stem(session_id)
        assert "/" not in stem and not stem.startswith(".")
    assert file_stem("x" * 256).startswith("~") and len(file_stem("x" * 256)) == 65


def test_a_stuck_writer_is_reported_not_waited_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl

    from toolledger.stores import jsonfile

    monkeypatch.setattr(jsonfile, "LOCK_TIMEOUT_S", 0.2)
    url, _ = written_ledger(tmp_path, n=1)
    holder = os.open(tmp_path / "ledger" / ".toolledger.lock", os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another process's open file description
    try:
        with tl.open_store(url) as store:
            (result,) = tl.run_tool_uses(
                [tool_use("toolu_x", "create_ticket", title="x")],
                [create_ticket],
                ledger=store.ledger("s"),
            )
        assert result["is_error"] and "stayed locked" in result["content"]
        assert result["content"].startswith("not executed")
    finally:
        os.close(holder)
