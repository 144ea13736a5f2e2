"""What a pipe gets: every cell as the terminal shows it on one line, escaped once. An id's cell
is the id as shown (``\\x09``, ``\\u200b``, a backslash doubled only where it could start an
escape), which reads back to the exact id; a command — in a column of its own or inside a
session's reason — is printed as it is pasted, and pasted it names the real session and call
and runs nothing else."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

import toolledger as tl
from toolledger.ops import InsertEffect, TakeLease
from toolledger.records import Holder, Lease
from toolledger.testing._samples import make_record
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse
from toolledger.testing.world import AgentSpec, World, run_agent

from .test_widths import BIN, started

# Left in doubt by a real SIGKILL: a backslash that reads as an escape, quotes, a zero-width
# space, a right-to-left override and a C1 CSI (a session id and a call id hold no C0 control).
DOUBT_SID = "ops\\x41 \"q'\u200b\u202e\x9bz"
DOUBT_TID = 'toolu_a\\b"c\u200bd\u202ee\x9b'
# Awaiting approval, printable: its commands are plain shell quoting, which shlex reads.
WAIT_SID = 'acct\\x41 "it\'s"'
WAIT_TID = "toolu_b\\q'x"
# An id whose command, printed with its backslashes doubled, ends its quoting early.
TRAP_SID = "inv\u200b'; touch PWNED; '"
# Records alone: a tab, a line break, a backslash, a quote — as a store may hold them.
LEDGER_SID = "led\\x41\u200b"
LEDGER_TID = "toolu_t\tab\nnl\\x41\u202e'q"
LEDGER_TOOL = "send\tmail"

# How a script reads an id back from its cell: ``\\`` is a backslash, ``\xHH``, ``\uHHHH`` and
# ``\UHHHHHHHH`` the character of that code point; any other backslash stands for itself.
SHOWN = re.compile(r"\\(\\|x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8})")


def id_of(cell: str) -> str:
    return SHOWN.sub(lambda m: "\\" if m[1] == "\\" else chr(int(m[1][1:], 16)), cell)


def crashed(store_url: str, directory: Path, session: str, tool_use_id: str) -> None:
    """``session`` left in doubt on ``tool_use_id``: killed before its outcome, run again."""
    World(directory)
    script = [Reply(tool_uses=[ToolUse("create_ticket", {"title": "x"}, id=tool_use_id)])]
    with ScriptedModel([*script, Reply(text="done")]) as model:
        spec = AgentSpec(
            store_url=store_url, base_url=model.url, world=str(directory), session=session
        )
        assert run_agent(spec, crash_at="before_record")[0] == -9
        ran = run_agent(spec)[1]
        assert ran is not None and ran["status"] == "needs_attention", ran


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    here = tmp_path_factory.mktemp("pipes")
    made = f"sqlite:///{here / 'p.db'}"
    crashed(made, here / "world", DOUBT_SID, DOUBT_TID)

    @tl.tool(effect="non_idempotent", high_impact=True)
    def pay(amount: int) -> str:
        return f"paid {amount}"

    script = [Reply(tool_uses=[ToolUse("pay", {"amount": 5}, id=WAIT_TID)]), Reply(text="ok")]
    with ScriptedModel(script) as model, tl.open_store(made) as store:
        agent = tl.Agent(
            client=model.client(), model="x", tools=[pay], store=store, approve=tl.approvals.queue
        )
        assert agent.run(session=WAIT_SID, prompt="go").status is tl.RunStatus.AWAITING_APPROVAL
        failed = dataclasses.replace(
            started(LEDGER_SID, "toolu_2"),
            status=tl.Status.FAILED,
            error='boom\tat C:\\tmp\n"done"',
            approved_by='ana\tat C:\\tmp\n"x"',
        )
        in_doubt = started(LEDGER_SID, LEDGER_TID, LEDGER_TOOL)
        store.backend.apply(LEDGER_SID, [InsertEffect(in_doubt), InsertEffect(failed)])
    return made


def piped(*argv: str) -> str:
    """What ``toolledger ARGV | cat`` receives, as UTF-8."""
    done = subprocess.run(
        [sys.executable, "-m", "toolledger", *argv], capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0 and done.stderr == b"", done.stderr
    return done.stdout.decode("utf-8")


def rows(out: str) -> list[dict[str, str]]:
    """The rows of each TSV table of ``out`` as printed (comment lines skipped)."""
    found: list[dict[str, str]] = []
    header: list[str] | None = None
    for line in out.splitlines():
        if line.startswith("# "):
            header = None
        elif header is None:
            header = line.split("\t")
        else:
            found.append(dict(zip(header, line.split("\t"), strict=True)))
    return found


def bash_words(command: str) -> list[str]:
    """The arguments bash gives ``toolledger`` for the pasted ``command``."""
    assert command.startswith("toolledger "), command
    done = subprocess.run(
        ["bash", "-c", f"printf '%s\\0' {command.removeprefix('toolledger ')}"],
        capture_output=True,
        check=False,
    )
    assert done.returncode == 0, (command, done.stderr)
    return [w.decode("utf-8", "surrogateescape") for w in done.stdout.split(b"\0")[:-1]]


def commands_in(text: str) -> list[str]:
    return re.findall(r"`(toolledger [^`]*)`", text)


def test_a_reason_in_a_pipe_names_its_commands_as_they_are_pasted(url: str) -> None:
    """``toolledger sessions | cat``: the reason cell holds the commands as the terminal shows
    them — not with every backslash doubled — and each, pasted, names the real ids."""
    by_session = {r["session"]: r for r in rows(piped("sessions", "--store", url))}
    store = f"--store {url}"

    doubt = by_session[r'ops\\x41 "q' + "'" + r"\u200b\u202e\x9bz"]
    sid = r"""$'ops\\x41 "q\'\xe2\x80\x8b\xe2\x80\xae\xc2\x9bz'"""
    tid = r"""$'toolu_a\\b"c\xe2\x80\x8bd\xe2\x80\xaee\xc2\x9b'"""
    assert doubt["reason"] == (
        r"""in doubt: 'create_ticket' (toolu_a\b"c\u200bd\u202ee\x9b) may already have """
        "happened. Settle each with one command: "
        f"`toolledger {store} resolve {sid} {tid} --happened` if it took effect, or "
        f"`toolledger {store} resolve {sid} {tid} --not-happened` if it did not, "
        "then run the session again."
    )
    pasted = [bash_words(c) for c in commands_in(doubt["reason"])]
    assert pasted == [
        ["--store", url, "resolve", DOUBT_SID, DOUBT_TID, how]
        for how in ("--happened", "--not-happened")
    ]

    wait = by_session['acct\\\\x41 "it\'s"']
    sid, tid = """'acct\\x41 "it'"'"'s"'""", """'toolu_b\\q'"'"'x'"""
    assert wait["reason"] == (
        r"""awaiting approval: 'pay' (toolu_b\q'x). Decide with """
        f"`toolledger {store} approve {sid} {tid} --in-doubt=no` or "
        f"`toolledger {store} deny {sid} {tid} --in-doubt=no`, then run the session again."
    )
    assert [shlex.split(c) for c in commands_in(wait["reason"])] == [
        ["toolledger", "--store", url, verb, WAIT_SID, WAIT_TID, "--in-doubt=no"]
        for verb in ("approve", "deny")
    ]


