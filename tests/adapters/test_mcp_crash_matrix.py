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

import toolledger as tl
from toolledger._crash import POINTS
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse
from toolledger.testing.world import KINDS, TOOL_OF_KIND, World

from ..conftest import url_for
from .mcp_agent import MCPSpec, run_mcp_agent

KILLED = -9
CASES = [(point, kind, 1) for point in POINTS for kind in KINDS]


def needs_intent(kind: str) -> bool:
    return kind in ("plain", "checked")


@pytest.mark.parametrize(("point", "kind", "calls"), CASES)
def test_mcp_crash_matrix(point: str, kind: str, calls: int, tmp_path: Path) -> None:
    world = World(tmp_path / "world")
    tool_name = TOOL_OF_KIND[kind]
    script = [
        Reply(
            text="Opening tickets.",
            tool_uses=[ToolUse(tool_name, {"title": f"outage {i}"}) for i in range(calls)],
        ),
        Reply(text="All tickets are open."),
    ]
    with ScriptedModel(script) as model:
        spec = MCPSpec(
            store_url=url_for("sqlite", tmp_path), base_url=model.url, world=str(world.path)
        )
        per_call = ("after_intent", "before_record") + (
            ("after_record",) if needs_intent(kind) else ()
        )
        nth = calls if point in per_call else 1
        code, _ = run_mcp_agent(spec, crash_at=f"{point}:{nth}")
        reachable = point != "after_intent" or needs_intent(kind)
        assert code == (KILLED if reachable else 0)

        code, result = run_mcp_agent(spec)  # resume, no crash
        assert code == 0 and result is not None, result
        if kind == "plain" and point in ("after_intent", "before_record"):
            assert result["status"] == "needs_attention", result
            assert "in doubt" in result["reason"]
            with tl.open_store(spec.store_url) as store:
                (doubt,) = store.ledger("outage-42").in_doubt()
                happened = point == "before_record"
                store.ledger("outage-42").resolve(doubt.tool_use_id, happened=happened, by="test")
            code, result = run_mcp_agent(spec)
            assert code == 0 and result is not None
        assert result["status"] == "completed", result

        assert model.rejected == [], "every request obeyed the pairing rule"
        final = model.requests[-1]["messages"][-1]
        results = [b for b in final["content"] if b["type"] == "tool_result"]
        assert len(results) == calls and not any(r.get("is_error") for r in results)

    tickets = world.tickets()
    assert sorted(t["title"] for t in tickets) == [f"outage {i}" for i in range(calls)], (
        "exactly one effect per call, on the server"
    )
    executions = world.executions(tool_name)
    if kind in ("plain", "checked"):
        assert len(executions) == calls, "a non-idempotent MCP tool never ran twice"
    else:
        assert calls <= len(executions) <= 2 * calls, "safe tools may re-run; effects did not"
    if kind in ("checked", "keyed"):
        assert all(e["key"] and e["key"].startswith("tl-") for e in executions), (
            "every call carried its idempotency key in _meta"
        )
