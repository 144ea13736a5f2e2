"""Retention from the command line and under overlap: ``prune`` removes what ended and keeps a
session a worker is running at that very moment; ``export`` writes a session as JSON lines."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
from toolledger.cli.app import main
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

from .test_show_transcripts import SECRETS, _run_kind


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    code = main(list(argv))
    out = capsys.readouterr().out
    return code, json.loads(out) if "--json" in argv and out.strip() else out


def rows(db: Path, session: str) -> dict[str, int]:
    """What the SQLite file itself holds of ``session``, table by table."""
    with sqlite3.connect(db) as conn:
        return {
            t: conn.execute(
                f"SELECT count(*) FROM {t} WHERE session_id = ?", (session,)
            ).fetchone()[0]
            for t in ("sessions", "messages", "effects", "approvals", "leases")
        }


@tl.tool(effect="non_idempotent")
def create_ticket(title: str, api_key: str) -> str:
    """Open a ticket."""
    return f"T-{title}"


def run_one(db: Path, session: str) -> None:
    script = [
        Reply(text="On it.", tool_uses=[ToolUse("create_ticket", {"title": "x", "api_key": "k9"})]),
        Reply(text="Done."),
    ]
    with ScriptedModel(script) as m, tl.open_store(f"sqlite:///{db}") as store:
        agent = tl.Agent(client=m.client(), model="c", tools=[create_ticket], store=store)
        assert agent.run(session=session, prompt="go").status is tl.RunStatus.COMPLETED


def test_prune_and_export_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "l.db"
    run_one(db, "old")
    run_one(db, "new")
    url = f"sqlite:///{db}"
    code, out = cli(capsys, "--store", url, "export", "old")
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    kinds = [line["kind"] for line in lines]
    assert kinds[0] == "session" and kinds.count("message") == 4 and kinds.count("effect") == 1
    assert lines[0]["state"]["status"] == "completed"
    assert "k9" not in out and "***" in out  # masked unless --show-secrets
    target = tmp_path / "old.jsonl"
    code, _ = cli(capsys, "--store", url, "export", "old", "--show-secrets", "-o", str(target))
    assert code == 0 and "k9" in target.read_text()
    assert target.stat().st_mode & 0o777 == 0o600

    code, report = cli(capsys, "--store", url, "--json", "prune", "--older-than", "1h")
    assert code == 0 and report["removed"] == []  # nothing is an hour old
    code, report = cli(capsys, "--store", url, "--json", "prune", "--older-than", "0s", "--dry-run")
    assert sorted(p["session_id"] for p in report["removed"]) == ["new", "old"]
    assert rows(db, "old")["effects"] == 1  # a dry run removes nothing
    code, text = cli(capsys, "--store", url, "prune", "--older-than", "0s")
    assert code == 0 and "removed 2 session(s)" in text
    for session in ("old", "new"):
        assert rows(db, session) == dict.fromkeys(rows(db, session), 0)
    code, _ = cli(capsys, "--store", url, "export", "old")
    assert code == 1  # gone


def test_export_to_a_file_is_private_whatever_lies_beside_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``export -o FILE`` with what --show-secrets revealed: the file is a new one, 0600, put in
    place whole — never a world-readable file left over or planted beside it, never written
    through a symbolic link to somewhere else — and nothing is left behind."""
    db = tmp_path / "l.db"
    run_one(db, "old")
    url = f"sqlite:///{db}"
    target = tmp_path / "out.jsonl"
    target.write_text("an older export")
    target.chmod(0o644)
    planted = tmp_path / "out.jsonl.tmp"
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("not yours")
    planted.symlink_to(elsewhere)
    code, _ = cli(capsys, "--store", url, "export", "old", "--show-secrets", "-o", str(target))
    assert code == 0
    assert not target.is_symlink() and "k9" in target.read_text()
    assert target.stat().st_mode & 0o777 == 0o600
    assert elsewhere.read_text() == "not yours" and planted.is_symlink()
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.jsonl")]
    assert left == [], "no temporary file left"