def test_a_command_pasted_from_a_piped_reason_runs_nothing_else(tmp_path: Path) -> None:
    """The session ``inv\\u200b'; touch PWNED; '``: its command quotes the id in ``$'…'`` with
    ``\\'`` for the quote. Doubled in a pipe, ``\\\\'`` ended the quoting and ``touch PWNED``
    ran. As printed now it settles that call, and nothing else runs."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    crashed(url, tmp_path / "world", TRAP_SID, "toolu_1")
    (row,) = rows(piped("sessions", "--store", url))
    command = next(c for c in commands_in(row["reason"]) if c.endswith("--not-happened"))
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    cwd = tmp_path / "here"
    cwd.mkdir()
    done = subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=env, capture_output=True, check=False
    )
    assert not (cwd / "PWNED").exists(), "the pasted command ran another one"
    assert done.returncode == 0, done.stderr
    with tl.open_store(url) as store:
        record = store.ledger(TRAP_SID).get("toolu_1")
    assert record is not None and record.status is tl.Status.NOT_HAPPENED
    assert command == (
        f"toolledger --store {url} resolve $'inv\\xe2\\x80\\x8b\\'; touch PWNED; \\'' toolu_1 "
        "--not-happened"
    )
    assert row["session"] == r"inv\u200b'; touch PWNED; '"


@pytest.mark.parametrize(
    ("argv", "column", "cell", "real"),
    [
        (["sessions"], "session", r"led\\x41\u200b", LEDGER_SID),
        (["effects", LEDGER_SID], "tool_use_id", r"toolu_t\x09ab\x0anl\\x41\u202e'q", LEDGER_TID),
        (["effects", LEDGER_SID], "tool", r"send\x09mail", LEDGER_TOOL),
        (["show", LEDGER_SID], "tool_use_id", r"toolu_t\x09ab\x0anl\\x41\u202e'q", LEDGER_TID),
        (["in-doubt"], "session", r"led\\x41\u200b", LEDGER_SID),
        (["in-doubt"], "tool_use_id", r"""toolu_a\b"c\u200bd\u202ee\x9b""", DOUBT_TID),
        (["approvals"], "session", 'acct\\\\x41 "it\'s"', WAIT_SID),
        (["approvals"], "tool_use_id", r"toolu_b\q'x", WAIT_TID),
        (["history", WAIT_SID], "tool_use_id", r"toolu_b\q'x", WAIT_TID),
    ],
)
def test_an_id_s_cell_in_a_pipe_is_the_id_as_shown_and_reads_back(
    url: str, argv: list[str], column: str, cell: str, real: str
) -> None:
    cells = [r[column] for r in rows(piped(*argv, "--store", url)) if r.get(column)]
    assert cell in cells, cells
    assert id_of(cell) == real


