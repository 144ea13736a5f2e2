"""toolledger's own costs: one durable record, one standalone tool call."""

from __future__ import annotations

import itertools
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import toolledger as tl
from toolledger.codec import input_hash
from toolledger.records import EffectRecord, Status
from toolledger.stores.base import InsertEffect

from .measure import Contender


@tl.tool(effect="non_idempotent")
def noop_effect(n: int) -> str:
    """A non-idempotent no-op: the cost measured is toolledger's alone."""
    return "ok"


@tl.tool(effect="read_only")
def noop_read(n: int) -> str:
    """A read-only no-op."""
    return "ok"


TOOLS = tl.ToolSet([noop_effect, noop_read])
_ids = itertools.count()


def open_bench_store(kind: str, directory: Path, name: str, stack: ExitStack) -> tl.Store:
    url = {
        "sqlite": f"sqlite:///{directory / (name + '.db')}",
        "json": f"json:///{directory / name}",
    }[kind]
    return stack.enter_context(tl.open_store(url))


def per_record(kind: str, directory: Path, stack: ExitStack) -> Contender:
    store = open_bench_store(kind, directory, f"{kind}-records", stack)
    h = input_hash({"n": 0})

    def step(i: int) -> Any:
        record = EffectRecord(
            session_id="bench",
            tool_use_id=f"toolu_{next(_ids)}",
            tool="noop_effect",
            input_hash=h,
            status=Status.SUCCEEDED,
            attempt=1,
            result='"ok"',
            created_at=0.0,
            updated_at=0.0,
            worker="bench",
        )
        return store.backend.apply("bench", [InsertEffect(record)])

    return Contender(f"{kind}: one durable record", step, writes=1)


def per_call(kind: str, directory: Path, stack: ExitStack, tool_name: str) -> Contender:
    store = open_bench_store(kind, directory, f"{kind}-{tool_name}", stack)
    ledger = store.ledger("bench")

    def step(i: int) -> Any:
        block = {
            "type": "tool_use",
            "id": f"toolu_{next(_ids)}",
            "name": tool_name,
            "input": {"n": i},
        }
        return tl.run_tool_uses([block], TOOLS, ledger=ledger)

    tool = TOOLS[tool_name]
    label = tool.effect.value.replace("_", "-")
    return Contender(
        f"{kind}: run_tool_uses, one {label} call", step, writes=2 if tool.needs_intent else 1
    )


class _FakeMessages:
    """``messages.create`` answering every request with one fresh non-idempotent call: the model
    costs nothing, so what is measured is toolledger's turn."""

    def __init__(self) -> None:
        self.calls = 0

    def create(self, **kwargs: Any) -> dict[str, Any]:
        self.calls += 1
        return {
            "content": [
                {
                    "type": "tool_use",
                    "id": f"toolu_{next(_ids)}",
                    "name": "noop_effect",
                    "input": {"n": self.calls},
                }
            ],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 10, "output_tokens": 5},
        }


class FakeAnthropic:
    def __init__(self) -> None:
        self.messages = _FakeMessages()


TURNS_PER_RUN = 20


def agent_turn(kind: str, directory: Path, stack: ExitStack) -> Contender:
    """One agent turn with one non-idempotent call: model call, checkpoint A, intent, tool,
    outcome + checkpoint B. A step is a run of 20 such turns (plus the prompt's commit and the
    final status, amortised), reported per turn."""
    store = open_bench_store(kind, directory, f"{kind}-agent", stack)
    agent = tl.Agent(
        client=FakeAnthropic(), model="bench", tools=TOOLS, store=store, max_turns=TURNS_PER_RUN
    )

    def step(i: int) -> Any:
        return agent.run(session=f"bench-{next(_ids)}", prompt="go")

    writes = 3 + 2 / TURNS_PER_RUN
    return Contender(
        f"{kind}: Agent turn, one non-idempotent call",
        step,
        writes=writes,
        ops_per_step=TURNS_PER_RUN,
    )
