"""Public helpers for testing code built on toolledger.

* ``ScriptedModel``, ``Reply``, ``ToolUse``, ``Flaky`` — a fake Messages API on 127.0.0.1 for
  the real ``anthropic`` SDK (see ``toolledger.testing.scripted``);
  ``ScriptedModel.from_session(store, session)`` replays a recorded session's model turns.
* ``arm_crash(point)`` / ``CRASH_POINTS`` — make this process ``SIGKILL`` itself at a named
  point, as ``TOOLLEDGER_CRASH_AT`` does.
* ``World``, ``AgentSpec``, ``run_agent`` — tools whose effects are files, and an agent run in a
  forked process a test can kill.
* ``Counter`` — a thread-safe count of real executions, per tool.
* ``elsewhere(store, host)`` — the same store seen by a worker on another host (its own identity,
  optionally a skewed clock), for tests of overlapping workers without a second machine.
* ``toolledger.testing.conformance.StoreConformance`` — the contract every store backend passes
  (a plain pytest class; imported on its own, as it needs pytest).

toolledger's own kill and concurrency tortures and its simulation are not here: they are the
project's proving ground (``toolledger._harness``), not an API.
"""

from __future__ import annotations

from .._crash import POINTS as CRASH_POINTS
from .._crash import arm as arm_crash
from .elsewhere import elsewhere
from .fakes import Counter
from .scripted import Flaky, Reply, ScriptedModel, ToolUse
from .world import AgentSpec, World, run_agent

__all__ = [
    "CRASH_POINTS",
    "AgentSpec",
    "Counter",
    "Flaky",
    "Reply",
    "ScriptedModel",
    "ToolUse",
    "World",
    "arm_crash",
    "elsewhere",
    "run_agent",
]
