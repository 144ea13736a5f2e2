"""One case of the crash matrix, whatever the provider: kill the agent process at a point,
resume it, settle what a person must settle, and check the world. The Anthropic, OpenAI and MCP
matrices differ only in how an agent process is started and how results look on the wire."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import toolledger as tl
from toolledger import _switches as switches
from toolledger.testing.scripted import Reply, ToolUse
from toolledger.testing.world import TOOL_OF_KIND, World

KILLED = -9
SESSION = "outage-42"

RunAgent = Callable[[str | None], tuple[int, dict[str, Any] | None]]


def needs_intent(kind: str) -> bool:
    return kind in ("plain", "checked")


def script(kind: str, calls: int, turns: int = 1) -> list[Reply]:
    """``turns`` turns of ``calls`` calls each (every call its own ticket), then the answer."""
    replies = []
    for turn in range(turns):
        uses = [
            ToolUse(TOOL_OF_KIND[kind], {"title": f"outage {turn * calls + i}"})
            for i in range(calls)
        ]
        replies.append(Reply(text="Opening tickets.", tool_uses=uses))
    return [*replies, Reply(text="All tickets are open.")]


def crash_and_recover(
    run: RunAgent, store_url: str, *, point: str, kind: str, calls: int, turns: int = 1
) -> dict[str, Any]:
    """Kill a run at ``point`` in its last tool turn (on that turn's last call where the point
    is per call), resume it; a plain call left in doubt must stop for a person, who says whether
    it happened. Returns what the final run returned (``completed``)."""
    # Safe calls' outcomes share one commit (the last, with checkpoint B): one after_record.
    per_call = ("after_intent", "before_record") + (("after_record",) if needs_intent(kind) else ())
    nth = calls * turns if point in per_call else turns
    code, _ = run(f"{point}:{nth}")
    reachable = point != "after_intent" or needs_intent(kind)
    assert code == (KILLED if reachable else 0)

    code, result = run(None)  # resume, no crash
    assert code == 0 and result is not None, result
    # A turn's one call takes the straight path, and its intent rides in checkpoint A's commit:
    # killed after A, it was killed after its intent, before the tool ran.
    folded = point == "after_checkpoint_a" and calls == 1 and switches.STRAIGHT
    if kind == "plain" and (point in ("after_intent", "before_record") or folded):
        # Never re-run silently: a person must say whether it happened.
        assert result["status"] == "needs_attention", result
        assert "in doubt" in result["reason"]
        with tl.open_store(store_url) as store:
            (doubt,) = store.ledger(SESSION).in_doubt()
            happened = point == "before_record"  # after_intent: killed before the tool ran
            store.ledger(SESSION).resolve(doubt.tool_use_id, happened=happened, by="test")
        code, result = run(None)
        assert code == 0 and result is not None
    assert result["status"] == "completed", result
    return result


def assert_one_effect_per_call(world: World, kind: str, calls: int) -> list[dict[str, Any]]:
    """Effects counted in the world's own files: one ticket per call; a non-idempotent tool
    never ran twice. Returns the tool's executions."""
    tickets = world.tickets()
    assert sorted(t["title"] for t in tickets) == [f"outage {i}" for i in range(calls)], (
        "exactly one effect per call"
    )
    executions = world.executions(TOOL_OF_KIND[kind])
    if needs_intent(kind):
        assert len(executions) == calls, "a non-idempotent tool never ran twice"
    else:
        assert calls <= len(executions) <= 2 * calls, "safe tools may re-run; effects did not"
    return executions
