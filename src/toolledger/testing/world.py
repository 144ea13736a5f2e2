"""A fake world for crash tests: tools whose effects are files, counted independently of the ledger.

Every tool logs each real execution (``executions``) and leaves its effect as a file
(``tickets``). A test asserts on those files — what really happened — never on toolledger's own
records. The same tools run in a separate process that the test kills with ``SIGKILL``
(``run_agent``), which is what the crash matrix and the torture harness do.

Four ways to create a ticket, one per recovery strategy of docs/design.md, rule 6:

* ``create_ticket`` — plain non-idempotent: an in-doubt call needs a person;
* ``create_ticket_checked`` — non-idempotent with a ``check`` that finds the ticket by its
  external id (the idempotency key);
* ``create_ticket_keyed`` — forwards its idempotency key to a ticket API that de-duplicates;
* ``ensure_ticket`` — idempotent by design: looks the title up before creating.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..approvals._queue import queue
from ..engine._gate import ApprovalRequest
from ..tools import Tool, ToolContext, ToolSet, tool

__all__ = ["KINDS", "AgentSpec", "World", "create_whole", "run_agent", "run_forked"]


def create_whole(path: Path, text: str) -> bool:
    """Create ``path`` holding ``text``, whole: written to a temporary file and linked into place
    (``link`` fails if the name is taken). ``False`` if ``path`` exists. A kill cannot leave half
    a file."""
    tmp = path.with_name(f".{path.stem}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(text)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    return True


KINDS = ("plain", "checked", "keyed", "idempotent")
TOOL_OF_KIND = {
    "plain": "create_ticket",
    "checked": "create_ticket_checked",
    "keyed": "create_ticket_keyed",
    "idempotent": "ensure_ticket",
}


class World:
    """A directory standing for the outside world (a ticket system)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        (self.path / "tickets").mkdir(parents=True, exist_ok=True)

    # -- what happened ---------------------------------------------------------------------------

    def log_execution(self, tool_name: str, ctx: ToolContext) -> None:
        line = json.dumps(
            {
                "tool": tool_name,
                "tool_use_id": ctx.tool_use_id,
                "attempt": ctx.attempt,
                "in_doubt": ctx.in_doubt,
            }
        )
        with open(self.path / "executions.log", "a") as fh:
            fh.write(line + "\n")

    def executions(self, tool_name: str | None = None) -> list[dict[str, Any]]:
        try:
            lines = (self.path / "executions.log").read_text().splitlines()
        except FileNotFoundError:
            return []
        entries = [json.loads(line) for line in lines if line]
        return [e for e in entries if tool_name is None or e["tool"] == tool_name]

    def tickets(self) -> list[dict[str, Any]]:
        return [
            json.loads(p.read_text())
            for p in sorted((self.path / "tickets").iterdir())
            if p.suffix == ".json"
        ]

    # -- the ticket system -----------------------------------------------------------------------

    def _write_ticket(self, name: str, ticket: dict[str, Any]) -> dict[str, Any] | None:
        """Create ``tickets/name.json`` unless it exists; ``None`` if it did. Whole
        (``create_whole``): a worker killed at any instant leaves the ticket or nothing, never an
        empty file that no reader could attribute."""
        path = self.path / "tickets" / f"{name}.json"
        return ticket if create_whole(path, json.dumps(ticket)) else None

    def _read_ticket(self, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = json.loads((self.path / "tickets" / f"{name}.json").read_text())
        except FileNotFoundError:
            return None
        return found

    def toolset(self) -> ToolSet:
        """The four ticket tools plus a read-only lookup, bound to this world."""
        world = self

        @tool(effect="non_idempotent")
        def create_ticket(title: str, ctx: ToolContext) -> dict[str, Any]:
            """Open a support ticket (every call opens a new one)."""
            world.log_execution("create_ticket", ctx)
            ticket = {"id": uuid.uuid4().hex[:8], "title": title}
            world._write_ticket(ticket["id"], ticket)
            return ticket

        @tool(effect="non_idempotent")
        def create_ticket_checked(title: str, ctx: ToolContext) -> dict[str, Any]:
            """Open a support ticket tagged with an external id."""
            world.log_execution("create_ticket_checked", ctx)
            ticket = {
                "id": uuid.uuid4().hex[:8],
                "title": title,
                "external_id": ctx.idempotency_key,
            }
            world._write_ticket(ticket["id"], ticket)
            return ticket

        @create_ticket_checked.check
        def _(title: str, ctx: ToolContext) -> dict[str, Any] | None:
            found = [t for t in world.tickets() if t.get("external_id") == ctx.idempotency_key]
            return found[0] if found else None

        @tool(effect="non_idempotent", forwards_idempotency_key=True)
        def create_ticket_keyed(title: str, ctx: ToolContext) -> dict[str, Any]:
            """Open a support ticket through an API that honours Idempotency-Key."""
            world.log_execution("create_ticket_keyed", ctx)
            ticket = {"id": ctx.idempotency_key, "title": title}
            return world._write_ticket(ctx.idempotency_key, ticket) or (
                world._read_ticket(ctx.idempotency_key) or ticket
            )

        @tool(effect="idempotent")
        def ensure_ticket(title: str, ctx: ToolContext) -> dict[str, Any]:
            """Return the ticket with this title, opening it if there is none."""
            world.log_execution("ensure_ticket", ctx)
            name = hashlib.sha256(title.encode()).hexdigest()[:16]
            ticket = {"id": name, "title": title}
            return world._write_ticket(name, ticket) or world._read_ticket(name) or ticket

        @tool(effect="read_only")
        def list_tickets() -> list[dict[str, Any]]:
            """List every ticket."""
            return world.tickets()

        tools: list[Tool[Any, Any]] = [
            create_ticket,
            create_ticket_checked,
            create_ticket_keyed,
            ensure_ticket,
            list_tickets,
        ]
        return ToolSet(tools)


@dataclass(frozen=True)
class AgentSpec:
    """Everything a child process needs to run one agent session against a scripted model."""

    store_url: str
    base_url: str
    world: str
    session: str
    prompt: str = "A customer reports an outage; open a ticket."
    approve: str = "none"  # none | all | queue
    model: str = "claude-scripted"
    provider: str = "anthropic"  # anthropic | openai (Chat Completions) | openai-responses


def _approve_all(request: ApprovalRequest) -> bool:
    return True


def _child(spec: AgentSpec, crash_at: str | None, result_path: str) -> None:
    from .. import _crash
    from ..agent._agent import Agent
    from ..errors import ToolLedgerError
    from ..stores import open_store

    _crash.arm(crash_at)
    approve = {"none": None, "all": _approve_all, "queue": queue}[spec.approve]
    client = _client(spec)
    out: dict[str, Any]
    with open_store(spec.store_url) as store:
        agent = Agent(
            client=client,
            model=spec.model,
            tools=World(spec.world).toolset(),
            store=store,
            approve=approve,
        )
        try:
            run = agent.run(session=spec.session, prompt=spec.prompt)
            out = {
                "status": run.status.value,
                "reason": run.reason,
                "turns": run.turns,
                "alerts": len(run.alerts),
            }
        except ToolLedgerError as exc:
            out = {"error": type(exc).__name__, "message": str(exc)}
    Path(result_path).write_text(json.dumps(out))


def _client(spec: AgentSpec) -> Any:
    """The model client a child builds for ``spec.provider``, pointed at ``spec.base_url``."""
    if spec.provider == "anthropic":
        import anthropic

        return anthropic.Anthropic(base_url=spec.base_url, api_key="scripted", max_retries=0)
    import openai

    from ..adapters.openai import OpenAIResponses

    client = openai.OpenAI(base_url=spec.base_url, api_key="scripted", max_retries=0)
    if spec.provider == "openai":
        return client
    if spec.provider == "openai-responses":
        return OpenAIResponses(client)
    raise ValueError(f"unknown provider {spec.provider!r}: anthropic, openai, openai-responses")


def run_agent(
    spec: AgentSpec, *, crash_at: str | None = None, timeout: float = 60
) -> tuple[int, dict[str, Any] | None]:
    """Run one ``Agent.run`` in a forked process, armed to ``SIGKILL`` itself at ``crash_at``.

    Returns the exit code (``-9`` when it was killed) and what the run returned (``None`` when it
    was killed first).
    """
    import anthropic  # noqa: F401 - imported once here, inherited by every forked child

    if spec.provider != "anthropic":
        import openai

        # The SDK loads its resources on first use: load them here, once, not in every child.
        warm = openai.OpenAI(base_url=spec.base_url, api_key="scripted")
        _ = warm.chat.completions, warm.responses

    return run_forked(_child, (spec, crash_at), Path(spec.world), timeout=timeout)


def run_forked(
    target: Callable[..., None],
    args: tuple[Any, ...],
    directory: Path,
    *,
    timeout: float = 60,
) -> tuple[int, dict[str, Any] | None]:
    """Run ``target(*args, result_path)`` in a forked process; it writes its JSON result there.
    Returns the exit code (``-9`` when it was killed) and the result (``None`` when there was
    none). Raises ``TimeoutError`` (after killing it) if it does not finish in ``timeout``."""
    result = directory / f"result-{uuid.uuid4().hex[:8]}.json"
    ctx = multiprocessing.get_context("fork")
    proc = ctx.Process(target=target, args=(*args, str(result)))
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
        raise TimeoutError(f"the forked process did not finish in {timeout}s: {args!r:.300}")
    assert proc.exitcode is not None
    try:
        found: dict[str, Any] | None = json.loads(result.read_text())
    except FileNotFoundError:
        found = None
    finally:
        result.unlink(missing_ok=True)
    return proc.exitcode, found
