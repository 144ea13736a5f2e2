"""The simulated outside world: its own ledger of truth, the tools that act on it, the model.

Every effect a tool makes lands here, with which attempt of which call made it, when, and from
which process — so the checks count effects in the world, never in toolledger's ledger.

Tool kinds, one per recovery strategy: ``plain`` (non-idempotent: an in-doubt call needs a
person), ``checked`` (non-idempotent with a ``check`` that finds the effect by its key), ``keyed``
(forwards its idempotency key to a receiver that drops repeats), ``idempotent`` (ensure-exists by
the call's title), ``read_only`` and ``high_impact`` (non-idempotent, approved through the
persisted queue).

A tool's effect happens at one instant of its run (when its request is "sent"). A tool that
*honours its deadline* counts down what ``ctx.remaining()`` says is left (``ctx.expires``, on the
monotonic clock, which no wall-clock step moves) before sending, and fails instead of sending
late — as a client given ``ctx.remaining()`` as its timeout does. One that does not may send
after its deadline: the documented limit (rule 14 of docs/design.md).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...records import EffectClass
from ...tools import Tool, ToolContext, ToolSet

__all__ = ["KINDS", "Effect", "SimWorld", "script_for"]

KINDS = ("plain", "checked", "keyed", "idempotent", "read_only", "high_impact")
NAMES = {
    "plain": "create_ticket",
    "checked": "create_ticket_checked",
    "keyed": "charge_keyed",
    "idempotent": "ensure_ticket",
    "read_only": "list_tickets",
    "high_impact": "wire_money",
}
KIND_OF = {name: kind for kind, name in NAMES.items()}
EFFECT = {"idempotent": EffectClass.IDEMPOTENT, "read_only": EffectClass.READ_ONLY}


@dataclass(frozen=True)
class Effect:
    """One effect in the world."""

    kind: str
    title: str  # the logical call (session, turn, index): unique per call of a script
    tool_use_id: str
    attempt: int
    key: str  # the call's idempotency key
    at: float  # simulated true time
    process: str  # which simulated process sent it
    past_deadline: bool  # sent after the attempt's deadline (by its host's clock)


@dataclass
class SimWorld:
    """What really happened. ``clock_of`` gives a process's own clock; ``who`` the process
    running now (set by the engine around each tool run)."""

    now: Callable[[], float]
    effects: list[Effect] = field(default_factory=list)
    by_key: dict[str, Effect] = field(default_factory=dict)  # keyed receiver's memory
    by_title: dict[str, Effect] = field(default_factory=dict)  # idempotent receiver's
    late_sends_refused: int = 0
    who: str = ""
    local_time: float = 0.0
    honours_deadline: bool = True

    def effects_of(self, title: str) -> list[Effect]:
        return [e for e in self.effects if e.title == title]

    def _send(self, kind: str, title: str, ctx: ToolContext) -> dict[str, Any]:
        # An honest tool counts down what its context says is left, on the monotonic clock (the
        # simulation's true time): no wall clock, stepped or skewed, gives it longer.
        late = ctx.expires is not None and self.now() > ctx.expires
        if late and self.honours_deadline:
            self.late_sends_refused += 1
            raise TimeoutError("past its deadline: not sent")
        if kind == "keyed" and ctx.idempotency_key in self.by_key:
            return {"id": self.by_key[ctx.idempotency_key].tool_use_id, "repeat": True}
        if kind == "idempotent" and title in self.by_title:
            return {"id": self.by_title[title].tool_use_id, "repeat": True}
        effect = Effect(
            kind=kind,
            title=title,
            tool_use_id=ctx.tool_use_id,
            attempt=ctx.attempt,
            key=ctx.idempotency_key,
            at=self.now(),
            process=self.who,
            past_deadline=late,
        )
        self.effects.append(effect)
        self.by_key.setdefault(effect.key, effect)
        self.by_title.setdefault(title, effect)
        return {"id": ctx.tool_use_id, "title": title, "attempt": ctx.attempt}

    def _found(self, title: str, ctx: ToolContext) -> dict[str, Any] | None:
        for e in self.effects:
            if e.key == ctx.idempotency_key:
                return {"id": e.tool_use_id, "title": title, "attempt": e.attempt}
        return None

    def toolset(self, timeout: float) -> ToolSet:
        """The six tools, bound to this world, each with ``timeout``."""
        world = self
        made: list[Tool[Any, Any]] = []
        for kind in KINDS:
            made.append(_make(world, kind, timeout))
        return ToolSet(made)


def _make(world: SimWorld, kind: str, timeout: float) -> Tool[Any, Any]:
    def act(title: str, ctx: ToolContext) -> Any:
        if kind == "read_only":
            return [e.title for e in world.effects]
        return world._send(kind, title, ctx)

    made: Tool[Any, Any] = Tool(
        act,
        name=NAMES[kind],
        effect=EFFECT.get(kind, EffectClass.NON_IDEMPOTENT),
        high_impact=kind == "high_impact",
        forwards_idempotency_key=kind == "keyed",
        timeout=timeout,
    )
    if kind == "checked":

        @made.check
        def _(title: str, ctx: ToolContext) -> dict[str, Any] | None:
            return world._found(title, ctx)

    return made


def script_for(
    rng: random.Random, session: str, kinds: tuple[str, ...]
) -> list[list[tuple[str, str]]]:
    """A session's script: turns of ``(tool name, title)`` calls; the last turn is text only."""
    turns: list[list[tuple[str, str]]] = []
    for turn in range(rng.randint(1, 3)):
        calls = []
        for i in range(rng.randint(1, 2)):
            kind = rng.choice(kinds)
            calls.append((NAMES[kind], f"{session}/t{turn}c{i}"))
        turns.append(calls)
    return turns
