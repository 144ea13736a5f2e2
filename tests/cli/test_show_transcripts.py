"""``toolledger show`` reads each transcript through the provider of its kind: an OpenAI Chat
Completions or Responses API session is shown as an Anthropic one is — its calls, results and
texts, not Python reprs; secrets masked alike; markup and control characters shown literally."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
from toolledger.adapters.openai import ERROR_PREFIX
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

from .test_output import CONTROL, MARKUP, _cells, run


@tl.tool(effect="read_only")
def sign_in(user: str, password: str, api_key: str, headers: dict[str, str]) -> dict[str, Any]:
    """Sign in (a result whose text is markup and control characters)."""
    return {"authToken": "tok-SECRET-2", "user": user, "motd": MARKUP + CONTROL}


@tl.tool(effect="read_only")
def audit(note: str) -> str:
    """Always fails."""
    raise RuntimeError(f"audit down {CONTROL}{MARKUP}")


SIGN_IN = ToolUse(
    "sign_in",
    {
        "user": "ana",
        "password": "hunter2",
        "api_key": "sk-SECRET-3",
        "headers": {"Authorization": "Bearer abc123SECRET4"},
    },
)
SAID = "Signing in [bold]now[/bold]."
SIGN_IN_SCRIPT = [
    Reply(text=SAID, tool_uses=[SIGN_IN, ToolUse("audit", {"note": "x"})]),
    Reply(text="Signed in as ana."),
]
SECRETS = ("hunter2", "sk-SECRET-3", "abc123SECRET4", "tok-SECRET-2")


def _run_kind(kind: str, url: str) -> None:
    """The sign-in session, on Anthropic's Messages API or one of OpenAI's two APIs."""
    if kind == "anthropic":
        with ScriptedModel(SIGN_IN_SCRIPT) as model, tl.open_store(url) as store:
            tl.Agent(client=model.client(), model="x", tools=[sign_in, audit], store=store).run(
                session="s", prompt="sign in"
            )
        return
    from toolledger.testing.scripted_openai import ScriptedOpenAI

    with ScriptedOpenAI(SIGN_IN_SCRIPT) as openai_model, tl.open_store(url) as store:
        client = openai_model.client()
        if kind == "responses":
            client = tl.OpenAIResponses(client)
        tl.Agent(client=client, model="gpt", tools=[sign_in, audit], store=store).run(
            session="s", prompt="sign in"
        )


def _message_events(shown: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """What the transcript's events say, ids aside (each API mints its own), an error result's
    text without the prefix OpenAI results carry in place of an error flag."""
    out = []
    for e in shown:
        if e["event"].startswith("ledger"):
            continue
        detail = e["detail"]
        if e["event"].endswith("(is_error)"):
            detail = detail.removeprefix(ERROR_PREFIX)
        out.append((e["event"], detail))
    return out


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_openai_sessions_are_shown_as_anthropic_ones_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, api: str
) -> None:
    """``show`` reads each transcript through its own API: the same calls, results and texts as
    an Anthropic session, secret-looking inputs and results masked alike, markup and control
    characters shown, not obeyed."""
    pytest.importorskip("openai")
    urls = {kind: f"sqlite:///{tmp_path / (kind + '.db')}" for kind in ("anthropic", api)}
    shown = {}
    for kind, url in urls.items():
        _run_kind(kind, url)
        code, out = run(capsys, "show", "s", "--store", url, "--json")
        assert code == 0, out
        assert not any(secret in out for secret in SECRETS), out
        shown[kind] = json.loads(out)["timeline"]
    events = _message_events(shown[api])
    assert events == _message_events(shown["anthropic"])
    asked = json.loads(next(d for e, d in events if e == "model asks: sign_in"))
    assert asked == {
        "user": "ana",
        "password": "***",
        "api_key": "***",
        "headers": {"Authorization": "***"},
    }
    assert ("model", "Signed in as ana.") in events
    assert ("model", SAID) in events
    assert any(e == "→ model: tool_result (is_error)" and "audit down" in d for e, d in events)
    result = next(d for e, d in events if e == "→ model: tool_result")
    assert json.loads(result) == {"authToken": "***", "user": "ana", "motd": MARKUP + CONTROL}

    monkeypatch.setenv("COLUMNS", "400")
    code, out = run(capsys, "show", "s", "--store", urls[api])
    assert code == 0
    assert not any(secret in out for secret in SECRETS)
    assert "{'role'" not in out and "{'type'" not in out, "no Python reprs"
    assert "\x1b" not in out and "\x07" not in out, "control characters obeyed"
    assert "\\x1b[31m" in out, "an escape sequence is shown, escaped"
    flat = "".join(_cells(out).split())
    assert "".join(SAID.split()) in flat, "markup interpreted"
    assert "model asks: sign_in" in out and "→ model: tool_result (is_error)" in out
