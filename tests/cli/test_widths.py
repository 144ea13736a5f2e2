"""Output for people and pipes: at 60, 80 and 120 columns on a real terminal (a pty) and piped,
every id and every printed command appears whole on one line; a table is used only where it
fits; a pipe gets tab-separated lines with a header; every settle line pasted into ``bash -c``
does what it says; ``| head`` ends quietly."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import shlex
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest

import toolledger as tl
from toolledger.cli.app import EXIT_CLOSED_PIPE, main
from toolledger.codec import input_hash
from toolledger.ops import InsertEffect
from toolledger.records import EffectRecord, Status
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

LONG_SESSION = "support-session-" + "9b13b1d367ca44fd99fd8a3a" * 2
LONG_ID = "toolu_" + "9b13b1d367ca44fd99fd8a3a" * 2
# A session id a hostile neighbour chose: a bidirectional override, a C1 CSI, shell syntax.
EVIL = "ops\u202etxt.exe\x9b31m; touch PWNED #"
BIN = Path(sys.executable).parent
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def started(session: str, tool_use_id: str, tool: str = "send_email") -> EffectRecord:
    """A call whose process died mid-tool long ago: in doubt."""
    return EffectRecord(
        session_id=session,
        tool_use_id=tool_use_id,
        tool=tool,
        input_hash=input_hash({}),
        status=Status.STARTED,
        attempt=1,
        created_at=1.0,
        updated_at=1.0,
        worker="gone:1:x",
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str]]:
    """A store with a long-named agent session (a call in doubt, one awaiting approval, a
    finished one) and ledgers whose ids are long or hostile; and every id in it."""
    url = f"sqlite:///{tmp_path_factory.mktemp('widths') / 'w.db'}"

    @tl.tool(effect="read_only")
    def lookup(q: str) -> str:
        return "found " + q * 20

    @tl.tool(high_impact=True)
    def refund(order: str, amount: int) -> str:
        return "refunded"

    script = [
        Reply(text="Looking it up.", tool_uses=[ToolUse("lookup", {"q": "order 1"})]),
        Reply(tool_uses=[ToolUse("refund", {"order": "o-1", "amount": 5})]),
    ]
    with ScriptedModel(script) as model, tl.open_store(url) as store:
        agent = tl.Agent(
            client=model.client(),
            model="x",
            tools=[lookup, refund],
            store=store,
            approve=tl.approvals.queue,
        )
        agent.run(session=LONG_SESSION, prompt="refund order o-1")
        store.backend.apply(LONG_SESSION, [InsertEffect(started(LONG_SESSION, LONG_ID))])
        store.backend.apply(EVIL, [InsertEffect(started(EVIL, "toolu_evil\u2066x"))])
        ids = [
            LONG_SESSION,
            LONG_ID,
            *(r.tool_use_id for r in store.ledger(LONG_SESSION).records()),
        ]
    return url, ids


def in_terminal(argv: list[str], columns: int, *, code: int = 0, timeout: float = 60) -> str:
    """What ``toolledger ARGV`` shows on a terminal ``columns`` wide (a pty: ``isatty`` is true,
    the window size is set), colours off, line endings as written."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {**os.environ, "COLUMNS": str(columns), "NO_COLOR": "1", "TERM": "xterm"}
    env.pop("FORCE_COLOR", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolledger", *argv],
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=follower,
        env=env,
    )
    os.close(follower)
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the terminal
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    assert proc.wait(timeout=timeout) == code, b"".join(chunks).decode(errors="replace")
    reader.join(timeout=10)
    os.close(leader)
    return ANSI.sub("", b"".join(chunks).decode()).replace("\r\n", "\n")


