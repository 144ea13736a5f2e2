"""``toolledger history``: a session's turns printed literally (markup and HTML from the store
are shown, not obeyed), secrets masked unless ``--show-secrets``, ids whole; ``--json`` whole."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
from toolledger.cli.app import main
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse
from toolledger.testing.world import World

from .test_cli import crashed
from .test_output import _cells

__all__ = ["crashed"]  # a fixture, shared with test_cli

SESSION = "[red]s[/red] <i>x</i>"
SAID = "[bold]Sending[/bold] <script>alert(1)</script>"
TOLD = "[red]x[/red] <b>hi</b>"
LONG_ID = "toolu_" + "0123456789abcdef" * 4


@tl.tool(effect="non_idempotent")
def send(to: str, password: str) -> dict[str, str]:
    """Send a message."""
    return {"note": TOLD, "api_key": "sk-live-123"}


TOOLS = tl.ToolSet([send])


@pytest.fixture
def url(tmp_path: Path) -> str:
    made = f"sqlite:///{tmp_path / 'h.db'}"
    script = [
        Reply(
            text=SAID,
            tool_uses=[ToolUse("send", {"to": "a@b", "password": "hunter2"}, id=LONG_ID)],
        ),
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


def test_history_json_is_whole_and_masked(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, "history", SESSION, "--store", url, "--json")
    assert code == 0
    shown: dict[str, Any] = json.loads(out)
    assert shown["session_id"] == SESSION
    first, second = shown["turns"]
    assert (first["turn"], first["text"], second["turn"], second["text"]) == (1, SAID, 2, "Sent.")
    (call,) = first["calls"]
    assert call["tool_use_id"] == LONG_ID and call["tool"] == "send"
    assert call["disposition"] == "succeeded" and call["effect"] is None
    assert call["input"] == {"to": "a@b", "password": "***"}
    assert "hunter2" not in out and "sk-live-123" not in out
    assert TOLD in json.loads(call["result"])["note"]

    code, out = run(
        capsys,
        "history",
        SESSION,
        "--store",
        url,
        "--json",
        "--show-secrets",
        "--tools",
        "tests.cli.test_history:TOOLS",
    )
    (call,) = json.loads(out)["turns"][0]["calls"]
    assert call["input"]["password"] == "hunter2" and "sk-live-123" in call["result"]
    assert call["effect"] == "non_idempotent"


@pytest.mark.parametrize("columns", ["80", "200"])
def test_history_table_prints_store_data_literally(
    url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, columns: str
) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    code, out = run(capsys, "history", SESSION, "--store", url)
    assert code == 0, out
    flat = "".join(_cells(out).split())
    assert "".join(f"history of {SESSION}".split()) in "".join(out.split()), "title markup"
    assert LONG_ID in flat, f"an id cut at {columns} columns"
    assert "hunter2" not in out and "sk-live-123" not in out
    assert '"password":"***"' in flat
    if columns == "200":  # wide enough that the previews are whole
        assert "".join(SAID.split()) in flat, "the model's text is shown, markup and all"
        assert "".join(TOLD.split()) in flat, "the result is shown, markup and all"


def test_history_of_an_unknown_session(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, "history", "nope", "--store", url, "--json")
    assert code == 1 and json.loads(out)["error"] == "NoSuchSession"


def test_history_shows_a_call_left_in_doubt_by_a_kill(
    crashed: tuple[str, World], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = crashed
    code, out = run(capsys, "history", "broken", "--store", url, "--json")
    assert code == 0
    (turn,) = json.loads(out)["turns"]
    (call,) = turn["calls"]
    code, doubts = run(capsys, "in-doubt", "--store", url, "--json")
    (doubt,) = json.loads(doubts)
    assert (call["tool_use_id"], call["tool"]) == (doubt["tool_use_id"], "create_ticket")
    assert call["disposition"] == "in_doubt" and call["why"]
    # the session stopped for a person (needs_attention): the model has not been answered
    assert call["result"] is None
    code, table = run(capsys, "history", "broken", "--store", url)
    assert "in_doubt" in table and doubt["tool_use_id"] in "".join(_cells(table).split())
