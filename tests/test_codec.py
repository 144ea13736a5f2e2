"""Canonical JSON and input hashes: one text per value."""

from __future__ import annotations

import dataclasses
import datetime
import json
import subprocess
import sys
import tracemalloc
from typing import Any

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolledger.adapters.anthropic import read_tool_uses
from toolledger.codec import (
    MAX_NESTING,
    canonical_json,
    content_of,
    encode_result,
    input_hash,
    json_text,
    json_text_with,
    nesting,
    valid_unicode,
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


def test_canonical_json_ignores_key_order_and_whitespace() -> None:
    assert canonical_json({"b": 1, "a": [1, {"d": 2, "c": 3}]}) == '{"a":[1,{"c":3,"d":2}],"b":1}'
    assert input_hash({"b": 1, "a": 2}) == input_hash({"a": 2, "b": 1})
    assert input_hash({"a": 1}) != input_hash({"a": "1"})
    assert input_hash({}).startswith("sha256:") and len(input_hash({})) == 71


@given(json_values)
def test_input_hash_is_a_function_of_the_value(value: object) -> None:
    reparsed = json.loads(json.dumps(value))
    assert input_hash({"v": value}) == input_hash({"v": reparsed})


@given(json_values)
def test_encoded_results_replay_exactly(value: object) -> None:
    encoded = encode_result(value)
    assert encoded.note is None
    assert json.loads(encoded.stored) == value or value != value  # noqa: PLR0124
    assert content_of(encoded.stored) == encoded.content
    if isinstance(value, str):
        assert encoded.content == value or "\\ud" in encoded.content


@given(json_values)
def test_valid_unicode_leaves_clean_values_alone_and_cleans_the_rest(value: object) -> None:
    cleaned = valid_unicode(value)
    json.dumps(cleaned, ensure_ascii=False).encode("utf-8")  # never raises
    if json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass") == json.dumps(
        value, ensure_ascii=False
    ).encode("utf-8", "replace"):
        assert cleaned is value


def test_valid_unicode_replaces_lone_surrogates_only() -> None:
    value = {"a": ["ok", "bad \ud800"], "b\udc00": 1, "c": "😀"}
    assert valid_unicode(value) == {"a": ["ok", "bad \ufffd"], "b\ufffd": 1, "c": "😀"}
    clean = {"a": ["ok"], "c": "😀"}
    assert valid_unicode(clean) is clean


def test_content_is_what_the_stored_text_reads_back_as_for_every_kind_of_value() -> None:
    """``encode_result`` tells the content without parsing its text back where the type says
    what it is; for anything else (a string enum, a model, a dataclass) it reads it back."""
    import dataclasses
    import enum

    class Colour(enum.StrEnum):
        RED = "red"

    @dataclasses.dataclass
    class Point:
        x: int

    for value in ["ok", "a\ud800b", 1, 2.5, True, None, [1, "x"], (1, 2), {"k": "v"}]:
        encoded = encode_result(value)
        assert encoded.content == content_of(encoded.stored)
        assert type(encoded.content) is str
    assert encode_result(Colour.RED).content == "red"
    assert type(encode_result(Colour.RED).content) is str
    assert encode_result(Point(3)).content == '{"x": 3}'


def lone_surrogates(value: Any) -> int:
    """How many lone surrogates ``value`` holds, in strings, keys and tuples alike."""
    if isinstance(value, str):
        return sum(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, dict):
        return sum(lone_surrogates(k) + lone_surrogates(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(lone_surrogates(v) for v in value)
    return 0


@pytest.mark.parametrize(
    "value",
    [
        ["fine", {"k": "v"}],
        [{"text": "a\ud800b"}],
        {"ke\udfffy": 1},
        {1: ["x", ("t\udc00",)]},
        {(1, 2): "a tuple key: not JSON, walked"},
        {(1, 2): "a tuple key: not JSON, walked \ud800"},
        [float("nan"), None, True, 3],
        {"deep": [[["\ud83d"]]]},
    ],
)
def test_valid_unicode_replaces_every_lone_surrogate_and_keeps_what_has_none(value: Any) -> None:
    out = valid_unicode(value)
    assert lone_surrogates(out) == 0
    if lone_surrogates(value) == 0:
        assert out is value  # nothing to replace: the very same object, not a copy
    else:
        assert out is not value


def _depth(value: Any) -> int:
    """How deeply lists, tuples and dicts nest, by recursion (the definition ``nesting`` must
    agree with on a tree)."""
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list | tuple):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


@given(
    st.recursive(
        st.none() | st.integers() | st.text(max_size=3),
        lambda children: (
            st.lists(children, max_size=4)
            | st.tuples(children, children)
            | st.dictionaries(st.text(max_size=3), children, max_size=4)
        ),
        max_leaves=40,
    ),
    st.integers(min_value=0, max_value=8),
)
def test_nesting_counts_the_deepest_path_and_stops_past_the_limit(value: Any, limit: int) -> None:
    depth = _depth(value)
    assert nesting(value, limit) == (depth if depth <= limit else limit + 1)


def test_nesting_of_containers_reached_twice_stops_past_the_limit() -> None:
    """A container held by several parents, or by itself, is reached again at every level: the
    count still stops one past the limit (not after walking every path), and a tool input that
    holds itself is answered as too deep, not read for ever."""
    itself: list[Any] = []
    itself.extend([itself, itself])
    assert nesting(itself) == MAX_NESTING + 1
    shared: list[Any] = []
    for _ in range(MAX_NESTING + 50):
        shared = [shared, shared]  # 2^250 paths, 251 containers
    assert nesting(shared) == MAX_NESTING + 1
    cyclic: dict[str, Any] = {}
    cyclic["a"] = cyclic["b"] = cyclic
    block = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": cyclic}
    [call] = read_tool_uses([block])
    assert call.problem is not None and "nested more than" in call.problem


@dataclasses.dataclass
class _Prefixer:  # compares by value, so it cannot be hashed
    prefix: str

    def __call__(self, value: Any) -> str:
        return self.prefix + type(value).__name__


@dataclasses.dataclass(frozen=True)
class _Tagged:  # equal whatever ``n`` is
    tag: str
    n: int = dataclasses.field(default=0, compare=False)

    def __call__(self, value: Any) -> str:
        return f"{self.tag}{self.n}"


def test_json_text_takes_any_default_and_uses_the_one_it_was_given() -> None:
    """Encoders are built once per set of options, but a caller's ``default`` is not one of them:
    it may be unhashable, or equal to another that does something else."""
    assert json_text({"a": object()}, default=_Prefixer("p:")) == '{"a": "p:object"}'
    assert json_text(object(), default=_Tagged("x", 1)) == '"x1"'
    assert json_text(object(), default=_Tagged("x", 2)) == '"x2"'


@given(json_values | st.floats())
def test_the_encoders_called_straight_write_what_json_dumps_writes(value: Any) -> None:
    """``codec._one_shot``: the same text as ``json.dumps`` with the same options, or the same
    error."""

    def both(ours: Any, theirs: Any) -> None:
        try:
            expected: Any = theirs()
        except ValueError as exc:
            expected = (ValueError, str(exc))
        try:
            got: Any = ours()
        except ValueError as exc:
            got = (ValueError, str(exc))
        assert got == expected

    both(
        lambda: canonical_json(value),
        lambda: json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
        ),
    )
    both(lambda: json_text(value), lambda: json.dumps(value, ensure_ascii=False, allow_nan=False))
    both(
        lambda: json_text(value, separators=(",", ":"), allow_nan=True),
        lambda: json.dumps(value, ensure_ascii=False, separators=(",", ":")),
    )


