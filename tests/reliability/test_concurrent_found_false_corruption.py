"""Found by the concurrency torture (``toolledger._harness.concurrent_torture``): a worker paused
while it opened a session, whose lease another host took over meanwhile, reported a sound store as
corrupt.

``Agent.run`` takes the session's lease, then reads the session's state, then its ledger — two
reads, not one snapshot. Paused between them past its lease (here it stops itself with
``SIGSTOP``, heartbeat and all), it is taken over by a worker on another host, which starts the
session and runs its first turn. The paused worker wakes, reads the ledger and finds records of a
session whose state it read as absent. It used to raise ``CorruptLedgerError`` ("behind its ledger
… restore the session's newer checkpoint"), telling a person to restore a backup of a store that
is perfectly sound; being taken over is ``LeaseLostError`` (a ``SessionConflictError``).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import toolledger as tl
from toolledger._verify import Severity, verify
from toolledger.records import EffectRecord
from toolledger.testing import elsewhere
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

LEASE_TTL = 0.3


class StopsBeforeTheLedger:
    """A store backend whose process stops itself (``SIGSTOP``) before it first reads a whole
    ledger: after ``Agent.run`` has read the session's state, before it reads its records."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self._stopped = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def _stop_once(self) -> None:
        if not self._stopped:
            self._stopped = True
            os.kill(os.getpid(), signal.SIGSTOP)

    def read_effects(
        self, session_id: str, tool_use_ids: Sequence[str] | None = None
    ) -> dict[str, EffectRecord]:
        if tool_use_ids is None:
            self._stop_once()
        found: dict[str, EffectRecord] = self._backend.read_effects(session_id, tool_use_ids)
        return found

    def read_effect_ids(self, session_id: str) -> list[str]:
        # Opening a session reads the ledger's ids alone: the same read, as far as a take-over
        # between it and the state is concerned.
        self._stop_once()
        found: list[str] = self._backend.read_effect_ids(session_id)
        return found


@tl.tool(effect="non_idempotent")
def create_ticket(title: str) -> str:
    """Open a ticket."""
    return f"ticket {title}"


def _paused_worker(url: str, model: ScriptedModel) -> int:
    """Fork the worker that stops between its two reads; returns its pid (a pipe tells its end)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(read_fd)
            with tl.open_store(url) as store:
                paused = tl.Store(StopsBeforeTheLedger(store.backend))
                agent = tl.Agent(
                    client=model.client(),
                    model="x",
                    tools=[create_ticket],
                    store=paused,
                    lease_ttl=LEASE_TTL,
                )
                try:
                    out = {"status": agent.run(session="s", prompt="go").status.value}
                except tl.ToolLedgerError as exc:
                    out = {
                        "error": type(exc).__name__,
                        "conflict": isinstance(exc, tl.SessionConflictError),
                    }
            os.write(write_fd, json.dumps(out).encode())
        except BaseException:
            code = 70
        finally:
            os._exit(code)
    os.close(write_fd)
    _pipes[pid] = read_fd
    return pid


_pipes: dict[int, int] = {}


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0] == "T"


def test_a_take_over_while_a_worker_opens_the_session_is_no_corruption(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    tl.open_store(url).close()
    script = [Reply(tool_uses=[ToolUse("create_ticket", {"title": "x"})]), Reply(text="Done.")]
    with ScriptedModel(script) as model:
        pid = _paused_worker(url, model)
        try:
            deadline = time.time() + 30
            while not _stopped(pid):
                assert time.time() < deadline, "the worker never reached its pause"
                time.sleep(0.005)
            time.sleep(LEASE_TTL + 0.2)  # its lease expires; another host takes the session
            with tl.open_store(url) as store:
                other = tl.Agent(
                    client=model.client(),
                    model="x",
                    tools=[create_ticket],
                    store=elsewhere(store, "host-b"),
                    lease_ttl=LEASE_TTL,
                )
                assert other.run(session="s", prompt="go").status is tl.RunStatus.COMPLETED
        finally:
            os.kill(pid, signal.SIGCONT)
            _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        fd = _pipes.pop(pid)
        woke: dict[str, Any] = json.loads(os.read(fd, 65536))
        os.close(fd)
    assert woke.get("error") != "CorruptLedgerError", "a take-over is no corruption"
    assert woke.get("conflict") is True, woke  # taken over: LeaseLostError
    with tl.open_store(url) as store:
        assert [p.message for p in verify(store) if p.severity is Severity.ERROR] == []
