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
* ``run_torture(kills=..., backend=...)`` → ``TortureReport`` — agent sessions ``SIGKILL``ed at
  random instants and resumed until they finish, every invariant checked against the world after
  each (``python -m toolledger.testing.torture``; see ``toolledger.testing.torture``).
* ``run_concurrent_torture(seconds=..., backend=...)`` → ``ConcurrentReport`` — worker
  processes sharing one store, paused past their leases and deadlines, killed, some acting as
  other hosts, while an operator approves and resolves; every invariant checked against the world
  at the end (``python -m toolledger.testing.concurrent_torture``).
* ``toolledger.testing.conformance.StoreConformance`` — the contract every store backend passes
  (a plain pytest class; imported on its own, as it needs pytest).
"""

from __future__ import annotations

from .._crash import POINTS as CRASH_POINTS
from .._crash import arm as arm_crash
from ._concurrent import ConcurrentReport, run_concurrent_torture
from ._torture import TortureReport, run_torture
from .elsewhere import elsewhere
from .fakes import Counter
from .scripted import Flaky, Reply, ScriptedModel, ToolUse
from .world import AgentSpec, World, run_agent

__all__ = [
    "CRASH_POINTS",
    "AgentSpec",
    "ConcurrentReport",
    "Counter",
    "Flaky",
    "Reply",
    "ScriptedModel",
    "ToolUse",
    "TortureReport",
    "World",
    "arm_crash",
    "elsewhere",
    "run_agent",
    "run_concurrent_torture",
    "run_torture",
]
