"""The concurrency torture's checks on hand-built evidence: a same-host worker's judgement that
an attempt was over, held against the moment the harness killed the process that ran it.

The case is the one a JSON run met once: w0015 (this host) ran attempt 1 of a non-idempotent
call and was paused past its deadline; w0013, acting as another host, judged it over (rule 14's
limit) and a person approved a re-run; w0015 woke, made its ticket and was killed before it
could report; w0002, of this host, then ran attempt 2. Whether that is rule 14's limit or a
liveness bug depends on when w0002 looked — which only its logged judgement tells.
"""

from __future__ import annotations

from typing import Any

from toolledger._harness._concurrent_checks import _Run
from toolledger._harness._concurrent_evidence import Evidence, Findings, WorkerInfo
from toolledger.records import PastAttempt

HOST = "this-host"
TID = "toolu_c00062"
KILLED = 273.002
DEADLINE = 271.653
ENDED = "its process (pid 15 on this host) has ended"


def _worker(serial: str, pid: int, host: str, *, killed: float | None = None) -> WorkerInfo:
    return WorkerInfo(
        serial=serial,
        pid=pid,
        host=host,
        offset=0.0,
        threads=1,
        started=200.0,
        ended=killed,
        killed=killed is not None,
    )


def _event(ev: str, w: str, pid: int, host: str, t: float, **fields: Any) -> dict[str, Any]:
    return {"ev": ev, "w": w, "pid": pid, "host": host, "t": t, **fields}


def _run(judged_by_w0002: list[tuple[float, float, str]]) -> _Run:
    """The run as the world logged it, with w0002's judgements ``(t0, t, why)``."""
    workers = {
        "w0015": _worker("w0015", 15, HOST, killed=KILLED),
        "w0013": _worker("w0013", 13, "torture-host-1"),
        "w0002": _worker("w0002", 2, HOST),
    }
    call = {"tid": TID, "tool": "create_ticket"}
    events = [
        _event("start", "w0015", 15, HOST, 270.654, x="x1", attempt=1, **call),
        _event(
            "judged",
            "w0013",
            13,
            "torture-host-1",
            272.151,
            t0=272.150,
            tid=TID,
            attempt=1,
            of_pid=15,
            of_host=HOST,
            why="its worker's lease is gone and its deadline has passed",
        ),
        *(
            _event(
                "judged",
                "w0002",
                2,
                HOST,
                t,
                t0=t0,
                tid=TID,
                attempt=1,
                of_pid=15,
                of_host=HOST,
                why=why,
            )
            for t0, t, why in judged_by_w0002
        ),
        _event("start", "w0002", 2, HOST, 273.189, x="x2", attempt=2, **call),
    ]
    evidence = Evidence(
        this_host=HOST,
        other_hosts=1,
        sessions={},
        scripts={},
        tickets=[],
        events=events,
        workers=workers,
        actions=[],
        verify_errors=[],
        rejected=[],
    )
    return _Run(evidence, Findings())


PAST = PastAttempt(
    attempt=1, worker="w0015", holder=None, at=270.6, deadline=DEADLINE, settled="approved"
)


def test_a_same_host_judgement_after_the_kill_leaves_rule_14s_limit() -> None:
    run = _run([(273.150, 273.151, ENDED)])
    assert run.limit(TID, 1, PAST) is None  # w0013 (another host) settled it past its deadline
    run.judgements()
    assert run.c.failed == [] and run.f.judged_ended == 1  # w0013's lease judgement is not one


def test_a_same_host_judgement_that_read_the_table_as_the_process_died_is_right() -> None:
    run = _run([(KILLED - 0.002, KILLED + 0.002, ENDED)])
    assert run.limit(TID, 1, PAST) is None
    run.judgements()
    assert run.c.failed == []


def test_a_same_host_judgement_while_the_process_lived_is_caught() -> None:
    run = _run([(272.980, 272.985, ENDED)])
    why = run.limit(TID, 1, PAST)
    assert why is not None and "on the host of w0015" in why
    run.judgements()
    assert (
        len(run.c.failed) == 1 and "w0015 (pid 15, the same host) lived until" in (run.c.failed[0])
    )


def test_without_a_logged_judgement_the_next_attempt_start_is_the_settle() -> None:
    why = _run([]).limit(TID, 1, PAST)
    assert why == "w0002 ran attempt 2, on the host of w0015"


def test_a_same_host_judgement_not_by_the_process_table_is_held_to_its_time() -> None:
    """Only a reading of the process table may straddle the kill: any other same-host
    judgement explains nothing unless it began after the process was gone."""
    why = "its worker's lease is gone and its deadline has passed"
    run = _run([(KILLED - 0.002, KILLED + 0.002, why)])
    found = run.limit(TID, 1, PAST)
    assert found is not None and "on the host of w0015" in found
    assert _run([(KILLED + 0.1, KILLED + 0.101, why)]).limit(TID, 1, PAST) is None
