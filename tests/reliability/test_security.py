"""Security: owner-only files whatever the umask, secrets masked by the command line, and no
deserialisation or evaluation of stored data anywhere in the code. The threat model is
docs/security.md; the ``redact=`` hook (scrubbing before anything is stored) is tested in
tests/test_redact.py.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
from toolledger.cli.app import main
from toolledger.masking import TOO_DEEP, is_secret_key, masked, masked_text
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

SRC = Path(tl.__file__).parent

# -- nothing in the code turns stored bytes into code ------------------------------------------

FORBIDDEN = {
    r"\bpickle\b": "pickle runs code while it loads",
    r"\bcPickle\b|\bdill\b|\bcloudpickle\b": "pickle by another name",
    r"\bmarshal\b|\bshelve\b": "unsafe serialisation",
    r"(?<![\w.])eval\(": "eval",
    r"(?<![\w.])exec\(": "exec",
    r"\byaml\.(?:unsafe_)?load\(|\byaml\.load_all\(": "yaml.load constructs arbitrary objects",
    r"\b__import__\(": "imports named by data",
    r"\bsubprocess\.[a-z_]+\([^)]*shell\s*=\s*True": "a shell",
}


def test_no_pickle_eval_or_exec_anywhere_in_the_code() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for pattern, why in FORBIDDEN.items():
                if re.search(pattern, line):
                    found.append(f"{path.relative_to(SRC)}:{number}: {why}: {line.strip()}")
    assert found == []


def test_the_forbidden_patterns_do_match() -> None:
    """The scan above is not vacuous."""
    samples = [
        "import pickle",
        "x = eval(text)",
        "exec(code)",
        "yaml.load(f)",
        "__import__(name)",
        "subprocess.run(cmd, shell=True)",
    ]
    for sample in samples:
        assert any(re.search(p, sample) for p in FORBIDDEN), sample
    assert not any(re.search(p, "ast.literal_eval(x); self.evaluate(y)") for p in FORBIDDEN)


# -- owner-only files ---------------------------------------------------------------------------


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The most permissive umask a user could have."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.parametrize("kind", ["sqlite", "json"])
@pytest.mark.usefixtures("open_umask")
def test_every_file_of_a_store_is_owner_only_whatever_the_umask(kind: str, tmp_path: Path) -> None:
    root = tmp_path / "new" / "dir"
    url = f"sqlite:///{root / 'agent.db'}" if kind == "sqlite" else f"json:///{root}"

    @tl.tool
    def create_ticket(title: str) -> str:
        return "T-1"

    script = [Reply(tool_uses=[ToolUse("create_ticket", {"title": "x"})]), Reply(text="ok")]
    with ScriptedModel(script) as model, tl.open_store(url) as store:
        agent = tl.Agent(client=model.client(), model="m", tools=[create_ticket], store=store)
        agent.run(session="s", prompt="go")
        made = sorted(root.rglob("*"))  # while open: the WAL and shared-memory files too
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in made}
    assert len(made) >= 2
    assert {n: m for n, m in modes.items() if m != 0o600} == {}, "files readable by others"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


# -- the command line masks secrets -------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("password", True),
        ("db_password", True),
        ("Passphrase", True),
        ("api_key", True),
        ("apiKey", True),
        ("APIKEY", True),
        ("X-Api-Key", True),
        ("access_token", True),
        ("authToken", True),
        ("Authorization", True),
        ("client_secret", True),
        ("aws_secret_access_key", True),
        ("credentials", True),
        ("Cookie", True),
        ("private_key", True),
        ("pwd", True),
        ("db_pwd", True),
        ("passcode", True),
        ("auth", True),
        ("basic_auth", True),
        ("bearer", True),
        ("jwt", True),
        ("idToken", True),
        ("oauth_token", True),
        ("max_tokens", False),
        ("input_tokens", False),
        ("author", False),
        ("keyboard", False),
        ("title", False),
        ("monkey", False),
        ("authority", False),
        ("authored_by", False),
        ("password_changed_at", True),
    ],
)
def test_which_fields_are_secret(key: str, secret: bool) -> None:
    assert is_secret_key(key) is secret


def test_masking_reaches_every_level_and_keeps_the_shape() -> None:
    value = {"a": [{"token": "t", "n": 1}], "password": None, "headers": {"Cookie": ["c"]}}
    assert masked(value) == {"a": [{"token": "***", "n": 1}], "password": None,
                             "headers": {"Cookie": "***"}}  # fmt: skip


def test_header_pairs_url_passwords_and_credentials_in_strings_are_masked() -> None:
    headers = [
        {"name": "Authorization", "value": "Bearer abc.def-123"},
        {"name": "Accept", "value": "text/html"},
        {"key": "X-Api-Key", "value": "k-1"},
        {"header": "Cookie", "value": "sid=9"},
    ]
    assert masked(headers) == [
        {"name": "Authorization", "value": "***"},
        {"name": "Accept", "value": "text/html"},
        {"key": "X-Api-Key", "value": "***"},
        {"header": "Cookie", "value": "***"},
    ]
    assert masked("postgres://app:s3cr3t@db:5432/x") == "postgres://app:***@db:5432/x"
    assert masked({"dsn": "https://u:p%40ss@h/p", "url": "https://h/p?q=1"}) == {
        "dsn": "https://u:***@h/p",
        "url": "https://h/p?q=1",
    }
    assert masked("curl -H 'Authorization: Bearer eyJhbGciOi.J9x' x") == (
        "curl -H 'Authorization: Bearer ***' x"
    )
    assert masked("Basic dXNlcjpwYXNz== then") == "Basic *** then"
    prose = "Basic arithmetic, a Bearer of news, user@host and mailto:a@b stay as they are"
    assert masked(prose) == prose
    assert masked_text('"postgres://a:b@h"') == '"postgres://a:***@h"'
    assert masked_text("not json: https://a:b@h") == "not json: https://a:***@h"


def test_json_held_in_a_string_is_masked_as_the_json_it_holds() -> None:
    """OpenAI's ``arguments`` and every stored tool result are JSON in a string."""
    call = {"function": {"name": "f", "arguments": '{"user":"ana","password":"p1"}'}}
    assert masked(call) == {
        "function": {"name": "f", "arguments": '{"user": "ana", "password": "***"}'}
    }
    nested = json.dumps({"output": json.dumps({"token": "t1"})})
    assert json.loads(json.loads(masked_text(nested))["output"]) == {"token": "***"}
    assert masked("[not json] token=t1") == "[not json] token=t1"
    assert masked_text('{"a": "\\ud800", "token": "t1"}') == '{"a": "\\ud800", "token": "***"}'


