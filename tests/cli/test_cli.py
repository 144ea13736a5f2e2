"""The toolledger command line, driven in-process; outputs checked through --json."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
from toolledger.cli.app import build_parser, main
from toolledger.ops import InsertEffect
from toolledger.records import Status
from toolledger.testing.conformance import make_record
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse
from toolledger.testing.world import AgentSpec, World, run_agent

from ..helpers import awaiting_approval
from .test_widths import started

COMMANDS = [
    "demo",
    "sessions",
    "show",
    "history",
    "fork",
    "rewind",
    "effects",
    "in-doubt",
    "resolve",
    "approvals",
    "approve",
    "deny",
    "verify",
    "console",
    "resume-all",
    "bench",
    "audit",
    "prune",
    "export",
]


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    code = main(list(argv))
    out = capsys.readouterr().out
    return code, json.loads(out) if "--json" in argv and out.strip() else out


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert f"toolledger {command}" in out
    # Every command that prints offers --json; the console serves pages and offers none.
    assert ("--json" in out) is (command != "console")
    # The demo makes its own store: it offers no --store (one given to it is refused).
    assert ("--store" in out) is (command != "demo")


@pytest.mark.parametrize(
    "argv",
    [
        ["--store", "sqlite:///mine.db", "demo", "--dir", "d"],
        ["demo", "--store", "sqlite:///mine.db", "--dir", "d"],
    ],
)
def test_demo_refuses_a_store_it_would_ignore(
    argv: list[str],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--store with demo, before the command or after it: a usage error that says the demo
    makes its own store, and nothing runs — no store, no --dir made."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "error: demo takes no --store: it makes its own store" in err, err
    assert "use --dir DIR" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["--store", "", "sessions"],
        ["resolve", "--store", " ", "s", "t1", "--happened"],
    ],
)
def test_an_empty_store_url_is_refused_not_taken_for_the_default(
    argv: list[str],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--store "$STORE"`` with the variable unset: a usage error naming the mistake, not the
    command carried out on $TOOLLEDGER_STORE's store (here one holding a call in doubt, which
    stays in doubt)."""
    monkeypatch.chdir(tmp_path)
    other = tmp_path / "other.db"
    with tl.open_store(f"sqlite:///{other}") as store:
        store.apply("s", [InsertEffect(make_record("s", "t1"))])
    monkeypatch.setenv("TOOLLEDGER_STORE", f"sqlite:///{other}")
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "error: --store was given an empty URL" in err and "Traceback" not in err, err
    with tl.open_store(f"sqlite:///{other}") as store:
        assert store.backend.read_effects("s")["t1"].status is Status.STARTED
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]