def test_a_value_that_holds_itself_is_refused_at_once() -> None:
    """The encoders called straight keep ``json``'s check for a value that holds itself: it is
    refused where it first comes back (not after recursing to the limit, writing what sits
    above it again at every level: a 1 MB text, a thousand times), and nothing is left behind
    that refuses the next value."""
    looped: dict[str, Any] = {"body": "x" * 1_000_000}
    looped["again"] = [looped]
    tracemalloc.start()
    try:
        for encode in (canonical_json, json_text, json_text_with(separators=(",", ":"))):
            with pytest.raises(ValueError, match="Circular reference detected"):
                encode(looped)
            assert encode([1, {"again": [1]}]).replace(" ", "") == '[1,{"again":[1]}]'
        note = encode_result(looped).note or ""
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "Circular reference" in note
    assert peak < 40_000_000, f"{peak:,} bytes at the peak: the value was written again and again"
    assert encode_result({"a": 1}).stored == '{"a": 1}'


def test_a_result_json_cannot_hold_is_named_as_such() -> None:
    """A result holding what JSON cannot hold (a ``datetime``, a ``set``) is recorded as a note
    naming its type — not as a value that holds itself, which it is not."""

    class Model(pydantic.BaseModel):
        n: int

    for value, kind in (
        (datetime.datetime(2024, 1, 1), "datetime"),
        ({1, 2}, "set"),
        (Model, "ModelMetaclass"),
    ):
        note = encode_result({"at": value}).note or ""
        assert f"Object of type {kind} is not JSON serializable" in note, note
        assert "Circular" not in note


def test_an_awkward_result_is_recorded_under_a_raised_recursion_limit(tmp_path: Any) -> None:
    """With the recursion limit raised far past what the C stack holds, a result that holds
    itself, or holds a ``datetime``, is still recorded as a note: the process does not crash
    between the tool's effect and its outcome's record."""
    program = f"""
import datetime, json, sys
import toolledger as tl
sys.setrecursionlimit(100_000)
looped = {{"body": "x"}}
looped["again"] = looped
results = {{"looped": looped, "dated": {{"at": datetime.datetime(2024, 1, 1)}}}}

@tl.tool
def fetch(what: str) -> object:
    return results[what]

with tl.open_store("sqlite:///{tmp_path / "ledger.db"}") as store:
    blocks = [
        {{"type": "tool_use", "id": f"toolu_{{w}}", "name": "fetch", "input": {{"what": w}}}}
        for w in results
    ]
    out = tl.run_tool_uses(blocks, [fetch], ledger=store.ledger("s"))
    print(json.dumps([json.loads(r["content"])["reason"] for r in out]))
    print(sorted(r.status.value for r in store.ledger("s").records()))
"""
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    reasons, statuses = done.stdout.strip().splitlines()
    first, second = json.loads(reasons)
    assert "Circular reference detected" in first
    assert "Object of type datetime is not JSON serializable" in second
    assert statuses == "['succeeded', 'succeeded']"


_SURROGATES = st.text(alphabet=st.sampled_from(["a", "é", "\ud800", "\udfff", "\U0001f600"]))


@given(json_values | _SURROGATES | st.lists(_SURROGATES, max_size=3))
def test_json_text_with_fixed_options_is_json_text(value: Any) -> None:
    """The encoder found once for one set of options writes what ``json_text`` writes with
    them, a lone surrogate's escaped form included."""
    for options in ({}, {"separators": (",", ":"), "allow_nan": True}):
        assert json_text_with(**options)(value) == json_text(value, **options)
