"""An agent on a ``json:///`` store killed at every file write of its run.

A json commit that touches both of a session's files writes them one after the other, so a
kill can land between the two: the order must leave a state a resume reads correctly. The
session exists after the first turn, and the turns after it are the ones at stake: a turn's
one call has its intent in checkpoint A's commit (``toolledger.engine._straight``), a turn of
two calls writes checkpoint A alone, and every turn ends with its outcomes in checkpoint B's.

Each case forks an agent that ``SIGKILL``s itself as it starts the n-th file write (a ledger
file replaced, or a log line appended), then resumes it in a new process. A call left in doubt
is settled as a person would, from the world; effects are counted there.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
from toolledger._verify import verify
from toolledger.stores.jsonfile import _files
from toolledger.testing import world as worlds
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse
from toolledger.testing.world import AgentSpec, World, run_agent, run_forked

SESSION = "s"
TITLES = ["outage 0", "outage 1", "outage 2", "outage 3"]
SCRIPT = [
    Reply(text="One.", tool_uses=[ToolUse("create_ticket", {"title": TITLES[0]})]),
    Reply(text="Another.", tool_uses=[ToolUse("create_ticket", {"title": TITLES[1]})]),
    Reply(
        text="Two more.",
        tool_uses=[ToolUse("create_ticket", {"title": t}) for t in TITLES[2:]],
    ),
    Reply(text="All open."),
]


def _killed_at_write(spec: AgentSpec, nth: int, result_path: str) -> None:
    """``world``'s agent child, ``SIGKILL``ed as it starts its ``nth`` file write."""
    writes = 0

    def counted(write: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            nonlocal writes
            writes += 1
            if writes == nth:
                os.kill(os.getpid(), signal.SIGKILL)
            return write(*args, **kwargs)

        return wrapper

    # Forked: the patch is this process's alone.
    _files.Directory.replace = counted(_files.Directory.replace)  # type: ignore[method-assign]
    _files.Directory.append = counted(_files.Directory.append)  # type: ignore[method-assign]
    worlds._child(spec, None, result_path)


def _settle_from_the_world(url: str, world: World) -> None:
    """What a person does with a call in doubt: looks in the world whether it ran."""
    ran = {e["tool_use_id"] for e in world.executions("create_ticket")}
    with tl.open_store(url) as store:
        ledger = store.ledger(SESSION)
        for doubt in ledger.in_doubt():
            ledger.resolve(doubt.tool_use_id, happened=doubt.tool_use_id in ran, by="test")


@pytest.mark.slow
def test_a_kill_at_any_file_write_of_a_run_loses_and_repeats_nothing(tmp_path: Path) -> None:
    killed = 0
    with ScriptedModel(SCRIPT) as model:
        for nth in range(1, 100):
            world = World(tmp_path / f"w{nth}")
            url = f"json:///{tmp_path / f'l{nth}'}"
            spec = AgentSpec(
                store_url=url, base_url=model.url, world=str(world.path), session=SESSION
            )
            tl.open_store(
                url
            ).close()  # made (its format file written) first: writes counted are the run's
            code, result = run_forked(_killed_at_write, (spec, nth), world.path)
            if code == 0:
                break  # the run wrote fewer files than nth: every write has been a kill point
            assert code == -signal.SIGKILL, (nth, code)
            killed += 1
            for _ in range(len(TITLES) + 1):  # each call in doubt stops the run once at most
                code, result = run_agent(spec)
                assert code == 0 and result is not None, (nth, result)
                if result.get("status") != "needs_attention":
                    break
                assert "in doubt" in result["reason"], (nth, result)
                _settle_from_the_world(url, world)
            assert result.get("status") == "completed", (nth, result)
            tickets = sorted(t["title"] for t in world.tickets())
            assert tickets == TITLES, f"killed at file write {nth}: one ticket per call, {tickets}"
            with tl.open_store(url) as store:
                assert verify(store) == [], nth
        else:
            raise AssertionError("the run never finished within 99 file writes")
        assert model.rejected == [], "every request the model got obeyed the pairing rule"
    assert killed >= 10, f"a run of 4 turns writes its files at least 10 times, not {killed}"