def test_an_empty_store_variable_is_refused_not_taken_for_the_default(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``TOOLLEDGER_STORE="$URL"`` with ``$URL`` unset: the command says so (exit 1) rather than
    act on the default store — here one in the working directory holding a call in doubt,
    which stays in doubt."""
    monkeypatch.chdir(tmp_path)
    with tl.open_store("sqlite:///toolledger.db") as store:
        store.apply("s", [InsertEffect(make_record("s", "t1"))])
    monkeypatch.setenv("TOOLLEDGER_STORE", "")
    assert main(["resolve", "s", "t1", "--not-happened", "--force"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "$TOOLLEDGER_STORE is set but empty" in err and "Traceback" not in err, err
    with tl.open_store("sqlite:///toolledger.db") as store:
        assert store.backend.read_effects("s")["t1"].status is Status.STARTED


def test_the_parser_knows_every_command() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert sorted(sub.choices) == sorted(COMMANDS)  # type: ignore[arg-type]


@pytest.fixture
def crashed(tmp_path: Path) -> tuple[str, World]:
    """A store holding one session left in doubt by a real SIGKILL, and one completed."""
    world = World(tmp_path / "world")
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    script = [Reply(tool_uses=[ToolUse("create_ticket", {"title": "Outage"})]), Reply(text="done")]
    with ScriptedModel(script) as model:
        spec = AgentSpec(store_url=url, base_url=model.url, world=str(world.path), session="broken")
        assert run_agent(spec, crash_at="before_record")[0] == -9
        assert run_agent(spec)[1]["status"] == "needs_attention"  # type: ignore[index]
        ok = AgentSpec(store_url=url, base_url=model.url, world=str(world.path), session="fine")
        assert run_agent(ok)[1]["status"] == "completed"  # type: ignore[index]
    return url, world


def test_inspecting_and_resolving(
    crashed: tuple[str, World], capsys: pytest.CaptureFixture[str]
) -> None:
    url, world = crashed
    code, sessions = cli(capsys, "--store", url, "sessions", "--json")
    assert code == 0
    assert {s["session_id"]: s["status"] for s in sessions["sessions"]} == {
        "broken": "needs_attention",
        "fine": "completed",
    }

    code, doubts = cli(capsys, "in-doubt", "--store", url, "--json")
    (doubt,) = doubts
    assert (doubt["session_id"], doubt["tool"], doubt["status"]) == (
        "broken",
        "create_ticket",
        "started",
    )
    code, effects = cli(capsys, "effects", "fine", "--store", url, "--json")
    assert [e["status"] for e in effects] == ["succeeded"]

    code, shown = cli(capsys, "show", "broken", "--store", url, "--json")
    events = [e["event"] for e in shown["timeline"]]
    assert "ledger: create_ticket IN DOUBT" in events and shown["session"]["turns"] == 1

    code, report = cli(capsys, "verify", "--store", url, "--json")
    assert code == 0 and report["ok"] is True
    assert [p["severity"] for p in report["problems"]] == ["warning"]

    code, resolved = cli(
        capsys,
        "resolve",
        "broken",
        doubt["tool_use_id"],
        "--happened",
        "--result",
        '{"ticket": "T-1"}',
        "--by",
        "ana",
        "--store",
        url,
        "--json",
    )
    assert (
        code == 0 and resolved["status"] == "succeeded" and resolved["result"] == {"ticket": "T-1"}
    )
    code, _ = cli(
        capsys, "resolve", "broken", doubt["tool_use_id"], "--not-happened", "--store", url
    )
    assert code == 1, "it is no longer in doubt"
    assert cli(capsys, "in-doubt", "--store", url, "--json")[1] == []
    assert len(world.tickets()) == 2  # the two sessions' tickets; none twice


def test_approvals_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    monkeypatch.setenv("TOOLLEDGER_STORE", url)

    @tl.tool(high_impact=True)
    def wire(amount: int) -> str:
        return "wired"

    with (
        ScriptedModel([Reply(tool_uses=[ToolUse("wire", {"amount": 3})]), Reply(text="paid")]) as m,
        tl.open_store(url) as store,
    ):
        agent = tl.Agent(
            client=m.client(), model="x", tools=[wire], store=store, approve=tl.approvals.queue
        )
        assert agent.run(session="pay", prompt="pay").status is tl.RunStatus.AWAITING_APPROVAL
        code, waiting = cli(capsys, "approvals", "--json")
        (request,) = waiting
        assert request["input"] == {"amount": 3} and request["status"] == "pending"
        code, decided = cli(
            capsys, "approve", "pay", request["tool_use_id"], "--by", "ana", "--json"
        )
        assert decided["status"] == "approved" and decided["decided_by"] == "ana"
        code, _ = cli(capsys, "deny", "pay", request["tool_use_id"])
        assert code == 1, "a decided request cannot be decided again"
        assert agent.run(session="pay").status is tl.RunStatus.COMPLETED
    assert cli(capsys, "approvals", "--json")[1] == []
    assert [a["status"] for a in cli(capsys, "approvals", "--all", "--json")[1]] == ["used"]


@pytest.mark.parametrize(
    ("change", "shown"),
    [
        ({"input": {"amount": 3000}}, ["--input-hash"]),
        ({"in_doubt": True}, ["--in-doubt"]),
        ({"attempt": 2}, ["--attempt"]),
    ],
)
@pytest.mark.parametrize("decision", ["approve", "deny"])
def test_a_decision_from_the_command_line_is_bound_to_the_request_it_was_shown(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    change: dict[str, Any],
    shown: list[str],
    decision: str,
) -> None:
    """`approvals --json` gives each request's input hash, whether it is in doubt and its
    attempt; `approve`/`deny` given them decide that request only. One replaced meanwhile by
    another question for the same call (another input, a re-run of a call in doubt, another
    attempt) is refused and stays pending; the one shown is decided."""
    from dataclasses import replace

    from toolledger.codec import input_hash
    from toolledger.ops import PutApproval
    from toolledger.records import ApprovalStatus

    url = f"sqlite:///{tmp_path / 'a.db'}"
    awaiting_approval(url, "pay")
    code, (request,) = cli(capsys, "approvals", "--json", "--store", url)
    assert request["input_hash"] == input_hash({"amount": 3}), request
    as_shown = {
        "--input-hash": request["input_hash"],
        "--in-doubt": "yes" if request["in_doubt"] else "no",
        "--attempt": str(request["attempt"]),
    }
    bound = [word for option in shown for word in (option, as_shown[option])]
    tid = request["tool_use_id"]
    with tl.open_store(url) as store:
        (current,) = store.approvals("pay")
        if "input" in change:
            change = {**change, "input_hash": input_hash(change["input"])}
        store.apply("pay", [PutApproval(replace(current, **change), ApprovalStatus.PENDING)])
    code = main([decision, "pay", tid, *bound, "--by", "ana", "--store", url])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 1 and "is not the one you were shown" in err, err
    with tl.open_store(url) as store:
        (now,) = store.approvals("pay")
    assert now.status is ApprovalStatus.PENDING and now.decided_by is None
    code, (again,) = cli(capsys, "approvals", "--json", "--store", url)
    if again["in_doubt"] and decision == "approve":
        return  # a yes to a re-run of a call not in doubt in the ledger answers nothing
    every = [
        "--input-hash",
        again["input_hash"],
        "--in-doubt",
        "yes" if again["in_doubt"] else "no",
        "--attempt",
        str(again["attempt"]),
    ]
    code, decided = cli(
        capsys, decision, "pay", tid, *every, "--by", "ana", "--store", url, "--json"
    )
    assert code == 0 and decided["decided_by"] == "ana", decided
    assert decided["input_hash"] == again["input_hash"]


@pytest.mark.parametrize("damage", ["not a database", "truncated"])
def test_verify_reports_a_store_too_damaged_to_open(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    """Other commands say a damaged store is damaged and point to verify; verify itself
    reports it as its finding — what is damaged, restore from a backup, how an SQLite file's
    readable rows may be salvaged — instead of failing with the error that sent the user to it."""
    bad = tmp_path / "bad.db"
    if damage == "not a database":
        bad.write_bytes(b"not a database" * 100)
    else:
        with tl.open_store(f"sqlite:///{bad}") as store:
            for n in range(200):
                store.apply("s", [InsertEffect(make_record("s", f"toolu_{n}"))])
        bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
        for extra in ("bad.db-wal", "bad.db-shm"):
            (tmp_path / extra).unlink(missing_ok=True)
    url = f"sqlite:///{bad}"
    assert main(["sessions", "--store", url]) == 1
    assert "toolledger verify" in capsys.readouterr().err
    assert main(["verify", "--store", url]) == 1
    out, err = capsys.readouterr()
    flat = " ".join(out.split())
    assert "is damaged" in flat and "Restore it from a backup" in flat and ".recover" in flat
    assert "run `toolledger verify`" not in flat and err == ""
    code, report = cli(capsys, "verify", "--store", url, "--json")
    assert code == 1 and report["ok"] is False and report["store"] == url
    assert "is damaged" in report["problems"][0]["message"]


def test_a_file_that_is_no_database_is_said_to_be_damaged_or_another_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--store sqlite:///notes.txt``: the file's first bytes are not SQLite's. It may be a
    ledger whose header was damaged, or another file the URL names by mistake: the error says
    both, and what to do for each; the file is left as it was."""
    notes = tmp_path / "notes.txt"
    notes.write_text("groceries: milk, eggs\n")
    assert main(["sessions", "--store", f"sqlite:///{notes}"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "is damaged, or names a file that is no toolledger store" in err, err
    assert "point --store or $TOOLLEDGER_STORE at the ledger's file" in err, err
    assert "restore it from a backup" in err, err
    assert notes.read_text() == "groceries: milk, eggs\n"


def test_errors_are_reported_not_raised(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"not a database" * 100)
    assert main(["sessions", "--store", f"sqlite:///{bad}"]) == 1
    assert "CorruptLedgerError" in capsys.readouterr().err
    missing = f"sqlite:///{tmp_path / 'e.db'}"
    for command in (["show", "nobody"], ["sessions"], ["in-doubt"], ["approve", "s", "t"]):
        assert main([*command, "--store", missing]) == 1
        assert "no store at" in capsys.readouterr().err
        assert not (tmp_path / "e.db").exists(), "looking never creates a store"
    missing_dir = tmp_path / "no-such-dir"
    assert main(["sessions", "--store", f"json:///{missing_dir}"]) == 1
    assert "no store at" in capsys.readouterr().err and not missing_dir.exists()
    tl.open_store(missing).close()
    for command in (["show", "nobody"], ["effects", "nobody"]):
        code, out = cli(capsys, *command, "--store", missing)
        assert code == 1 and "no session 'nobody'" in out


def test_a_store_url_naming_a_directory_says_it_is_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """sqlite:/// naming a directory that exists: the error says it is a directory (not that it
    does not exist), for a command that looks and one that writes, and nothing is made in it."""
    for command in (["sessions"], ["prune", "--older-than", "1h"]):
        assert main(["--store", f"sqlite:///{tmp_path}", *command]) == 1
        err = " ".join(capsys.readouterr().err.split())
        assert f"{tmp_path} is a directory, not a database file" in err, err
        assert "does not exist" not in err and f"sqlite:///{tmp_path}/toolledger.db" in err
    assert list(tmp_path.iterdir()) == []
    # And a json:/// URL naming a file: it says so, for both kinds of command.
    (tmp_path / "notes.txt").write_text("mine")
    for command in (["sessions"], ["prune", "--older-than", "1h"]):
        assert main(["--store", f"json:///{tmp_path / 'notes.txt'}", *command]) == 1
        err = " ".join(capsys.readouterr().err.split())
        assert "notes.txt is a file, not a directory" in err, err
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert "a missing one is made" not in err  # looking never makes one
    # json:/// naming a SQLite store's file, and sqlite:/// naming a json:/// store's directory:
    # each says which kind of store it is.
    tl.open_store(f"sqlite:///{tmp_path / 's.db'}").close()
    assert main(["--store", f"json:///{tmp_path / 's.db'}", "sessions"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert f"It is a SQLite file: name it as one (sqlite:///{tmp_path / 's.db'})" in err, err
    tl.open_store(f"json:///{tmp_path / 'j'}").close()
    assert main(["--store", f"sqlite:///{tmp_path / 'j'}", "sessions"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert f"It is a json:/// store: name it as one (json:///{tmp_path / 'j'})" in err, err
    assert "toolledger.db" not in err


def test_verify_and_prune_refuse_another_application_s_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--store pointed at some other program's SQLite file: looking (verify) says it is not a
    toolledger store instead of "ok", writing (prune) refuses instead of adding our tables to
    it; both exit 1 and leave the file's bytes as they were."""
    db = tmp_path / "app.db"
    with sqlite3.connect(db) as raw:
        raw.execute("CREATE TABLE notes (body TEXT)")
    raw.close()
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    url = f"sqlite:///{db}"
    for command in (["verify"], ["prune", "--older-than", "1d"]):
        assert main([*command, "--store", url]) == 1
        out, err = capsys.readouterr()
        assert out == ""
        assert err.startswith(f"StoreUnavailableError: {url} is not a toolledger store: "), err
        assert "Nothing was written to it" in err and "Traceback" not in err
    code, report = cli(capsys, "verify", "--store", url, "--json")
    assert code == 1 and report["error"] == "StoreUnavailableError"
    assert "is not a toolledger store" in report["message"]
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]


def test_a_mistake_on_the_command_line_is_said_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The error's kind, one space, what happened and what to do — no traceback — for a
    call that is not in doubt, a --dir that is a file, an --output into a missing directory;
    and ``--version`` answers. (An error in a user's own module keeps its traceback.)"""
    url = f"sqlite:///{tmp_path / 'm.db'}"
    with tl.open_store(url) as store:
        store.backend.apply("s", [InsertEffect(make_record("s", "toolu_1"))])
    assert main(["resolve", "s", "toolu_01", "--happened", "--store", url]) == 1
    err = capsys.readouterr().err
    assert err.startswith("NotInDoubtError: call 'toolu_01' has no record in session 's'")
    assert "toolledger in-doubt" in err
    afile = tmp_path / "a-file"
    afile.write_text("x")
    assert main(["demo", "--dir", str(afile)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ConfigurationError: --dir ") and "is a file" in err, err
    gone = tmp_path / "no-such-dir" / "out.jsonl"
    assert main(["export", "s", "--output", str(gone), "--store", url]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ConfigurationError: cannot write --output ") and str(gone) in err, err
    assert "No such file or directory" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"toolledger {tl.__version__}"


def test_demo(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """--dir keeps the store (the path it names exists afterwards, and holds the story); a
    rerun on the same directory starts a fresh story and says so."""
    code, report = cli(capsys, "demo", "--dir", str(tmp_path), "--json")
    assert code == 0, report
    assert report["ok"] and report["killed"] and report["status"] == "completed"
    assert report["tickets"] == 1 and report["emails"] == 1
    assert report["store"] == f"sqlite:///{tmp_path / 'demo.db'}" and not report["fresh_start"]
    with tl.open_store(report["store"]) as store:
        assert [s.session_id for s in store.session_states()] == ["outage-42"]
    # Again on the same directory: a fresh story, said so, and the world holds its one ticket.
    assert main(["demo", "--dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    out = " ".join(printed.split())
    assert "held an earlier demo run" in out and "nothing happened twice" in out
    assert f"in {tmp_path}; look again with" in out
    assert len(list((tmp_path / "world" / "tickets").iterdir())) == 1
    assert len(list((tmp_path / "world" / "outbox").iterdir())) == 1
    # The command it prints, pasted as printed, shows the story it tells.
    (look,) = [line for line in printed.splitlines() if line.startswith("toolledger ")]
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    shown = subprocess.run(
        ["bash", "-c", look],
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        check=False,
    )
    assert shown.returncode == 0 and "create_ticket" in shown.stdout, shown.stderr


def _theirs(path: Path, sessions: list[str] | None) -> list[Any]:
    """A store of the user's at ``path`` holding a record in each of ``sessions`` (``None``:
    another program's SQLite database); what it holds, read back."""
    if sessions is None:
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE customers (name TEXT)")
            conn.execute("INSERT INTO customers VALUES ('acme-corp')")
        conn.close()
        return _held(path, None)
    with tl.open_store(f"sqlite:///{path}") as store:
        for sid in sessions:
            store.backend.apply(sid, [InsertEffect(make_record(sid, "toolu_1"))])
    return _held(path, sessions)


def _held(path: Path, sessions: list[str] | None) -> list[Any]:
    query = (
        "SELECT name FROM customers"
        if sessions is None
        else "SELECT session_id, tool_use_id FROM effects ORDER BY session_id"
    )
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute(query).fetchall()
    finally:
        conn.close()


@pytest.mark.parametrize(
    "sessions", [["mine"], ["outage-42", "mine"], None], ids=["other", "demo-and-other", "foreign"]
)
def test_demo_leaves_a_demo_db_it_did_not_make_alone(
    sessions: list[str] | None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--dir naming a directory whose demo.db is the user's own (a store with a session the
    demo does not make, or not a toolledger store at all): the demo refuses in one line and
    removes nothing — not the file, not a row in it, not the world beside it."""
    where = tmp_path / "dir"
    where.mkdir()
    held = _theirs(tmp_path / "theirs.db", sessions)
    assert held
    shutil.copyfile(tmp_path / "theirs.db", where / "demo.db")
    tickets = where / "world" / "tickets"
    tickets.mkdir(parents=True)
    (tickets / "T-1.json").write_text('{"id": "T-1"}')
    before = (where / "demo.db").read_bytes()
    assert main(["demo", "--dir", str(where)]) == 1
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith(f"ConfigurationError: --dir {where} holds a demo.db the demo did not")
    assert "nothing was removed" in err and "Choose another --dir" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "agent starts" not in captured.out, "the story did not begin"
    assert (where / "demo.db").read_bytes() == before
    assert _held(where / "demo.db", sessions) == held
    assert (tickets / "T-1.json").read_text() == '{"id": "T-1"}'


def test_demo_starts_over_where_a_stopped_run_left_an_empty_store(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A demo run stopped before it wrote its session leaves a toolledger store with nothing
    in it: that is an earlier run's too, and the demo starts over (nothing is lost)."""
    tl.open_store(f"sqlite:///{tmp_path / 'demo.db'}").close()
    (tmp_path / "world" / "tickets").mkdir(parents=True)
    assert main(["demo", "--dir", str(tmp_path)]) == 0
    assert "held an earlier demo run" in " ".join(capsys.readouterr().out.split())


def test_demo_leaves_a_world_without_its_store_alone(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """world/tickets in --dir with no demo.db beside it is not an earlier run's: kept."""
    tickets = tmp_path / "world" / "tickets"
    tickets.mkdir(parents=True)
    (tickets / "T-1.json").write_text('{"id": "T-1"}')
    assert main(["demo", "--dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"ConfigurationError: --dir {tmp_path} holds demo files"), err
    assert "no demo.db" in err and "nothing was removed" in err
    assert (tickets / "T-1.json").read_text() == '{"id": "T-1"}'
    assert not (tmp_path / "demo.db").exists()


def test_demo_as_a_newcomer_runs_it() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "toolledger.cli", "demo"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "nothing happened twice" in proc.stdout
    assert "a temporary directory, removed when the demo ends" in " ".join(proc.stdout.split())


def test_a_call_in_progress_is_shown_as_such_and_cannot_be_resolved_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker on another host is running a call (its deadline has not passed): `in-doubt`
    lists it as in progress with its owner, lease and deadline; `resolve` refuses it and says
    why; `--force` settles it and says what it overrode."""
    from toolledger.codec import input_hash
    from toolledger.ops import InsertEffect
    from toolledger.records import EffectRecord, Holder, Status

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    with tl.open_store(url) as store:
        running = EffectRecord(
            session_id="s",
            tool_use_id="toolu_run",
            tool="refund",
            input_hash=input_hash({"amount": 5}),
            status=Status.STARTED,
            attempt=1,
            created_at=store.clock(),
            updated_at=store.clock(),
            worker="host-b:77:abcd",
            holder=Holder(host="host-b", pidns="4026531836", pid=77, start=9),
            lease_token=3,
            deadline=store.now() + 600,
        )
        store.backend.apply("s", [InsertEffect(running)])
    code, listed = cli(capsys, "--store", url, "in-doubt", "--json")
    assert code == 0
    (row,) = listed
    assert row["state"] == "in_progress" and row["worker"] == "host-b:77:abcd"
    assert row["holder"] == "host-b/4026531836/77/9" and row["lease_token"] == 3
    assert "deadline has not passed" in row["why"] and row["until"] == row["deadline"]
    monkeypatch.setenv("COLUMNS", "250")
    code, text = cli(capsys, "--store", url, "in-doubt")
    assert "in progress" in text and "do not settle" in text and "host-b:77:abcd" in text
    code = main(["--store", url, "resolve", "s", "toolu_run", "--not-happened", "--by", "ana"])
    err = capsys.readouterr().err
    assert code == 1 and "EffectInProgressError" in err and "--force" in err
    with tl.open_store(url) as store:
        record = store.ledger("s").get("toolu_run")
        assert record is not None and record.status is Status.STARTED, "nothing was settled"
    code, text = cli(
        capsys, "--store", url, "resolve", "s", "toolu_run", "--not-happened", "--force"
    )
    assert code == 0 and "forced while attempt 1 may still run" in " ".join(text.split())
    code = main(["--store", url, "resolve", "s", "x", "--not-happened", "--result", "1"])
    assert code == 2 and "--result goes with --happened" in capsys.readouterr().err


@pytest.mark.parametrize("columns", [40, 200])
def test_a_call_in_progress_refused_names_the_whole_forcing_command(
    tmp_path: Path, columns: int
) -> None:
    """`resolve` of a call still in progress is refused, and the refusal ends with the one
    complete command that forces it — the same choice, --result and --by, quoted, alone on its
    line at any width — not a flag to add. Pasted into bash, it settles that call so."""
    from toolledger.codec import input_hash
    from toolledger.records import EffectRecord, Holder

    from .test_widths import BIN, EVIL, in_terminal

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    tid = "toolu_" + "9b13b1d367ca44fd99fd8a3a" * 2
    with tl.open_store(url) as store:
        running = EffectRecord(
            session_id=EVIL,
            tool_use_id=tid,
            tool="refund",
            input_hash=input_hash({"amount": 5}),
            status=Status.STARTED,
            attempt=1,
            created_at=store.clock(),
            updated_at=store.clock(),
            worker="host-b:77:abcd",
            holder=Holder(host="host-b", pidns="4026531836", pid=77, start=9),
            lease_token=3,
            deadline=store.now() + 600,
        )
        store.backend.apply(EVIL, [InsertEffect(running)])
    result = '{"refund": "R-1", "note": "it\'s done"}'
    argv = ["--store", url, "resolve", EVIL, tid, "--happened", "--result", result, "--by", "a n"]
    out = in_terminal([*argv, "--watch", "0"], columns, code=1)
    assert "EffectInProgressError" in out and "\u202e" not in out and "\x9b" not in out, out
    assert "use --force" not in " ".join(out.split()), out
    (line,) = [line for line in out.splitlines() if line.startswith("toolledger ")]
    assert "--force" in line, out
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-c", line], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, (line, done.stdout, done.stderr)
    with tl.open_store(url) as store:
        record = store.ledger(EVIL).get(tid)
    assert record is not None and record.status is Status.SUCCEEDED
    assert record.result is not None and json.loads(record.result) == json.loads(result)
    assert record.error is not None and record.error.startswith("resolved by a n: happened")
    assert "forced while attempt 1 may still run" in record.error


@pytest.mark.parametrize(
    ("result", "why"),
    [
        ("NaN", "NaN is not JSON"),
        ('{"amount": Infinity}', "Infinity is not JSON"),
        ("[" * 5000 + "]" * 5000, "nested too deep"),
        ("[" * 300 + "]" * 300, "nested more than 200 levels deep"),
        ("{oops", "Expecting property name"),
    ],
)
def test_resolve_refuses_a_result_that_is_not_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], result: str, why: str
) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    code = main(["--store", url, "resolve", "s", "t", "--happened", "--result", result])
    seen = capsys.readouterr()
    assert code == 2 and why in " ".join(seen.err.split()), seen
    assert seen.out == ""
    for json_flag in ([], ["--json"]):  # a usage error: on stderr, stdout left empty
        code = main(
            ["--store", url, "resolve", "s", "t", "--not-happened", "--result", "1", *json_flag]
        )
        seen = capsys.readouterr()
        assert code == 2 and "--result goes with --happened" in seen.err and seen.out == ""


@pytest.mark.parametrize("name", ["what?now", "100%25 sure"])
def test_demo_keeps_its_store_in_a_dir_whose_name_holds_url_characters(
    name: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A --dir named with a ``?`` (where a store URL's options begin) or a ``%`` escape: the
    store is made in that directory, not beside it under another name, and the store URL the
    demo reports (and prints in its command) opens that file."""
    where = tmp_path / name
    code, report = cli(capsys, "demo", "--dir", str(where), "--json")
    assert code == 0, report
    assert (where / "demo.db").is_file(), sorted(p.name for p in tmp_path.rglob("*"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [name], "nothing written beside it"
    with tl.open_store(report["store"], create=False) as store:
        assert store.sessions() == ["outage-42"]
    # Run again on the same directory: a fresh story, not a refusal.
    code, again = cli(capsys, "demo", "--dir", str(where), "--json")
    assert code == 0 and again["fresh_start"], again


def test_demo_in_a_directory_it_cannot_write_says_so_before_the_story(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A --dir where no store can be made (here: inside /proc, which makes no files) is one
    line saying so, before the agent is started, not a story told half-way."""
    assert main(["demo", "--dir", "/proc/self/fdinfo"]) == 1
    captured = capsys.readouterr()
    assert "agent starts" not in captured.out, captured.out
    err = captured.err
    assert err.startswith("StoreUnavailableError: cannot create "), err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_console_on_a_port_out_of_range_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    tl.open_store(url).close()
    for port in ("99999", "-1"):
        with pytest.raises(SystemExit) as done:
            main(["console", "--port", port, "--store", url])
        assert done.value.code == 2
        err = capsys.readouterr().err
        assert "--port" in err and "0-65535" in err and "Traceback" not in err, err


def test_console_on_a_port_in_use_says_so_and_does_not_announce_itself(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another program holds the port: one line saying so and what to do, exit status 1 —
    not a server's log line and its own exit status after the console said where it was."""
    pytest.importorskip("uvicorn")
    import socket

    url = f"sqlite:///{tmp_path / 'c.db'}"
    tl.open_store(url).close()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["console", "--port", str(port), "--store", url]) == 1
    captured = capsys.readouterr()
    assert "toolledger console for" not in captured.out, captured.out
    err = captured.err
    assert err.startswith(f"ConfigurationError: the console cannot listen on 127.0.0.1:{port}")
    assert "--port" in err and "Traceback" not in err, err


def test_a_memory_store_no_process_opened_is_no_store(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--store memory://NAME`` — a store that lives in the memory of the program that opened
    it — from a command line that never opened it: "no store", as for a missing file, saying
    where the program's store must be; not an empty store where every session and call is
    "not there". One this process opened is read as it is."""
    for argv in (["sessions"], ["resolve", "s", "toolu_1", "--happened"], ["approvals"]):
        assert main([*argv, "--store", "memory://getting-started-cli"]) == 1, argv
        err = capsys.readouterr().err
        assert err.startswith("StoreUnavailableError: no store at memory://getting-started-cli:")
        assert "sqlite:///" in err and "Traceback" not in err, err
    with tl.open_store("memory://opened-here") as store:
        store.backend.apply("s", [InsertEffect(make_record("s", "toolu_1"))])
        code, listed = cli(capsys, "sessions", "--store", "memory://opened-here", "--json")
        assert code == 0 and listed["ledger_only"] == ["s"], listed


def test_a_printed_command_names_the_default_store_when_the_environment_names_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``$TOOLLEDGER_STORE`` names one store and ``--store`` the default one: the commands
    printed for the default store's calls name it, so that pasted into the same shell they
    settle the call listed — not the one of the same ids in the store the variable names (a
    copy kept to investigate)."""
    monkeypatch.chdir(tmp_path)
    for name in ("toolledger.db", "copy.db"):
        with tl.open_store(f"sqlite:///{name}") as store:
            store.backend.apply("s", [InsertEffect(started("s", "toolu_1"))])
    monkeypatch.setenv("TOOLLEDGER_STORE", "sqlite:///copy.db")
    happened = _happened_command(capsys, "sqlite:///toolledger.db")
    assert happened.startswith("toolledger --store sqlite:///toolledger.db resolve "), happened
    assert main(shlex.split(happened)[1:]) == 0
    with tl.open_store("sqlite:///toolledger.db") as store:
        record = store.ledger("s").get("toolu_1")
        assert record is not None and record.status.value == "succeeded"
    monkeypatch.delenv("TOOLLEDGER_STORE")
    happened = _happened_command(capsys, "sqlite:///copy.db")
    assert happened.startswith("toolledger --store sqlite:///copy.db resolve "), happened


def _happened_command(capsys: pytest.CaptureFixture[str], url: str) -> str:
    """The `if it happened` column of the one call `in-doubt --store URL` lists, in a pipe."""
    code, out = cli(capsys, "in-doubt", "--store", url)
    assert code == 0, out
    header, row = [line.split("\t") for line in out.splitlines() if "\t" in line]
    return row[header.index("if it happened")]


def test_a_session_that_is_not_there_says_how_to_list_the_ones_that_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A mistyped session id: what happened, and — on a line of its own, whole, naming the
    store that was looked at — the command that lists the sessions there."""
    url = f"sqlite:///{tmp_path / 'd b.db'}"
    with tl.open_store(url) as store:
        store.backend.apply("outage-42", [InsertEffect(make_record("outage-42", "toolu_1"))])
    for command in (["show", "outage-43"], ["effects", "outage-43"], ["history", "outage-43"]):
        code, out = cli(capsys, *command, "--store", url)
        assert code == 1
        lines = out.splitlines()
        assert lines[0].startswith("no session 'outage-43' in "), out
        listing = f"toolledger --store 'sqlite:///{tmp_path / 'd b.db'}' sessions"
        assert listing in lines, out
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
        done = subprocess.run(
            ["bash", "-c", listing], env=env, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0 and "outage-42" in done.stdout, done


def test_show_counts_one_turn_as_one_turn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A session of one turn is "1 turn", of two "2 turns"."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    with ScriptedModel([Reply(text="hi"), Reply(text="again")]) as model, tl.open_store(url) as s:
        agent = tl.Agent(client=model.client(), model="x", tools=[], store=s)
        agent.run(session="one", prompt="go")
        agent.run(session="two", prompt="go")
        agent.run(session="two", prompt="more")
    code, out = cli(capsys, "show", "one", "--store", url)
    assert code == 0 and " — 1 turn, " in out, out
    code, out = cli(capsys, "show", "two", "--store", url)
    assert code == 0 and " — 2 turns, " in out, out


@pytest.mark.parametrize("argv", [["console", "--json"], ["--json", "console"]])
def test_console_refuses_a_json_it_would_ignore(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The console serves pages: ``--json`` is a usage error that says so, and its help does
    not offer it."""
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "error: console serves web pages: it has no --json" in err, err
    with pytest.raises(SystemExit):
        main(["console", "--help"])
    assert "--json" not in capsys.readouterr().out


def test_approvals_with_none_says_so_for_what_was_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With ``--all`` none at all — not "none waiting", which would hint at decided ones."""
    url = f"sqlite:///{tmp_path / 'l.db'}"
    tl.open_store(url).close()
    assert main(["--store", url, "approvals"]) == 0
    assert "no approval request is waiting" in capsys.readouterr().out
    assert main(["--store", url, "approvals", "--all"]) == 0
    out = capsys.readouterr().out
    assert "no approval request" in out and "waiting" not in out


def test_a_damaged_row_is_said_to_be_damaged_by_every_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A row one value of which no release writes (a status edited by hand): every command
    says which record of which session is damaged — no traceback — and verify reports it as
    its finding."""
    db = tmp_path / "d.db"
    with tl.open_store(f"sqlite:///{db}") as store:
        store.apply("s", [InsertEffect(make_record("s", "toolu_1"))])
    raw = sqlite3.connect(db)
    raw.execute("UPDATE effects SET status = 'bogus'")
    raw.commit()
    raw.close()
    url = f"sqlite:///{db}"
    for argv in (["effects", "s"], ["show", "s"], ["history", "s"], ["export", "s"]):
        assert main([*argv, "--store", url]) == 1, argv
        err = capsys.readouterr().err
        assert "ledger record 'toolu_1' of session 's' is damaged" in err, (argv, err)
        assert "Traceback" not in err and "toolledger verify" in err, err
    code, report = cli(capsys, "verify", "--store", url, "--json")
    assert code == 1 and report["ok"] is False
    (problem,) = report["problems"]
    assert problem["session_id"] == "s" and "'bogus' is not a valid Status" in problem["message"]
    assert "toolledger verify" not in problem["message"]


def test_a_damaged_message_is_named_with_its_session(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A transcript message cut short (its JSON text damaged): the error names the message and
    its session, as it does a damaged record, and carries the session's id."""
    db = tmp_path / "d.db"
    url = f"sqlite:///{db}"
    with ScriptedModel([Reply(text="Hello.")]) as model, tl.open_store(url) as store:
        tl.Agent(client=model.client(), model="claude-test", tools=[], store=store).run(
            session="s", prompt="hi"
        )
    raw = sqlite3.connect(db)
    raw.execute("UPDATE messages SET content = '{bad' WHERE seq = 0")
    raw.commit()
    raw.close()
    with tl.open_store(url, read_only=True) as store, pytest.raises(tl.CorruptLedgerError) as e:
        store.backend.read_messages("s")
    assert e.value.session_id == "s"
    assert "message 'seq 0' of session 's' is damaged" in str(e.value), e.value
    assert main(["show", "s", "--store", url]) == 1
    err = capsys.readouterr().err
    assert "message 'seq 0' of session 's' is damaged" in err and "Traceback" not in err, err