def toolledger(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``python -m toolledger ARGV`` in a process of its own, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "toolledger", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def piped(argv: list[str], *, codes: tuple[int, ...] = (0,)) -> str:
    proc = toolledger(argv)
    assert proc.returncode in codes, proc.stderr
    assert proc.stderr == ""
    return proc.stdout


COMMANDS = [["sessions"], ["show", LONG_SESSION], ["effects", LONG_SESSION],
            ["history", LONG_SESSION], ["in-doubt"], ["approvals"]]  # fmt: skip


def assert_whole(out: str, ids: list[str], where: str) -> None:
    """Every id that appears at all appears whole: no line holds the start of one without the
    rest (wrapped or cut), and the ids each command is about are there."""
    lines = out.splitlines()
    for i in ids:
        for line in lines:
            if i[:14] in line:
                assert i in line, f"{where}: {i!r} cut or wrapped in line {line!r}"


@pytest.mark.parametrize("columns", [60, 80, 120])
def test_on_a_terminal_ids_are_whole_and_tables_fit(
    world: tuple[str, list[str]], columns: int
) -> None:
    url, ids = world
    for argv in COMMANDS:
        out = in_terminal([*argv, "--store", url], columns)
        where = f"{argv} at {columns} columns"
        assert_whole(out, ids, where)
        assert "\u202e" not in out and "\x9b" not in out, f"{where}: a raw control reached it"
        if argv[0] in ("sessions", "in-doubt"):
            assert LONG_SESSION in out, where
        if argv[0] in ("effects", "in-doubt"):
            assert LONG_ID in out, where
        for line in out.splitlines():
            if "│" in line or "┃" in line:  # a table was drawn: it fits the terminal
                assert len(line) <= columns, f"{where}: table wider than the screen: {line!r}"
        table = any("│" in line for line in out.splitlines())
        if (not table and argv[0] != "approvals") or columns == 60:
            # Records: one field a line, each whole.
            assert re.search(r"^tool_use_id: +toolu_|^session: +", out, re.M), (where, out)


def test_a_pipe_gets_tab_separated_lines_with_a_header(world: tuple[str, list[str]]) -> None:
    url, ids = world
    for argv in COMMANDS:
        out = piped([*argv, "--store", url])
        where = str(argv)
        assert "│" not in out and "\x1b" not in out, where
        assert_whole(out, ids, where)
        data = [line for line in out.splitlines() if line and not line.startswith("# ")]
        header = data[0].split("\t")
        assert len(header) > 2, (where, data[0])
        for line in data[1:]:
            assert len(line.split("\t")) == len(header), (where, line)
    rows = tsv_rows(piped(["sessions", "--store", url]))
    shown = "ops\\u202etxt.exe\\x9b31m; touch PWNED #"  # escaped for display, whole
    assert {r["session"] for r in rows} >= {LONG_SESSION, shown}


def tsv_rows(out: str) -> list[dict[str, str]]:
    """The rows of the first TSV table in ``out`` (comment lines skipped), each cell as printed:
    as the terminal shows it, escaped once (an id as an id is shown; a command as it is
    pasted)."""
    data = [line for line in out.splitlines() if not line.startswith("# ")]
    header = data[0].split("\t")
    return [dict(zip(header, line.split("\t"), strict=True)) for line in data[1:] if line]


def test_json_on_every_read_command(world: tuple[str, list[str]]) -> None:
    url, _ = world
    for argv in [*COMMANDS, ["verify"], ["export", LONG_SESSION]]:
        # verify finds errors here (a ledger with no transcript): exit 1, and still JSON
        out = piped([*argv, "--store", url, "--json"], codes=(0, 1) if argv == ["verify"] else (0,))
        if argv[0] == "export":
            assert all(json.loads(line) for line in out.splitlines())
        else:
            json.loads(out)


def settle_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("toolledger ")]


