"""A session's history, and the same session replayed offline as a regression test.

A support agent looks an order up, e-mails the customer and is declined a refund. Then:

* ``store.history(session, tools=...)`` — every turn: when, what the model said and asked for,
  each call's effect class and disposition in the ledger (``toolledger history SESSION`` prints
  the same);
* ``ScriptedModel.from_session(store, session)`` — a model that answers exactly as the recorded
  one did, tool_use ids included. The agent run against it, on a fresh store, stores the same
  transcript. Its tools run again (a new session's ledger is empty), so they are fakes here.

Run it with pytest (``pytest examples/history_and_replay.py``) or as a script:

    python examples/history_and_replay.py
"""

from __future__ import annotations

from typing import Any

import toolledger as tl
from toolledger.testing import Counter
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

PROMPT = "Order 42 arrived broken; the customer wants a refund."


def make_tools(sent: Counter) -> tl.ToolSet:
    @tl.tool(effect="read_only")
    def find_order(order_id: int) -> dict[str, Any]:
        """Look an order up."""
        return {"order_id": order_id, "customer": "ana@example.com", "total": 30}

    @tl.tool(effect="non_idempotent")
    def send_email(to: str, body: str) -> str:
        """E-mail a customer."""
        sent.hit("send_email")
        return "sent"

    @tl.tool(effect="non_idempotent", high_impact=True)
    def refund(order_id: int, amount: int) -> str:
        """Refund an order."""
        sent.hit("refund")
        return "refunded"

    return tl.ToolSet([find_order, send_email, refund])


def decline(request: tl.ApprovalRequest) -> bool:
    """The approver: no refunds today."""
    return False


def agent(client: Any, store: tl.Store, tools: tl.ToolSet) -> tl.Agent:
    return tl.Agent(client=client, model="claude-test", tools=tools, store=store, approve=decline)


def test_history_and_replay() -> None:
    # 1. The recorded session (in production: your real model and store).
    script = [
        Reply(text="Let me find the order.", tool_uses=[ToolUse("find_order", {"order_id": 42})]),
        Reply(
            tool_uses=[
                ToolUse("send_email", {"to": "ana@example.com", "body": "Sorry!"}),
                ToolUse("refund", {"order_id": 42, "amount": 30}),
            ]
        ),
        Reply(text="I apologised; the refund needs a person."),
    ]
    recorded = tl.open_store("memory://")
    sent = Counter()
    with ScriptedModel(script) as model:
        run = agent(model.client(), recorded, make_tools(sent)).run(session="s1", prompt=PROMPT)
    assert run.status is tl.RunStatus.COMPLETED

    # 2. Its history.
    turns = recorded.history("s1", tools=make_tools(Counter()))
    for turn in turns:
        print(f"turn {turn.number}: {turn.text or '(no text)'}")
        for call in turn.calls:
            print(f"  {call.tool} [{call.effect}] -> {call.disposition}")
    assert [[c.disposition.value for c in t.calls] for t in turns] == [
        ["succeeded"],
        ["succeeded", "declined"],
        [],
    ]

    # 3. The session replayed offline: same transcript, ids included.
    replayed = tl.open_store("memory://")
    again = Counter()
    with ScriptedModel.from_session(recorded, "s1") as model:
        run = agent(model.client(), replayed, make_tools(again)).run(session="s1", prompt=PROMPT)
    assert run.status is tl.RunStatus.COMPLETED

    def transcript(store: tl.Store) -> list[tuple[str, Any]]:
        return [(m.role, m.content) for m in store.messages("s1")]

    assert transcript(replayed) == transcript(recorded)
    assert (sent["send_email"], again["send_email"]) == (1, 1)
    assert sent["refund"] == again["refund"] == 0
    print(f"replayed: {len(transcript(replayed))} messages, the same as recorded")


if __name__ == "__main__":
    test_history_and_replay()
