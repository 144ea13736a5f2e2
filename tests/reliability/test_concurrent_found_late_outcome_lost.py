"""Found by the concurrency torture (``toolledger._harness.concurrent_torture``): a late outcome
written into the history of a record whose next attempt was still running was erased when that
attempt's own outcome landed.

docs/design.md, rule 14: a worker paused past its deadline on another host can wake and make its
effect after the call was settled and run again; that duplicate is never silent — the late outcome
is kept in the record's history (``record.late_effects``) and ``verify`` reports it. Here attempt 1
(this host) is paused inside its tool past its deadline; a worker on another host checks, finds
nothing, and runs attempt 2. Attempt 1 wakes, makes its effect, and its late outcome is written
into the history of the record — still ``started``, attempt 2 running. Then attempt 2 returns.
Its outcome used to be a compare-and-set on (status, attempt) only, carrying the history it read
when it wrote its intent, so the late entry was overwritten: two tickets in the world, and the
ledger and ``verify`` silent about the first.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import toolledger as tl
from toolledger._verify import Severity, verify
from toolledger.testing import elsewhere

# Long enough for each attempt to reach its tool after its intent on a loaded host (past it,
# the tool is not called at all); the test waits for the deadline attempt 1 recorded, not for
# a fixed time.
TIMEOUT = 2.0


def _past_the_deadline(store: tl.Store) -> None:
    """Sleep until the deadline the running attempt recorded has passed, on the store's clock."""
    record = store.ledger("s").get("t1")
    assert record is not None and record.deadline is not None
    time.sleep(max(0.0, record.deadline - store.now()) + 0.2)


def test_a_late_outcome_survives_the_next_attempt_s_outcome(tmp_path: Path) -> None:
    tickets: list[int] = []
    entered = {1: threading.Event(), 2: threading.Event()}
    release = {1: threading.Event(), 2: threading.Event()}

    @tl.tool(effect="non_idempotent", timeout=TIMEOUT)
    def create_ticket(title: str, ctx: tl.ToolContext) -> dict[str, Any]:
        entered[ctx.attempt].set()
        assert release[ctx.attempt].wait(30)
        tickets.append(ctx.attempt)  # the effect
        return {"title": title, "attempt": ctx.attempt}

    @create_ticket.check
    def _(title: str, ctx: tl.ToolContext) -> dict[str, Any] | None:
        return {"title": title} if tickets else None

    block = {"type": "tool_use", "id": "t1", "name": "create_ticket", "input": {"title": "x"}}
    alerts: list[tl.LedgerWriteError] = []
    with tl.open_store(f"sqlite:///{tmp_path / 'ledger.db'}") as store:
        here = threading.Thread(
            target=tl.run_tool_uses,
            args=([block], [create_ticket]),
            kwargs={"ledger": store.ledger("s"), "on_alert": alerts.append},
        )
        here.start()
        assert entered[1].wait(30)
        _past_the_deadline(store)  # attempt 1, "paused", is past its deadline
        far = elsewhere(store, "host-b")
        there = threading.Thread(
            target=tl.run_tool_uses,
            args=([block], [create_ticket]),
            # It waits, watching: another host's call without a lease is over once watched
            # for its whole timeout from there.
            kwargs={"ledger": far.ledger("s"), "wait": TIMEOUT + 10.0},
        )
        there.start()
        assert entered[2].wait(30), "host b judged attempt 1 over, checked, and ran attempt 2"
        release[1].set()  # attempt 1 wakes and makes its effect: late
        here.join(30)
        assert [type(a).__name__ for a in alerts] == ["LateOutcomeError"]
        running = store.ledger("s").get("t1")
        assert running is not None and [p.attempt for p in running.late_effects] == [1]
        release[2].set()  # attempt 2 returns
        there.join(30)
        record = store.ledger("s").get("t1")
        errors = [p.message for p in verify(store) if p.severity is Severity.ERROR]
    assert tickets == [1, 2], "the documented limit: both attempts took effect"
    assert record is not None and record.status is tl.Status.SUCCEEDED and record.attempt == 2
    assert [p.attempt for p in record.late_effects] == [1], "the late effect is still recorded"
    assert any("Both may have taken effect" in e for e in errors), errors