@pytest.mark.parametrize("where", ["terminal", "records", "pipe"])
def test_each_settle_line_pasted_into_bash_does_what_it_says(tmp_path: Path, where: str) -> None:
    """Two calls in doubt — one in a session whose id holds a bidirectional override and a C1
    control. Each call gets two complete commands, one choice each, on lines of their own; the
    'happened' line of the first and the 'not happened' line of the second, pasted into bash as
    printed, settle exactly those calls that way, under their real ids."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    with tl.open_store(url) as store:
        store.backend.apply("plain", [InsertEffect(started("plain", "toolu_a"))])
        store.backend.apply(EVIL, [InsertEffect(started(EVIL, "toolu_b\u202e"))])
    argv = ["in-doubt", "--store", url]
    if where == "pipe":
        out = piped(argv)
        rows = tsv_rows(out)
        pairs = {r["tool_use_id"]: (r["if it happened"], r["if it did not"]) for r in rows}
        happened, not_happened = pairs["toolu_a"][0], pairs["toolu_b\\u202e"][1]
    else:
        out = in_terminal(argv, 200 if where == "terminal" else 60)
        assert ("│" in out) is (where == "terminal"), out
        lines = settle_lines(out) if where == "terminal" else [
            line.split(": ", 1)[1].strip() for line in out.splitlines() if line.startswith("if it")
        ]  # fmt: skip
        assert len(lines) == 4, out
        happened = next(c for c in lines if "toolu_a" in c and c.endswith("--happened"))
        not_happened = next(c for c in lines if "toolu_b" in c and c.endswith("--not-happened"))
    assert " | " not in out and "|--" not in out, "nothing printed is `a | b`"
    assert "\u202e" not in out and "\x9b" not in out, "raw controls reached the terminal"
    for line in (happened, not_happened):
        assert line.count("--happened") + line.count("--not-happened") == 1, line
        env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
        done = subprocess.run(
            ["bash", "-c", line], env=env, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, (line, done.stdout, done.stderr)
    with tl.open_store(url) as store:
        a = store.ledger("plain").get("toolu_a")
        b = store.ledger(EVIL).get("toolu_b\u202e")
    assert a is not None and a.status is Status.SUCCEEDED
    assert b is not None and b.status is Status.NOT_HAPPENED


def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """``toolledger effects S | head -1`` on a ledger far bigger than a pipe's buffer: head
    exits, toolledger gets EPIPE and stops — no traceback, the documented exit status."""
    url = f"sqlite:///{tmp_path / 'big.db'}"
    with tl.open_store(url) as store:
        ops = [InsertEffect(started("big", f"toolu_{n:06d}_{'x' * 40}")) for n in range(3000)]
        store.backend.apply("big", ops)
    # Each output is far larger than a pipe's 64 KiB: the writer blocks until the reader has
    # gone, so it must meet the closed pipe.
    for argv in (["effects", "big", "--all"], ["effects", "big", "--all", "--json"], ["in-doubt"]):
        proc = subprocess.Popen(
            [sys.executable, "-m", "toolledger", *argv, "--store", url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.readline()
        proc.stdout.close()  # what `head -1` does
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=60) == EXIT_CLOSED_PIPE, (argv, err)
        assert err == "", (argv, err)


def test_python_dash_m_and_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'e.db'}"
    with tl.open_store(url) as store:
        store.backend.apply("s", [InsertEffect(started("s", "toolu_1"))])
    help_ = subprocess.run(
        [sys.executable, "-m", "toolledger", "--help"], capture_output=True, text=True, check=False
    )
    assert help_.returncode == 0 and "exit status" in help_.stdout
    assert main(["effects", "s", "--store", url]) == 0
    assert main(["effects", "nope", "--store", url]) == 1
    assert main(["resolve", "s", "toolu_nope", "--happened", "--store", url]) == 1
    with pytest.raises(SystemExit) as usage:
        main(["resolve", "s"])
    assert usage.value.code == 2
    capsys.readouterr()


def test_no_passwd_entry_and_no_user_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under a uid with no passwd entry and no $USER/$LOGNAME (a container's random uid: the
    password database answers ``KeyError``), the command line runs, and a person's decision is
    recorded as made by that uid."""
    import pwd

    def no_entry(uid: int) -> object:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    url = f"sqlite:///{tmp_path / 'u.db'}"
    with tl.open_store(url) as store:
        store.backend.apply("s", [InsertEffect(started("s", "toolu_1"))])
    assert main(["resolve", "s", "toolu_1", "--happened", "--store", url]) == 0
    capsys.readouterr()
    with tl.open_store(url) as store:
        record = store.ledger("s").get("toolu_1")
    assert record is not None and record.status is Status.SUCCEEDED
    assert f"uid {os.getuid()}" in str(record.result), record


