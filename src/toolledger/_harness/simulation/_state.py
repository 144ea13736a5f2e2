"""What every part of the simulation shares: its state (declared here, set by
``Simulation.__init__``), the simulated instant with its queue of events, and the trace."""

from __future__ import annotations

import heapq
import itertools
import random
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...agent._agent import Agent
from ...engine._gate import ApprovalRequest, Decision
from ...stores.memory import MemoryBackend
from ...tools import ToolSet
from ._cluster import SimProcess, Table, Worker
from ._config import SimConfig
from ._world import SimWorld

__all__ = ["T0", "Attempt", "SimState"]

T0 = 1_800_000_000.0


@dataclass(order=True)
class _Event:
    at: float
    tie: float
    seq: int
    act: Callable[[], None] = field(compare=False)


@dataclass
class Attempt:
    """The truth about one attempt, as the simulation sees it."""

    worker: Worker
    gen: Any  # the run that made it: the attempt lives while that run does
    process: SimProcess
    deadline: float | None  # when its time is up, in true time, as its ToolContext counts
    effect_done: bool = False
    over: bool = False  # returned, or its worker is gone
    stalled: bool = False  # its process stopped renewing past its lease while it ran: paused,
    # or cut off from the store (rule 14)


class SimState:
    """The simulation's state, and the two things every part of it does: schedule an event
    (``_at``) and note what happened (``note``)."""

    seed: int
    config: SimConfig
    rng: random.Random
    t: float
    backend: MemoryBackend
    world: SimWorld
    stats: Counter[str]
    violations: list[str]
    trace: deque[str]
    alerts: list[tuple[str, str, str]]  # (kind, session, tool_use_id)
    attempts: dict[tuple[str, str, int], Attempt]
    _attempt_numbers: dict[tuple[str, str], list[int]]
    forced: set[tuple[str, str]]
    approved: Counter[tuple[str, str]]
    limit_cases: set[tuple[str, str]]
    steps: int
    _events: list[_Event]
    _seq: itertools.count[int]
    _graveyard: list[Any]  # crashed generators: never finalised mid-run
    _current: Worker | None
    _acting_forced: bool
    tables: list[Table]
    fooling: bool
    local_clock: bool
    tools: ToolSet
    _agents: dict[str, Agent]
    processes: list[SimProcess]
    operator: SimProcess
    scripts: dict[str, list[list[tuple[str, str]]]]
    made_in: dict[int, str]  # id() of an effect -> the session whose call made it
    _minted: itertools.count[int]

    def _at(self, delay: float, act: Callable[[], None]) -> None:
        heapq.heappush(
            self._events, _Event(self.t + max(delay, 0.0), self.rng.random(), next(self._seq), act)
        )

    def note(self, text: str) -> None:
        self.trace.append(f"{self.t - T0:10.4f} {text}")

    # -- what the engine does, used by the other parts ----------------------------------------

    def _spawn(
        self, table: Table, *, name: str | None = None, workers: int | None = None
    ) -> SimProcess:
        raise NotImplementedError

    def _starter(self, w: Worker) -> Callable[[], None]:
        raise NotImplementedError

    def _start_job(self, w: Worker) -> None:
        raise NotImplementedError

    # -- what ``_branches`` does, used by the other parts --------------------------------------

    def ask(self, process: SimProcess, request: ApprovalRequest) -> Decision:
        raise NotImplementedError

    def replayed(self, session: str, turn: int) -> dict[str, Any] | None:
        raise NotImplementedError

    def _branch(self) -> None:
        raise NotImplementedError

    def rerun_across_branches(self, same: list[Any]) -> bool:
        raise NotImplementedError
