"""In doubt needs its own yes (docs/design.md rules 6 and 21): an approver that answers a plain
``True`` to everything — the first thing people write in a test or a demo — approves high-impact
calls, and never re-runs a call in doubt. The process is killed with a real ``SIGKILL`` after its
``create_ticket`` (non-idempotent, not high-impact) opened the ticket and before the outcome was
recorded; the world is counted in ticket files."""

from __future__ import annotations

from pathlib import Path

import toolledger as tl
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse
from toolledger.testing.world import AgentSpec, World, run_agent

SESSION = "blanket-yes"
SCRIPT = [
    Reply(tool_uses=[ToolUse("create_ticket", {"title": "Outage"})]),
    Reply(text="Ticket opened."),
]


def test_a_blanket_yes_does_not_rerun_an_interrupted_call(shared_url: str, tmp_path: Path) -> None:
    world = World(tmp_path / "world")
    with ScriptedModel(SCRIPT) as model:
        spec = AgentSpec(
            store_url=shared_url,
            base_url=model.url,
            world=str(world.path),
            session=SESSION,
            approve="all",  # yes to every question
        )
        code, _ = run_agent(spec, crash_at="before_record")
        assert code == -9, "killed after the ticket was opened, before its outcome was recorded"
        assert len(world.tickets()) == 1

        code, outcome = run_agent(spec)
        assert code == 0 and outcome is not None

    assert len(world.tickets()) == 1, "one ticket in the world"
    assert outcome["status"] == "needs_attention"
    assert "in doubt" in outcome["reason"] and "resolve" in outcome["reason"]
    with tl.open_store(shared_url) as store:
        (doubt,) = store.in_doubt()
        assert doubt.tool == "create_ticket" and doubt.attempt == 1
