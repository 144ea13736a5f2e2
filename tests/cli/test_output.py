"""What the command line prints is data printed literally, whole, and safe to paste: markup and
control characters from a store are shown, not obeyed; ids and commands are never cut; printed
commands are shell-quoted; OpenAI transcripts are read as such and their secrets masked."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
from toolledger.cli.app import main
from toolledger.codec import input_hash
from toolledger.ops import InsertEffect
from toolledger.records import EffectRecord, Status
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

MARKUP = "[bold red]ALL OK[/] [/] [link=http://evil.example]click[/link]"
CONTROL = "\x1b[31mred\x1b[0m\x07"
EVIL_SESSION = "x; touch /tmp/PWNED # [red]"
LONG_ID = "toolu_" + "0123456789abcdef" * 4


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def left_started(store: tl.Store, session: str, tool_use_id: str, result: str = "") -> None:
    """A call the process died in the middle of (long ago: in doubt), one that succeeded with
    ``result`` and one that failed with ``result`` as its error (raw text, not JSON)."""
    started = EffectRecord(
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
    done = EffectRecord(
        session_id=session,
        tool_use_id=tool_use_id + "_done",
        tool="fetch",
        input_hash=input_hash({}),
        status=Status.SUCCEEDED,
        attempt=0,
        result=json.dumps(result),
        created_at=2.0,
        updated_at=2.0,
        worker="w",
    )
    failed = EffectRecord(
        session_id=session,
        tool_use_id=tool_use_id + "_failed",
        tool="fetch",
        input_hash=input_hash({}),
        status=Status.FAILED,
        attempt=0,
        error=result,
        created_at=3.0,
        updated_at=3.0,
        worker="w",
    )
    store.backend.apply(session, [InsertEffect(started), InsertEffect(done), InsertEffect(failed)])


@pytest.fixture
def url(tmp_path: Path) -> str:
    made = f"sqlite:///{tmp_path / 'l.db'}"
    with tl.open_store(made) as store:
        left_started(store, EVIL_SESSION, LONG_ID, result=CONTROL + MARKUP)
        left_started(store, MARKUP, "toolu_m", result="ok")
    return made


@pytest.mark.parametrize("columns", ["80", "120"])
def test_data_is_printed_literally_and_ids_whole(
    url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, columns: str
) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    for argv in (
        ["sessions"],
        ["effects", EVIL_SESSION],
        ["show", EVIL_SESSION],
        ["in-doubt"],
        ["effects", MARKUP],
    ):
        code, out = run(capsys, *argv, "--store", url)
        assert code == 0, (argv, out)
        assert "\x1b" not in out and "\x07" not in out, f"{argv}: control characters obeyed"
        flat = "".join(_cells(out).split())
        if argv[0] in ("sessions", "in-doubt"):
            assert "".join(MARKUP.split()) in flat, f"{argv}: markup interpreted"
        if argv[0] in ("effects", "in-doubt") and argv[-1] != MARKUP:
            assert LONG_ID in flat, f"{argv}: an id cut at {columns} columns"
    monkeypatch.setenv("COLUMNS", "400")  # wide enough that the result is not elided
    code, out = run(capsys, "effects", EVIL_SESSION, "--store", url)
    assert "\\x1b[31m" in out, "an escape sequence is shown, escaped"


def test_printed_commands_paste_whole_and_quoted(
    url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    code, out = run(capsys, "in-doubt", "--store", url)
    assert code == 0
    commands = [cell for line in out.splitlines() for cell in line.split("\t")]
    pasted = [shlex.split(c) for c in commands if c.startswith("toolledger ")]
    for session, call in ((EVIL_SESSION, LONG_ID), (MARKUP, "toolu_m")):
        for how in ("--happened", "--not-happened"):
            assert ["toolledger", "--store", url, "resolve", session, call, how] in pasted


def test_a_run_s_reason_names_the_real_call_quoted(tmp_path: Path) -> None:
    """needs_attention tells the command to run, whole: the real id, the store, quoted."""
    url = f"sqlite:///{tmp_path / 'l.db'}"

    @tl.tool
    def send_email(to: str) -> str:
        raise tl.OutcomeUnknown("the SMTP server hung up")

    with (
        ScriptedModel([Reply(tool_uses=[ToolUse("send_email", {"to": "a@b"})])]) as model,
        tl.open_store(url) as store,
    ):
        run = tl.Agent(client=model.client(), model="x", tools=[send_email], store=store).run(
            session=EVIL_SESSION, prompt="go"
        )
        (doubt,) = store.ledger(EVIL_SESSION).in_doubt()
    assert run.status is tl.RunStatus.NEEDS_ATTENTION
    assert run.reason is not None
    commands = re.findall(r"`(toolledger [^`]*)`", run.reason)
    assert [shlex.split(c) for c in commands] == [
        ["toolledger", "--store", url, "resolve", EVIL_SESSION, doubt.tool_use_id, how]
        for how in ("--happened", "--not-happened")
    ], run.reason
    assert "|" not in run.reason


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_an_openai_session_is_shown_as_calls_and_results_with_secrets_masked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, api: str
) -> None:
    pytest.importorskip("openai")
    from toolledger.testing.scripted_openai import ScriptedOpenAI

    @tl.tool(effect="read_only")
    def login(user: str, password: str) -> dict[str, Any]:
        return {"token": "tok-SECRET-1", "user": user}

    url = f"sqlite:///{tmp_path / 'l.db'}"
    script = [
        Reply(tool_uses=[ToolUse("login", {"user": "ana", "password": "hunter2"})]),
        Reply(text="Logged in."),
    ]
    with ScriptedOpenAI(script) as model, tl.open_store(url) as store:
        client = model.client() if api == "chat" else tl.OpenAIResponses(model.client())
        tl.Agent(client=client, model="gpt", tools=[login], store=store).run(
            session="s", prompt="log in"
        )
    monkeypatch.setenv("COLUMNS", "200")
    code, out = run(capsys, "show", "s", "--store", url)
    assert code == 0
    assert "model asks: login" in out and "→ model: tool_result" in out
    assert "tok-SECRET-1" not in out and "hunter2" not in out and "***" in out
    assert "{'role'" not in out, "no Python reprs"
    code, out = run(capsys, "show", "s", "--store", url, "--json")
    shown = json.loads(out)
    assert "tok-SECRET-1" not in out and any(
        e["event"] == "→ model: tool_result" for e in shown["timeline"]
    )
    long = [e["detail"] for e in shown["timeline"]]
    assert not any(d.endswith("…") for d in long), "JSON output is never truncated"


def _cells(out: str) -> str:
    """The text of a rich table, its cells' pieces joined back (a folded id is whole again)."""
    columns: dict[int, list[str]] = {}
    other: list[str] = []
    for line in out.splitlines():
        if "│" in line or "┃" in line:
            parts = re.split("[│┃]", line)
            for n, part in enumerate(parts):
                columns.setdefault(n, []).append(part.strip())
        else:
            other.append(line)
    joined = ["".join(cells) for cells in columns.values()]
    return "\n".join([*other, *joined])


