"""Rewind and fork a session without forgetting what the world saw.

A support agent looks an order up, e-mails the customer and opens a ticket. Then:

* ``tl.fork(store, "s1", at_turn=1)`` — a new session made of turn 1 (the lookup). The e-mail
  and the ticket of turns 2-3 were not undone by going back: the fork lists them
  (``run.effects_after_fork``) and its first request tells the model, so it does not send the
  e-mail again under a new tool_use id that no ledger could match;
* ``tl.rewind(store, "s1", to_turn=1)`` — the same in place: turns 2-3 leave the transcript but
  are kept as an abandoned branch (``store.branches``, ``toolledger history``), their records in
  the ledger.

Run it with pytest (``pytest examples/rewind_and_fork.py``) or as a script:

    python examples/rewind_and_fork.py
"""

from __future__ import annotations

from typing import Any

import toolledger as tl
from toolledger.testing import Counter
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

PROMPT = "Order 42 arrived broken: apologise and open a ticket."


def make_tools(world: Counter) -> tl.ToolSet:
    @tl.tool(effect="read_only")
    def find_order(order_id: int) -> dict[str, Any]:
        """Look an order up."""
        return {"order_id": order_id, "customer": "ana@example.com"}

    @tl.tool(effect="non_idempotent")
    def send_email(to: str, body: str) -> str:
        """E-mail a customer."""
        world.hit("send_email")
        return "sent"

    @tl.tool(effect="non_idempotent")
    def create_ticket(title: str) -> dict[str, str]:
        """Open a ticket."""
        world.hit("create_ticket")
        return {"ticket": f"T-{world['create_ticket']}"}

    return tl.ToolSet([find_order, send_email, create_ticket])


LOOKUP = Reply(text="Finding the order.", tool_uses=[ToolUse("find_order", {"order_id": 42})])
RECORDED = [
    LOOKUP,
    Reply(tool_uses=[ToolUse("send_email", {"to": "ana@example.com", "body": "So sorry!"})]),
    Reply(tool_uses=[ToolUse("create_ticket", {"title": "Broken order 42"})]),
    Reply(text="Apologised and opened T-1."),
]
# What the model says on the new path, having been told of the e-mail and the ticket.
NEW_PATH = [LOOKUP, Reply(text="The customer was e-mailed and T-1 is open: nothing to redo.")]


def run(store: tl.Store, session: str, script: list[Reply], world: Counter, **kw: Any) -> tl.Run:
    with ScriptedModel(script) as model:
        agent = tl.Agent(
            client=model.client(), model="claude-test", tools=make_tools(world), store=store
        )
        result = agent.run(session=session, **kw)
        last = model.requests[0]["messages"][-1]["content"] if model.requests else ""
        note = last[-1] if isinstance(last, list) and last[-1].get("type") == "text" else None
        if note is not None:
            print(f"the model was told, in the first request of {session}:\n{note['text']}\n")
        return result


def test_rewind_and_fork() -> None:
    store = tl.open_store("memory://")
    world = Counter()  # the e-mails and tickets the world holds
    assert run(store, "s1", RECORDED, world, prompt=PROMPT).status is tl.RunStatus.COMPLETED
    assert (world["send_email"], world["create_ticket"]) == (1, 1)

    # Fork at turn 1: the e-mail and the ticket are listed and told, not undone.
    forked = tl.fork(store, "s1", at_turn=1, tools=make_tools(Counter()))
    on_fork = run(store, forked, NEW_PATH, world)
    assert on_fork.status is tl.RunStatus.COMPLETED
    print("effects after the fork:", [(e.tool, e.state) for e in on_fork.effects_after_fork])
    assert [e.tool for e in on_fork.effects_after_fork] == ["send_email", "create_ticket"]

    # Rewind the original in place: turns 2-3 are kept as abandoned branch 1.
    tl.rewind(store, "s1", to_turn=1, by="ana")
    again = run(store, "s1", NEW_PATH, world)
    assert again.status is tl.RunStatus.COMPLETED
    (branch,) = store.branches("s1")
    print(f"abandoned branch {branch.branch.branch}: turns", [t.number for t in branch.abandoned])
    assert [t.number for t in branch.abandoned] == [2, 3, 4]

    assert (world["send_email"], world["create_ticket"]) == (1, 1)  # nothing happened twice
    assert [p for p in tl.verify(store) if p.severity is tl.Severity.ERROR] == []


if __name__ == "__main__":
    test_rewind_and_fork()
    print("ok")
