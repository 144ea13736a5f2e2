"""LedgerToolset under Pydantic AI's DBOS durability: a workflow killed after the tool's effect
is recovered by DBOS in a new process, and the world holds one effect.

DBOS replays the model's requests from its own steps, so the recovered workflow makes the same
tool calls under the same ids; it runs function tools inline (not as steps), so without the
ledger the tool would run again. Offline: a SQLite system database, a scripted model.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .apps import finished, killed, run_app
from .conftest import require

require("pydantic_ai", "pydantic-ai")
require("dbos", "recipes", "pydantic ai under dbos")

import toolledger as tl  # noqa: E402
from toolledger.records import Status  # noqa: E402

APP = str(Path(__file__).with_name("pydantic_ai_dbos_app.py"))


@pytest.mark.slow  # DBOS takes a few seconds to recover a workflow and shut down
@pytest.mark.parametrize("point", ["after_record", "before_record"])
def test_a_killed_workflow_recovered_by_dbos_does_the_effect_once(
    point: str, tmp_path: Path
) -> None:
    killed(run_app(APP, str(tmp_path), "start", crash_at=point), tmp_path)
    out = finished(run_app(APP, str(tmp_path), "resume"), tmp_path)
    (session,) = out["sessions"]  # the conversation id DBOS derived from the workflow, stable
    with tl.open_store(f"sqlite:///{tmp_path / 'ledger.db'}") as store:
        (record,) = store.ledger(session).records()
    if point == "after_record":
        assert out["output"] == "done: line 1", "the recovered run got the recorded result"
        assert (record.status, record.result, record.attempt) == (Status.SUCCEEDED, '"line 1"', 1)
    else:  # the outcome was never written: in doubt, never re-run, the model told
        assert "toolledger resolve" in out["output"]
        assert record.status is Status.STARTED
