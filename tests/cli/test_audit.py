"""``toolledger audit MODULE:TOOLSET``: the brief's six tools, and the warnings."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
from toolledger.cli.app import main
from toolledger.cli.audit import audit

ROOT = Path(__file__).parent.parent.parent


def audit_json(capsys: pytest.CaptureFixture[str], target: str) -> tuple[int, dict[str, Any]]:
    code = main(["audit", target, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_the_brief_six_tools(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("BRIEF_WORLD", str(tmp_path))
    code, report = audit_json(capsys, "examples.brief_tools:TOOLS")
    assert code == 0
    rows = {r["tool"]: (r["effect"], r["needs_approval"], r["risk"]) for r in report["tools"]}
    assert rows == {
        "read_file": ("read_only", False, "low"),
        "send_email": ("non_idempotent", True, "high"),
        "ensure_ticket": ("idempotent", False, "low"),
        "append_log": ("non_idempotent", False, "medium"),
        "set_config": ("idempotent", False, "low"),
        "delete_file": ("idempotent", True, "medium"),
    }
    by_tool = {r["tool"]: r for r in report["tools"]}
    assert "a person must resolve it" in by_tool["send_email"]["reason"]
    assert "only as good as its lookup" in by_tool["ensure_ticket"]["reason"]
    assert "'already gone' as success" in by_tool["delete_file"]["reason"]
    assert by_tool["send_email"]["on_resume"].startswith("never re-runs it silently")
    assert by_tool["delete_file"]["on_resume"] == "runs it again (approved once; not asked again)"
    assert report["warnings"] == []


def test_as_a_person_runs_it(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "toolledger.cli", "audit", "examples.brief_tools:TOOLS"],
        cwd=ROOT,
        env={"BRIEF_WORLD": str(tmp_path), "PATH": ""},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    first = [line.split() for line in proc.stdout.splitlines() if not line.startswith(" ")]
    assert [(w[0], w[-1]) for w in first] == [
        ("read_file", "low"),
        ("send_email", "high"),
        ("ensure_ticket", "low"),
        ("append_log", "medium"),
        ("set_config", "low"),
        ("delete_file", "medium"),
    ]


MODULE = """
import toolledger as tl

@tl.tool(effect="read_only")
def send_invoice(to: str) -> str:
    return "sent"

@tl.tool(effect="read_only")
def createTicket(title: str) -> str:
    return "created"

@tl.tool(effect="idempotent")
def append_row(row: str) -> str:
    return "appended"

@tl.tool(effect="read_only")
def list_sent_emails() -> list:
    return []

@tl.tool(effect="non_idempotent", forwards_idempotency_key=True, high_impact=True)
def charge(amount: int) -> str:
    return "charged"

@tl.tool(effect="non_idempotent")
def open_case(title: str) -> str:
    return "opened"

@open_case.check
def _(title: str) -> str | None:
    return None

@tl.tool(effect="read_only")
def read_file(path: str) -> str:
    return ""

@tl.tool(effect="read_only")
def search(q: str) -> str:
    return ""

MIXED = tl.ToolSet([send_invoice, createTicket, append_row, list_sent_emails, charge, open_case])
READERS = [read_file, search]
def factory():
    return tl.ToolSet([read_file])
