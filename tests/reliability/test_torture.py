"""The torture harness, bounded for CI: a few hundred real SIGKILLs per backend, every session
checked against the world (``python -m toolledger._harness.torture`` / ``make torture`` runs
10,000+). Two deliberately broken builds prove the harness notices when the promise breaks.

``TOOLLEDGER_TORTURE_SEED`` replays a schedule; by default each run draws a new one and a failure
prints it.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest

from toolledger._harness._torture import _Backend
from toolledger._harness.torture import TortureReport, main, run_torture
from toolledger.engine import _decide as decide
from toolledger.records import Status
from toolledger.tools import Tool

CI_KILLS = {"sqlite": 300, "json": 200, "postgres": 150}


def seed() -> int:
    fixed = os.environ.get("TOOLLEDGER_TORTURE_SEED")
    return int(fixed) if fixed else random.SystemRandom().randrange(2**32)


def assert_survived(report: TortureReport, kills: int) -> None:
    assert report.ok, report.summary()
    assert report.kills >= kills, report.summary()
    assert report.kills_at_random_instant > 0 and report.kills_at_crash_point > 0
    assert report.effects_checked > report.sessions, "sessions made tickets, and each was counted"
    assert report.invariants_checked > 10 * report.sessions


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "json"])
def test_kills_at_random_instants_break_no_invariant(backend: str, tmp_path: Path) -> None:
    kills = CI_KILLS[backend]
    report = run_torture(kills=kills, backend=backend, seed=seed(), directory=tmp_path)
    assert_survived(report, kills)


@pytest.mark.slow
@pytest.mark.postgres
def test_kills_at_random_instants_break_no_invariant_on_postgres(
    postgres_url: str, tmp_path: Path
) -> None:
    kills = CI_KILLS["postgres"]
    report = run_torture(
        kills=kills, backend="postgres", seed=seed(), directory=tmp_path, postgres_url=postgres_url
    )
    assert_survived(report, kills)


# -- the harness catches a broken build ---------------------------------------------------------
# The forked children inherit these patches, so each run below is toolledger with one rule
# removed. Every kill lands at a named crash point, where the removed rule matters.


def test_a_silent_rerun_of_an_in_doubt_call_is_caught(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real = decide.first_step

    def rerun_anything_in_doubt(record: Any, tool: Any, call: Any, **kwargs: Any) -> Any:
        if record is not None and record.status is Status.STARTED and tool is not None:
            return decide.Run(in_doubt=True)  # rule 6 broken: "it may have happened" ignored
        return real(record, tool, call, **kwargs)

    monkeypatch.setattr(decide, "first_step", rerun_anything_in_doubt)
    report = run_torture(kills=60, seed=5, directory=tmp_path, crash_point_fraction=1.0)
    assert not report.ok
    assert any("left 2 tickets, not 1" in v for v in report.violations), report.summary()


def test_a_missing_intent_is_caught(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(Tool, "needs_intent", property(lambda self: False))  # no `started`
    report = run_torture(kills=60, seed=6, directory=tmp_path, crash_point_fraction=1.0)
    assert not report.ok
    assert any("tickets, not 1" in v for v in report.violations), report.summary()


def test_the_command_line_prints_the_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--kills", "5", "--seed", "3", "--quiet"]) == 0
    out = capsys.readouterr().out
    figures = dict(line.split(None, 1) for line in out.splitlines()[1:] if "  " in line.strip())
    assert figures.get("violations", "").strip() == "0", out
    for figure in ("kills survived", "sessions", "effects checked", "in-doubt resolutions", "time"):
        assert figure in out


def test_two_runs_on_one_database_never_share_a_session_store(tmp_path: Path) -> None:
    """Found when a run killed before it dropped its schemas left ``tl_torture_s000088``
    behind: the next run's session s000088 opened it, found another run's records and reported
    them as violations. Each run's PostgreSQL schemas are its own."""
    url = "postgresql://postgres@127.0.0.1:5432/test"
    first, second = _Backend("postgres", tmp_path, url), _Backend("postgres", tmp_path, url)
    assert first.url("s000088") != second.url("s000088")
    assert first.url("s000088") == first.url("s000088")