def shell_words(line: str) -> list[str]:
    """The words bash reads in the printed command ``line`` after ``toolledger`` — the argv the
    command would get — after checking that the line itself is printable ASCII."""
    assert all(0x20 <= ord(c) < 0x7F for c in line), line
    got = subprocess.run(
        ["bash", "-c", f"printf '%s\\0' {line.removeprefix('toolledger ')}"],
        capture_output=True,
        check=True,
    ).stdout
    return [w.decode() for w in got.split(b"\0")[:-1]]


def test_printed_commands_quote_controls_so_the_shell_gets_the_real_id() -> None:
    from toolledger.cli.render import command

    for sid in (EVIL, "a\x1b[2Jb", "t\u2067x\u2069", "it's"):
        line = command("resolve", sid, "toolu_x", options=["--happened"])
        assert shell_words(line) == ["resolve", sid, "toolu_x", "--happened"]
        assert shlex.split(line)[0] == "toolledger"


def test_a_reason_naming_commands_is_never_folded_in_a_table(tmp_path: Path) -> None:
    """A short session id on a wide terminal: the sessions list may be a table — but the
    reason names the commands to run, so it is printed whole, each command on one line."""
    url = f"sqlite:///{tmp_path / 'r.db'}"

    @tl.tool(high_impact=True)
    def refund(order: str) -> str:
        return "refunded"

    with (
        ScriptedModel([Reply(tool_uses=[ToolUse("refund", {"order": "o-1"})])]) as model,
        tl.open_store(url) as store,
    ):
        run = tl.Agent(
            client=model.client(),
            model="x",
            tools=[refund],
            store=store,
            approve=tl.approvals.queue,
        ).run(session="s", prompt="refund")
    assert run.reason is not None
    commands = re.findall(r"`(toolledger [^`]*)`", run.reason)
    assert len(commands) == 2
    for columns in (80, 200):
        out = in_terminal(["sessions", "--store", url], columns)
        for command in commands:
            assert any(command in line for line in out.splitlines()), (columns, out)


LONG_TOOL = "lookup_customer_account_by_external_reference_id"


@pytest.mark.parametrize("columns", [80, 100, 120])
@pytest.mark.parametrize("command", ["show", "history"])
def test_a_long_tool_name_is_never_cut_in_a_table(
    tmp_path: Path, columns: int, command: str
) -> None:
    """A tool's name is an id: in a timeline's event (``ledger: NAME → succeeded``) or in what
    the model asked for, a table may wrap it onto a line of its own, never cut it."""
    url = f"sqlite:///{tmp_path / 't.db'}"

    @tl.tool(effect="non_idempotent", name=LONG_TOOL)
    def look(x: str) -> str:
        return "ok"

    script = [Reply(text="hi", tool_uses=[ToolUse(LONG_TOOL, {"x": "1"})]), Reply(text="done")]
    with ScriptedModel(script) as model, tl.open_store(url) as store:
        tl.Agent(client=model.client(), model="m", tools=[look], store=store).run(
            session="s1", prompt="go"
        )
    out = in_terminal([command, "s1", "--store", url], columns)
    assert_whole(out, [LONG_TOOL], f"{command} at {columns} columns")
    assert LONG_TOOL in out, out


@pytest.mark.parametrize("kept", [True, False])
def test_the_demo_names_its_store_whole_on_a_narrow_terminal(tmp_path: Path, kept: bool) -> None:
    """The store the demo says it uses is a path: at 40 columns it is on one line, whole —
    never folded inside the box around the story's opening."""
    where = tmp_path / "a directory with a long name for the demo"
    argv = ["demo", "--dir", str(where)] if kept else ["demo"]
    out = in_terminal(argv, 40, timeout=300)  # the whole story: two agent processes
    line = next((x for x in out.splitlines() if x.startswith("store: ")), None)
    assert line is not None, out
    url = line.removeprefix("store: ").split(" (")[0]
    assert url.startswith("sqlite:///") and url.endswith("/demo.db"), out
    if kept:
        assert url == f"sqlite:///{where / 'demo.db'}", out
