"""A worker paused (``SIGSTOP``) inside a tool past its lease, and what another worker does with
its session — on this host, on another host before the call's deadline, and past it.

Worker 1 is a real forked process running ``Agent.run``; its tool announces that it has started,
then waits for the test's "go" before it makes its effect, so the test can freeze it at exactly
that moment. Worker 2 runs here: as this host (same process table: the paused holder is known
alive) or as another host (``toolledger.testing.elsewhere``: it sees only leases and deadlines on
the store's clock). Effects are counted in the world — ticket files — never in the ledger.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
from toolledger._verify import Severity, verify
from toolledger.records import Status
from toolledger.testing import elsewhere
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

from ..helpers import freeze_between_writes

LEASE_TTL = 0.5
SESSION = "outage-7"
# A paused worker's tool timeout, when the test goes past it: long enough for the worker to reach
# its tool after its intent on a loaded host (past it the tool is not called, and the worker
# never pauses); the tests then wait for the deadline recorded, not for a fixed time.
SHORT_TIMEOUT = 2.0


class Tickets:
    """The ticket system: one file per ticket, an optional external id to look them up by."""

    def __init__(self, path: Path) -> None:
        self.path = path
        (path / "tickets").mkdir(parents=True, exist_ok=True)

    def all(self) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted((self.path / "tickets").glob("*.json"))]

    def create(self, title: str, key: str | None) -> dict[str, Any]:
        name = key or uuid.uuid4().hex
        ticket = {"id": name, "title": title, "external_id": key}
        try:
            fd = os.open(
                self.path / "tickets" / f"{name}.json", os.O_CREAT | os.O_EXCL | os.O_WRONLY
            )
        except FileExistsError:  # an Idempotency-Key seen before: the first ticket answers
            return json.loads((self.path / "tickets" / f"{name}.json").read_text())
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(ticket))
        return ticket

    def entered(self) -> bool:
        return (self.path / "entered").exists()

    def go(self) -> None:
        (self.path / "go").touch()


def toolset(world: Tickets, kind: str, timeout: float) -> tl.ToolSet:
    """``checked``: non-idempotent with a check; ``approved``: non-idempotent, high-impact;
    ``keyed``: forwards its idempotency key to a ticket API that honours it."""

    def open_ticket(title: str, ctx: tl.ToolContext) -> dict[str, Any]:
        if not world.entered():
            (world.path / "entered").write_text(str(os.getpid()))
            deadline = time.time() + 60
            while not (world.path / "go").exists() and time.time() < deadline:
                time.sleep(0.005)
        key = ctx.idempotency_key if kind == "keyed" else None
        return world.create(title, key)

    declared = tl.tool(
        open_ticket,
        name="create_ticket",
        effect="non_idempotent",
        high_impact=kind == "approved",
        forwards_idempotency_key=kind == "keyed",
        timeout=timeout,
    )
    if kind == "checked":

        @declared.check
        def _(title: str, ctx: tl.ToolContext) -> dict[str, Any] | None:
            # Tickets made by this test carry no key: a checked tool finds its own by title.
            found = [t for t in world.all() if t["title"] == title]
            return found[0] if found else None

    return tl.ToolSet([declared])


def _approve(request: tl.ApprovalRequest) -> tl.Decision:
    return tl.Decision(approved=True, by="ana")


def agent(
    store: tl.Store, model: ScriptedModel, world: Tickets, kind: str, timeout: float
) -> tl.Agent:
    alerts: list[tl.LedgerWriteError] = []
    made = tl.Agent(
        client=model.client(),
        model="x",
        tools=toolset(world, kind, timeout),
        store=store,
        approve=_approve if kind == "approved" else None,
        lease_ttl=LEASE_TTL,
        on_alert=alerts.append,
    )
    made.alerts = alerts  # type: ignore[attr-defined]
    return made


def _start_paused_worker(
    url: str, model: ScriptedModel, world: Tickets, kind: str, timeout: float
) -> int:
    """Worker 1 in a forked child, frozen inside the tool before its effect. Returns its pid."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(read_fd)
            with tl.open_store(url) as store:
                a = agent(store, model, world, kind, timeout)
                try:
                    run = a.run(session=SESSION, prompt="open a ticket")
                    out: dict[str, Any] = {"status": run.status.value}
                except tl.ToolLedgerError as exc:
                    out = {"error": type(exc).__name__}
                out["alerts"] = [type(x).__name__ for x in a.alerts]  # type: ignore[attr-defined]
            os.write(write_fd, json.dumps(out).encode())
        except BaseException:
            code = 70
        finally:
            os._exit(code)
    os.close(write_fd)
    deadline = time.time() + 30
    while not world.entered() and time.time() < deadline:
        time.sleep(0.002)
    assert world.entered(), "worker 1 never reached its tool"
    freeze_between_writes(
        url, stop=lambda: _stopped(pid, signal.SIGSTOP), go=lambda: os.kill(pid, signal.SIGCONT)
    )
    _child_pipes[pid] = read_fd
    return pid


def past_lease_and_deadline(url: str) -> None:
    """Sleep until the paused worker's lease and the deadline its intent recorded (a keyed tool
    writes none) have passed, on the store's clock: how long after the intent the worker was
    frozen varies with load."""
    with tl.open_store(url) as store:
        left = [r.deadline - store.now() for r in store.ledger(SESSION).records() if r.deadline]
        time.sleep(max([LEASE_TTL, *left]) + 0.3)