KILLED_RUN = """
import sys, time
from pathlib import Path
import toolledger as tl
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

@tl.tool(effect="read_only")
def wait_forever(marker: str) -> str:
    Path(marker).write_text("in the tool")
    time.sleep(600)
    return "never"

with ScriptedModel([Reply(tool_uses=[ToolUse("wait_forever", {"marker": sys.argv[2]})])]) as m:
    with tl.open_store(sys.argv[1]) as store:
        tl.Agent(client=m.client(), model="x", tools=[wait_forever], store=store).run(
            session="killed", prompt="go"
        )
"""


def test_a_killed_session_is_listed_as_interrupted_not_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session whose process was SIGKILLed is still ``running`` in the store; the listing says
    nobody holds it and what to do, where a live one names its holder."""
    url = f"sqlite:///{tmp_path / 'l.db'}"
    marker = tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_RUN, url, str(marker)])
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the run never started"
            time.sleep(0.02)
        monkeypatch.setenv("COLUMNS", "200")
        code, out = run(capsys, "sessions", "--store", url)
        assert code == 0 and "nobody: interrupted" not in out, "alive: it is held"
        code, out = run(capsys, "sessions", "--store", url, "--json")
        (alive,) = json.loads(out)["sessions"]
        assert alive["lease"] is not None and alive["interrupted"] is False
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    code, out = run(capsys, "sessions", "--store", url)
    assert code == 0
    row = next(line for line in out.splitlines() if "killed" in line)
    assert "running" in row and "nobody: interrupted" in _cells(out)
    code, out = run(capsys, "sessions", "--store", url, "--json")
    (gone,) = json.loads(out)["sessions"]
    assert gone["status"] == "running" and gone["lease"] is None and gone["interrupted"] is True


def test_the_timeline_shows_an_intent_only_for_calls_that_write_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"

    @tl.tool(effect="read_only")
    def lookup(q: str) -> str:
        return "found"

    @tl.tool
    def send_email(to: str) -> str:
        return "sent"

    script = [
        Reply(tool_uses=[ToolUse("lookup", {"q": "a"})]),
        Reply(tool_uses=[ToolUse("send_email", {"to": "a@b"})]),
        Reply(text="done"),
    ]
    with ScriptedModel(script) as model, tl.open_store(url) as store:
        run_ = tl.Agent(
            client=model.client(), model="x", tools=[lookup, send_email], store=store
        ).run(session="s", prompt="go")
        assert run_.status is tl.RunStatus.COMPLETED
        ids = {r.tool: r.tool_use_id for r in store.ledger("s").records()}
    code, out = run(capsys, "show", "s", "--store", url, "--json")
    assert code == 0
    events = json.loads(out)["timeline"]
    intents = [e["tool_use_id"] for e in events if "intent" in e["event"]]
    assert intents == [ids["send_email"]], events
    settled = {e["tool_use_id"]: e["detail"] for e in events if e["event"].startswith("ledger:")}
    assert "no intent needed" in settled[ids["lookup"]]
    assert "attempt 1" in settled[ids["send_email"]]


def test_effects_json_puts_a_success_s_note_in_note_not_error(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = run(
        capsys, "resolve", EVIL_SESSION, LONG_ID, "--happened", "--by", "ana", "--store", url
    )
    assert code == 0, out
    code, out = run(capsys, "effects", EVIL_SESSION, "--store", url, "--json")
    by_id = {e["tool_use_id"]: e for e in json.loads(out)}
    resolved = by_id[LONG_ID]
    assert resolved["status"] == "succeeded" and resolved["error"] is None
    assert "ana" in resolved["note"]
    failed = by_id[LONG_ID + "_failed"]
    assert failed["error"] == CONTROL + MARKUP and failed["note"] is None


def test_deciding_a_used_approval_says_it_was_used_and_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"

    @tl.tool(high_impact=True)
    def wire(amount: int) -> str:
        return "wired"

    script = [Reply(tool_uses=[ToolUse("wire", {"amount": 3})]), Reply(text="ok")]
    with ScriptedModel(script) as model, tl.open_store(url) as store:
        agent = tl.Agent(
            client=model.client(), model="x", tools=[wire], store=store, approve=tl.approvals.queue
        )
        agent.run(session="pay", prompt="pay")
        (request,) = store.backend.read_approvals("pay")
        call = request.tool_use_id
        assert run(capsys, "approve", "pay", call, "--by", "ana", "--store", url)[0] == 0
        assert agent.run(session="pay").status is tl.RunStatus.COMPLETED
    code, out = run(capsys, "approve", "pay", call, "--store", url)
    assert code == 1
    flat = " ".join(out.split())
    assert "approved by ana" in flat and "has been used" in flat and url in flat
    code, out = run(capsys, "deny", "pay", "toolu_nope", "--store", url)
    flat = " ".join(out.split())
    assert code == 1 and "no approval request for 'toolu_nope'" in flat and url in flat


def test_top_level_help_gives_each_command_a_whole_sentence(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for command in ("resolve", "demo", "audit", "resume-all", "in-doubt", "show"):
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(command + " "))
        text = line.strip()[len(command) :].strip()
        assert text.endswith("."), f"{command}: help cut mid-sentence: {text!r}"


def stopped_in_doubt(url: str, *, queue: bool) -> tl.RunStatus:
    """A session ``s3`` whose ``send_email`` (``toolu_01``) is in doubt, stopped for a person:
    ``needs_attention``, or — with the approval queue, run once more — ``awaiting_approval``
    on the request to run it again."""

    @tl.tool
    def send_email(to: str) -> str:
        """Send."""
        raise tl.OutcomeUnknown("the mail server did not answer")

    script = [Reply(tool_uses=[ToolUse("send_email", {"to": "a@b.c"}, id="toolu_01")])]
    approve = tl.approvals.queue if queue else None
    with ScriptedModel([*script, Reply(text="done")]) as model, tl.open_store(url) as store:
        agent = tl.Agent(
            client=model.client(), model="m", tools=[send_email], store=store, approve=approve
        )
        run = agent.run(session="s3", prompt="mail")
        assert run.status is tl.RunStatus.NEEDS_ATTENTION
        if queue:
            run = agent.run(session="s3")
            assert run.status is tl.RunStatus.AWAITING_APPROVAL
            assert [a.in_doubt for a in tl.approvals.pending(store, "s3")] == [True]
    return run.status


@pytest.mark.parametrize("queue", [False, True], ids=["needs_attention", "awaiting_approval"])
def test_a_stop_reason_settled_since_says_so_and_points_to_the_next_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], queue: bool
) -> None:
    """A session stopped for a person keeps its run's reason, commands and all. Once a person
    settled the call, ``sessions`` and ``show`` — on a terminal, in a pipe, in JSON — still
    show the reason, and say it is settled since: run the session again (its resolve is refused
    now, its approve too)."""
    from .test_widths import in_terminal

    url = f"sqlite:///{tmp_path / 'q.db'}"
    status = stopped_in_doubt(url, queue=queue)

    def looked() -> dict[str, str]:
        seen = {f"{c} piped": run(capsys, c, *a, "--store", url)[1] for c, *a in LOOKS}
        seen |= {f"{c} on a terminal": in_terminal([c, *a, "--store", url], 200) for c, *a in LOOKS}
        return {where: " ".join(out.split()) for where, out in seen.items()}

    def in_json() -> list[dict[str, Any]]:
        (listed,) = json.loads(run(capsys, "sessions", "--store", url, "--json")[1])["sessions"]
        shown = json.loads(run(capsys, "show", "s3", "--store", url, "--json")[1])["session"]
        assert listed["reason"] == shown["reason"] and "resolve s3 toolu_01" in shown["reason"]
        assert listed["status"] == shown["status"] == status.value
        return [listed, shown]

    for where, out in looked().items():
        assert "may already have happened" in out, where
        assert "settled since" not in out, f"{where}: nothing is settled yet"
    before = in_json()

    assert main(["--store", url, "resolve", "s3", "toolu_01", "--happened", "--by", "ana"]) == 0
    capsys.readouterr()

    for where, out in looked().items():
        assert "may already have happened" in out, f"{where}: the stored reason is kept"
        assert "settled since: that was so when the run stopped" in out, where
        assert "Run the session again to go on (not the commands it names)" in out, where
    assert [s.get("settled_since") for s in before] == [False, False]
    assert [s.get("settled_since") for s in in_json()] == [True, True]
    # What it says is so: the reason's commands are spent.
    assert main(["--store", url, "resolve", "s3", "toolu_01", "--not-happened"]) == 1
    if queue:
        assert main(["--store", url, "approve", "s3", "toolu_01"]) == 1


LOOKS = [("sessions",), ("show", "s3")]


def test_a_stop_that_waited_on_no_call_is_not_called_settled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``needs_attention`` for something else than a call in doubt — a late outcome the ledger
    cannot vouch for — has no call in doubt from the start: nothing was settled since, and its
    reason is still what a person must look at."""
    from dataclasses import replace

    from toolledger.ops import PutSession
    from toolledger.testing.conformance import make_record, make_state

    url = f"sqlite:///{tmp_path / 'l.db'}"
    reason = "'create_ticket' (toolu_1) in session 's': attempt 1 took effect after it was settled"
    stopped = replace(make_state(status=tl.RunStatus.NEEDS_ATTENTION, version=2), reason=reason)
    done = make_record(status=Status.SUCCEEDED, result="T-1", at=stopped.updated_at - 1)
    with tl.open_store(url) as store:
        store.apply("s", [PutSession(stopped, None), InsertEffect(done)])
    for argv in (["sessions"], ["show", "s"]):
        code, out = run(capsys, *argv, "--store", url)
        assert code == 0 and reason in out and "settled since" not in out, argv
    (listed,) = json.loads(run(capsys, "sessions", "--store", url, "--json")[1])["sessions"]
    assert listed["reason"] == reason and listed["settled_since"] is False


