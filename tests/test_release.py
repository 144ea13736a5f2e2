"""The release as a user gets it: ``python -m build`` makes an sdist and a wheel whose metadata
``twine check`` passes, carrying the version written in ``toolledger/_version.py``; the wheel
installed alone into a fresh virtual environment — the core, no optional SDK — runs
``toolledger demo`` to its end, and says in one line which extra its own agents would need."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

import toolledger

ROOT = Path(__file__).parents[1]

pytestmark = pytest.mark.slow


def run(*argv: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
    )
    assert done.returncode == 0, f"{argv}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_the_built_wheel_installed_alone_runs_the_demo(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    run(sys.executable, "-m", "build", "--outdir", dist, ROOT)
    wheel, sdist = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    version = toolledger.__version__
    assert [w.name for w in wheel] == [f"toolledger-{version}-py3-none-any.whl"]
    assert [s.name for s in sdist] == [f"toolledger-{version}.tar.gz"]
    run(sys.executable, "-m", "twine", "check", "--strict", *wheel, *sdist)
    with zipfile.ZipFile(wheel[0]) as z:
        names = set(z.namelist())
        metadata = z.read(f"toolledger-{version}.dist-info/METADATA").decode()
    assert "toolledger/py.typed" in names and "toolledger/__main__.py" in names
    assert any(n.startswith("toolledger/console/templates/") for n in names)
    assert f"Version: {version}" in metadata

    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    python = env / "bin" / "python"
    run(python, "-m", "pip", "install", "--quiet", wheel[0])
    installed = run(python, "-m", "pip", "list", "--format=freeze").lower()
    for optional in ("anthropic", "openai", "psycopg", "starlette", "mcp"):
        assert f"\n{optional}==" not in f"\n{installed}", f"{optional} came with the core"
    out = run(env / "bin" / "toolledger", "demo", cwd=tmp_path)
    flat = " ".join(out.split())
    assert "nothing happened twice" in flat, out
    assert "pip install 'toolledger[anthropic]'" in flat, out
    assert run(python, "-m", "toolledger", "--help").startswith("usage: toolledger")
