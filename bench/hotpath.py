"""Hot-path candidates found by profiling, measured as *patches applied inside the bench only*.

Nothing here changes ``src/``: each patch is a context manager that swaps one function for the
duration of a round (outside the timed region) and restores it, so the stock code and the
patched code run interleaved on the same disk. What each patch stands for in ``src/`` is in its
docstring.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import toolledger as tl
from toolledger.adapters import anthropic as anthropic_adapter
from toolledger.codec import canonical_json, encode_result, input_hash
from toolledger.stores._sql.rows import sql_json

from . import core, floor
from .measure import Contender, Sample, interleaved

Patch = Callable[[], Any]


def no_in_doubt_index(store: tl.Store) -> None:
    """Drop the partial index ``effects_in_doubt`` (records in ``started``). Every intent inserts
    into it and every outcome deletes from it: one more B-tree page in each of those commits.

    In src: stores/_sql/schema.py SQLITE_MIGRATIONS — a new migration dropping the index, and
    ``in_doubt()`` scanning ``effects`` (a CLI listing, not a hot path). Measured to decide
    whether the page is worth it.
    """
    conn = store.backend._conn  # type: ignore[attr-defined]
    conn.execute("DROP INDEX IF EXISTS effects_in_doubt")


def patched_rows(directory: Path, stack: ExitStack, n: int) -> list[Sample]:
    """Stock against patched, interleaved, on durable SQLite stores."""
    contenders: list[Contender] = [floor.append_fsync(directory, stack)]
    for patched in (False, True):
        store = core.open_bench_store("sqlite", directory, f"hot-call-{patched}", stack)
        if patched:
            no_in_doubt_index(store)
        label = "stock" if not patched else "patched: no in-doubt index"
        c = core.per_call(store, label, "noop_effect")
        c.key = f"hot_call_{'patched' if patched else 'stock'}"
        contenders.append(c)
    return interleaved(contenders, n)


def micro(n: int) -> list[tuple[str, float]]:
    """What single steps of a call cost, in µs (median of ``n``)."""
    tool = core.TOOLS["noop_effect"]
    message = {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "noop_effect", "input": {"n": 1}}
        ],
    }
    block = [{"type": "tool_use", "id": "toolu_1", "name": "noop_effect", "input": {"n": 1}}]
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("pydantic: Tool.validate of the input", lambda: tool.validate({"n": 1})),
        ("input hash: canonical JSON + SHA-256", lambda: input_hash({"n": 1})),
        ("canonical JSON alone", lambda: canonical_json({"n": 1})),
        ("result encoding: encode_result", lambda: encode_result("ok")),
        ("transcript JSON: one message", lambda: sql_json(message)),
        ("read the tool_use blocks of a message", lambda: anthropic_adapter.read_tool_uses(block)),
    ]
    out = []
    for name, fn in steps:
        xs = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            fn()
            xs.append(time.perf_counter_ns() - t0)
        out.append((name, statistics.median(xs) / 1000))
    return out


def scripted_rows(stack: ExitStack, n: int) -> list[Sample]:
    """``ScriptedModel`` with Nagle's algorithm on, against TCP_NODELAY.

    testing/scripted.py ``_handler_for`` — ``disable_nagle_algorithm = True`` on the handler
    class, which src now sets: without it every SDK request to a ScriptedModel took 40 ms.
    """
    rows = []
    for nodelay in (False, True):
        model = core.scripted_model(stack, nodelay=nodelay)
        if model is None:
            return []
        label = "ScriptedModel round trip, " + (
            "TCP_NODELAY (as src now sets)" if nodelay else "Nagle on (as before)"
        )
        key = f"scripted_{'nodelay' if nodelay else 'stock'}"
        rows.append(core.sdk_round_trip(model, key=key, label=label))
    return interleaved(rows, n, round_size=5, warmup=2)


# Kept across rounds (a patch is switched on per round): keyed by the record object, which the
# backend's parsed-ledger cache keeps alive.
_JSON_CACHE: dict[int, tuple[Any, dict[str, Any]]] = {}
_LINE_CACHE: dict[int, tuple[Any, str]] = {}


def json_rows(directory: Path, stack: ExitStack, n: int, size: int) -> list[Sample]:
    """toolledger's ``json:///`` store at ``size`` records (each record's line is encoded once
    and reused while it is unchanged; the whole file is still rewritten per record)."""
    from .rivals import grow_session

    contenders: list[Contender] = [floor.append_fsync(directory, stack)]
    store = core.open_bench_store("json", directory, "hot-json", stack)
    grow_session(store, size)
    contenders.append(core.per_record(store, f"json store at {size:,} records", key="json_stock"))
    return interleaved(contenders, n, round_size=2, warmup=2)