def test_export_names_the_file_it_wrote_with_what_hides_in_its_name_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A path with a no-break space and a word joiner in it: the line that says where the
    export went shows both as escapes (the name is data), and the file is where it was asked."""
    db = tmp_path / "l.db"
    run_one(db, "old")
    target = tmp_path / "out\u00a0\u2060.jsonl"
    code, out = cli(capsys, "--store", f"sqlite:///{db}", "export", "old", "-o", str(target))
    assert code == 0 and target.is_file()
    assert "\u00a0" not in out and "\u2060" not in out, repr(out)
    assert "out\\xa0\\u2060.jsonl" in out, out


@pytest.mark.parametrize("kind", ["anthropic", "chat", "responses"])
def test_export_masks_the_secrets_in_tool_inputs_and_results_of_every_api(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A call's input and its result are JSON held in a string in OpenAI's transcripts (the
    ``arguments``, the tool message's content) and in Anthropic's (the ``tool_result``'s
    content): export masks what is inside them, as ``show`` does, and ``--show-secrets`` writes
    every message and record as stored."""
    if kind != "anthropic":
        pytest.importorskip("openai")
    url = f"sqlite:///{tmp_path / 'k.db'}"
    _run_kind(kind, url)
    code, out = cli(capsys, "--store", url, "export", "s")
    assert code == 0, out
    assert [secret for secret in SECRETS if secret in out] == [], out
    assert "***" in out

    code, out = cli(capsys, "--store", url, "export", "s", "--show-secrets")
    assert code == 0, out
    assert [secret for secret in SECRETS if secret in out] == list(SECRETS)
    lines = [json.loads(line) for line in out.splitlines()]
    with tl.open_store(url) as store:
        assert [(m["seq"], m["content"]) for m in lines if m["kind"] == "message"] == [
            (m.seq, m.content) for m in store.messages("s")
        ]
        assert [e["result"] for e in lines if e["kind"] == "effect"] == [
            None if r.result is None else json.loads(r.result) for r in store.ledger("s").records()
        ]


def test_export_to_a_pipe_writes_into_it_and_leaves_it_a_pipe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``-o`` naming what is not a file — a named pipe, /dev/stdout, a shell's ``>(…)`` — is
    written to, never replaced by a file of the same name."""
    import contextlib
    import os
    import stat

    db = tmp_path / "l.db"
    run_one(db, "old")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    read: list[str] = []
    reader = threading.Thread(target=lambda: read.append(fifo.read_text()), daemon=True)
    reader.start()
    code, _ = cli(capsys, "--store", f"sqlite:///{db}", "export", "old", "-o", str(fifo))
    reader.join(10)
    if reader.is_alive():  # nothing was written into the pipe: let the reader go
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)
    assert code == 0 and stat.S_ISFIFO(fifo.lstat().st_mode), "still a pipe"
    (text,) = read
    assert json.loads(text.splitlines()[0])["kind"] == "session" and "k9" not in text


def test_a_records_error_text_is_masked_wherever_it_is_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tool's error may carry a credential (a URL's password, a bearer token): ``effects``
    (table and --json) and ``export`` mask it as ``show`` does, unless --show-secrets."""
    from dataclasses import replace

    from toolledger.ops import InsertEffect
    from toolledger.testing.conformance import make_record

    url = f"sqlite:///{tmp_path / 'e.db'}"
    failed = replace(
        make_record("s", "toolu_1", status=tl.Status.FAILED),
        result=None,
        error="could not connect to postgres://app:hunter2@db/x (Bearer sk-live-12345678)",
    )
    with tl.open_store(url) as store:
        assert store.apply("s", [InsertEffect(failed)]) == [True]
    for argv in (["effects", "s"], ["effects", "s", "--json"], ["export", "s"]):
        code, out = cli(capsys, "--store", url, *argv)
        text = out if isinstance(out, str) else json.dumps(out)
        assert code == 0 and "could not connect" in text, argv
        assert "hunter2" not in text and "sk-live-12345678" not in text, argv
    code, out = cli(capsys, "--store", url, "export", "s", "--show-secrets")
    assert "hunter2" in out and "sk-live-12345678" in out


