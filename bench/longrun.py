"""Long sessions: is turn 1,000 as cheap as turn 1?

The contenders share one SQLite store, interleaved: runs of 20 turns in new sessions (turns
1-20), and runs of 20 more turns of one session grown to 1,000 turns first (setup). A turn is
timed from one model call to the next (checkpoint A, intent, tool, outcome + checkpoint B, and
building the next request); every checkpoint commit is also timed on its own. Opening the long
session is timed too: from ``agent.run`` with a new prompt until the model is asked.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import toolledger as tl
from toolledger.ops import AppendMessages, Op

from . import core
from .measure import Contender, Sample, summarise

TURNS = 20


class _StampedMessages(core._FakeMessages):
    def __init__(self) -> None:
        super().__init__("noop_effect", 1)
        self.stamps: list[int] = []

    def create(self, **kwargs: Any) -> dict[str, Any]:
        self.stamps.append(time.perf_counter_ns())
        return super().create(**kwargs)


class _StampedClient:
    def __init__(self) -> None:
        self.messages = _StampedMessages()


class _FirstRequest:
    """``messages.create`` noting when it was called and answering with text: the run ends
    after that one model call."""

    def __init__(self) -> None:
        self.stamp = 0

    def create(self, **kwargs: Any) -> dict[str, Any]:
        self.stamp = time.perf_counter_ns()
        return {
            "content": [{"type": "text", "text": "done"}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 10, "output_tokens": 5},
        }


class _FirstRequestClient:
    def __init__(self) -> None:
        self.messages = _FirstRequest()


@dataclass
class LongRun:
    contenders: list[Contender]
    checkpoints: dict[str, list[float]] = field(default_factory=dict)
    start_turn: int = 0

    def checkpoint_samples(self) -> list[Sample]:
        out = []
        for c in self.contenders[:2]:
            probe = Contender(
                f"{c.name}: one checkpoint commit (A or B)",
                c.step,
                self_timed=True,
                key=c.key.replace("turn_", "cp_"),
            )
            out.append(summarise(probe, self.checkpoints[c.name]))
        return out


def long_run(store: tl.Store, *, grow_to: int) -> LongRun:
    backend = store.backend
    inner = backend.apply
    current: list[str] = [""]
    checkpoints: dict[str, list[float]] = {}

    def timed_apply(session_id: str, ops: Sequence[Op]) -> list[bool]:
        t0 = time.perf_counter_ns()
        out = inner(session_id, ops)
        if current[0] and any(isinstance(op, AppendMessages) for op in ops):
            checkpoints.setdefault(current[0], []).append(float(time.perf_counter_ns() - t0))
        return out

    backend.apply = timed_apply  # type: ignore[method-assign]

    def make(name: str, key: str, session: str | None) -> Contender:
        client = _StampedClient()
        agent = tl.Agent(
            client=client, model="bench", tools=core.TOOLS, store=store, max_turns=TURNS
        )

        def step(i: int) -> list[float]:
            current[0] = name
            stamps = client.messages.stamps
            stamps.clear()
            if session is None:
                agent.run(session=f"early-{core.next_id()}", prompt="go")
            else:
                agent.run(session=session, prompt=f"go on {i}")
            current[0] = ""
            return [float(b - a) for a, b in itertools.pairwise(stamps)]

        return Contender(name, step, ops_per_step=TURNS - 1, self_timed=True, key=key)

    def opening(name: str, key: str, session: str) -> Contender:
        """``agent.run`` on the finished long session with a new prompt, timed until the model
        is asked: the lease, reading the session back, the prompt's commit, the request."""
        client = _FirstRequestClient()
        agent = tl.Agent(client=client, model="bench", tools=core.TOOLS, store=store, max_turns=1)

        def step(i: int) -> list[float]:
            t0 = time.perf_counter_ns()
            agent.run(session=session, prompt=f"open {i}")
            return [float(client.messages.stamp - t0)]

        return Contender(name, step, self_timed=True, key=key)

    long_session = "long"
    grower = tl.Agent(
        client=core.FakeAnthropic(), model="bench", tools=core.TOOLS, store=store, max_turns=grow_to
    )
    grower.run(session=long_session, prompt="grow")
    state = backend.read_session(long_session)
    assert state is not None
    late = f"turns {state.turns:,}+ of one long session"
    return LongRun(
        [
            make("turns 1-20 of new sessions: one turn", "turn_early", None),
            make(f"{late}: one turn", "turn_late", long_session),
            opening(
                f"agent.run on the {state.turns:,}-turn session until the model is asked",
                "open_late",
                long_session,
            ),
        ],
        checkpoints=checkpoints,
        start_turn=state.turns,
    )
