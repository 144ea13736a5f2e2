"""The commands that look open a store read-only and never migrate it: a SQLite store on a
read-only mount is read (``mode=ro``, or ``immutable=1`` where there is no WAL to read), an
older release's store is read without a byte of it changing, and a write through a read-only
store is refused, not half-done."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import toolledger as tl
from toolledger.codec import input_hash
from toolledger.ops import InsertEffect
from toolledger.records import EffectRecord, Status

FIXTURE = Path(__file__).parents[1] / "upgrade" / "fixtures" / "v0_1_0" / "v0_1_0.db"
READS = [["sessions"], ["in-doubt"], ["verify"], ["show", "s"], ["effects", "s"], ["history", "s"]]


def doubt(session: str, tool_use_id: str) -> EffectRecord:
    return EffectRecord(
        session_id=session,
        tool_use_id=tool_use_id,
        tool="send_email",
        input_hash=input_hash({}),
        status=Status.STARTED,
        attempt=1,
        created_at=1.0,
        updated_at=1.0,
        worker="gone:1:x",
    )


def on_read_only_mount(directory: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``python -m toolledger ARGV`` with ``directory`` bind-mounted read-only over itself, in a
    mount namespace of its own (the kernel refuses every write under it, root's included)."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) for a read-only bind mount")
    d = str(directory)
    script = (
        f'mount --bind "{d}" "{d}" && mount -o remount,bind,ro "{d}" && '
        f'touch "{d}/probe" 2>/dev/null && echo "the mount is writable" >&2 && exit 99; '
        f'exec "$@"'
    )
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", script, "sh", sys.executable, "-m", "toolledger", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0 and "mount" in done.stderr and "permission" in done.stderr.lower():
        pytest.skip(f"no mount namespace here: {done.stderr.strip()}")
    return done


def digest(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file()
    }


def test_a_checkpointed_store_on_a_read_only_mount_is_read(tmp_path: Path) -> None:
    db = tmp_path / "ro.db"
    with tl.open_store(f"sqlite:///{db}") as store:
        store.backend.apply("s", [InsertEffect(doubt("s", "toolu_1"))])
    assert not Path(f"{db}-wal").exists(), "closed cleanly: checkpointed, no WAL"
    before = digest(tmp_path)
    for argv in READS:
        done = on_read_only_mount(tmp_path, [*argv, "--store", f"sqlite:///{db}", "--json"])
        assert done.returncode in (0, 1), (argv, done.stderr)
        assert done.stderr == "", (argv, done.stderr)
        json.loads(done.stdout)
    done = on_read_only_mount(tmp_path, ["in-doubt", "--store", f"sqlite:///{db}", "--json"])
    assert [r["tool_use_id"] for r in json.loads(done.stdout)] == ["toolu_1"]
    assert digest(tmp_path) == before
    # A command that writes says why it cannot, and changes nothing.
    done = on_read_only_mount(
        tmp_path, ["resolve", "s", "toolu_1", "--not-happened", "--store", f"sqlite:///{db}"]
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert digest(tmp_path) == before


def test_a_store_with_a_live_wal_on_a_read_only_mount_sees_every_commit(tmp_path: Path) -> None:
    """A writer still has the store open (its commits are in the -wal file): the read-only
    reader sees them all, or says it cannot — never an older state silently."""
    db = tmp_path / "live.db"
    writer = tl.open_store(f"sqlite:///{db}")
    try:
        writer.backend.apply("s", [InsertEffect(doubt("s", f"toolu_{n}")) for n in range(5)])
        assert Path(f"{db}-wal").stat().st_size > 0
        done = on_read_only_mount(tmp_path, ["in-doubt", "--store", f"sqlite:///{db}", "--json"])
    finally:
        writer.close()
    if done.returncode == 0:  # (SQLite reads a WAL on a read-only mount when its -shm exists)
        assert len(json.loads(done.stdout)) == 5, "every commit in the WAL is seen"
    else:
        assert "write-ahead log" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_an_older_release_s_store_is_read_without_changing_a_byte(tmp_path: Path) -> None:
    """A 0.1.0 store: the reading commands answer from a migrated copy in memory; the file
    keeps 0.1.0's schema version and bytes — also on a read-only mount."""
    shutil.copy(FIXTURE, tmp_path / "old.db")
    url = f"sqlite:///{tmp_path / 'old.db'}"
    version = sqlite3.connect(tmp_path / "old.db").execute("PRAGMA user_version").fetchone()[0]
    before = digest(tmp_path)
    for argv in (["sessions"], ["in-doubt"], ["effects", "in-doubt"], ["history", "completed"]):
        done = subprocess.run(
            [sys.executable, "-m", "toolledger", *argv, "--store", url, "--json"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, (argv, done.stderr)
        json.loads(done.stdout)
    assert digest(tmp_path) == before, "a reading command changed the store"
    after = sqlite3.connect(tmp_path / "old.db").execute("PRAGMA user_version").fetchone()[0]
    assert after == version
    done = on_read_only_mount(tmp_path, ["sessions", "--store", url, "--json"])
    assert done.returncode == 0, done.stderr
    names = {s["session_id"] for s in json.loads(done.stdout)["sessions"]}
    assert "completed" in names and "in-doubt" in names


def test_a_read_only_store_refuses_writes(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    with tl.open_store(f"sqlite:///{db}") as store:
        store.backend.apply("s", [InsertEffect(doubt("s", "toolu_1"))])
    before = digest(tmp_path)
    with tl.open_store(f"sqlite:///{db}", read_only=True) as store:
        assert [r.tool_use_id for r in store.ledger("s").records()] == ["toolu_1"]
        with pytest.raises(tl.StoreUnavailableError):
            store.ledger("s").resolve("toolu_1", happened=False, by="ana")
    # (SQLite's read-only reader of a WAL store may leave an empty -wal and its -shm behind.)
    assert digest(tmp_path)["r.db"] == before["r.db"]
    assert not Path(f"{db}-wal").exists() or Path(f"{db}-wal").stat().st_size == 0
    with pytest.raises(tl.StoreUnavailableError, match="no store at"):
        tl.open_store(f"sqlite:///{tmp_path / 'missing.db'}", read_only=True)


def test_a_read_only_store_of_an_earlier_release_refuses_writes(tmp_path: Path) -> None:
    """An earlier release's store is read through a migrated copy in memory: a write is refused
    as it is on the file, not taken by the copy and lost when the store is closed (the tool's
    intent and outcome "written", then gone: it runs again on the next open)."""
    db = tmp_path / "old.db"
    shutil.copy(FIXTURE, db)
    ran: list[str] = []

    @tl.tool(effect="non_idempotent")
    def send_note(to: str) -> str:
        ran.append(to)
        return "sent"

    call = {"type": "tool_use", "id": "toolu_ro_1", "name": "send_note", "input": {"to": "a"}}
    before = digest(tmp_path)
    with tl.open_store(f"sqlite:///{db}", read_only=True) as store:
        assert store.backend.copied
        with pytest.raises(tl.StoreUnavailableError):
            tl.run_tool_uses([call], tl.ToolSet([send_note]), ledger=store.ledger("s"))
        with pytest.raises(tl.StoreUnavailableError):
            store.backend.apply("s", [InsertEffect(doubt("s", "toolu_ro_2"))])
        assert store.ledger("s").records() == []
    assert ran == []
    assert digest(tmp_path)["old.db"] == before["old.db"]


def test_a_read_only_json_store_refuses_writes(tmp_path: Path) -> None:
    """As SQLite's: ``read_only=True`` never writes — not a record, not the lock file, and not
    this release's lines into a 0.1 directory it does not stamp with their format."""
    where = tmp_path / "old_json"
    shutil.copytree(FIXTURE.parent / "v0_1_0_json", where)
    before = digest(where)
    with tl.open_store(f"json:///{where}", read_only=True) as store:
        with pytest.raises(tl.StoreUnavailableError, match="read-only"):
            store.backend.apply("s", [InsertEffect(doubt("s", "toolu_ro_1"))])
        assert store.ledger("s").records() == []
    assert digest(where) == before


def test_a_read_only_store_meeting_a_damaged_row_writes_nothing(tmp_path: Path) -> None:
    """A damaged row makes the store look for a newer release's schema: on a read-only store
    that look is read-only too — it used to open a read-write connection whose close, the last
    on the file, checkpointed a killed writer's write-ahead log into the database."""
    db = tmp_path / "d.db"
    writer = (
        "import os, signal, sqlite3, sys, toolledger as tl\n"
        "from toolledger.ops import InsertEffect\n"
        "sys.path.insert(0, sys.argv[2])\n"
        "from test_read_only import doubt\n"
        "store = tl.open_store('sqlite:///' + sys.argv[1])\n"
        "store.backend.apply('s', [InsertEffect(doubt('s', 'toolu_1'))])\n"
        "raw = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "raw.execute(\"UPDATE effects SET status = 'bogus'\")\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", writer, str(db), str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == -9, done.stderr
    assert Path(f"{db}-wal").stat().st_size > 0, "the killed writer's commits are in its WAL"
    before = digest(tmp_path)
    with (
        tl.open_store(f"sqlite:///{db}", read_only=True) as store,
        pytest.raises(tl.CorruptLedgerError),
    ):
        store.ledger("s").records()
    after = digest(tmp_path)
    assert after[db.name] == before[db.name], "the database file was written"
    assert after[f"{db.name}-wal"] == before[f"{db.name}-wal"], "the WAL was checkpointed"
