"""The world of the concurrency torture (``toolledger._harness.concurrent_torture``): a ticket
system whose tickets are files, the tools that open them, the execution log every process
appends to, and the scripted model every worker talks to.

One directory, shared by every process of a run:

* ``tickets/SESSION/NAME.json`` — one file per ticket, created whole (written aside, then
  linked into place: ``link`` fails if the name is taken), so a ticket file is an effect, whole;
* ``log/WORKER.jsonl`` — each process's events, one JSON line per ``write``: a tool execution's
  ``start`` and ``end``, a check's answer, an agent run's outcome, an alert;
* ``active/SESSION`` — the sessions workers may pick; ``stop`` — time to finish.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._liveness import this_process
from ..testing.scripted import Reply, ScriptedModel, ToolUse
from ..testing.world import create_whole
from ..tools import Tool, ToolContext, ToolSet, tool

__all__ = [
    "KINDS",
    "TOOL_OF_KIND",
    "UNSAFE_TOOLS",
    "Call",
    "LogTail",
    "ScriptServer",
    "SharedWorld",
    "prompt_of",
]

KINDS = ("plain", "checked", "keyed", "idempotent", "read_only", "high_impact")
TOOL_OF_KIND = {
    "plain": "create_ticket",
    "checked": "create_ticket_checked",
    "keyed": "create_ticket_keyed",
    "idempotent": "ensure_ticket",
    "read_only": "list_tickets",
    "high_impact": "open_incident",
}
UNSAFE_TOOLS = frozenset({"create_ticket", "create_ticket_checked", "open_incident"})
"""Ticket tools without a forwarded key: one attempt, one intent, at most one ticket each."""


class SharedWorld:
    """The directory standing for the outside world, seen from any process of the run."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        for sub in ("tickets", "log", "active"):
            (self.path / sub).mkdir(parents=True, exist_ok=True)
        self._fd: int | None = None
        self._me: dict[str, Any] = {}
        self._rng = random.Random()  # noqa: S311 - test timing, not a secret

    # -- this process ----------------------------------------------------------------------------

    def join(self, worker: str, seed: int) -> None:
        """Open this process's log as ``worker`` (once per process, after it forked). The host it
        logs is the identity toolledger judges it by."""
        holder = this_process().holder
        self._fd = os.open(
            self.path / "log" / f"{worker}.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600
        )
        self._me = {"w": worker, "pid": os.getpid(), "host": holder.host if holder else ""}
        self._rng = random.Random(seed)  # noqa: S311 - test timing, not a secret

    def log(self, ev: str, **fields: Any) -> None:
        """Append one event: a single ``write`` on an ``O_APPEND`` file, whole or not at all."""
        assert self._fd is not None, "join() the world first"
        line = json.dumps({"ev": ev, "t": time.time(), **self._me, **fields}) + "\n"
        os.write(self._fd, line.encode())

    def nap(self, low: float, high: float) -> None:
        time.sleep(self._rng.uniform(low, high))

    # -- the ticket system -----------------------------------------------------------------------

    def make_ticket(self, session: str, name: str, ticket: dict[str, Any]) -> bool:
        """Create ticket ``name`` whole; ``False`` if that name exists (a repeat it refused)."""
        folder = self.path / "tickets" / session
        folder.mkdir(exist_ok=True)
        return create_whole(folder / f"{name}.json", json.dumps(ticket))

    def read_ticket(self, session: str, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = json.loads(
                (self.path / "tickets" / session / f"{name}.json").read_text()
            )
        except FileNotFoundError:
            return None
        return found

    def tickets(self, session: str | None = None) -> list[dict[str, Any]]:
        """Every ticket (of one session), by its file name."""
        root = self.path / "tickets"
        folders = [root / session] if session is not None else sorted(root.iterdir())
        out: list[dict[str, Any]] = []
        for folder in folders:
            if folder.is_dir():
                out += [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
        return out

    def has_ticket(self, session: str, title: str) -> bool:
        """The evidence a person would look for: is there a ticket with this title?"""
        return any(t.get("title") == title for t in self.tickets(session))

    # -- the sessions on offer ---------------------------------------------------------------------

    def activate(self, session: str) -> None:
        (self.path / "active" / session).touch()

    def retire(self, session: str) -> None:
        (self.path / "active" / session).unlink(missing_ok=True)

    def active(self) -> list[str]:
        return sorted(os.listdir(self.path / "active"))

    def stop(self) -> None:
        (self.path / "stop").touch()

    def stopped(self) -> bool:
        return (self.path / "stop").exists()

    def events(self) -> list[dict[str, Any]]:
        """Every event of every process (a line cut short by a kill is skipped)."""
        return [e for p in sorted((self.path / "log").glob("*.jsonl")) for e in _read_lines(p)]

    # -- the tools -------------------------------------------------------------------------------

    def toolset(self, timeouts: dict[str, float]) -> ToolSet:
        """The ticket tools, one per kind, bound to this world, with these ``timeout=``s.

        Each ticket-making execution logs ``start``, waits a few ms to tens of ms, makes its
        ticket, waits again and logs ``end``: the windows between intent, effect and outcome are
        wide enough for a pause or a kill to land in them.
        """
        world = self

        def effect(tool_name: str, title: str, ctx: ToolContext, name: str) -> dict[str, Any]:
            base = {
                "sid": ctx.session_id,
                "tid": ctx.tool_use_id,
                "tool": tool_name,
                "attempt": ctx.attempt,
                "x": uuid.uuid4().hex[:10],
            }
            world.log("start", **base)
            world.nap(0.002, 0.04)
            ticket = {
                "id": name,
                "title": title,
                "session": ctx.session_id,
                "tool_use_id": ctx.tool_use_id,
                "tool": tool_name,
                "attempt": ctx.attempt,
                "key": ctx.idempotency_key,
                **world._me,
                "at": time.time(),
            }
            made = world.make_ticket(ctx.session_id, name, ticket)
            found = ticket if made else (world.read_ticket(ctx.session_id, name) or ticket)
            world.nap(0.0, 0.015)
            world.log("end", made=made, **base)
            return {"id": found["id"], "title": title}

        def fresh(ctx: ToolContext) -> str:
            return f"{ctx.tool_use_id}.{uuid.uuid4().hex[:8]}"

        @tool(effect="non_idempotent", timeout=timeouts["create_ticket"])
        def create_ticket(title: str, ctx: ToolContext) -> dict[str, Any]:
            """Open a support ticket (every call opens a new one)."""
            return effect("create_ticket", title, ctx, fresh(ctx))

        @tool(effect="non_idempotent", timeout=timeouts["create_ticket_checked"])
        def create_ticket_checked(title: str, ctx: ToolContext) -> dict[str, Any]:
            """Open a support ticket; a lost outcome is found again by its title."""
            return effect("create_ticket_checked", title, ctx, fresh(ctx))

        @create_ticket_checked.check
        def _(title: str, ctx: ToolContext) -> dict[str, Any] | None:
            found = [t for t in world.tickets(ctx.session_id) if t.get("title") == title]
            world.log(
                "check",
                sid=ctx.session_id,
                tid=ctx.tool_use_id,
                attempt=ctx.attempt,
                found=bool(found),
            )
            return {"id": found[0]["id"], "title": title} if found else None

        @tool(
            effect="non_idempotent",
            forwards_idempotency_key=True,
            timeout=timeouts["create_ticket_keyed"],
        )
        def create_ticket_keyed(title: str, ctx: ToolContext) -> dict[str, Any]:
            """Open a support ticket through an API that de-duplicates by Idempotency-Key."""
            return effect("create_ticket_keyed", title, ctx, ctx.idempotency_key)

        @tool(effect="idempotent", timeout=timeouts["ensure_ticket"])
        def ensure_ticket(title: str, ctx: ToolContext) -> dict[str, Any]:
            """Return the ticket with this title, opening it if there is none."""
            return effect("ensure_ticket", title, ctx, hashlib.sha256(title.encode()).hexdigest())

        @tool(effect="non_idempotent", high_impact=True, timeout=timeouts["open_incident"])
        def open_incident(title: str, ctx: ToolContext) -> dict[str, Any]:
            """Open an incident and page the on-call engineer (a person approves each one)."""
            return effect("open_incident", title, ctx, fresh(ctx))

        @tool(effect="read_only", timeout=timeouts["list_tickets"])
        def list_tickets(session: str) -> list[str]:
            """The titles of a session's tickets."""
            return sorted(str(t.get("title")) for t in world.tickets(session))

        tools: list[Tool[Any, Any]] = [
            create_ticket,
            create_ticket_checked,
            create_ticket_keyed,
            ensure_ticket,
            open_incident,
            list_tickets,
        ]
        return ToolSet(tools)


def _read_lines(path: Path) -> Iterator[dict[str, Any]]:
    for line in path.read_bytes().splitlines():
        try:
            yield json.loads(line)
        except ValueError:
            continue


class LogTail:
    """The parent's running view of the logs: which executions are under way in which worker,
    read as the lines arrive."""

    def __init__(self, world: SharedWorld) -> None:
        self.world = world
        self._offsets: dict[Path, int] = {}
        self.inside: dict[str, dict[str, tuple[str, int]]] = {}  # worker -> id -> tool, attempt

    def poll(self) -> list[dict[str, Any]]:
        """Read what arrived; returns the executions that started since the last poll."""
        started: list[dict[str, Any]] = []
        for path in (self.world.path / "log").glob("*.jsonl"):
            start = self._offsets.get(path, 0)
            with open(path, "rb") as fh:
                fh.seek(start)
                data = fh.read()
            end = data.rfind(b"\n") + 1
            self._offsets[path] = start + end
            for line in data[:end].splitlines():
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if e.get("ev") == "start":
                    self.inside.setdefault(e["w"], {})[e["x"]] = (e["tool"], e["attempt"])
                    started.append(e)
                elif e.get("ev") == "end":
                    self.inside.get(e["w"], {}).pop(e["x"], None)
        return started

    def in_unsafe_tool(self, worker: str, *, again: bool = False) -> bool:
        """Whether ``worker`` is inside a tool without a forwarded key (``again``: running an
        attempt after the first)."""
        return any(
            t in UNSAFE_TOOLS and (a > 1 or not again)
            for t, a in self.inside.get(worker, {}).values()
        )


# -- the scripted model -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Call:
    kind: str
    title: str

    @property
    def tool(self) -> str:
        return TOOL_OF_KIND[self.kind]

    def tool_use(self, session: str) -> ToolUse:
        if self.kind == "read_only":
            return ToolUse(self.tool, {"session": session})
        return ToolUse(self.tool, {"title": self.title})


def prompt_of(session: str) -> str:
    return f"concurrent torture session {session}: open the tickets the script asks for"


class ScriptServer(ScriptedModel):
    """One scripted server for every session of a run: a session's prompt names its script."""

    def __init__(self, max_turns: int) -> None:
        self.scripts: dict[str, tuple[str, list[list[Call]]]] = {}  # prompt -> session, turns
        super().__init__([self._step(i) for i in range(max_turns + 1)])

    def _step(self, turn: int) -> Callable[[dict[str, Any]], Reply]:
        def reply(body: dict[str, Any]) -> Reply:
            prompt = body["messages"][0]["content"]
            found = self.scripts.get(prompt) if isinstance(prompt, str) else None
            if found is None or turn > len(found[1]):
                with self._lock:
                    self.rejected.append(f"turn {turn + 1} asked beyond the script of {prompt!r}")
                return Reply(text="(beyond the script)")
            session, script = found
            if turn == len(script):
                return Reply(text="All done.")
            return Reply(
                text=f"Turn {turn + 1}.", tool_uses=[c.tool_use(session) for c in script[turn]]
            )

        return reply

    def start(self) -> ScriptServer:
        super().start()
        assert self._server is not None
        # A worker killed mid-request leaves a broken connection behind: expected, not news.
        self._server.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
        return self

    def __enter__(self) -> ScriptServer:
        return self.start()

    def forget_requests(self) -> None:
        """The request log grows with every turn of every worker: a long run drops it."""
        with self._lock:
            self.requests.clear()
            self.paths.clear()