"""


@pytest.fixture
def toolsets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "audit_sample_tools.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "audit_sample_tools", raising=False)


@pytest.mark.usefixtures("toolsets")
def test_names_that_contradict_their_declaration(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = audit_json(capsys, "audit_sample_tools:MIXED")
    assert code == 0
    warned = [w.split("'")[1] for w in report["warnings"]]
    assert warned == ["send_invoice", "createTicket", "append_row"], report["warnings"]
    assert "declared read_only, but its name says it sends" in report["warnings"][0]
    assert "declared idempotent" in report["warnings"][2]
    risks = {r["tool"]: r["risk"] for r in report["tools"]}
    assert risks["charge"] == "medium" and risks["open_case"] == "low"
    by_tool = {r["tool"]: r for r in report["tools"]}
    assert by_tool["charge"]["on_resume"] == "runs it again with the same idempotency key"
    assert by_tool["open_case"]["on_resume"].startswith("asks its check")


@pytest.mark.usefixtures("toolsets")
def test_a_read_only_toolset_may_not_need_a_ledger(capsys: pytest.CaptureFixture[str]) -> None:
    for target in ("audit_sample_tools:READERS", "audit_sample_tools:factory"):
        code, report = audit_json(capsys, target)
        assert code == 0
        assert report["warnings"] == [
            "every tool is read-only: a ledger may not be worth it here (a re-run costs nothing)"
        ]
    main(["audit", "audit_sample_tools:READERS"])
    assert "a ledger may not be worth it here" in capsys.readouterr().out


@pytest.mark.usefixtures("toolsets")
def test_bad_targets_are_reported(capsys: pytest.CaptureFixture[str]) -> None:
    for target, message in [
        ("audit_sample_tools", "expected MODULE:TOOLSET"),
        ("no_such_module_here:TOOLS", "cannot import"),
        ("audit_sample_tools:NOPE", "has no attribute"),
        ("audit_sample_tools:MODULE_NAME_IS_A_STRING", "has no attribute"),
    ]:
        assert main(["audit", target]) == 1
        assert message in capsys.readouterr().err


def test_a_file_s_name_is_not_imported_and_a_module_that_exits_is_said_to(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tools.py:TOOLS`` — a file's name where a module's goes, the likeliest slip — is refused
    before anything is imported (importing ``tools.py`` runs ``tools``, a script perhaps, then
    fails on ``py``), naming the module to write. A module that calls ``sys.exit`` as it is
    imported (a script) is one line saying so and where, not the end of the command; one whose
    code raises keeps its traceback, which is the user's to read."""
    ran = tmp_path / "ran"
    (tmp_path / "script_tools.py").write_text(
        f"import pathlib, sys\npathlib.Path({str(ran)!r}).touch()\nsys.exit('done')\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "script_tools", raising=False)
    for target in ("script_tools.py:TOOLS", "./script_tools.py:TOOLS"):
        assert main(["audit", target]) == 1
        err = capsys.readouterr().err
        assert "is a file's name" in err and "script_tools:TOOLS" in err, err
        assert not ran.exists(), "the file was run"
    assert main(["audit", "script_tools:TOOLS"]) == 1
    err = capsys.readouterr().err
    assert ran.exists()
    assert "importing 'script_tools' called sys.exit('done')" in err, err
    assert "script_tools.py:3)" in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    (tmp_path / "broken_tools.py").write_text('import json\nCONFIG = json.loads("{bad")\n')
    monkeypatch.delitem(sys.modules, "broken_tools", raising=False)
    with pytest.raises(json.JSONDecodeError):
        main(["audit", "broken_tools:TOOLS"])
    # A dotted name ending in ``py`` that is a module, not a file here, is imported as one.
    (tmp_path / "shapes").mkdir()
    (tmp_path / "shapes" / "__init__.py").write_text("")
    (tmp_path / "shapes" / "py.py").write_text(
        "import toolledger as tl\n\n\n@tl.tool(effect='read_only')\ndef f(a: int) -> int:\n"
        "    \n    return a\n\n\nTOOLS = tl.ToolSet([f])\n"
    )
    monkeypatch.delitem(sys.modules, "shapes", raising=False)
    assert main(["audit", "shapes.py:TOOLS"]) == 0, capsys.readouterr().err


def test_audit_is_a_pure_function() -> None:
    assert audit([]).warnings == ["the toolset is empty"]

    def plain(x: int) -> int:
        return x

    (row,) = audit([plain]).rows
    assert (row.effect, row.risk) == ("non_idempotent", "medium")
    assert audit(tl.ToolSet([plain])).rows == [row]


def test_a_function_that_needs_arguments_is_reported_not_called(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A target that names a function of other arguments (``json:loads`` for audit, one that
    takes no store for resume-all): one line saying what the command expected, no traceback."""
    assert main(["audit", "json:loads"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ConfigurationError: json:loads is a function of (s, "), err
    assert "no arguments" in err and "Traceback" not in err, err
    url = f"sqlite:///{tmp_path / 'r.db'}"
    tl.open_store(url).close()
    for target in ("os:getcwd", "os:rename"):
        assert main(["resume-all", "--agent", target, "--store", url]) == 2
        out = " ".join(capsys.readouterr().out.split())
        assert f"{target} is a function of (" in out, out
        assert "a function taking a store and returning one" in out, out


def test_a_factory_that_raises_is_reported_not_a_traceback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A function that can be called with what the command gives it but raises doing so
    (``json:loads`` handed the store by resume-all; a tools factory that fails): one line
    naming the factory, what it was to build and its error — exit 1, no traceback, and
    nothing resumed."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    tl.open_store(url).close()
    assert main(["resume-all", "--agent", "json:loads", "--store", url]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith(
        "ConfigurationError: json:loads raised TypeError while building an Agent"
    ), err
    assert "Traceback" not in err
    (tmp_path / "broken_tools.py").write_text(
        "def tools():\n    raise RuntimeError('no API key in the environment')\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["audit", "broken_tools:tools"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "broken_tools:tools raised RuntimeError while building a ToolSet: no API key" in err, err