def test_a_value_keeps_its_text_unless_a_secret_was_taken_out_of_it() -> None:
    """A string inside a value (what export writes) that holds JSON with nothing to mask is
    kept byte for byte — its spacing, its escapes, its numbers — where a display shows it
    written again (``masked_text``)."""
    held = '{"b":  0.10000000000000000555, "e": "\\u00e9", "n": [1,2]}'
    assert masked({"content": held}) == {"content": held}
    assert masked_text(held) == '{"b": 0.1, "e": "é", "n": [1, 2]}'


def test_json_nested_past_the_interpreters_limit_is_masked_whole_not_raised() -> None:
    """A result nested deeper than masking can look through (``json.loads`` reads it) is shown
    masked whole — it may hold a secret — instead of failing the display or the export."""
    deep = "[" * 900 + '{"token": "t1"}' + "]" * 900
    assert masked(deep) == TOO_DEEP and masked_text(deep) == TOO_DEEP
    assert masked({"content": [{"type": "tool_result", "content": deep}]}) == TOO_DEEP


def test_a_urls_password_is_found_beside_long_runs_of_letters() -> None:
    """The URL-password pattern starts a scheme only where no scheme character precedes it
    (tried once per run of them, not at each); a long hex blob is left as it is, and a
    URL between two of them is still found."""
    blob = "ab12" * 5_000
    assert masked_text(blob) == blob
    assert masked_text(f"{blob} postgres://u:pw@h {blob}") == f"{blob} postgres://u:***@h {blob}"


SECRETS = ["sk-live-4f9a", "tok-7c2e", "Bearer-e81d", "hunter2-b5"]


@pytest.fixture
def store_with_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A session whose tool input and result hold secrets, and a queued approval whose input
    does."""
    monkeypatch.setenv("COLUMNS", "400")  # wide tables: nothing is cut off by accident
    url = f"sqlite:///{tmp_path / 'cli.db'}"

    @tl.tool
    def connect(user: str, api_key: str) -> dict[str, Any]:
        """Open an API session."""
        return {
            "session_token": SECRETS[1],
            "max_tokens": 4096,
            "headers": [{"Authorization": SECRETS[2]}],
        }

    @tl.tool(high_impact=True)
    def rotate(user: str, password: str) -> str:
        """Set a new password."""
        return "rotated"

    script = [
        Reply(tool_uses=[ToolUse("connect", {"user": "ana", "api_key": SECRETS[0]})]),
        Reply(tool_uses=[ToolUse("rotate", {"user": "ana", "password": SECRETS[3]})]),
        Reply(text="done"),
    ]
    with ScriptedModel(script) as model, tl.open_store(url) as store:
        agent = tl.Agent(
            client=model.client(),
            model="m",
            tools=[connect, rotate],
            store=store,
            approve=tl.approvals.queue,
        )
        assert agent.run(session="s", prompt="go").status is tl.RunStatus.AWAITING_APPROVAL
    return url


COMMANDS = [["show", "s"], ["effects", "s"], ["approvals"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_show_effects_and_approvals_mask_secret_fields(
    store_with_secrets: str, command: list[str], as_json: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*command, "--store", store_with_secrets, *(["--json"] if as_json else [])]
    assert main(argv) == 0
    shown = capsys.readouterr().out
    assert "***" in shown
    assert not [s for s in SECRETS if s in shown], shown
    if as_json:
        json.loads(shown)
    assert main([*argv, "--show-secrets"]) == 0
    revealed = capsys.readouterr().out
    expected = {  # what fits in each view: tables and timelines show previews
        "show": [SECRETS[0], SECRETS[1], SECRETS[3]],
        "effects": SECRETS[1:3] if as_json else SECRETS[1:2],
        "approvals": SECRETS[3:],
    }
    assert all(s in revealed for s in expected[command[0]]), revealed
    if command[0] != "approvals":
        assert "4096" in shown, "max_tokens is not a secret"
