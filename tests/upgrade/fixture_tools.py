"""The tools of the upgrade fixtures (``tests/upgrade/fixtures/``), and the world they act on.

The stores under ``fixtures/v0_1_0/`` were written by toolledger 0.1.0 running these tools
(``make_v0_1_0_fixtures.py``); a later release resumes those sessions with the same tools. So this
module uses only what 0.1.0 already had: ``tl.tool(effect=..., high_impact=...)``,
``tl.ToolContext`` and ``tl.ToolSet``.

Like ``toolledger.testing.World``, every tool logs each real execution (``executions.log``) and
leaves its effect as a file, so a test counts what really happened — never toolledger's own
records. A world is a directory:

* ``tickets/T-0001.json`` … — one file per ticket (``create_ticket`` opens the next number);
  ``add_comment`` appends to a ticket's ``comments`` (and fails for a ticket that does not exist);
* ``outbox/M-0001.json`` … — one file per e-mail sent (``send_email``);
* ``executions.log`` — one JSON line per real execution: tool, tool_use_id, attempt, in_doubt.

``FixtureWorld.snapshot()`` is that state as data (the manifest keeps one per session, so no world
directory is committed) and ``FixtureWorld.restore(path, snapshot)`` lays it out again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import toolledger as tl

__all__ = ["TOOLS", "FixtureWorld", "replies"]

TOOLS: dict[str, dict[str, Any]] = {
    "create_ticket": {"effect": "non_idempotent", "high_impact": False},
    "list_tickets": {"effect": "read_only", "high_impact": False},
    "add_comment": {"effect": "non_idempotent", "high_impact": False},
    "send_email": {"effect": "non_idempotent", "high_impact": True},
}
"""Each tool's declaration, as the fixtures' manifest records it."""


class FixtureWorld:
    """A directory standing for the outside world: a ticket system and an outbox."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        for sub in ("tickets", "outbox"):
            (self.path / sub).mkdir(parents=True, exist_ok=True)

    # -- what happened ---------------------------------------------------------------------------

    def log_execution(self, tool_name: str, ctx: tl.ToolContext) -> None:
        line = json.dumps(
            {
                "tool": tool_name,
                "tool_use_id": ctx.tool_use_id,
                "attempt": ctx.attempt,
                "in_doubt": ctx.in_doubt,
            },
            sort_keys=True,
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
        return self._read_all("tickets")

    def emails(self) -> list[dict[str, Any]]:
        return self._read_all("outbox")

    def snapshot(self) -> dict[str, Any]:
        """The whole world as data: ``{"tickets": [...], "emails": [...], "executions": [...]}``."""
        return {
            "tickets": self.tickets(),
            "emails": self.emails(),
            "executions": self.executions(),
        }

    @classmethod
    def restore(cls, path: str | Path, snapshot: Mapping[str, Any]) -> FixtureWorld:
        """A world at ``path`` holding exactly ``snapshot`` (as ``snapshot()`` returned it)."""
        world = cls(path)
        for sub, items in (("tickets", snapshot["tickets"]), ("outbox", snapshot["emails"])):
            for item in items:
                (world.path / sub / f"{item['id']}.json").write_text(json.dumps(item))
        lines = [json.dumps(e, sort_keys=True) + "\n" for e in snapshot["executions"]]
        (world.path / "executions.log").write_text("".join(lines))
        return world

    # -- the systems -----------------------------------------------------------------------------

    def _read_all(self, sub: str) -> list[dict[str, Any]]:
        return [
            json.loads(p.read_text())
            for p in sorted((self.path / sub).iterdir())
            if p.suffix == ".json"
        ]

    def _create(self, sub: str, prefix: str, item: dict[str, Any]) -> dict[str, Any]:
        """Store ``item`` under the next free number (``T-0001``, ``M-0001`` …): O_EXCL, so a
        number is never taken twice."""
        n = len(list((self.path / sub).glob("*.json"))) + 1
        while True:
            name = f"{prefix}-{n:04d}"
            try:
                fd = os.open(self.path / sub / f"{name}.json", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                n += 1
                continue
            created = {"id": name, **item}
            with os.fdopen(fd, "w") as fh:
                fh.write(json.dumps(created))
            return created

    def toolset(self) -> tl.ToolSet:
        """The fixtures' four tools, bound to this world."""
        world = self

        @tl.tool(effect="non_idempotent")
        def create_ticket(title: str, ctx: tl.ToolContext) -> dict[str, Any]:
            """Open a support ticket (every call opens a new one)."""
            world.log_execution("create_ticket", ctx)
            return world._create(
                "tickets",
                "T",
                {"title": title, "status": "open", "external_id": ctx.idempotency_key},
            )

        @tl.tool(effect="read_only")
        def list_tickets(ctx: tl.ToolContext) -> list[dict[str, Any]]:
            """List every ticket."""
            world.log_execution("list_tickets", ctx)
            return world.tickets()

        @tl.tool(effect="non_idempotent")
        def add_comment(ticket_id: str, text: str, ctx: tl.ToolContext) -> dict[str, Any]:
            """Add a comment to a ticket (every call adds one more)."""
            world.log_execution("add_comment", ctx)
            path = world.path / "tickets" / f"{ticket_id}.json"
            if not path.is_file():
                raise LookupError(f"no ticket {ticket_id}")
            ticket: dict[str, Any] = json.loads(path.read_text())
            ticket["comments"] = [*ticket.get("comments", []), text]
            path.write_text(json.dumps(ticket))
            return ticket

        @tl.tool(effect="non_idempotent", high_impact=True)
        def send_email(to: str, subject: str, ctx: tl.ToolContext) -> dict[str, Any]:
            """E-mail a customer (a person approves each one)."""
            world.log_execution("send_email", ctx)
            return world._create(
                "outbox", "M", {"to": to, "subject": subject, "message_id": ctx.idempotency_key}
            )

        return tl.ToolSet([create_ticket, list_tickets, add_comment, send_email])


def replies(steps: Iterable[Mapping[str, Any]]) -> list[Any]:
    """A manifest script (``[{"text": ..., "tool_uses": [{"name": ..., "input": ...}]}, …]``) as
    ``toolledger.testing.Reply`` steps for ``ScriptedModel``."""
    from toolledger.testing import Reply, ToolUse

    out = []
    for step in steps:
        uses: Sequence[Mapping[str, Any]] = step.get("tool_uses", ())
        out.append(
            Reply(
                text=step.get("text", ""),
                tool_uses=[ToolUse(u["name"], dict(u.get("input", {}))) for u in uses],
            )
        )
    return out
