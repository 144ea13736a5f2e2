"""Kill and resume with an MCP toolset: the agent process is ``SIGKILL``ed at every crash point,
for every recovery strategy (declared through MCP annotations and overrides), and resumed.

The effects are counted on the MCP server's side (its ticket files and execution log), and the
assertions are those of the Anthropic crash matrix (tests/agent/test_crash_matrix.py). Every run
starts a real MCP server over stdio (about 0.7 s of imports), so this matrix runs one call per
turn (the two-call cases exercise the runner, which is the same code: the Anthropic and OpenAI
matrices run them) at every point, on SQLite: 20 cases.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from toolledger._crash import POINTS
from toolledger.testing.scripted import ScriptedModel
from toolledger.testing.world import KINDS, World

from ..conftest import url_for
from ..crashcase import assert_one_effect_per_call, crash_and_recover, script
from .mcp_agent import MCPSpec, run_mcp_agent

CASES = [(point, kind, 1) for point in POINTS for kind in KINDS]


@pytest.mark.parametrize(("point", "kind", "calls"), CASES)
def test_mcp_crash_matrix(point: str, kind: str, calls: int, tmp_path: Path) -> None:
    world = World(tmp_path / "world")
    with ScriptedModel(script(kind, calls)) as model:
        spec = MCPSpec(
            store_url=url_for("sqlite", tmp_path), base_url=model.url, world=str(world.path)
        )
        crash_and_recover(
            lambda at: run_mcp_agent(spec, crash_at=at),
            spec.store_url,
            point=point,
            kind=kind,
            calls=calls,
        )
        assert model.rejected == [], "every request obeyed the pairing rule"
        final = model.requests[-1]["messages"][-1]
        results = [b for b in final["content"] if b["type"] == "tool_result"]
        assert len(results) == calls and not any(r.get("is_error") for r in results)
    executions = assert_one_effect_per_call(world, kind, calls)  # counted on the server's side
    if kind in ("checked", "keyed"):
        assert all(e["key"] and e["key"].startswith("tl-") for e in executions), (
            "every call carried its idempotency key in _meta"
        )
