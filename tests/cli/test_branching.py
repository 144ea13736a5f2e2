"""``toolledger fork`` and ``toolledger rewind``, and the branches ``history`` and ``show`` print:
store data printed literally, secrets masked unless ``--show-secrets``, ids whole."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
from toolledger.cli.app import main
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

SESSION = "[red]s[/red] <i>x</i>"
LONG_ID = "toolu_" + "0123456789abcdef" * 4
SECRET = "hunter2"


@tl.tool(effect="read_only")
def look(q: str) -> str:
    """Look."""
    return "found"


@tl.tool(effect="non_idempotent")
def send(to: str, password: str) -> dict[str, str]:
    """Send a message."""
    return {"note": "[bold]sent[/bold]"}


TOOLS = tl.ToolSet([look, send])


@pytest.fixture
def url(tmp_path: Path) -> str:
    made = f"sqlite:///{tmp_path / 'b.db'}"
    script = [
        Reply(text="Looking.", tool_uses=[ToolUse("look", {"q": "x"})]),
        Reply(tool_uses=[ToolUse("send", {"to": "a@b", "password": SECRET}, id=LONG_ID)]),
        Reply(text="Sent."),
    ]
    with ScriptedModel(script) as model, tl.open_store(made) as store:
        agent = tl.Agent(client=model.client(), model="x", tools=TOOLS, store=store)
        assert agent.run(session=SESSION, prompt="go").status is tl.RunStatus.COMPLETED
    return made


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_fork_json_names_the_new_session_and_what_it_left_behind(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = run(
        capsys, "fork", SESSION, "--at-turn", "1", "--as", "<b>f</b>", "--store", url, "--json"
    )
    assert code == 0, out
    shown: dict[str, Any] = json.loads(out)
    assert shown["session_id"] == "<b>f</b>"
    branch = shown["branch"]
    assert (branch["kind"], branch["source"], branch["turn"], branch["told"]) == (
        "fork",
        SESSION,
        1,
        True,
    )
    (effect,) = branch["effects"]
    assert effect["tool_use_id"] == LONG_ID and effect["state"] == "succeeded"
    assert effect["input"] == {"to": "a@b", "password": "***"} and SECRET not in out
    with tl.open_store(url) as store:
        state = store.session("<b>f</b>")
        assert state is not None and state.status is tl.RunStatus.READY
        note = str(store.messages("<b>f</b>")[-1].content)
        assert LONG_ID in note and '"password": "***"' in note and SECRET not in note


def test_fork_and_rewind_print_store_data_literally(
    url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    code, out = run(
        capsys,
        "fork",
        SESSION,
        "--at-turn",
        "0",
        "--store",
        url,
        "--tools",
        "tests.cli.test_branching:TOOLS",
    )
    assert code == 0, out
    flat = "".join(out.split())
    assert "".join(f"forked {SESSION} at turn 0 into".split()) in flat  # markup shown, not obeyed
    assert LONG_ID in flat and SECRET not in out
    assert "look" not in out  # read_only: left out with --tools

    code, out = run(capsys, "rewind", SESSION, "--to-turn", "1", "--by", "ana", "--store", url)
    assert code == 0, out
    flat = "".join(out.split())
    assert "".join(f"rewound {SESSION} to turn 1".split()) in flat
    assert "abandonedbranch1" in flat and "byana" in flat and LONG_ID in flat

    code, out = run(capsys, "history", SESSION, "--store", url, "--json")
    shown = json.loads(out)
    assert [t["turn"] for t in shown["turns"]] == [1]
    (branch,) = shown["branches"]
    assert branch["kind"] == "rewind" and branch["branch"] == 1 and branch["by"] == "ana"
    assert [t["turn"] for t in branch["abandoned"]] == [2, 3]
    (call,) = branch["abandoned"][0]["calls"]
    assert call["tool_use_id"] == LONG_ID and call["disposition"] == "succeeded"
    assert call["input"]["password"] == "***"

    code, out = run(capsys, "history", SESSION, "--store", url)
    assert code == 0 and "".join(f"abandoned branch 1 of {SESSION}".split()) in "".join(out.split())
    code, out = run(capsys, "show", SESSION, "--store", url, "--json")
    (entry,) = json.loads(out)["lineage"]
    assert entry["effects"][0]["tool_use_id"] == LONG_ID
    code, out = run(capsys, "verify", "--store", url, "--json")
    assert code == 0, out
    # The export keeps what a removal would take: the lineage and the abandoned messages.
    code, out = run(capsys, "export", SESSION, "--store", url)
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[0]["lineage"][0]["branch"] == 1
    abandoned = [line for line in lines if line["kind"] == "abandoned"]
    assert [(a["branch"], a["seq"], a["role"]) for a in abandoned] == [
        (1, 3, "assistant"),
        (1, 4, "user"),
        (1, 5, "assistant"),
    ]
    assert SECRET not in out


def test_a_bad_branch_point_is_a_clear_error(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, "rewind", SESSION, "--to-turn", "7", "--store", url, "--json")
    assert code == 1
    shown = json.loads(out)
    assert shown["error"] == "BranchPointError" and "no turn 7" in shown["message"]
    code, out = run(capsys, "fork", "nobody", "--at-turn", "1", "--store", url, "--json")
    assert code == 1 and json.loads(out)["error"] == "NoSuchSession"
