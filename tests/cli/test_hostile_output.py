"""Ids and names a hostile neighbour chose, on every way the command line prints: the title of
a listing, a table cell, a note, JSON, a command to paste. Nothing invisible reaches the screen
or the pipe raw, two different ids never print alike, no id is cut or wrapped, and every
printed command does exactly what it says when pasted."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

import toolledger as tl
from toolledger import fork
from toolledger.ops import InsertEffect
from toolledger.testing.scripted import Reply, ScriptedModel

from .test_widths import BIN, in_terminal, piped, started, toolledger

SPOOF = "inv\u202eoice\x9b2J"  # a right-to-left override and a C1 CSI; a valid session id
LONG = "support-session-" + "9b13b1d367ca44fd99fd8a3a" * 6  # 160 characters


def store_with(tmp_path: Path, *calls: tuple[str, str], tool: str = "send_email") -> str:
    """A store holding one call in doubt for each ``(session, tool_use_id)``."""
    url = f"sqlite:///{tmp_path / 'h.db'}"
    with tl.open_store(url) as store:
        for sid, tid in calls:
            store.backend.apply(sid, [InsertEffect(started(sid, tid, tool))])
    return url


def first_cells(out: str) -> list[str]:
    """The first cell of every TSV row of ``out``."""
    return [line.split("\t")[0] for line in out.splitlines()[2:] if line]


@pytest.mark.parametrize("command", ["effects", "show", "history"])
def test_the_title_of_a_listing_shows_its_session_id_escaped(tmp_path: Path, command: str) -> None:
    url = store_with(tmp_path, (SPOOF, "toolu_1"))
    for out in (
        piped([command, SPOOF, "--store", url]),
        in_terminal([command, SPOOF, "--store", url], 120),
    ):
        assert "\u202e" not in out and "\x9b" not in out, out
        assert "\\u202e" in out.splitlines()[0] or "\\u202e" in out  # fmt: skip


def test_the_title_of_a_table_never_wraps_its_session_id(tmp_path: Path) -> None:
    url = store_with(tmp_path, (LONG, "toolu_1"))
    out = in_terminal(["effects", LONG, "--store", url], 120)
    assert "┃" in out, "a table was drawn"
    assert any(LONG in line for line in out.splitlines()), out


@pytest.mark.parametrize(
    "ch", ["\u2060", "\u00ad", "\u2028", "\u180e", "\U000e0041", "\u2064", "\u200b", "\ufe0f"]
)
def test_ids_that_differ_by_an_invisible_character_never_print_alike(
    tmp_path: Path, ch: str
) -> None:
    url = store_with(tmp_path, ("prod", "toolu_1"), ("prod" + ch, "toolu_1"))
    for out in (
        piped(["sessions", "--store", url]),
        in_terminal(["sessions", "--store", url], 120),
    ):
        assert ch not in out, f"U+{ord(ch):04X} printed raw"
    assert len(set(first_cells(piped(["sessions", "--store", url])))) == 2


@pytest.mark.parametrize(
    ("one", "other"),
    [("cafe", "cafe "), ("café", "cafe\u0301"), ("a b", "a\u00a0b"), ("a b", "a  b")],
)
def test_ids_that_print_like_each_other_never_print_alike(
    tmp_path: Path, one: str, other: str
) -> None:
    """A space a cell drops, a space that is not U+0020, an id not in composed form: the
    listing shows two sessions, and a person reading the table can tell them apart."""
    url = store_with(tmp_path, (one, "toolu_1"), (other, "toolu_1"))
    assert len({c.strip() for c in first_cells(piped(["sessions", "--store", url]))}) == 2
    seen = [
        " ".join(unicodedata.normalize("NFC", line.split("│")[1]).split())
        for line in in_terminal(["sessions", "--store", url], 160).splitlines()
        if line.startswith("│")
    ]
    assert len(seen) == 2 and len(set(seen)) == 2, seen


def test_an_escape_and_the_text_that_spells_it_print_differently(tmp_path: Path) -> None:
    real, spelled = "acct\x9bx", "acct\\x9bx"
    url = store_with(tmp_path, (real, "toolu_1"), (spelled, "toolu_1"))
    assert len(set(first_cells(piped(["sessions", "--store", url])))) == 2
    shown = [
        line.split("│")[1].strip()
        for line in in_terminal(["sessions", "--store", url], 160).splitlines()
        if line.startswith("│") and "acct" in line
    ]
    assert len(set(shown)) == 2, shown


@pytest.mark.parametrize(
    ("sid", "tid"), [("-rf", "toolu_1"), ("s", "-x"), ("s", "--help"), ("--store", "toolu_1")]
)
def test_a_printed_command_settles_an_id_that_begins_with_a_dash(
    tmp_path: Path, sid: str, tid: str
) -> None:
    """``resolve -rf toolu_1`` would read the id as options (``--help`` prints help and exits
    0, having settled nothing): the printed command ends its options with ``--``."""
    url = store_with(tmp_path, (sid, tid))
    out = in_terminal(["in-doubt", "--store", url], 220)
    line = next(
        ln for ln in out.splitlines() if ln.startswith("toolledger ") and "--not-happened" in ln
    )
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-c", line], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, (line, done.stdout, done.stderr)
    with tl.open_store(url) as store:
        record = store.ledger(sid).get(tid)
    assert record is not None and record.status is tl.Status.NOT_HAPPENED, line


def test_a_command_in_a_pipe_runs_as_written(tmp_path: Path) -> None:
    url = store_with(tmp_path, ("acct\u202e", "toolu_1"))
    out = piped(["in-doubt", "--store", url])
    header, row = out.splitlines()[1:3]
    cell = dict(zip(header.split("\t"), row.split("\t"), strict=True))["if it did not"]
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-c", cell], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, (cell, done.stderr)
    with tl.open_store(url) as store:
        record = store.ledger("acct\u202e").get("toolu_1")
    assert record is not None and record.status is tl.Status.NOT_HAPPENED


def test_no_session_never_wraps_the_id_it_names(tmp_path: Path) -> None:
    url = store_with(tmp_path, ("s", "toolu_1"))
    missing = "missing-session-9b13b1d367ca44fd99fd8a3a9b13b1d367ca44fd"
    out = in_terminal(["effects", missing, "--store", url], 40, code=1)
    assert any(missing in line for line in out.splitlines()), out


def test_a_tab_in_a_name_never_cuts_a_whole_column(tmp_path: Path) -> None:
    url = store_with(tmp_path, ("s", "toolu_1"), tool="send\tmail")
    out = in_terminal(["effects", "s", "--store", url], 160)
    assert "┃" in out and "…" not in out, out
    assert "send\\x09mail" in out


def test_audit_of_a_tool_named_with_controls_refuses_it_escaped(tmp_path: Path) -> None:
    """Such a name is refused where the tool is declared; the refusal, as audit prints it,
    holds the name escaped — no control reaches the terminal."""
    (tmp_path / "hostile_tools.py").write_text(
        "import toolledger as tl\n"
        "@tl.tool(effect='read_only', name='lookup\\x1b[2J\\u202egnp.exe')\n"
        "def lookup(q: str) -> str:\n    return q\n"
        "TOOLS = [lookup]\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "toolledger", "audit", "hostile_tools:TOOLS"],
        cwd=tmp_path,
        capture_output=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert b"control or invisible" in said and b"lookup" in said, said
    assert b"\x1b[2J" not in said and "\u202e".encode() not in said


@pytest.mark.parametrize("command", [["effects", "--json"], ["export"]])
def test_json_writes_invisible_characters_as_escapes(tmp_path: Path, command: list[str]) -> None:
    url = store_with(tmp_path, (SPOOF, "toolu_1"))
    out = in_terminal([command[0], SPOOF, *command[1:], "--store", url], 80)
    assert "\u202e" not in out and "\x9b" not in out
    values = [json.loads(line) for line in out.splitlines()] if command == ["export"] else [
        json.loads(out)
    ]  # fmt: skip
    assert SPOOF in json.dumps(values, ensure_ascii=False), "the same value, loaded"


def test_a_line_break_in_a_note_never_starts_a_row(tmp_path: Path) -> None:
    """A branch's ``by`` is a person's free text: a line break in it must not forge a TSV row
    (or a line on a terminal) after the note it belongs to."""
    url = f"sqlite:///{tmp_path / 'n.db'}"
    forged = "mallory\n9.999\tFORGED ROW\ttoolu_x\tall good"
    with ScriptedModel([Reply(text="hi")]) as model, tl.open_store(url) as store:
        tl.Agent(client=model.client(), model="x", tools=[], store=store).run(
            session="s", prompt="go"
        )
        fork(store, "s", at_turn=1, new_session="f", by=forged)
    for command in ("show", "history"):
        out = piped([command, "f", "--store", url])
        assert not [ln for ln in out.splitlines() if "FORGED" in ln and not ln.startswith("# ")]
        shown = in_terminal([command, "f", "--store", url], 200)
        assert not [ln for ln in shown.splitlines() if ln.startswith("9.999")], shown


def test_content_is_shown_as_it_was_before_escaping_grew(tmp_path: Path) -> None:
    """What ids need is not done to content: a command inside a reason, a repr, a JSON preview
    with a Windows path, an emoji, and a multi-line message keep their text — the commands in
    them still run when pasted."""
    url = f"sqlite:///{tmp_path / 'c.db'}"
    with tl.open_store(url) as store:
        store.backend.apply(
            "win",
            [
                InsertEffect(
                    dataclasses.replace(
                        started("win", "toolu_1"),
                        status=tl.Status.SUCCEEDED,
                        result=json.dumps({"path": "C:\\build\\x64\\out", "ok": "✔\ufe0f"}),
                    )
                )
            ],
        )
    out = in_terminal(["effects", "win", "--store", url], 200)
    assert "C:\\\\build\\\\x64\\\\out" in out, out  # as JSON writes it, not doubled again
    assert "✔\ufe0f" in out, "an emoji keeps its variation selector"
    missing = in_terminal(["show", "C:\\build\\x64", "--store", url], 200, code=1)
    # The id as an id is shown: its one backslash that reads as an escape (``\\x64``) doubled.
    assert "'C:\\build\\\\x64'" in missing, missing


def test_a_reason_names_commands_that_run_when_pasted(tmp_path: Path) -> None:
    from toolledger.testing.scripted import ToolUse

    @tl.tool(effect="non_idempotent", high_impact=True)
    def pay(amount: int) -> str:
        return f"paid {amount}"

    url = f"sqlite:///{tmp_path / 'r.db'}"
    sid = "ops\u202etxt"
    script = [Reply(tool_uses=[ToolUse("pay", {"amount": 5})]), Reply(text="done")]
    with ScriptedModel(script) as model, tl.open_store(url) as store:
        agent = tl.Agent(
            client=model.client(), model="x", tools=[pay], store=store, approve=tl.approvals.queue
        )
        assert agent.run(session=sid, prompt="go").status is tl.RunStatus.AWAITING_APPROVAL
    out = in_terminal(["show", sid, "--store", url], 250)
    # On a screen each command the reason names is a line of its own: pasted whole, it runs.
    lines = out.splitlines()
    (command,) = [ln for ln in lines if ln.startswith("toolledger ") and " approve " in ln]
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-c", command], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, (command, done.stderr)
    with tl.open_store(url) as store:
        (request,) = store.approvals(sid)
    assert request.status is tl.ApprovalStatus.APPROVED


def test_a_multi_line_error_stays_on_its_lines(tmp_path: Path) -> None:
    (tmp_path / "broken_tools.py").write_text(
        "raise ImportError('numpy is not installed.\\nInstall it with:\\n    pip install numpy')\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "toolledger", "audit", "broken_tools:TOOLS"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    said = done.stdout + done.stderr
    assert "\n    pip install numpy" in said and "\\x0a" not in said, said


def test_a_forked_sessions_hint_names_it_as_it_is(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'f.db'}"
    with ScriptedModel([Reply(text="hi")]) as model, tl.open_store(url) as store:
        tl.Agent(client=model.client(), model="x", tools=[], store=store).run(
            session="acct", prompt="go"
        )
    out = in_terminal(["fork", "acct", "--at-turn", "1", "--as", "new\x9b", "--store", url], 200)
    assert "session='new\\x9b'" in out, out  # Python's repr of the id, pasted as Python


def test_a_line_break_in_a_reason_never_fakes_a_field(tmp_path: Path) -> None:
    """A narrow terminal shows one field a line: a reason holding line breaks must not add
    lines that read as fields of their own."""
    from toolledger.ops import PutSession
    from toolledger.testing.conformance import make_state

    url = f"sqlite:///{tmp_path / 'f.db'}"
    forged = "boom\nsession:   admin-prod\nstatus:    completed"
    with tl.open_store(url) as store:
        state = dataclasses.replace(
            make_state("real"), status=tl.RunStatus.NEEDS_ATTENTION, reason=forged
        )
        store.backend.apply("real", [PutSession(state, None)])
    out = in_terminal(["sessions", "--store", url], 60)
    assert "│" not in out, "one field a line"
    assert not [ln for ln in out.splitlines() if ln.startswith("session:") and "admin" in ln]
    assert "boom\\x0asession:" in out, out


def test_the_terminal_approver_shows_ids_escaped() -> None:
    import io

    from rich.console import Console

    from toolledger.approvals._terminal import ask_approval
    from toolledger.engine._gate import ApprovalRequest

    request = ApprovalRequest(
        session_id="s\u202e",
        tool_use_id="toolu_\x1b[2Jx",
        tool="pay\u200b",
        input={"amount": 5},
        in_doubt=False,
        reason="high impact",
    )
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=120, color_system=None)
    console.input = lambda *a, **k: "n"  # type: ignore[method-assign]
    ask_approval(request, console)
    shown = screen.getvalue()
    assert "\x1b[2J" not in shown and "\u202e" not in shown and "\u200b" not in shown, shown
    assert "toolu_\\x1b[2Jx" in shown and "s\\u202e" in shown


def test_no_session_names_an_id_with_a_variation_selector_escaped(tmp_path: Path) -> None:
    url = store_with(tmp_path, ("prod", "toolu_1"))
    out = in_terminal(["show", "prod\ufe0f", "--store", url], 120, code=1)
    assert "\ufe0f" not in out and "prod\\ufe0f" in out, out


@pytest.mark.parametrize(("one", "other"), [("a b", "a\u00a0b"), ("cafe", "cafe ")])
def test_verify_names_sessions_that_print_alike_apart(tmp_path: Path, one: str, other: str) -> None:
    """verify's findings name their session in brackets: as every id is shown, so two
    sessions that differ by a space that is not U+0020, or a trailing one, read apart."""
    url = store_with(tmp_path, (one, "toolu_1"), (other, "toolu_1"))
    for out in (piped(["verify", "--store", url]), in_terminal(["verify", "--store", url], 400)):
        named = {line.split("]")[0] for line in out.splitlines() if line.startswith("warning [")}
        assert len(named) == 2, out
        assert "\u00a0" not in out, "a no-break space printed raw"


def test_a_verify_finding_stays_on_its_line(tmp_path: Path) -> None:
    """A line break in what a record holds (its call's id, its worker) is shown escaped: it
    never starts a line of its own, which could pass for another finding or a command."""
    forged = "toolledger resolve --happened prod toolu_9"
    url = store_with(tmp_path, ("prod", f"toolu_1\n{forged}"))
    with tl.open_store(url) as store:
        store.backend.apply("prod", [InsertEffect(dataclasses.replace(
            started("prod", "toolu_2"), worker=f"gone\n{forged}"))])  # fmt: skip
    for out in (piped(["verify", "--store", url]), in_terminal(["verify", "--store", url], 400)):
        lines = [line for line in out.splitlines() if line]
        assert all(line.startswith(("warning [", "error [", url)) for line in lines), out
        assert f"\\x0a{forged}" in out, out


def test_a_refusal_names_the_worker_on_its_line(tmp_path: Path) -> None:
    """The error that refuses to settle a call still in progress names the worker running it:
    a line break in that name (read from the store) is shown escaped, so the only command on a
    line of its own is the one the refusal prints."""
    import time

    from toolledger.records import Holder

    forged = "toolledger resolve --happened prod toolu_9"
    url = store_with(tmp_path)
    running = dataclasses.replace(
        started("prod", "toolu_1"),
        worker=f"w\n{forged}",
        holder=Holder(host="", pidns="", pid=1, start=0),  # another machine's process
        deadline=time.time() + 3600,
    )
    with tl.open_store(url) as store:
        assert store.backend.apply("prod", [InsertEffect(running)]) == [True]
    done = toolledger(["resolve", "prod", "toolu_1", "--happened", "--store", url])
    assert done.returncode == 1, done.stderr
    assert "w\\x0a" + forged in done.stderr, done.stderr
    assert not any(line.startswith(forged) for line in done.stderr.splitlines()), done.stderr


def test_who_decided_is_named_on_its_line(tmp_path: Path) -> None:
    """Who decided a request is a name read from the store: a line break in it is shown
    escaped — in the line that says it was decided, and in the refusal of a second decision —
    never starting a line that passes for a command to paste."""
    from tests.helpers import awaiting_approval

    forged = "toolledger approve prod toolu_9"
    url = f"sqlite:///{tmp_path / 'a.db'}"
    awaiting_approval(url, "prod")
    with tl.open_store(url) as store:
        (request,) = tl.approvals.pending(store)
    for code in (0, 1):  # decided, then refused: it is decided already
        argv = ["approve", "prod", request.tool_use_id, "--by", f"ann\n{forged}", "--store", url]
        done = toolledger(argv)
        said = done.stdout + done.stderr
        assert done.returncode == code, said
        assert "ann\\x0a" + forged in said, said
        assert not any(line.startswith(forged) for line in said.splitlines()), said


def test_ids_that_print_alike_are_told_apart_by_verify(tmp_path: Path) -> None:
    """Two calls whose ids differ by an invisible character (U+2060) print apart in verify's
    findings: the invisible one is shown as its escape."""
    url = store_with(tmp_path)
    with tl.open_store(url) as store:
        store.backend.apply("prod", [InsertEffect(started("prod", "toolu_\u20601"))])
    out = piped(["verify", "--store", url])
    assert "toolu_\\u20601" in out and "\u2060" not in out, out
