"""resume_all / `toolledger resume-all`: after a fleet restart, every unfinished session with a
free lease is run again — once — and the rest are left alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import toolledger as tl
from toolledger.cli.app import main
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse
from toolledger.testing.world import AgentSpec, World, run_agent

from ..helpers import held_elsewhere

AGENT_MODULE = """
import anthropic
import toolledger as tl
from toolledger.testing.world import World

def make_agent(store):
    client = anthropic.Anthropic(base_url="{base_url}", api_key="x", max_retries=0)
    return tl.Agent(client=client, model="x", tools=World("{world}").toolset(), store=store)
"""


def test_resume_all_after_a_fleet_restart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    world = World(tmp_path / "world")
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    script = [Reply(tool_uses=[ToolUse("ensure_ticket", {"title": "t"})]), Reply(text="done")]
    with ScriptedModel(script) as model:
        for n, point in enumerate(["after_checkpoint_a", "before_record", "after_checkpoint_b"]):
            spec = AgentSpec(
                store_url=url, base_url=model.url, world=str(world.path), session=f"crashed-{n}"
            )
            assert run_agent(spec, crash_at=point)[0] == -9
        done = AgentSpec(store_url=url, base_url=model.url, world=str(world.path), session="done")
        assert run_agent(done)[1] == {
            "status": "completed",
            "reason": None,
            "turns": 2,
            "alerts": 0,
        }
        (tmp_path / "fleet_agent.py").write_text(
            AGENT_MODULE.format(base_url=model.url, world=world.path)
        )
        monkeypatch.chdir(tmp_path)
        argv = ["resume-all", "--agent", "fleet_agent:make_agent", "--store", url]
        # crashed-2's holder lives, elsewhere: it renews its lease every 0.2 s.
        with (
            tl.open_store(url) as store,
            held_elsewhere(store, "crashed-2", ttl=0.6, every=0.2, token=9, expect_token=1),
        ):
            code = main([*argv, "--workers", "2", "--json"])
        rows = json.loads(capsys.readouterr().out)
        assert model.rejected == []
    assert code == 0
    assert sorted((r["session_id"], r["status"]) for r in rows) == [
        ("crashed-0", "completed"),
        ("crashed-1", "completed"),
        ("crashed-2", "skipped"),
    ], "crashed-2's lease is held elsewhere; 'done' was finished"
    (held,) = [r for r in rows if r["session_id"] == "crashed-2"]
    assert held["detail"] == "taken by other-host:1:x", held
    with tl.open_store(url) as store:
        states = {s.session_id: s.status for s in store.backend.list_sessions()}
    assert states == {
        "crashed-0": tl.RunStatus.COMPLETED,
        "crashed-1": tl.RunStatus.COMPLETED,
        "crashed-2": tl.RunStatus.RUNNING,
        "done": tl.RunStatus.COMPLETED,
    }
    assert sorted(t["title"] for t in world.tickets()) == ["t"], "ensure_ticket: one ticket"
