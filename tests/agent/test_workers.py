"""Many worker processes, one store: a call executes once, a session runs in one worker at a time.

Sixteen real processes start together (a barrier) against the same store; executions are counted
in a file each execution appends to, never in the ledger.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

from ..conftest import url_for

WORKERS = 16


def _record_execution(log: Path, who: int) -> None:
    fd = os.open(log, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
    try:
        os.write(fd, f"{who}\n".encode())
    finally:
        os.close(fd)


def _race_call(url: str, log: str, out: str, who: int, barrier: Any) -> None:
    @tl.tool
    def charge(amount: int) -> str:
        _record_execution(Path(log), who)
        return f"charged by {who}"

    block = {"type": "tool_use", "id": "toolu_race", "name": "charge", "input": {"amount": 5}}
    with tl.open_store(url) as store:
        barrier.wait()
        try:
            (result,) = tl.run_tool_uses([block], [charge], ledger=store.ledger("race"))
            answer = {"content": result["content"]}
        except tl.EffectInProgressError as exc:
            answer = {"in_progress": exc.holder}
    Path(out).write_text(json.dumps(answer))


def _race_session(url: str, base_url: str, log: str, out: str, who: int, barrier: Any) -> None:
    import anthropic

    @tl.tool
    def create_ticket(title: str) -> str:
        _record_execution(Path(log), who)
        return "T-1"

    client = anthropic.Anthropic(base_url=base_url, api_key="x", max_retries=0)
    with tl.open_store(url) as store:
        agent = tl.Agent(client=client, model="x", tools=[create_ticket], store=store)
        barrier.wait()
        try:
            answer = {"status": agent.run(session="race", prompt="open it").status.value}
        except tl.SessionBusyError as exc:
            answer = {"busy": exc.owner}
    Path(out).write_text(json.dumps(answer))


def _start_all(target: Any, args: list[tuple[Any, ...]]) -> list[int | None]:
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=target, args=a) for a in args]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    return [p.exitcode for p in procs]


@pytest.fixture(params=["sqlite", "json", "postgres"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("postgres_store_url"))
    return url_for(str(request.param), tmp_path)


def test_sixteen_processes_racing_on_one_call_execute_it_once(
    shared_url: str, tmp_path: Path
) -> None:
    tl.open_store(shared_url).close()  # created (and migrated) before the race
    log = tmp_path / "executions.log"
    barrier = multiprocessing.get_context("fork").Barrier(WORKERS)
    outs = [tmp_path / f"out-{i}.json" for i in range(WORKERS)]
    codes = _start_all(
        _race_call, [(shared_url, str(log), str(o), i, barrier) for i, o in enumerate(outs)]
    )
    assert codes == [0] * WORKERS
    executions = log.read_text().split()
    assert len(executions) == 1, f"executed by {executions}"
    winner = executions[0]
    answers = [json.loads(o.read_text()) for o in outs]
    for answer in answers:
        assert answer.get("content") == f"charged by {winner}" or "in_progress" in answer
    assert sum("content" in a for a in answers) >= 1


def test_sixteen_processes_on_one_session_run_it_once(shared_url: str, tmp_path: Path) -> None:
    tl.open_store(shared_url).close()
    log = tmp_path / "executions.log"
    script = [Reply(tool_uses=[ToolUse("create_ticket", {"title": "t"})]), Reply(text="done")]
    with ScriptedModel(script) as model:
        barrier = multiprocessing.get_context("fork").Barrier(WORKERS)
        outs = [tmp_path / f"out-{i}.json" for i in range(WORKERS)]
        codes = _start_all(
            _race_session,
            [(shared_url, model.url, str(log), str(o), i, barrier) for i, o in enumerate(outs)],
        )
        assert model.rejected == []
    assert codes == [0] * WORKERS
    assert len(log.read_text().split()) == 1
    answers = [json.loads(o.read_text()) for o in outs]
    assert all(a in ({"status": "completed"},) or "busy" in a for a in answers), answers
    assert {"status": "completed"} in answers
    with tl.open_store(shared_url) as store:
        state = store.backend.read_session("race")
        assert state is not None and state.status is tl.RunStatus.COMPLETED
        assert [m.role for m in store.backend.read_messages("race")] == [
            "user",
            "assistant",
            "user",
            "assistant",
        ]


def _race_approval(url: str, log: str, out: str, who: int, barrier: Any) -> None:
    @tl.tool(high_impact=True)
    def wire(amount: int) -> str:
        _record_execution(Path(log), who)
        return f"wired by {who}"

    block = {"type": "tool_use", "id": "toolu_wire", "name": "wire", "input": {"amount": 5}}
    with tl.open_store(url) as store:
        barrier.wait()
        try:
            (result,) = tl.run_tool_uses(
                [block], [wire], ledger=store.ledger("race"), approve=tl.approvals.queue
            )
            answer = {"content": result["content"], "is_error": result.get("is_error", False)}
        except tl.EffectInProgressError as exc:
            answer = {"in_progress": exc.holder}
    Path(out).write_text(json.dumps(answer))


def test_ten_processes_consuming_one_approval_execute_once(shared_url: str, tmp_path: Path) -> None:
    """One approved request, ten workers reaching for it at once: the call runs once, the
    approval ends used (never a fresh pending request over it), and no worker is told that a
    call which ran awaits approval."""
    workers = 10
    with tl.open_store(shared_url) as store:
        block = {"type": "tool_use", "id": "toolu_wire", "name": "wire", "input": {"amount": 5}}

        @tl.tool(high_impact=True)
        def wire(amount: int) -> str:
            raise AssertionError("not before the decision")

        (first,) = tl.run_tool_uses(
            [block], [wire], ledger=store.ledger("race"), approve=tl.approvals.queue
        )
        assert "awaiting approval" in first["content"]
        tl.approvals.decide(store, "race", "toolu_wire", approved=True, by="ana")
    log = tmp_path / "executions.log"
    barrier = multiprocessing.get_context("fork").Barrier(workers)
    outs = [tmp_path / f"out-{i}.json" for i in range(workers)]
    codes = _start_all(
        _race_approval, [(shared_url, str(log), str(o), i, barrier) for i, o in enumerate(outs)]
    )
    assert codes == [0] * workers
    executions = log.read_text().split()
    assert len(executions) == 1, f"executed by {executions}"
    answers = [json.loads(o.read_text()) for o in outs]
    for answer in answers:
        assert answer.get("content") == f"wired by {executions[0]}" or "in_progress" in answer, (
            answer
        )
    with tl.open_store(shared_url) as store:
        (approval,) = store.backend.read_approvals("race")
        assert approval.status is tl.ApprovalStatus.USED
        assert tl.approvals.pending(store) == []
        record = store.ledger("race").get("toolu_wire")
        assert record is not None and record.approved_by == "ana"


def _wire_alone(url: str, log: str, out: str) -> None:
    _race_approval(url, log, out, 1, multiprocessing.get_context("fork").Barrier(1))


def test_an_approval_used_by_an_attempt_that_finished_as_it_was_judged_is_not_asked_again(
    shared_url: str, tmp_path: Path
) -> None:
    """The race behind a rare failure of the ten-process test: a worker reads the call's record
    as started, by a process that then writes its outcome and exits before the worker judges it.
    Judged now, that stale record's process has ended — but the attempt is over because it
    finished, not in doubt. The approval it used up answers this worker too (the stored
    result), and is never queued again for a person."""
    block = {"type": "tool_use", "id": "toolu_wire", "name": "wire", "input": {"amount": 5}}

    @tl.tool(high_impact=True)
    def wire(amount: int) -> str:
        raise AssertionError("not in this process")

    with tl.open_store(shared_url) as store:
        tl.run_tool_uses([block], [wire], ledger=store.ledger("race"), approve=tl.approvals.queue)
        tl.approvals.decide(store, "race", "toolu_wire", approved=True, by="ana")
    log, out = tmp_path / "executions.log", tmp_path / "out.json"
    assert _start_all(_wire_alone, [(shared_url, str(log), str(out))]) == [0]
    assert json.loads(out.read_text()) == {"content": "wired by 1", "is_error": False}
    with tl.open_store(shared_url) as store:
        done = store.ledger("race").get("toolu_wire")
        assert done is not None and done.status is tl.Status.SUCCEEDED
        # As this worker would have read it between the other's intent and its outcome.
        stale = dataclasses.replace(done, status=tl.Status.STARTED, result=None)
        backend = store.backend
        real = backend.read_effects
        reads: list[int] = []

        def read_effects(session_id: str, ids: Any = None) -> dict[str, tl.EffectRecord]:
            reads.append(1)
            if len(reads) == 1:
                return {}  # the runner's read: before the other's intent
            if len(reads) == 2:
                return {"toolu_wire": stale}  # the approver's: between intent and outcome
            return real(session_id, ids)

        backend.read_effects = read_effects  # type: ignore[method-assign]
        (result,) = tl.run_tool_uses(
            [block], [wire], ledger=store.ledger("race"), approve=tl.approvals.queue
        )
        backend.read_effects = real  # type: ignore[method-assign]
        assert len(reads) >= 2, "the approver read the stale record"
        assert result == {
            "type": "tool_result",
            "tool_use_id": "toolu_wire",
            "content": "wired by 1",
        }
        assert tl.approvals.pending(store) == []
        (approval,) = store.backend.read_approvals("race")
        assert approval.status is tl.ApprovalStatus.USED
    assert log.read_text().split() == ["1"]
