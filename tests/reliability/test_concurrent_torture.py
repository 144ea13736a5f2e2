"""The concurrency torture, bounded for CI: a few seconds of chaos per backend — worker processes
sharing one store, paused past their leases and deadlines, killed and replaced, one acting as
another host, clocks skewed, an operator approving and resolving at random moments — then every
session driven to its end and checked against the world (``make torture-concurrent`` runs it for
ten minutes). A deliberately broken build proves the harness notices when the promise breaks.

``TOOLLEDGER_TORTURE_SEED`` replays a schedule (the timing still varies); by default each run
draws a new one and a failure prints it.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from toolledger._harness.concurrent_torture import ConcurrentReport, main, run_concurrent_torture

CHAOS_SECONDS = {"sqlite": 15.0, "json": 15.0, "postgres": 15.0}


def seed() -> int:
    fixed = os.environ.get("TOOLLEDGER_TORTURE_SEED")
    return int(fixed) if fixed else random.SystemRandom().randrange(2**32)


def assert_held(report: ConcurrentReport) -> None:
    """The promise held, and the chaos it held under really happened."""
    assert report.ok, report.summary()
    assert report.pauses_past_lease > 0 and report.pauses_past_timeout > 0, report.summary()
    assert report.kills > 0 and report.kills_in_tool > 0, report.summary()
    assert report.resolves["happened"] + report.resolves["not happened"] > 0, report.summary()
    assert report.approvals > 0, report.summary()
    assert report.other_host_workers > 0 and len(set(report.clock_offsets)) > 1
    assert report.effects_checked > report.sessions, "sessions made tickets, each one counted"
    assert report.invariants_checked > 5 * report.sessions


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "json"])
def test_workers_sharing_sessions_break_no_invariant(backend: str, tmp_path: Path) -> None:
    report = run_concurrent_torture(
        seconds=CHAOS_SECONDS[backend], backend=backend, seed=seed(), directory=tmp_path
    )
    assert_held(report)


@pytest.mark.slow
@pytest.mark.postgres
def test_workers_sharing_sessions_break_no_invariant_on_postgres(
    postgres_url: str, tmp_path: Path
) -> None:
    report = run_concurrent_torture(
        seconds=CHAOS_SECONDS["postgres"],
        backend="postgres",
        seed=seed(),
        directory=tmp_path,
        postgres_url=postgres_url,
    )
    assert_held(report)


@pytest.mark.slow
def test_on_one_host_no_attempt_is_ever_settled_alive(tmp_path: Path) -> None:
    """Every worker on this host: a paused one is known alive, however long the pause, so no
    call is ever settled under it — not one late effect, not even a harmless late outcome."""
    report = run_concurrent_torture(seconds=8.0, other_hosts=0, seed=seed(), directory=tmp_path)
    assert report.ok, report.summary()
    assert report.pauses_past_timeout > 0 and report.kills > 0, report.summary()
    assert report.other_host_workers == 0
    assert (report.late_effects, report.late_outcomes, report.cut_off) == (0, 0, 0)
    assert report.settled_elsewhere_past_deadline == 0
    assert report.alerts["LateOutcomeError"] == 0, report.summary()


# -- the harness catches a broken build ---------------------------------------------------------


def _judge_everything_over() -> None:
    """In each worker: a started call is in doubt as soon as it is seen — the behaviour before
    attempts had owners (running in another thread, process or host is ignored)."""
    from toolledger import _liveness as liveness

    def over(record: Any, **kwargs: Any) -> liveness.Verdict:
        return liveness.Over("the broken build judges every started call over")

    real = liveness.judge
    for name, module in list(sys.modules.items()):
        if name.startswith("toolledger") and getattr(module, "judge", None) is real:
            module.judge = over  # type: ignore[attr-defined]


def _search(tmp_path: Path, setup: Any, found: Any, **options: Any) -> tuple[ConcurrentReport, str]:
    """A broken build (``setup`` in each worker) run up to three times, each on a schedule of
    its own, until ``found(report)``: the last report, and every run's summary."""
    reports: list[ConcurrentReport] = []
    for attempt in range(3):
        report = run_concurrent_torture(
            seconds=8.0,
            seed=seed() + attempt,
            directory=tmp_path / f"run{attempt}",
            worker_setup=setup,
            **options,
        )
        reports.append(report)
        if found(report):
            break
    return report, "\n\n".join(r.summary() for r in reports)


def test_settling_calls_that_still_run_is_caught(tmp_path: Path) -> None:
    """The harness is a random search: on an idle machine one 8 s run catches the broken build
    with 20-110 violations, on a starved one (the suite's other workers busy) with as few as 3,
    and now and then with none. So it searches up to three runs, each on a schedule of its own,
    and the broken build must be caught — one run that catches it is the proof."""
    report, runs = _search(
        tmp_path,
        _judge_everything_over,
        lambda r: not r.ok,
        duplicate_fraction=0.4,  # second deliveries meet calls that are running
    )
    assert not report.ok, runs
    caught = [
        v
        for v in report.violations
        if "alive on the same host" in v or "before its deadline" in v or "done twice" in v
    ]
    assert caught, report.summary()


def _see_every_other_process_ended() -> None:
    """In each worker: this host's process table is misread, and every other process of it is
    taken for ended — a paused worker (or a running one) with it."""
    from toolledger._liveness import this_process

    runtime = this_process()
    runtime.evidence = runtime.is_me  # type: ignore[method-assign]


LIVED = "the same host) lived until"


def test_judging_a_live_process_of_the_same_host_ended_is_caught(tmp_path: Path) -> None:
    """The workers log each judgement that an attempt is over, and the checks hold it against
    the moment the harness killed the process it named: a build that reads every other process
    of the host as ended is caught by that check itself (up to three runs, as above)."""
    report, runs = _search(
        tmp_path,
        _see_every_other_process_ended,
        lambda r: any(LIVED in v for v in r.violations),
    )
    assert [v for v in report.violations if LIVED in v], runs


def test_the_command_line_prints_the_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seconds", "3", "--seed", "3", "--sessions", "4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("toolledger concurrency torture: OK"), out
    figures = ("workers", "clock offsets", "pauses", "kills", "operator", "late effects")
    for figure in (*figures, "judged ended"):
        assert f"  {figure} " in out, figure
    assert "violations             0" in out, out


def test_an_alert_only_the_logger_carries_is_counted_as_alerted() -> None:
    """The background writer, finding an outcome it kept arrive late, alerts through the
    ``toolledger`` logger alone (its run has returned: no hook to call). The torture's workers
    log such an alert too, so the check that every late success was alerted sees it."""
    import logging

    from toolledger._harness._concurrent_worker import _LoggedAlerts
    from toolledger.engine._drivers import _emit
    from toolledger.errors import LateOutcomeError

    logged: list[tuple[str, dict[str, Any]]] = []

    class World:
        def log(self, ev: str, **fields: Any) -> None:
            logged.append((ev, fields))

    alert = LateOutcomeError(
        "late", session_id="s", tool_use_id="t", tool="x", result="r", attempt=1, current="c"
    )
    handler = _LoggedAlerts(World())  # type: ignore[arg-type]
    logger = logging.getLogger("toolledger")
    logger.addHandler(handler)
    try:
        _emit(alert, None)
    finally:
        logger.removeHandler(handler)
    assert logged == [
        ("alert_logged", {"type": "LateOutcomeError", "sid": "s", "tid": "t", "attempt": 1})
    ]
