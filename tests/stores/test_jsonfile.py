"""The json:/// store: the brief's effects.json, atomic rewrites, and damage that is never read as
an empty ledger."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import toolledger as tl
from toolledger.ops import AppendMessages, InsertEffect, PutApproval, PutSession, UpdateEffect
from toolledger.records import Status
from toolledger.stores.jsonfile import file_stem, legacy_stem
from toolledger.stores.store import check_session_id
from toolledger.testing import Counter
from toolledger.testing.conformance import make_approval, make_message, make_record, make_state

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


def _contents(directory: Path) -> dict[str, bytes | None]:
    return {p.name: p.read_bytes() if p.is_file() else None for p in directory.iterdir()}


def test_a_directory_of_other_files_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    """A directory holding files of its own and none of toolledger's is not a store: opening
    it, to write or only to look, is an error that names it — never a format file, a lock file
    or an empty ledger written into it. An empty directory, one with only hidden files, and a
    0.1 store (no format file: its lock file or its ledgers say it is one) still open."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    (theirs / "photos").mkdir()
    before = _contents(theirs)
    for options in ({}, {"create": False}, {"read_only": True}):
        with pytest.raises(tl.StoreUnavailableError, match="is not a toolledger store") as err:
            tl.open_store(f"json:///{theirs}", **options)
        assert str(theirs) in str(err.value) and "Nothing was written to it" in str(err.value)
        assert "'notes.txt'" in str(err.value)
    assert _contents(theirs) == before
    ok = [tmp_path / name for name in ("empty", "hidden", "locked", "ledgers")]
    for directory in ok:
        directory.mkdir()
    (tmp_path / "hidden" / ".gitkeep").touch()
    (tmp_path / "locked" / ".toolledger.lock").touch()
    _, ledger = written_ledger(tmp_path)
    os.replace(ledger, tmp_path / "ledgers" / ledger.name)  # copied without its dotfiles
    for directory in ok:
        with tl.open_store(f"json:///{directory}") as store:
            assert store.session_states() == []
        assert (directory / ".toolledger-format").exists()
    assert tl.open_store(f"json:///{tmp_path / 'ledgers'}").ledger("s").records() != []


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

    from toolledger.stores.jsonfile import _files

    monkeypatch.setattr(_files, "LOCK_TIMEOUT_S", 0.2)
    url, _ = written_ledger(tmp_path, n=1)
    holder = os.open(tmp_path / "ledger" / ".toolledger.lock", os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another process's open file description
    try:
        with tl.open_store(url) as store:
            # Neither the intent nor the answer "not executed" can be written: nothing is
            # answered, and the error says why.
            with pytest.raises(tl.StoreUnavailableError) as raised:
                tl.run_tool_uses(
                    [tool_use("toolu_x", "create_ticket", title="x")],
                    [create_ticket],
                    ledger=store.ledger("s"),
                )
            said = str(raised.value)
            assert "'create_ticket' (toolu_x) in session 's' did not run" in said
            assert "stayed locked" in said
            assert store.ledger("s").get("toolu_x") is None
    finally:
        os.close(holder)


# -- file names ---------------------------------------------------------------------------------


SESSION_IDS = st.text(min_size=1, max_size=300).filter(
    lambda s: (
        all(ord(c) >= 0x20 and ord(c) != 0x7F and not 0xD800 <= ord(c) <= 0xDFFF for c in s)
        and len(s) <= 256
    )
)


@settings(max_examples=2000, deadline=None)
@given(SESSION_IDS, SESSION_IDS)
def test_file_names_are_injective_even_where_case_is_ignored(a: str, b: str) -> None:
    check_session_id(a), check_session_id(b)
    stem_a, stem_b = file_stem(a), file_stem(b)
    if a != b:
        assert stem_a.casefold() != stem_b.casefold(), (a, b, stem_a)
    for stem in (stem_a, stem_b):
        assert "/" not in stem and stem not in (".", "..") and not stem.startswith(".")
        assert len((stem + ".effects.json").encode()) <= 255


def test_a_session_named_like_another_s_hash_has_its_own_file(tmp_path: Path) -> None:
    """``~`` + the hash of a long id was the long id's file name, and ``~`` was left as it is:
    two sessions shared one file, and one was answered with the other's results."""
    import hashlib

    long_id = "b" * 250
    twin = "~" + hashlib.sha256(long_id.encode()).hexdigest()
    assert file_stem(twin) != file_stem(long_id)
    refunds = Counter()

    @tl.tool
    def refund(amount: int) -> str:
        refunds.hit("refund")
        return f"refunded {amount}"

    url = f"json:///{tmp_path / 'l'}"
    block = {"type": "tool_use", "id": "toolu_1", "name": "refund", "input": {"amount": 5}}
    with tl.open_store(url) as store:
        tl.run_tool_uses([block], [refund], ledger=store.ledger(twin))
        tl.run_tool_uses([block], [refund], ledger=store.ledger(long_id))
        assert refunds["refund"] == 2, "each session ran its own call"
        assert {r.session_id for r in store.ledger(long_id).records()} == {long_id}


def test_files_under_their_old_names_are_found_and_renamed(tmp_path: Path) -> None:
    """toolledger 0.1 named files with ``~`` and upper case as they are; they are renamed to
    the new names on first use, never taken for an empty ledger."""
    url = f"json:///{tmp_path / 'l'}"
    sid = "Outage~42"
    calls = Counter()

    @tl.tool
    def create_ticket(title: str) -> str:
        calls.hit("create_ticket")
        return "T-1"

    block = {"type": "tool_use", "id": "toolu_1", "name": "create_ticket", "input": {"title": "x"}}
    with tl.open_store(url) as store:
        tl.run_tool_uses([block], [create_ticket], ledger=store.ledger(sid))
    new = tmp_path / "l" / (file_stem(sid) + ".effects.json")
    old = tmp_path / "l" / (legacy_stem(sid) + ".effects.json")
    assert old != new
    new.rename(old)  # as 0.1 left it
    with tl.open_store(url) as store:
        (result,) = tl.run_tool_uses([block], [create_ticket], ledger=store.ledger(sid))
        assert store.sessions() == [sid]
    assert result["content"] == "T-1" and calls["create_ticket"] == 1
    assert new.exists() and not old.exists()


# -- a session created with records (a fork), killed between its two files -----------------------

# A child process writes a fork's batch (state, transcript, three records) into a new session
# and SIGKILLs itself at one point of the commit: ``append`` (about to write the log line: before
# anything of it is durable), ``rename`` (the new log written to its temporary file, not yet
# renamed into place), ``replace:2`` (writing the ledger file, after the log line).
_FORK_AND_DIE = """
import os, signal, sys
from toolledger import open_store
from toolledger.ops import AppendMessages, InsertEffect, PutSession
from toolledger.records import Status
from toolledger.stores.jsonfile import _files
from toolledger.testing.conformance import make_approval, make_message, make_record, make_state

url, point = sys.argv[1], sys.argv[2]
def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
if point == "rename":
    _files.os.replace = die
elif point == "replace:2":
    first = _files.Directory.replace
    def second(self, *args, **kwargs):
        _files.Directory.replace = die
        return first(self, *args, **kwargs)
    _files.Directory.replace = second
else:
    setattr(_files.Directory, point, die)
batch = [
    PutSession(make_state("fork", version=1, messages=2), None),
    AppendMessages((make_message(0), make_message(1, "assistant"))),
    *(
        InsertEffect(make_record("fork", f"toolu_{i}", status=Status.SUCCEEDED, result=i))
        for i in range(3)
    ),
]
open_store(url).backend.apply("fork", batch)
"""


def _fork_and_die(url: str, point: str) -> None:
    # Made (and its format file written) first: the child's writes counted are the batch's.
    tl.open_store(url).close()
    child = subprocess.run(
        [sys.executable, "-c", _FORK_AND_DIE, url, point],
        check=False,
        capture_output=True,
        timeout=60,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()


def _fork_records() -> list[tl.EffectRecord]:
    return [make_record("fork", f"toolu_{i}", status=Status.SUCCEEDED, result=i) for i in range(3)]


def test_a_session_created_with_records_survives_a_kill_before_its_ledger_file(
    tmp_path: Path,
) -> None:
    url = f"json:///{tmp_path / 'ledger'}"
    _fork_and_die(url, "replace:2")
    ledger, log = (
        tmp_path / "ledger" / "fork.effects.json",
        tmp_path / "ledger" / "fork.session.jsonl",
    )
    assert not ledger.exists() and log.exists(), "killed between the log line and the ledger"
    with tl.open_store(url) as store:
        assert store.session("fork") == make_state("fork", version=1, messages=2)
        assert store.messages("fork") == [make_message(0), make_message(1, "assistant")]
        assert sorted(store.ledger("fork").records(), key=lambda r: r.tool_use_id) == (
            _fork_records()
        )
        # The next commit that writes records writes the file, every record in it.
        more = make_record("fork", "toolu_9", status=Status.SUCCEEDED, result=9)
        assert store.apply("fork", [InsertEffect(more)]) == [True]
    on_disk = json.loads(ledger.read_text())
    assert sorted(on_disk) == ["toolu_0", "toolu_1", "toolu_2", "toolu_9"]
    with tl.open_store(url) as store:
        assert len(store.ledger("fork").records()) == 4
        assert store.session("fork") == make_state("fork", version=1, messages=2)


@pytest.mark.parametrize("point", ["append", "rename"])
def test_a_session_created_with_records_killed_before_its_log_line_leaves_nothing(
    tmp_path: Path, point: str
) -> None:
    """Not even an empty log file, which would list a session that is not there."""
    url = f"json:///{tmp_path / 'ledger'}"
    _fork_and_die(url, point)
    visible = [p.name for p in (tmp_path / "ledger").iterdir() if not p.name.startswith(".")]
    assert visible == []
    with tl.open_store(url) as store:
        assert store.session("fork") is None
        assert store.ledger("fork").records() == [], "no record of a session that never was"
        assert store.sessions() == []


def _order_of_writes(store: tl.Store) -> list[str]:
    """The names of the files ``store`` writes from now on, in order; a log line must never
    carry records (only a batch that creates a session does)."""
    order: list[str] = []
    files = store.backend._files  # type: ignore[attr-defined]
    replace, append = files.replace, files.append

    def replacing(path: Path, data: bytes) -> os.stat_result:
        order.append(path.name)
        return replace(path, data)

    def appending(path: Path, line: bytes, **kwargs: Any) -> None:
        order.append(path.name)
        assert b'"records"' not in line
        append(path, line, **kwargs)

    files.replace, files.append = replacing, appending
    return order


def test_outcomes_are_written_to_the_ledger_before_the_checkpoint_reporting_them(
    tmp_path: Path,
) -> None:
    """Killed between the two files, the records answer the calls; a transcript never reports
    a result its ledger lacks."""
    url = f"json:///{tmp_path / 'ledger'}"
    with tl.open_store(url) as store:
        store.apply("s", [PutSession(make_state(version=1), None)])
        assert store.apply("s", [InsertEffect(make_record())]) == [True]
        order = _order_of_writes(store)
        done = make_record(status=Status.SUCCEEDED, result="T-1", at=1_700_000_001.0)
        batch = [
            UpdateEffect(done, Status.STARTED, 1),
            InsertEffect(make_record(tool_use_id="toolu_2", status=Status.SUCCEEDED)),
            PutSession(make_state(version=2), expect_version=1),
        ]
        assert store.apply("s", batch) == [True, True, True]
    assert order == ["s.effects.json", "s.session.jsonl"]


def test_intents_are_written_after_the_checkpoint_naming_their_calls(tmp_path: Path) -> None:
    """Checkpoint A with its call's intent: killed between the two files, the call is in the
    transcript with no record — it never ran — and never a record the transcript does not
    hold (which a resume must refuse: ``is behind its ledger``)."""
    url = f"json:///{tmp_path / 'ledger'}"
    with tl.open_store(url) as store:
        store.apply("s", [PutSession(make_state(version=1), None)])
        order = _order_of_writes(store)
        batch = [
            PutSession(make_state(version=2, messages=1), expect_version=1),
            AppendMessages((make_message(0, "assistant"),)),
            InsertEffect(make_record()),
        ]
        assert store.apply("s", batch) == [True, True, True]
    assert order == ["s.session.jsonl", "s.effects.json"]


def test_an_intent_using_up_an_approval_is_written_before_it(tmp_path: Path) -> None:
    """Killed between the two files, the call is in doubt and its approval unused — never an
    approval used up by an intent that is not there."""
    url = f"json:///{tmp_path / 'ledger'}"
    with tl.open_store(url) as store:
        store.apply("s", [PutSession(make_state(version=1), None)])
        approval = make_approval(status=tl.ApprovalStatus.APPROVED)
        store.apply("s", [PutApproval(approval, expect_status=None)])
        order = _order_of_writes(store)
        used = approval.consumed(at=1_700_000_002.0)
        batch = [InsertEffect(make_record()), PutApproval(used, expect_status=approval.status)]
        assert store.apply("s", batch) == [True, True]
    assert order == ["s.effects.json", "s.session.jsonl"]


def test_intents_whose_ledger_cannot_be_written_take_their_checkpoint_back(
    tmp_path: Path,
) -> None:
    """A commit lands whole or not at all: the log line written first is taken back when the
    ledger write after it fails (a full disk), and the next commit finds the store as it was —
    and so does another reader that had already read the line taken back."""
    url = f"json:///{tmp_path / 'ledger'}"
    log = tmp_path / "ledger" / "s.session.jsonl"
    with tl.open_store(url) as store, tl.open_store(url) as reader:
        store.apply("s", [PutSession(make_state(version=1), None)])
        assert reader.session("s") == make_state(version=1)
        before = log.read_bytes()
        files = store.backend._files  # type: ignore[attr-defined]
        replace = files.replace
        seen: list[tl.SessionState | None] = []

        def full(path: Path, data: bytes) -> os.stat_result:
            if path.name == "s.effects.json":
                seen.append(reader.session("s"))  # the line is there, and read
                raise OSError(28, "No space left on device")
            return replace(path, data)

        files.replace = full
        batch = [
            PutSession(make_state(version=2, messages=1), expect_version=1),
            AppendMessages((make_message(0, "assistant"),)),
            InsertEffect(make_record()),
        ]
        with pytest.raises(tl.StoreUnavailableError, match="No space left"):
            store.apply("s", batch)
        assert seen == [make_state(version=2, messages=1)]
        assert log.read_bytes() == before, "the checkpoint was taken back"
        assert store.session("s") == make_state(version=1)
        assert store.messages("s") == []
        assert store.ledger("s").records() == []
        files.replace = replace
        a_longer_checkpoint_lands(store, reader)
    a_longer_checkpoint_is_kept(url)


def a_longer_checkpoint_lands(store: tl.Store, reader: tl.Store) -> None:
    """After a checkpoint was taken back: a longer line than that one, written before the
    ``reader`` looks again (a reader still at its old offset would read from its middle), is
    read whole."""
    longer = [
        PutSession(make_state(version=2, messages=3), expect_version=1),
        AppendMessages(tuple(make_message(n, "assistant") for n in range(3))),
        InsertEffect(make_record()),
    ]
    assert store.apply("s", longer) == [True, True, True]
    assert reader.session("s") == make_state(version=2, messages=3)
    assert len(reader.messages("s")) == 3


def a_longer_checkpoint_is_kept(url: str) -> None:
    """``a_longer_checkpoint_lands``'s checkpoint, as a reopen reads it."""
    with tl.open_store(url) as store:
        assert store.session("s") == make_state(version=2, messages=3)
        assert [r.tool_use_id for r in store.ledger("s").records()] == ["toolu_1"]


def test_a_log_line_whose_fsync_failed_is_taken_back_and_written_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fsync fails once (EIO) after the checkpoint's line was written. Linux may then have
    dropped the line's dirty pages and marks them clean, so a later fsync succeeds without
    writing them: the line is not durable and must not be read as a commit. It is taken back —
    the store reads as before, to this process and to another — and the batch sent again lands
    whole, its bytes written anew before the fsync that makes them durable."""
    import errno
    import types

    from toolledger.stores.jsonfile import _files

    url = f"json:///{tmp_path / 'ledger'}"
    log = tmp_path / "ledger" / "s.session.jsonl"
    failures = [OSError(errno.EIO, "Input/output error")]
    written: list[bytes] = []

    def write(fd: int, data: Any) -> int:
        if os.readlink(f"/proc/self/fd/{fd}") == str(log):
            written.append(bytes(data))
        return os.write(fd, data)

    def fsync(fd: int) -> None:
        if failures and os.readlink(f"/proc/self/fd/{fd}") == str(log):
            raise failures.pop()
        os.fsync(fd)

    broken = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os) if k[0] != "_"})
    broken.write, broken.fsync = write, fsync
    batch = [
        PutSession(make_state(version=2, messages=1), expect_version=1),
        AppendMessages((make_message(0, "assistant"),)),
    ]
    with tl.open_store(url) as store:
        store.apply("s", [PutSession(make_state(version=1), None)])
        before = log.read_bytes()
        monkeypatch.setattr(_files, "os", broken)
        with pytest.raises(tl.StoreUnavailableError, match="Input/output error"):
            store.apply("s", batch)
        assert log.read_bytes() == before, "the line whose fsync failed was taken back"
        assert store.session("s") == make_state(version=1)
        with tl.open_store(url) as other:
            assert other.session("s") == make_state(version=1)
        written.clear()
        assert store.apply("s", batch) == [True, True]
        assert len(written) == 1 and log.read_bytes() == before + written[0]
    with tl.open_store(url) as store:
        assert store.session("s") == make_state(version=2, messages=1)
        assert len(store.messages("s")) == 1


def test_a_session_created_with_records_is_made_when_its_ledger_file_cannot_be(
    tmp_path: Path,
) -> None:
    """A batch that creates a session with records (a fork's copies) commits with its log line,
    which carries the records; the ledger file written after it only mirrors them. A full disk
    at that file does not undo the commit, so the batch is not reported failed: a caller told
    otherwise would make the branch again (a second one, or "exists already. Nothing was
    written"). The records are read from the line until the next write makes the file."""
    url = f"json:///{tmp_path / 'ledger'}"
    batch = [
        PutSession(make_state(version=1, messages=1), None),
        AppendMessages((make_message(0, "assistant"),)),
        InsertEffect(make_record(status=Status.SUCCEEDED, result="done")),
    ]
    with tl.open_store(url) as store:
        files = store.backend._files  # type: ignore[attr-defined]
        replace = files.replace

        def full(path: Path, data: bytes) -> os.stat_result:
            if path.name == "s.effects.json":
                raise OSError(28, "No space left on device")
            return replace(path, data)

        files.replace = full
        assert store.apply("s", batch) == [True, True, True]
        assert not (tmp_path / "ledger" / "s.effects.json").exists()
        files.replace = replace
        with tl.open_store(url) as other:
            assert other.session("s") == make_state(version=1, messages=1)
            (record,) = other.ledger("s").records()
            assert record.status is Status.SUCCEEDED and record.result == '"done"'
        later = make_record(tool_use_id="toolu_2")
        assert store.apply("s", [InsertEffect(later)]) == [True]
    with tl.open_store(url) as store:
        assert [r.tool_use_id for r in store.ledger("s").records()] == ["toolu_1", "toolu_2"]


def test_a_checkpoint_is_taken_back_on_a_disk_too_full_to_copy_its_log(tmp_path: Path) -> None:
    """The disk fills up right after the checkpoint's line: the ledger file cannot be written,
    and neither can a shortened copy of the log. The line is still taken back (truncated in
    place, which needs no space), so the batch reported failed is not there: sent again once
    there is space, it lands instead of failing as a conflict; and a reader that had read the
    line taken back reads the log again from its start, not from the middle of a later line."""
    url = f"json:///{tmp_path / 'ledger'}"
    log = tmp_path / "ledger" / "s.session.jsonl"
    with tl.open_store(url) as store, tl.open_store(url) as reader:
        store.apply("s", [PutSession(make_state(version=1), None)])
        assert reader.session("s") == make_state(version=1)
        before = log.read_bytes()
        files = store.backend._files  # type: ignore[attr-defined]
        replace = files.replace

        def full(path: Path, data: bytes) -> os.stat_result:
            if path.name == "s.effects.json":
                assert reader.session("s") == make_state(version=2, messages=1)
            raise OSError(28, "No space left on device")

        files.replace = full
        batch = [
            PutSession(make_state(version=2, messages=1), expect_version=1),
            AppendMessages((make_message(0, "assistant"),)),
            InsertEffect(make_record()),
        ]
        with pytest.raises(tl.StoreUnavailableError, match="No space left"):
            store.apply("s", batch)
        assert log.read_bytes() == before, "the checkpoint was taken back"
        assert store.session("s") == make_state(version=1)
        files.replace = replace
        a_longer_checkpoint_lands(store, reader)
    a_longer_checkpoint_is_kept(url)


def test_a_store_made_on_a_full_disk_is_a_store_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its format file cannot be written: ``open_store`` raises a ``StoreUnavailableError``
    naming the file and the cause, not a bare ``OSError``."""
    from toolledger.stores.jsonfile import _files

    def full(self: Any, path: Path, data: bytes) -> os.stat_result:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_files.Directory, "replace", full)
    with pytest.raises(tl.StoreUnavailableError, match="No space left on device") as raised:
        tl.open_store(f"json:///{tmp_path / 'ledger'}")
    assert str(tmp_path / "ledger") in str(raised.value)


def test_a_damaged_lineage_is_a_corrupt_log(tmp_path: Path) -> None:
    from toolledger.stores.jsonfile._codec import _digest

    url = f"json:///{tmp_path / 'ledger'}"
    with tl.open_store(url) as store:
        store.apply("s", [PutSession(make_state(version=1), None)])
    log = tmp_path / "ledger" / "s.session.jsonl"
    entry = json.loads(log.read_text())
    entry["state"]["lineage"] = [{"kind": "sideways"}]  # a hand edit, its digest made to match
    entry["digest"] = _digest(entry)
    log.write_text(json.dumps(entry) + "\n")
    with tl.open_store(url) as store, pytest.raises(tl.CorruptLedgerError):
        store.session("s")