def test_approving_a_call_in_doubt_says_it_runs_again_and_how_to_settle_it_instead(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The queue lists a request about a call in doubt as one whose yes runs it again; the yes
    itself says the call may already have happened and names the resolve that settles it
    instead — which still works after the yes, until the next run."""
    url = f"sqlite:///{tmp_path / 'q.db'}"
    stopped_in_doubt(url, queue=True)
    code, out = run(capsys, "approvals", "--store", url)
    (row,) = [line.split("\t") for line in out.splitlines() if line.startswith("s3\t")]
    assert code == 0 and "YES: approving runs it again" in row

    code, out = run(capsys, "approve", "s3", "toolu_01", "--by", "ana", "--store", url)
    assert code == 0
    flat = " ".join(out.split())
    assert "approved by ana" in flat
    assert "it may already have happened" in flat
    assert "the next run executes it again (a second effect if it had)" in flat
    assert "If it did happen, settle it instead" in flat
    resolve = f"toolledger --store {url} resolve s3 toolu_01 --happened"
    assert resolve in out.splitlines(), "the command alone on its line, to paste"
    assert run(capsys, *shlex.split(resolve)[1:])[0] == 0, "it settles the call after the yes"
    with tl.open_store(url) as store:
        assert store.ledger("s3").get("toolu_01").status is Status.SUCCEEDED  # type: ignore[union-attr]
    code, out = run(capsys, "approvals", "--all", "--store", url)
    assert "approving runs it again" not in out, "said of a request that waits, not a decided one"


def test_denying_a_call_in_doubt_says_it_is_still_in_doubt_and_how_to_settle_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A no to running a call in doubt again is not a word on whether it happened: the call
    stays in doubt and a run stops on it again. ``deny`` says so and prints the two resolves,
    each alone on its line; ``sessions`` does not call the stop settled since, nor send the
    person to a run instead of the commands that settle it."""
    url = f"sqlite:///{tmp_path / 'q.db'}"
    stopped_in_doubt(url, queue=True)
    code, out = run(capsys, "deny", "s3", "toolu_01", "--by", "ana", "--store", url)
    assert code == 0
    flat = " ".join(out.split())
    assert "denied by ana" in flat and "It is still in doubt" in flat
    assert "Run the session again to go on" not in flat, "a run would stop on it again"
    lines = out.splitlines()
    for flag in ("--happened", "--not-happened"):
        assert f"toolledger --store {url} resolve s3 toolu_01 {flag}" in lines
    for argv in (["sessions"], ["show", "s3"]):
        code, out = run(capsys, *argv, "--store", url)
        assert code == 0 and "settled since" not in out, argv
    (listed,) = json.loads(run(capsys, "sessions", "--store", url, "--json")[1])["sessions"]
    assert listed["settled_since"] is False, "the call still waits for a person"
    assert run(capsys, "resolve", "s3", "toolu_01", "--not-happened", "--store", url)[0] == 0
    (listed,) = json.loads(run(capsys, "sessions", "--store", url, "--json")[1])["sessions"]
    assert listed["settled_since"] is True, "settled now: the next run goes on"


def test_the_line_a_settling_command_prints_shows_its_ids_as_ids(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``resolve``, ``approve`` and ``deny`` confirm what they settled by its ids, shown as ids
    are everywhere: a character that shows nothing (a word joiner, a zero-width space) is
    written out, never sent raw, so two ids that look alike never read as one."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    hidden = "toolu_a\u2060b\u200bc"
    with tl.open_store(url) as store:
        left_started(store, "s", hidden)
        approvals = [
            tl.approvals.queue(
                tl.ApprovalRequest(
                    session_id="s",
                    tool_use_id=f"{hidden}_{n}",
                    tool="wire\u2060money",
                    input={},
                    in_doubt=False,
                    reason="high impact",
                    input_hash=input_hash({}),
                    ledger=store.ledger("s"),
                )
            )
            for n in (1, 2)
        ]
        assert all(d.pending for d in approvals), "queued for a person"
    printed = [
        run(capsys, "resolve", "s", hidden, "--not-happened", "--by", "ana", "--store", url),
        run(capsys, "approve", "s", f"{hidden}_1", "--by", "ana", "--store", url),
        run(capsys, "deny", "s", f"{hidden}_2", "--by", "ana", "--store", url),
    ]
    for code, out in printed:
        assert code == 0, out
        assert "\u2060" not in out and "\u200b" not in out, out
        assert "toolu_a\\u2060b\\u200bc" in out, out
    assert "wire\\u2060money" in printed[1][1]


def test_settling_names_the_session_and_a_mistyped_session_is_said_to_be_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A call's id is unique only within its session: ``resolve``, ``approve`` and ``deny``
    name the session they settled. A session the store does not hold — a typo, most likely —
    is said to be unknown, as ``show`` says it, with the command that lists the sessions; not
    that the call has no record or request there."""
    url = f"sqlite:///{tmp_path / 'q.db'}"
    stopped_in_doubt(url, queue=True)
    for argv in (
        ["resolve", "s33", "toolu_01", "--happened"],
        ["approve", "s33", "toolu_01"],
        ["deny", "s33", "toolu_01"],
    ):
        code, out = run(capsys, *argv, "--store", url)
        assert code == 1, (argv, out)
        assert f"no session 's33' in {url}" in out, (argv, out)
        assert f"toolledger --store {url} sessions" in out.splitlines(), (argv, out)
    code, out = run(capsys, "resolve", "s3", "toolu_02", "--happened", "--store", url)
    assert code == 1 and "NotInDoubtError" in out and "no session" not in out, out
    code, out = run(capsys, "approve", "s3", "toolu_02", "--store", url)
    assert code == 1 and "NotPendingError" in out and "no session" not in out, out

    code, out = run(
        capsys, "resolve", "s3", "toolu_01", "--happened", "--by", "ana", "--store", url
    )
    assert code == 0 and "toolu_01 in session s3 resolved: succeeded (by ana)" in out, out
    other = url.replace("q.db", "r.db")
    stopped_in_doubt(other, queue=True)
    code, out = run(capsys, "deny", "s3", "toolu_01", "--by", "ana", "--store", other)
    assert code == 0 and "send_email (toolu_01) in session s3: denied by ana" in out, out