def _stopped(pid: int, sig: int) -> None:
    os.kill(pid, sig)
    os.waitpid(pid, os.WUNTRACED)  # stopped, every thread of it


_child_pipes: dict[int, int] = {}


def _resume(pid: int, world: Tickets) -> dict[str, Any]:
    """Let worker 1 go on and finish; what its run returned."""
    world.go()
    os.kill(pid, signal.SIGCONT)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    fd = _child_pipes.pop(pid)
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    os.close(fd)
    found: dict[str, Any] = json.loads(data)
    return found


def _script() -> list[Reply]:
    return [
        Reply(tool_uses=[ToolUse("create_ticket", {"title": "checkout is down"})]),
        Reply(text="Ticket opened."),
    ]


@pytest.mark.parametrize("kind", ["checked", "approved"])
def test_a_paused_worker_on_this_host_keeps_its_session(
    shared_url: str, tmp_path: Path, kind: str
) -> None:
    """Same host: the paused holder is alive, so its session and its call are left alone, past
    the lease and past the deadline alike."""
    tl.open_store(shared_url).close()
    world = Tickets(tmp_path / "world")
    with ScriptedModel(_script()) as model:
        pid = _start_paused_worker(shared_url, model, world, kind, timeout=SHORT_TIMEOUT)
        try:
            past_lease_and_deadline(shared_url)
            with tl.open_store(shared_url) as store:
                with pytest.raises(tl.SessionBusyError, match="is alive"):
                    agent(store, model, world, kind, SHORT_TIMEOUT).run(session=SESSION)
                (call,) = store.backend.read_messages(SESSION)[-1].content[-1:]
                block = {**call, "type": "tool_use"}
                with pytest.raises(tl.EffectInProgressError, match="is alive"):
                    tl.run_tool_uses(
                        [block], toolset(world, kind, SHORT_TIMEOUT), ledger=store.ledger(SESSION)
                    )
                assert store.in_doubt() == []
        finally:
            first = _resume(pid, world)
    assert first == {"status": "completed", "alerts": []}
    assert len(world.all()) == 1


@pytest.mark.parametrize("kind", ["checked", "approved"])
def test_another_host_waits_for_the_paused_worker_s_deadline(
    shared_url: str, tmp_path: Path, kind: str
) -> None:
    """Another host takes the expired lease, but the call is in progress until its deadline:
    it is neither checked, nor put to the approver, nor run. The paused worker's outcome then
    lands (fenced out of its checkpoint, not out of its record) and the session goes on."""
    tl.open_store(shared_url).close()
    world = Tickets(tmp_path / "world")
    with ScriptedModel(_script()) as model:
        pid = _start_paused_worker(shared_url, model, world, kind, timeout=300)
        try:
            time.sleep(LEASE_TTL + 0.3)
            with tl.open_store(shared_url) as store:
                far = elsewhere(store, "host-b", skew=120)
                with pytest.raises(tl.EffectInProgressError) as info:
                    agent(far, model, world, kind, 300).run(session=SESSION)
                assert info.value.until is not None and info.value.until > store.now() + 200
        finally:
            first = _resume(pid, world)
        assert first == {"error": "LeaseLostError", "alerts": []}
        with tl.open_store(shared_url) as store:
            far = elsewhere(store, "host-b")
            run = agent(far, model, world, kind, 300).run(session=SESSION)
            assert run.status is tl.RunStatus.COMPLETED
            assert [p for p in verify(store) if p.severity is Severity.ERROR] == []
    assert len(world.all()) == 1


@pytest.mark.parametrize("kind", ["checked", "keyed"])
def test_past_the_deadline_a_late_effect_is_caught(
    shared_url: str, tmp_path: Path, kind: str
) -> None:
    """The limit (docs/design.md, rule 14): past its lease and its deadline a paused worker is
    judged over; another host settles the call — its check finds nothing yet — and runs it. When the
    paused worker wakes its effect lands too. With a plain check that is a second ticket, and it
    is never silent: the late outcome is kept in the record and raised as an alert, and verify
    reports it. A tool that forwards its idempotency key lets the receiver refuse the repeat."""
    tl.open_store(shared_url).close()
    world = Tickets(tmp_path / "world")
    with ScriptedModel(_script()) as model:
        pid = _start_paused_worker(shared_url, model, world, kind, timeout=SHORT_TIMEOUT)
        try:
            past_lease_and_deadline(shared_url)
            with tl.open_store(shared_url) as store:
                far = agent(elsewhere(store), model, world, kind, SHORT_TIMEOUT)
                run = far.run(session=SESSION)
                assert run.status is tl.RunStatus.COMPLETED
        finally:
            first = _resume(pid, world)
        assert first["error"] == "LeaseLostError"
        with tl.open_store(shared_url) as store:
            (record,) = store.ledger(SESSION).records()
            errors = [p.message for p in verify(store) if p.severity is Severity.ERROR]
    assert record.status is Status.SUCCEEDED
    if kind == "keyed":
        # Safe to re-run: no intent, no in-doubt window; both attempts reached the receiver
        # under one key, and it refused the second.
        assert len(world.all()) == 1, "the receiver refused the repeat"
        assert first["alerts"] == [] and errors == []
    else:
        assert record.attempt == 2
        (past,) = record.history
        assert past.attempt == 1 and past.late == "succeeded"
        assert past.settled == "its check found no trace of it"
        assert len(world.all()) == 2, (
            "the documented limit: a paused process woke past its deadline"
        )
        assert first["alerts"] == ["LateOutcomeError"]
        assert len(errors) == 1 and "Both may have taken effect" in errors[0]
