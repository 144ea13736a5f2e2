"""toolledger's own costs: one durable record, one standalone tool call, one agent turn.

Every toolledger contender counts its commits (``count_commits``), so the ``writes`` column is
measured, not declared. The agent turns use an in-process fake client, so what is measured is
toolledger's turn; ``agent_turn_sdk`` is the same turn through the real ``anthropic`` SDK and
``toolledger.testing.ScriptedModel``'s HTTP server, and ``sdk_round_trip`` that transport alone.
"""

from __future__ import annotations

import itertools
import re
import sqlite3
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import toolledger as tl
from toolledger.codec import input_hash
from toolledger.ops import InsertEffect, Op, UpdateEffect
from toolledger.records import EffectRecord, Status

from .measure import Contender


@tl.tool(effect="non_idempotent")
def noop_effect(n: int) -> str:
    """A non-idempotent no-op: the cost measured is toolledger's alone."""
    return "ok"


@tl.tool(effect="idempotent")
def noop_idem(n: int) -> str:
    """An idempotent no-op."""
    return "ok"


@tl.tool(effect="read_only")
def noop_read(n: int) -> str:
    """A read-only no-op."""
    return "ok"


TOOLS = tl.ToolSet([noop_effect, noop_idem, noop_read])
_ids = itertools.count()
HASH = input_hash({"n": 0})
LABEL = {"noop_effect": "non-idempotent", "noop_idem": "idempotent", "noop_read": "read-only"}


def next_id() -> str:
    return f"toolu_{next(_ids):012d}"


def open_bench_store(kind: str, directory: Path, name: str, stack: ExitStack) -> tl.Store:
    url = {
        "sqlite": f"sqlite:///{directory / (name + '.db')}",
        "json": f"json:///{directory / name}",
    }[kind]
    return stack.enter_context(tl.open_store(url))


def count_commits(store: tl.Store) -> Callable[[], int]:
    """Count the store's commits: a wrapper around its backend's ``apply`` (one extra Python
    call per commit, well under a microsecond)."""
    backend = store.backend
    existing: Callable[[], int] | None = getattr(backend, "bench_commits", None)
    if existing is not None:
        return existing
    inner = backend.apply
    count = [0]

    def apply(session_id: str, ops: Sequence[Op]) -> list[bool]:
        count[0] += 1
        return inner(session_id, ops)

    def commits() -> int:
        return count[0]

    backend.apply = apply  # type: ignore[method-assign]
    backend.bench_commits = commits  # type: ignore[attr-defined]
    return commits


def one_commit_per_record(store: tl.Store) -> None:
    """Undo toolledger's commit sharing: every ledger record in its own commit, then the
    checkpoint's writes in one more — the design where each record is written the moment it
    exists and nothing rides along."""
    backend = store.backend
    inner = backend.apply

    def apply(session_id: str, ops: Sequence[Op]) -> list[bool]:
        effects = [op for op in ops if isinstance(op, (InsertEffect, UpdateEffect))]
        rest = [op for op in ops if not isinstance(op, (InsertEffect, UpdateEffect))]
        flags = {id(op): ok for op in effects for ok in inner(session_id, [op])}
        if rest:
            flags.update(zip(map(id, rest), inner(session_id, rest), strict=True))
        return [flags[id(op)] for op in ops]

    backend.apply = apply  # type: ignore[method-assign]


def record(session_id: str, tool_use_id: str) -> EffectRecord:
    return EffectRecord(
        session_id=session_id,
        tool_use_id=tool_use_id,
        tool="noop_effect",
        input_hash=HASH,
        status=Status.SUCCEEDED,
        attempt=1,
        result='"ok"',
        created_at=0.0,
        updated_at=0.0,
        worker="bench",
    )


def per_record(store: tl.Store, label: str, *, key: str = "") -> Contender:
    """One ledger record (insert-if-absent), committed durably through ``Store.apply``."""

    def step(i: int) -> Any:
        return store.apply("bench", [InsertEffect(record("bench", next_id()))])

    counter = count_commits(store)
    return Contender(f"{label}: one durable record", step, key=key, counter=counter)


