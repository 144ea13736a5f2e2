"""A host clock that steps while workers share a SQLite or JSON store (NTP stepping, a VM
resumed, a laptop waking). Workers A and B run in containers of this kernel (PID namespaces of
their own), so neither can judge the other by its process table: only leases and deadlines.
Their wall clock is stepped through a shared offset file (``worker.py``); the monotonic clock is
not, as in a real step.

No step may let B run a call A is running, abort A's healthy run, or keep a dead A's lease for
longer than one TTL of real time.
"""

from __future__ import annotations

import pytest

from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse

from .harness import TOOL_USE_ID, Workers, container, require, wait_entered, world

pytestmark = pytest.mark.slow

TTL = 2.0


def _script() -> list[Reply]:
    return [
        Reply(tool_uses=[ToolUse("create_ticket", {"title": "outage"}, id=TOOL_USE_ID)]),
        Reply(text="Ticket opened."),
    ]


@pytest.mark.parametrize("step", [40.0, 600.0])
@pytest.mark.parametrize("kind", ["sqlite", "json"])
def test_a_forward_step_neither_runs_a_call_twice_nor_aborts_its_run(
    kind: str, step: float, workers: Workers
) -> None:
    """B comes right after the step, before A's heartbeat renewed under the new clock: a lease
    judged by its wall-clock expiry looks long gone (and, at +600 s, the call's deadline too)."""
    require([*container(), "true"], "containers (PID namespaces)")
    ttl = 15.0  # renewed every 5 s: B, a second after the step, meets the old expiry
    with ScriptedModel(_script()) as model, world(kind) as w:
        w.step_clock(0.0)
        common = {
            "place": container(),
            "mode": "agent",
            "model_url": model.url,
            "lease_ttl": ttl,
            "clock_file": w.clock_file,
        }
        a = workers.spawn(w, "a", **common)
        wait_entered(w, a)
        w.step_clock(step)
        b = workers.spawn(w, "b", **common).result()
        assert b.get("error") == "SessionBusyError", b
        w.go()
        first = a.result()
        assert first.get("status") == "completed", first
        assert len(w.tickets) == 1, w.tickets


@pytest.mark.parametrize("kind", ["sqlite", "json"])
def test_a_backward_step_keeps_a_dead_worker_s_lease_no_longer_than_its_ttl(
    kind: str, workers: Workers
) -> None:
    """A dies in its tool; the clock steps back 600 s. Its lease — which on the stepped clock
    would not expire for ten more minutes — is free one TTL after B starts watching it. Its call
    stays in progress until its deadline on the store's clock (it may have been a live worker's,
    paused: rule 14), so B stops there, having run nothing."""
    require([*container(), "true"], "containers (PID namespaces)")
    with ScriptedModel(_script()) as model, world(kind) as w:
        w.step_clock(0.0)
        common = {
            "place": container(),
            "mode": "agent",
            "model_url": model.url,
            "lease_ttl": TTL,
            "clock_file": w.clock_file,
        }
        a = workers.spawn(w, "a", **common)
        wait_entered(w, a)
        a.kill()
        w.step_clock(-600.0)
        b = workers.spawn(w, "b", retry_busy=60.0, **common).result(timeout=120)
        # The session was taken (it got as far as the call): within one TTL of watching.
        assert b.get("error") == "EffectInProgressError", b
        assert "deadline has not passed" in b["message"], b
        assert b["took"] < TTL + 10.0, b
        assert w.tickets == [], w.tickets
