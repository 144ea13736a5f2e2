"""Every code block of the README and the documentation runs, or says it is a fragment.

A ``python`` block is a complete program — imports included, every name defined — run here
against the scripted model and a local store, in a directory of its own; or its fence says
``title="fragment: …"`` and its page also holds a complete program, or the title names one in
``examples/`` (each run by ``tests/test_examples.py``) or ``tests/`` (run by the suite). In a
shell block, every ``toolledger`` command parses, every ``make`` target exists and every
``pip install 'toolledger[…]'`` names extras that exist.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from toolledger.cli.app import build_parser

ROOT = Path(__file__).parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(
    r"^(?P<indent> *)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```\s*$", re.M | re.S
)
EXAMPLE = re.compile(r"(?:examples|tests)/[\w/]+\.py")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    info: str
    body: str

    @property
    def fragment(self) -> bool:
        return 'title="fragment' in self.info

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for m in FENCE.finditer(text):
        info = m["info"].strip()
        lang = info.split()[0] if info else ""
        body = "\n".join(line[len(m["indent"]) :] for line in m["body"].splitlines())
        found.append(Block(page, text.count("\n", 0, m.start()) + 1, lang, info, body))
    return found


ALL = [b for page in PAGES for b in blocks(page)]
PYTHON = [b for b in ALL if b.lang == "python"]
SHELL = [b for b in ALL if b.lang in ("sh", "bash", "shell", "console")]


def test_the_pages_are_found() -> None:
    assert len(PAGES) > 20 and len(PYTHON) > 10 and len(SHELL) > 5


@pytest.mark.parametrize("block", [b for b in PYTHON if not b.fragment], ids=str)
def test_a_python_block_runs(block: Block, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLLEDGER_")}
    done = subprocess.run(
        [sys.executable, "-c", block.body],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{block} does not run:\n{done.stdout}\n{done.stderr}"


@pytest.mark.parametrize("block", [b for b in PYTHON if b.fragment], ids=str)
def test_a_fragment_stands_beside_a_complete_program(block: Block) -> None:
    page = [b for b in blocks(block.page) if b.lang == "python" and not b.fragment]
    named = [p for p in EXAMPLE.findall(block.info) if (ROOT / p).is_file()]
    assert page or named, f"{block} is a fragment with no complete program beside it"


MAKEFILE = (ROOT / "Makefile").read_text()
EXTRAS = set(
    tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
)


def commands(block: Block) -> list[str]:
    out = []
    for raw in block.body.splitlines():
        line = raw.strip().removeprefix("$ ")
        if not line or line.startswith("#"):
            continue
        out.append(line.split("  #")[0].split(" # ")[0].strip())
    return out


@pytest.mark.parametrize("block", SHELL, ids=str)
def test_a_shell_block_names_real_commands(block: Block) -> None:
    parser = build_parser()
    for line in commands(block):
        argv = shlex.split(line)
        if argv[:3] == ["python", "-m", "toolledger"]:
            argv = ["toolledger", *argv[3:]]
        if argv[0] == "toolledger":
            try:
                parser.parse_args(argv[1:])
            except SystemExit as exc:
                if exc.code != 0:
                    pytest.fail(f"{block}: `{line}` does not parse")
        elif argv[0] == "make":
            for target in (a for a in argv[1:] if "=" not in a):
                assert re.search(rf"^{re.escape(target)}:", MAKEFILE, re.M), f"{block}: {line}"
        elif argv[:2] == ["pip", "install"]:
            for spec in argv[2:]:
                m = re.fullmatch(r"toolledger(?:\[(.*)\])?", spec)
                assert m is not None, f"{block}: {line}"
                wanted = set(filter(None, (m[1] or "").split(",")))
                assert wanted <= EXTRAS, f"{block}: no extra {wanted - EXTRAS}"


def test_the_readme_quickstart_runs_again_on_a_store_that_lasts(tmp_path: Path) -> None:
    """The README's advice on its quickstart, taken literally: give it a store that lasts
    (``sqlite:///agent.db`` instead of a new temporary directory) and run it again — the
    second run, a new process on the same store, succeeds too."""
    (quickstart,) = [b for b in blocks(ROOT / "README.md") if "ScriptedModel" in b.body]
    temporary = "f\"sqlite:///{Path(tempfile.mkdtemp()) / 'agent.db'}\""
    assert temporary in quickstart.body, "the quickstart's store is no longer where it was"
    program = quickstart.body.replace(temporary, '"sqlite:///agent.db"')
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLLEDGER_")}
    for run in ("first", "again"):
        done = subprocess.run(
            [sys.executable, "-c", program],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"{run} run:\n{done.stdout}\n{done.stderr}"
