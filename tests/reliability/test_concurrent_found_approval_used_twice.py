"""Found by the concurrency torture (``toolledger._harness.concurrent_torture``, invariant 6): an
in-doubt approval allowed a second re-run.

A high-impact call (or a plain one, with the approval queue) in doubt asks the approver whether
to run it again. Approved, it runs — and is in doubt again (its worker was killed, or the tool
could not tell). Asked once more, the queue found the previous in-doubt decision, bound to the
same call, tool, input and "in doubt", and used up by an attempt that was in the ledger; it took
that for a racing worker's attempt and answered "approved" again: a third execution on two
approvals. In the torture it left two tickets for one call, on one host, with nothing in the
ledger to say so.
"""

from __future__ import annotations

import toolledger as tl
from toolledger import approvals


def test_each_re_run_of_an_in_doubt_call_needs_an_approval_of_its_own() -> None:
    runs: list[int] = []

    @tl.tool(effect="non_idempotent", high_impact=True)
    def open_incident(title: str, ctx: tl.ToolContext) -> str:
        runs.append(ctx.attempt)
        raise tl.OutcomeUnknown("the connection dropped after the request was sent")

    block = {"type": "tool_use", "id": "t1", "name": "open_incident", "input": {"title": "a"}}
    with tl.open_store("memory://approval-used-twice") as store:
        ledger = store.ledger("s")

        def run() -> str:
            (result,) = tl.run_tool_uses(
                [block], [open_incident], ledger=ledger, approve=approvals.queue
            )
            return str(result["content"])

        for attempt in (1, 2, 3):
            asked = "in doubt, awaiting a person" if attempt > 1 else "awaiting approval"
            assert run().startswith(asked), f"before attempt {attempt}"
            assert len(runs) == attempt - 1
            (waiting,) = approvals.pending(store, "s")
            assert waiting.in_doubt is (attempt > 1)
            approvals.decide(store, "s", "t1", approved=True, by="ana")
            assert "may already have happened" in run()
            assert runs == list(range(1, attempt + 1)), "one execution per approval"