def test_in_doubt_commands_in_a_pipe_name_the_real_ids(url: str) -> None:
    """The commands a pipe gets from ``in-doubt`` name each call's real ids — a tab and a line
    break in one included."""
    found = rows(piped("in-doubt", "--store", url))
    calls = {(id_of(r["session"]), id_of(r["tool_use_id"])): r for r in found}
    assert set(calls) >= {(DOUBT_SID, DOUBT_TID), (LEDGER_SID, LEDGER_TID)}
    for (sid, tid), row in calls.items():
        for column, how in (("if it happened", "--happened"), ("if it did not", "--not-happened")):
            words = bash_words(row[column])
            assert words[-3:] == [sid, tid, how], words


def test_content_in_a_pipe_is_escaped_once(url: str) -> None:
    """Content is shown as on the terminal: a tab and a line break as ``\\x09``, ``\\x0a``, a
    backslash as it is (a preview folds whitespace): the cell is the records layout's line."""
    (row,) = [
        r for r in rows(piped("effects", LEDGER_SID, "--store", url)) if r["status"] == "failed"
    ]
    assert row["result / error"] == r'boom at C:\tmp "done"'
    assert row["approved by"] == r'ana\x09at C:\tmp\x0a"x"'


def test_a_call_judged_only_by_watching_is_a_comment_in_a_pipe(tmp_path: Path) -> None:
    """A call another host runs under a lease a file store can judge only by watching its
    renewals: ``in-doubt``'s remark about it is a ``# `` comment in a pipe, as every remark —
    never a line a script would read as the header of the table after it."""
    url = f"sqlite:///{tmp_path / 'watched.db'}"
    now = time.time()
    holder = Holder(host="another-host", pidns="1", pid=7, start=1)
    record = dataclasses.replace(
        make_record("s", "toolu_w", status=tl.Status.STARTED, at=now),
        holder=holder,
        lease_token=1,
        deadline=now + 600,
    )
    lease = Lease(
        session_id="s",
        owner="another-host:7:x",
        token=1,
        expires_at=now + 600,
        holder=holder,
        ttl=600,
    )
    with tl.open_store(url) as store:
        store.apply("s", [TakeLease(lease, expect_token=0), InsertEffect(record)])
    out = piped("in-doubt", "--store", url)
    remark = [line for line in out.splitlines() if "--watch" in line]
    assert remark and all(line.startswith("# ") for line in remark), out
    assert [(r["session"], r["tool_use_id"]) for r in rows(out)] == [("s", "toolu_w")]
