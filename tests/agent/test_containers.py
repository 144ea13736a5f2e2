"""Containers of one host: two workers with one hostname and one kernel (one boot id) but their
own PID namespaces (``unshare --pid --fork --mount-proc``). Neither may judge the other's pid by
its own process table — there it names nothing, or someone else. Each sees the other as another
host: by lease, and by deadline on the store's clock.

Worker A takes the session and freezes (``SIGSTOP``) inside a plain non-idempotent tool, before
its effect; worker B, in another PID namespace, comes for the session after A's lease expired.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import toolledger as tl
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

from ..helpers import freeze_between_writes

SESSION = "container-run"

WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    import anthropic
    import toolledger as tl

    store_url, base_url, world, out = sys.argv[1:5]
    world = Path(world)

    @tl.tool(timeout=float(os.environ["TOOL_TIMEOUT"]))
    def create_ticket(title: str, ctx: tl.ToolContext) -> dict:
        \"\"\"Open a ticket.\"\"\"
        if not (world / "entered").exists():
            (world / "entered").write_text(str(os.getpid()))
            deadline = time.time() + 60
            while not (world / "go").exists() and time.time() < deadline:
                time.sleep(0.005)
        name = world / "tickets" / f"{ctx.tool_use_id}-{ctx.attempt}-{os.getpid()}.json"
        name.write_text(json.dumps({"title": title}))
        return {"ticket": name.name}

    client = anthropic.Anthropic(base_url=base_url, api_key="x", max_retries=0)
    with tl.open_store(store_url) as store:
        agent = tl.Agent(
            client=client, model="x", tools=[create_ticket], store=store, lease_ttl=0.5
        )
        try:
            run = agent.run(session=sys.argv[5], prompt="open a ticket")
            answer = {"status": run.status.value, "pid": os.getpid()}
        except tl.ToolLedgerError as exc:
            answer = {"error": type(exc).__name__, "message": str(exc), "pid": os.getpid()}
    Path(out).write_text(json.dumps(answer))
    """
)


def _unshare_works() -> str | None:
    if shutil.which("unshare") is None:
        return "unshare is not installed"
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, check=False
    )
    if done.returncode != 0:
        return f"unshare --pid failed: {done.stderr.decode().strip()}"
    return None


@pytest.fixture
def namespaces() -> None:
    why = _unshare_works()
    if why is not None:
        reason = f"CONTAINERS NOT TESTED: {why} (needs root or user namespaces)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason}. Under CI=true a skipped case is a failure.")
        pytest.skip(reason)


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Workers started by a test; whatever the test's outcome, none is left behind (a failed
    assertion must not leave a worker stopped with SIGSTOP for the rest of the run)."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def _worker(
    tmp_path: Path,
    url: str,
    model: ScriptedModel,
    name: str,
    timeout: float,
    spawned: list[subprocess.Popen[bytes]],
) -> tuple[subprocess.Popen[bytes], Path]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / f"{name}.json"
    env = {**os.environ, "TOOL_TIMEOUT": str(timeout), "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("TOOLLEDGER_HOST_ID", None)
    proc = subprocess.Popen(
        [
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            sys.executable,
            str(script),
            url,
            model.url,
            str(tmp_path / "world"),
            str(out),
            SESSION,
        ],
        env=env,
        start_new_session=True,  # its own process group: stopped and continued as one
    )
    spawned.append(proc)
    return proc, out


def _result(proc: subprocess.Popen[bytes], out: Path) -> dict[str, Any]:
    assert proc.wait(60) == 0
    found: dict[str, Any] = json.loads(out.read_text())
    return found


def _group_stopped(group: int) -> None:
    """Return once every thread of every process in process group ``group`` is stopped (its
    state in ``/proc``: ``T``): a signal to a group lands on each thread in its own time."""
    deadline = time.monotonic() + 10
    while True:
        states = []
        for stat in Path("/proc").glob("[0-9]*/task/[0-9]*/stat"):
            with contextlib.suppress(OSError):
                text = stat.read_text()
                fields = text[text.rindex(")") + 2 :].split()
                if int(fields[2]) == group:  # state, ppid, pgrp
                    states.append(fields[0])
        if states and all(s in "Tt" for s in states):
            return
        assert time.monotonic() < deadline, f"group {group} not stopped: {states}"
        time.sleep(0.005)


@pytest.mark.parametrize("ending", ["paused", "killed"])
def test_another_pid_namespace_never_judges_a_worker_by_its_own_process_table(
    namespaces: None, tmp_path: Path, ending: str, spawned: list[subprocess.Popen[bytes]]
) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    tl.open_store(url).close()
    (tmp_path / "world" / "tickets").mkdir(parents=True)
    # B must come while A's deadline stands: long enough for a Python to start on a loaded host.
    timeout = 10.0
    script = [Reply(tool_uses=[ToolUse("create_ticket", {"title": "outage"})]), Reply(text="ok")]
    with ScriptedModel(script) as model:
        a, a_out = _worker(tmp_path, url, model, "a", timeout, spawned)
        deadline = time.time() + 30
        entered = tmp_path / "world" / "entered"
        # Created, then written: wait for its text too (a loaded host can part the two).
        while not (entered.exists() and entered.read_text().strip().isdigit()):
            assert time.time() < deadline and a.poll() is None, "worker A never reached its tool"
            time.sleep(0.01)
        inner_pid = int(entered.read_text())
        assert inner_pid < 10, "A runs in a PID namespace of its own (its pid there is tiny)"
        if ending == "paused":
            # Between A's commits: its keeper frozen mid-renewal would hold the write lock.
            def stop() -> None:
                os.killpg(a.pid, signal.SIGSTOP)
                _group_stopped(a.pid)

            freeze_between_writes(url, stop=stop, go=lambda: os.killpg(a.pid, signal.SIGCONT))
        else:
            os.killpg(a.pid, signal.SIGKILL)
        time.sleep(0.8)  # past A's lease: only its deadline still stands

        b, b_out = _worker(tmp_path, url, model, "b", timeout, spawned)
        first_b = _result(b, b_out)
        assert first_b.get("error") == "EffectInProgressError", first_b
        assert "deadline has not passed" in first_b["message"]

        if ending == "paused":
            (tmp_path / "world" / "go").touch()
            os.killpg(a.pid, signal.SIGCONT)
            paused = _result(a, a_out)
            assert (paused["error"], paused["pid"]) == ("LeaseLostError", inner_pid), paused
        else:
            a.wait(10)
            with tl.open_store(url) as store:
                (intent,) = store.ledger(SESSION).records()
            assert intent.deadline is not None
            time.sleep(max(0.0, intent.deadline - time.time()) + 0.2)  # past it: now in doubt
        c, c_out = _worker(tmp_path, url, model, "c", timeout, spawned)
        last = _result(c, c_out)
        if ending == "killed":
            # A died before its effect: in doubt, and a person who looks finds no ticket.
            assert last["status"] == "needs_attention", last
            with tl.open_store(url) as store:
                (doubt,) = store.ledger(SESSION).in_doubt()
                store.ledger(SESSION).resolve(doubt.tool_use_id, happened=False, by="ana")
            d, d_out = _worker(tmp_path, url, model, "d", timeout, spawned)
            last = _result(d, d_out)
        assert last["status"] == "completed", last
    assert len(list((tmp_path / "world" / "tickets").iterdir())) == 1