def per_call(
    store: tl.Store, label: str, tool_name: str, *, calls: int = 1, key: str = ""
) -> Contender:
    """``run_tool_uses`` on a message with ``calls`` tool_use blocks of one no-op tool."""
    ledger = store.ledger("bench")

    def step(i: int) -> Any:
        blocks = [
            {"type": "tool_use", "id": next_id(), "name": tool_name, "input": {"n": i}}
            for _ in range(calls)
        ]
        return tl.run_tool_uses(blocks, TOOLS, ledger=ledger)

    counter = count_commits(store)
    what = f"one {LABEL[tool_name]} call" if calls == 1 else f"{calls} {LABEL[tool_name]} calls"
    return Contender(f"{label}: run_tool_uses, {what}", step, key=key, counter=counter)


class _FakeMessages:
    """``messages.create`` answering every request with fresh tool calls: the model costs
    nothing, so what is measured is toolledger's turn."""

    def __init__(self, tool: str, calls: int) -> None:
        self.tool = tool
        self.calls = calls
        self.requests = 0

    def create(self, **kwargs: Any) -> dict[str, Any]:
        self.requests += 1
        return {
            "content": [
                {"type": "tool_use", "id": next_id(), "name": self.tool, "input": {"n": k}}
                for k in range(self.calls)
            ],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 10, "output_tokens": 5},
        }


class FakeAnthropic:
    def __init__(self, tool: str = "noop_effect", calls: int = 1) -> None:
        self.messages = _FakeMessages(tool, calls)


TURNS_PER_RUN = 20


def agent_turn(
    store: tl.Store,
    label: str,
    *,
    tool: str = "noop_effect",
    calls: int = 1,
    key: str = "",
    lease_ttl: float = 30.0,
) -> Contender:
    """One agent turn: model call, checkpoint A, intents, tools, outcomes, checkpoint B. A step
    is a run of 20 such turns in a new session (the prompt's commit and the final status
    amortised over them), reported per turn. ``lease_ttl``: the run's lease, renewed by a
    thread every third of it (the default is the agent's own)."""
    agent = tl.Agent(
        client=FakeAnthropic(tool, calls),
        model="bench",
        tools=TOOLS,
        store=store,
        max_turns=TURNS_PER_RUN,
        lease_ttl=lease_ttl,
    )

    def step(i: int) -> Any:
        return agent.run(session=f"bench-{next_id()}", prompt="go")

    counter = count_commits(store)
    what = f"one {LABEL[tool]} call" if calls == 1 else f"{calls} {LABEL[tool]} calls"
    return Contender(
        f"{label}: Agent turn, {what}",
        step,
        ops_per_step=TURNS_PER_RUN,
        key=key,
        counter=counter,
    )


def scripted_model(stack: ExitStack, *, nodelay: bool | None = None) -> Any:
    """A started ``ScriptedModel`` answering every turn with one no-op call; ``None`` when
    the ``anthropic`` SDK is missing.

    ``nodelay`` overrides the handler's ``disable_nagle_algorithm`` (``None``: as shipped).
    Without TCP_NODELAY the handler's headers and body go out in two sends, and Nagle's
    algorithm holds the body until the client's delayed ACK — 40 ms per request on Linux.
    """
    try:
        import anthropic  # noqa: F401
    except ImportError:
        return None
    from toolledger.testing import Reply, ScriptedModel, ToolUse, _server

    script = [Reply(tool_uses=[ToolUse("noop_effect", {"n": 1})])] * (TURNS_PER_RUN + 1)
    model = ScriptedModel(script)
    original = _server._handler_for

    def handler_for(server: _server.ScriptedServer) -> type[BaseHTTPRequestHandler]:
        handler = original(server)
        if nodelay is not None:
            handler.disable_nagle_algorithm = nodelay
        return handler

    _server._handler_for = handler_for
    try:
        return stack.enter_context(model)
    finally:
        _server._handler_for = original


def agent_turn_sdk(store: tl.Store, model: Any, label: str, *, key: str = "") -> Contender:
    """The same turn, through the real SDK and ScriptedModel's HTTP server on 127.0.0.1."""
    agent = tl.Agent(
        client=model.client(), model="bench", tools=TOOLS, store=store, max_turns=TURNS_PER_RUN
    )

    def step(i: int) -> Any:
        return agent.run(session=f"sdk-{next_id()}", prompt="go")

    counter = count_commits(store)
    return Contender(
        f"{label}: Agent turn via anthropic SDK + ScriptedModel (HTTP on 127.0.0.1)",
        step,
        ops_per_step=TURNS_PER_RUN,
        key=key,
        counter=counter,
        note="includes the SDK's HTTP round trip to a local fake server",
    )