def test_a_lone_surrogate_in_a_result_is_exported_as_its_escape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A result holding a lone surrogate (a file name read with ``surrogateescape``): ``export``
    (to a file, and on standard output) and ``effects --json`` write it as its ``\\u`` escape —
    UTF-8 any reader takes, loading to the same value — never the raw code point UTF-8 cannot
    hold (the file's write raised, and a strict standard output lost every line after it)."""

    @tl.tool(effect="read_only")
    def list_dir(path: str) -> str:
        return "report-\udcff.txt"

    url = f"sqlite:///{tmp_path / 'l.db'}"
    content = [{"type": "tool_use", "id": "toolu_1", "name": "list_dir", "input": {"path": "."}}]
    with tl.open_store(url) as store:
        tl.run_tool_uses(content, [list_dir], ledger=store.ledger("s"))
    target = tmp_path / "s.jsonl"
    code, _ = cli(capsys, "--store", url, "export", "s", "--show-secrets", "-o", str(target))
    assert code == 0
    (effect,) = [
        r
        for r in map(json.loads, target.read_bytes().decode().splitlines())
        if r["kind"] == "effect"
    ]
    assert effect["result"] == "report-\udcff.txt"
    for argv in (["export", "s"], ["--json", "effects", "s", "--show-secrets"]):
        code = main(["--store", url, *argv])
        out = capsys.readouterr().out
        assert code == 0 and "\udcff" not in out and "\\udcff" in out, argv
        out.encode()  # the whole of it is UTF-8


def test_a_bad_age_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["prune", "--older-than", "30 days"])
    assert done.value.code == 2
    assert "is not a duration" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("age", "said"),
    [("30d", "30d"), ("12h", "12h"), ("90m", "90m"), ("1.5h", "90m"), ("2w", "2w"), ("45s", "45s")],
)
def test_prune_says_the_age_in_whole_units(
    age: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    tl.open_store(url).close()
    code, text = cli(capsys, "--store", url, "prune", "--older-than", age)
    assert code == 0
    assert " ".join(text.split()).endswith(
        f"nothing to remove: no ended session idle for longer than {said}"
    ), text


def test_a_session_being_run_is_kept_and_its_call_runs_once(tmp_path: Path) -> None:
    """A worker continues a completed session; prune runs while its tool is running. The
    session is kept (its lease is held, its call in progress); the tool runs once; once the run
    is over the session can go."""
    db = tmp_path / "l.db"
    run_one(db, "s")
    inside, release = threading.Event(), threading.Event()
    ran: list[str] = []

    @tl.tool(effect="non_idempotent")
    def slow_send(to: str) -> str:
        ran.append(to)
        inside.set()
        assert release.wait(30)
        return "sent"

    # The scripted model answers by turn: the session's first two turns are behind it.
    script = [
        Reply(text="(turn 1)"),
        Reply(text="(turn 2)"),
        Reply(text="Sending.", tool_uses=[ToolUse("slow_send", {"to": "a@b"})]),
        Reply(text="Sent."),
    ]
    with ScriptedModel(script) as m, tl.open_store(f"sqlite:///{db}") as store:
        agent = tl.Agent(client=m.client(), model="c", tools=[slow_send], store=store)
        runs: list[tl.Run] = []
        worker = threading.Thread(target=lambda: runs.append(agent.run(session="s", prompt="more")))
        worker.start()
        assert inside.wait(30)
        with tl.open_store(f"sqlite:///{db}") as operator:
            report = operator.prune(older_than=0)
        (kept,) = report.kept
        assert report.removed == [] and kept.session_id == "s"
        release.set()
        worker.join(30)
        assert runs[0].status is tl.RunStatus.COMPLETED
        assert ran == ["a@b"]
        assert rows(db, "s")["effects"] == 2
        assert [p.session_id for p in store.prune(older_than=0).removed] == ["s"]
    assert rows(db, "s") == dict.fromkeys(rows(db, "s"), 0)


def test_a_fork_waiting_to_be_run_is_kept_unless_asked_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``fork`` and ``rewind`` leave a session ``ready`` and say to run it: ``prune`` keeps it,
    saying why, and removes it only when ``--status ready`` asks for it."""
    db = tmp_path / "f.db"
    run_one(db, "source")
    url = f"sqlite:///{db}"
    with tl.open_store(url) as store:
        fork = tl.fork(store, "source", at_turn=1, new_session="branch")
    code, report = cli(capsys, "--store", url, "--json", "prune", "--older-than", "0s")
    assert code == 0
    assert [p["session_id"] for p in report["removed"]] == ["source"]
    (kept,) = report["kept"]
    assert kept["session_id"] == fork and "ready" in kept["why"] and "--status ready" in kept["why"]
    assert rows(db, fork)["messages"] > 0, "the branch is still there"
    code, report = cli(
        capsys, "--store", url, "--json", "prune", "--older-than", "0s", "--status", "ready"
    )
    assert code == 0 and [p["session_id"] for p in report["removed"]] == [fork]
    assert rows(db, fork) == dict.fromkeys(rows(db, fork), 0)
