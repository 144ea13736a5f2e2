"""The torture's scripted side: the world (tickets created whole), each session's script of calls,
the one scripted model serving every session, and the agent run a forked child makes."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._crash import arm as arm_crash
from ..agent._agent import Agent
from ..stores import open_store
from ..testing.scripted import Reply, ScriptedModel, ToolUse
from ..testing.world import TOOL_OF_KIND, World, create_whole
from ..tools import ToolSet

__all__ = [
    "KINDS",
    "MAX_TURNS",
    "Call",
    "ScriptModel",
    "TortureWorld",
    "child",
    "new_script",
    "prompt_of",
]

KINDS = ("plain", "checked", "keyed", "idempotent", "read_only")
MAX_TURNS = 4


class TortureWorld(World):
    """``World`` with ticket creation that is atomic, as a real ticket API's is: the ticket is
    written whole to a temporary file and linked into place (``link`` fails if the name is
    taken). A kill cannot leave half a ticket, so a ticket file is an effect, whole."""

    def _write_ticket(self, name: str, ticket: dict[str, Any]) -> dict[str, Any] | None:
        created = create_whole(self.path / "tickets" / f"{name}.json", json.dumps(ticket))
        return ticket if created else None

    def titles(self) -> Counter[str]:
        return Counter(str(t.get("title")) for t in self.tickets())


@dataclass(frozen=True)
class Call:
    kind: str
    title: str

    def tool_use(self) -> ToolUse:
        if self.kind == "read_only":
            return ToolUse("list_tickets", {})
        return ToolUse(TOOL_OF_KIND[self.kind], {"title": self.title})


def new_script(rng: random.Random) -> list[list[Call]]:
    return [
        [Call(rng.choice(KINDS), f"t{turn}c{i}") for i in range(rng.randint(1, 3))]
        for turn in range(rng.randint(2, MAX_TURNS))
    ]


class ScriptModel(ScriptedModel):
    """One scripted server for every session: the prompt names the session's script."""

    def __init__(self) -> None:
        self.scripts: dict[str, list[list[Call]]] = {}
        super().__init__([self._step(i) for i in range(MAX_TURNS + 1)])

    def __enter__(self) -> ScriptModel:
        return self.start()

    def _step(self, turn: int) -> Callable[[dict[str, Any]], Reply]:
        def reply(body: dict[str, Any]) -> Reply:
            prompt = body["messages"][0]["content"]
            script = self.scripts.get(prompt) if isinstance(prompt, str) else None
            if script is None or turn > len(script):
                with self._lock:
                    self.rejected.append(f"turn {turn + 1} asked beyond the script of {prompt!r}")
                return Reply(text="(beyond the script)")
            if turn == len(script):
                return Reply(text="All done.")
            return Reply(text=f"Turn {turn + 1}.", tool_uses=[c.tool_use() for c in script[turn]])

        return reply

    def start(self) -> ScriptModel:
        super().start()
        assert self._server is not None
        # A child killed mid-request leaves a broken connection behind: expected, not news.
        self._server.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
        return self


def child(store_url: str, client: Any, tools: ToolSet, session: str, crash_at: str | None) -> Any:
    """One ``Agent.run`` of ``session``, in the forked child."""
    arm_crash(crash_at)  # what TOOLLEDGER_CRASH_AT does at import time
    try:
        with open_store(store_url) as store:
            agent = Agent(client=client, model="claude-scripted", tools=tools, store=store)
            run = agent.run(session=session, prompt=prompt_of(session))
            return {"status": run.status.value, "reason": run.reason, "alerts": len(run.alerts)}
    except BaseException as exc:
        return {"error": type(exc).__name__, "message": str(exc)}


def prompt_of(session: str) -> str:
    return f"torture session {session}: open the tickets the script asks for"
