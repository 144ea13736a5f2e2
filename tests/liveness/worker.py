"""A worker for the liveness worlds (run as a script, never imported by the tests).

``python worker.py CONFIG_JSON``: runs one call — through ``run_tool_uses`` ("ledger") or an
agent session ("agent") — against a shared store, and writes what happened to ``out``. The tool,
``create_ticket``, writes one file per real execution into the world's ``tickets`` directory; the
first process to enter it writes ``entered`` (its pids, as it sees them and as ``/proc/self``
names it) and holds there until the test touches ``go``. Its ``check`` looks for the ticket by
the call's idempotency key, as a real ticketing API would.

With ``clock_file`` set, this process's wall clock (``time.time``) is the real one plus the
offset written in that file: a host clock stepped under a running worker, without stepping the
machine's. The monotonic clock, as in a real step, is untouched.
"""

from __future__ import annotations

import json
import os
import sys
import time

CONFIG = json.loads(sys.argv[1])

if CONFIG.get("clock_file"):
    _real_time = time.time
    _clock_file = CONFIG["clock_file"]
    _cached = [0.0, -1.0]  # offset, monotonic time it was read

    def _stepped_time() -> float:
        now = time.monotonic()
        if now - _cached[1] > 0.02:
            try:
                with open(_clock_file) as fh:
                    _cached[0] = float(fh.read().strip() or 0)
            except (OSError, ValueError):
                pass
            _cached[1] = now
        return _real_time() + _cached[0]

    time.time = _stepped_time  # before toolledger binds it anywhere

os.umask(0)  # the store's files are shared by workers of other uids

from pathlib import Path  # noqa: E402

import toolledger as tl  # noqa: E402

WORLD = Path(CONFIG["world"])
TICKETS = WORLD / "tickets"


@tl.tool(timeout=float(CONFIG.get("tool_timeout", 300.0)))
def create_ticket(title: str, ctx: tl.ToolContext) -> dict[str, str]:
    """Open a ticket."""
    entered = WORLD / "entered"
    try:
        fd = os.open(entered, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
    except FileExistsError:
        pass
    else:
        try:
            proc_self = os.readlink("/proc/self")
        except OSError:
            proc_self = None
        os.write(fd, json.dumps({"pid": os.getpid(), "proc_self": proc_self}).encode())
        os.close(fd)
        until = time.monotonic() + float(CONFIG.get("hold", 60.0))
        while not (WORLD / "go").exists() and time.monotonic() < until:
            time.sleep(0.01)
    name = TICKETS / f"{ctx.idempotency_key}-{os.getpid()}-{time.monotonic_ns()}"
    name.write_text(title)
    return {"ticket": name.name}


@create_ticket.check
def _(title: str, ctx: tl.ToolContext) -> dict[str, str] | None:
    for found in TICKETS.iterdir():
        if found.name.startswith(f"{ctx.idempotency_key}-"):
            return {"ticket": found.name}
    return None


def _ledger(store: tl.Store) -> dict[str, object]:
    content = [
        {
            "type": "tool_use",
            "id": CONFIG["tool_use_id"],
            "name": "create_ticket",
            "input": {"title": "outage"},
        }
    ]
    (result,) = tl.run_tool_uses(
        content, [create_ticket], ledger=store.ledger(CONFIG["session"]), wait=0.0
    )
    return {"status": "error" if result.get("is_error") else "ok", "content": result["content"]}


def _agent(store: tl.Store) -> dict[str, object]:
    import anthropic

    client = anthropic.Anthropic(base_url=CONFIG["model_url"], api_key="x", max_retries=0)
    agent = tl.Agent(
        client=client,
        model="x",
        tools=[create_ticket],
        store=store,
        lease_ttl=float(CONFIG.get("lease_ttl", 30.0)),
    )
    busy = 0
    give_up = time.monotonic() + float(CONFIG.get("retry_busy", 0.0))
    retry_on = tuple(getattr(tl, name) for name in CONFIG.get("retry_on", ["SessionBusyError"]))
    while True:
        try:
            run = agent.run(session=CONFIG["session"], prompt="open a ticket")
        except retry_on:
            busy += 1
            if time.monotonic() >= give_up:
                raise
            time.sleep(0.05)
            continue
        return {"status": run.status.value, "reason": run.reason, "busy": busy}


def main() -> None:
    began = time.monotonic()
    answer: dict[str, object]
    try:
        with tl.open_store(CONFIG["store"]) as store:
            answer = _agent(store) if CONFIG["mode"] == "agent" else _ledger(store)
    except tl.ToolLedgerError as exc:
        answer = {"error": type(exc).__name__, "message": str(exc)}
    answer["pid"] = os.getpid()
    answer["took"] = time.monotonic() - began
    Path(CONFIG["out"]).write_text(json.dumps(answer))


main()
