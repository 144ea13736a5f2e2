"""Every optional dependency, when missing, is named with the extra that brings it: the error
says ``pip install 'toolledger[EXTRA]'`` (an import blocked here stands for a core install)."""

from __future__ import annotations

import subprocess
import sys

import pytest

CASES = {
    "anthropic": (
        "from toolledger.testing import ScriptedModel\nwith ScriptedModel([]) as m:\n    m.client()"
    ),
    "openai": (
        "from toolledger.testing.scripted_openai import ScriptedOpenAI\n"
        "with ScriptedOpenAI([]) as m:\n    m.client()"
    ),
    "postgres": "import toolledger as tl\ntl.open_store('postgresql://127.0.0.1:1/none')",
    "console": "from toolledger.cli.app import main\nraise SystemExit(main(['console', '--store', 'memory://x']))",
}
BLOCKED = {
    "anthropic": ["anthropic"],
    "openai": ["openai"],
    "postgres": ["psycopg", "psycopg_pool"],
    "console": ["starlette", "jinja2", "uvicorn"],
}
BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError(f"No module named {{name!r}} (blocked: a core install)")
sys.meta_path.insert(0, Block())
"""


@pytest.mark.parametrize("extra", sorted(CASES))
def test_a_missing_optional_dependency_names_its_extra(extra: str) -> None:
    program = BLOCK.format(blocked=BLOCKED[extra]) + CASES[extra]
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
    )
    said = done.stdout + done.stderr
    assert done.returncode != 0, said
    assert f"pip install 'toolledger[{extra}]'" in said, said
    assert "ConfigurationError" in said, said


INTEGRATIONS = {
    "langgraph": ("langgraph", ["langchain_core", "langgraph"]),
    "pydantic-ai": ("pydantic_ai", ["pydantic_ai"]),
    "openai-agents": ("openai_agents", ["agents"]),
    "agent-framework": ("agent_framework", ["agent_framework"]),
    "dbos": ("dbos", ["dbos"]),
}


@pytest.mark.parametrize("extra", sorted(INTEGRATIONS))
def test_an_integration_without_its_framework_names_its_extra(extra: str) -> None:
    module, blocked = INTEGRATIONS[extra]
    program = BLOCK.format(blocked=blocked) + f"import toolledger.integrations.{module}"
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
    )
    said = done.stdout + done.stderr
    assert done.returncode != 0, said
    assert f"pip install 'toolledger[{extra}]'" in said, said