def sdk_round_trip(model: Any, *, key: str = "", label: str = "") -> Contender:
    """The SDK's request to ScriptedModel alone, no toolledger: what the row above pays for
    the transport."""
    client = model.client()
    tools = TOOLS.to_anthropic()

    def step(i: int) -> Any:
        return client.messages.create(
            model="bench",
            max_tokens=1024,
            tools=tools,
            messages=[{"role": "user", "content": "go"}],
        )

    name = label or "anthropic SDK round trip to ScriptedModel alone (no toolledger)"
    return Contender(name, step, key=key)


def turn_commits(store: tl.Store) -> tuple[float, float]:
    """Setup, not timed: commits per tool turn and per run, from a 10-turn and a 20-turn run in
    new sessions (the difference is ten turns' worth)."""
    commits = count_commits(store)
    counts = []
    for turns in (10, 20):
        agent = tl.Agent(
            client=FakeAnthropic(), model="bench", tools=TOOLS, store=store, max_turns=turns
        )
        before = commits()
        agent.run(session=f"count-{next_id()}", prompt="go")
        counts.append(commits() - before)
    per_turn = (counts[1] - counts[0]) / 10
    return per_turn, counts[0] - 10 * per_turn


@dataclass(frozen=True)
class Statements:
    """SQL statements SQLite ran for agent turns with one non-idempotent call each."""

    per_turn: float
    per_run: float
    kinds: list[tuple[str, float, float]]  # (kind, per turn, per run), most frequent first


def statement_kind(sql: str) -> str:
    """``INSERT INTO effects``, ``SELECT … FROM leases``, ``BEGIN IMMEDIATE``, ``COMMIT`` …"""
    text = " ".join(sql.split())
    if text.startswith("--"):
        return "trigger: " + text[2:].strip().split(" ")[-1]
    m = re.match(r"(INSERT(?: OR \w+)? INTO|UPDATE|DELETE FROM|REPLACE INTO) \"?(\w+)", text, re.I)
    if m:
        return f"{m[1].upper()} {m[2]}"
    if text[:6].upper() == "SELECT":
        tables = re.findall(r"\bFROM \"?(\w+)", text, re.I)
        return f"SELECT … FROM {', '.join(dict.fromkeys(tables))}" if tables else text[:40]
    return " ".join(text.split(" ")[:2]).upper()


def turn_statements(directory: Path) -> Statements:
    """Setup, not timed: every statement SQLite runs (``set_trace_callback``: BEGIN, COMMIT,
    SAVEPOINT and reads included, one per execution of an ``executemany``) over a 10-turn and a
    20-turn run in new sessions, on a store of its own; the difference is ten turns' worth.

    Every connection the store opens while counting is traced (``sqlite3.connect`` is wrapped
    for the duration), so a backend with more than one connection is counted whole."""
    seen: list[str] = []
    original = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn: sqlite3.Connection = original(*args, **kwargs)
        conn.set_trace_callback(seen.append)
        return conn

    sqlite3.connect = connect  # type: ignore[assignment]
    try:
        with tl.open_store(f"sqlite:///{directory / 'statements.db'}") as store:
            conn = getattr(store.backend, "_conn", None)
            if isinstance(conn, sqlite3.Connection):
                conn.set_trace_callback(seen.append)
            runs: list[Counter[str]] = []
            for turns in (10, 20):
                agent = tl.Agent(
                    client=FakeAnthropic(), model="bench", tools=TOOLS, store=store, max_turns=turns
                )
                seen.clear()
                agent.run(session=f"statements-{next_id()}", prompt="go")
                runs.append(Counter(map(statement_kind, seen)))
    finally:
        sqlite3.connect = original
    ten, twenty = runs
    kinds = []
    for kind in sorted(ten | twenty, key=lambda k: -twenty[k]):
        per_turn = (twenty[kind] - ten[kind]) / 10
        kinds.append((kind, per_turn, ten[kind] - 10 * per_turn))
    total_turn = (twenty.total() - ten.total()) / 10
    return Statements(total_turn, ten.total() - 10 * total_turn, kinds)
