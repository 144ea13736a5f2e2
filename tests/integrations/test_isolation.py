"""The core imports no integration, and no framework: ``import toolledger`` works without them."""

from __future__ import annotations

import subprocess
import sys


def test_the_core_imports_no_framework() -> None:
    code = (
        "import sys, toolledger, toolledger.integrations\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('langgraph', 'langchain_core', 'pydantic_ai') "
        "or m in ('toolledger.integrations.langgraph', 'toolledger.integrations.pydantic_ai'))\n"
        "assert not loaded, loaded\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
