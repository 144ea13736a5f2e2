"""Property: whatever sequence of messages arrives — repeated ids, reused ids with other input,
failures, "I may have done it", declined approvals, reopened stores — each non-idempotent
tool_use id executes at most once (plus once per in-doubt re-run a person explicitly approved),
and a replay answers exactly what the first run answered."""

from __future__ import annotations

import tempfile
import uuid
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import toolledger as tl

IDS = [f"toolu_{i}" for i in range(5)]

call = st.fixed_dictionaries(
    {
        "id": st.sampled_from(IDS),
        "name": st.sampled_from(["send", "flaky", "unsure", "guarded", "lookup"]),
        "x": st.integers(0, 2),
    }
)
batches = st.lists(st.lists(call, min_size=1, max_size=4), min_size=1, max_size=8)
events = st.lists(st.tuples(batches, st.booleans()), min_size=1, max_size=3)


def make_tools(executions: Counter[tuple[str, str]]) -> tl.ToolSet:
    @tl.tool
    def send(x: int, ctx: tl.ToolContext) -> str:
        executions[("send", ctx.tool_use_id)] += 1
        return f"sent {x}"

    @tl.tool
    def flaky(x: int, ctx: tl.ToolContext) -> str:
        executions[("flaky", ctx.tool_use_id)] += 1
        raise RuntimeError("boom")

    @tl.tool
    def unsure(x: int, ctx: tl.ToolContext) -> str:
        executions[("unsure", ctx.tool_use_id)] += 1
        raise tl.OutcomeUnknown("timed out")

    @tl.tool(high_impact=True)
    def guarded(x: int, ctx: tl.ToolContext) -> str:
        executions[("guarded", ctx.tool_use_id)] += 1
        return "done"

    @tl.tool(effect="read_only")
    def lookup(x: int) -> int:
        return x

    return tl.ToolSet([send, flaky, unsure, guarded, lookup])


@settings(max_examples=60, deadline=None)
@given(events=events, kind=st.sampled_from(["memory", "sqlite", "json"]), approve_odd=st.booleans())
def test_non_idempotent_ids_execute_at_most_once(
    events: list[tuple[list[list[dict[str, Any]]], bool]], kind: str, approve_odd: bool
) -> None:
    executions: Counter[tuple[str, str]] = Counter()
    tools = make_tools(executions)
    answers: dict[str, dict[str, Any]] = {}

    approved_reruns: Counter[str] = Counter()

    def approve(req: tl.ApprovalRequest) -> bool | tl.Decision:
        yes = approve_odd == (int(req.tool_use_id[-1]) % 2 == 1)
        if yes and req.in_doubt:
            # Only an answer that names the re-run runs a call in doubt again (a plain yes
            # leaves it in doubt, and warns): each such answer allows one execution more.
            approved_reruns[req.tool_use_id] += 1
            return tl.Decision(approved=True, rerun=True)
        return yes

    with tempfile.TemporaryDirectory() as tmp:
        url = {
            "memory": f"memory://{uuid.uuid4().hex}",
            "sqlite": f"sqlite:///{tmp}/l.db",
            "json": f"json:///{tmp}/l",
        }[kind]
        store = tl.open_store(url)
        try:
            for batches_, reopen in events:
                for batch in batches_:
                    content = [
                        {
                            "type": "tool_use",
                            "id": c["id"],
                            "name": c["name"],
                            "input": {"x": c["x"]},
                        }
                        for c in batch
                    ]
                    try:
                        results = tl.run_tool_uses(
                            content, tools, ledger=store.ledger("s"), approve=approve
                        )
                    except (tl.LedgerMismatchError, tl.MalformedContentError):
                        continue
                    for block, result in zip(content, results, strict=True):
                        first = answers.setdefault(block["id"], result)
                        if block["name"] != "unsure":
                            assert result == first, "a replay must answer what the first run did"
                if reopen:
                    store.close()
                    store = tl.open_store(url)
        finally:
            store.close()
    for (name, tool_use_id), count in executions.items():
        allowed = 1 + approved_reruns[tool_use_id]
        assert count <= allowed, f"{name} {tool_use_id} executed {count} times"
