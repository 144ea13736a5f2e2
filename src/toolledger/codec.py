"""Canonical JSON, input hashing, idempotency keys and the encoding of tool results.

Everything here is deterministic and pure: the same value gives the same bytes on every machine,
which is what lets a record written by one process be matched by another.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from json.encoder import encode_basestring, encode_basestring_ascii
from typing import Any

from ._invisible import escape_invisible

__all__ = [
    "DEFAULT_MAX_RESULT_BYTES",
    "EncodedResult",
    "canonical_json",
    "content_of",
    "describe",
    "encode_result",
    "escape_invisible",
    "idempotency_key",
    "input_hash",
    "json_text",
    "json_text_with",
    "nesting",
    "shallow",
    "shown_as_data",
    "valid_unicode",
]

logger = logging.getLogger("toolledger")

DEFAULT_MAX_RESULT_BYTES = 1 << 20
"""Results whose JSON is larger than this (1 MiB) are recorded as a note, not in full."""

_PREVIEW_CHARS = 2000


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_C_ENCODER: Any = getattr(json.encoder, "c_make_encoder", None)  # None where _json is not built


def _one_shot(encoder: json.JSONEncoder) -> Callable[[Any], str]:
    """``encoder.encode`` without the Python around it: ``json.JSONEncoder.encode`` goes
    through ``iterencode``, which defines a nested function and looks every option up again at
    each call, before the C encoder it makes does the work. This calls that C encoder directly,
    made with the same options — with a new dict of the containers it is inside for each
    value, as ``iterencode`` makes one, when ``encoder`` checks for a value that holds itself
    (so one is refused at once, ``ValueError: Circular reference detected``, and threads share
    nothing). Where the C encoder is not built, ``encoder.encode`` itself."""
    if _C_ENCODER is None or encoder.indent is not None:
        return encoder.encode
    options = (
        encoder.default,
        encode_basestring_ascii if encoder.ensure_ascii else encode_basestring,
        None,
        encoder.key_separator,
        encoder.item_separator,
        encoder.sort_keys,
        encoder.skipkeys,
        encoder.allow_nan,
    )
    make = _C_ENCODER
    join = "".join
    if not encoder.check_circular:
        made = make(None, *options)  # keeps nothing between values: built once

        def unchecked(value: Any) -> str:
            return join(made(value, 0))

        return unchecked

    def checked(value: Any) -> str:
        return join(make({}, *options)(value, 0))

    return checked


_UNESCAPED = _one_shot(json.JSONEncoder(ensure_ascii=False, check_circular=False))


def valid_unicode(value: Any) -> Any:
    """``value`` with every lone surrogate (text UTF-8 cannot hold, which the model APIs refuse)
    replaced by U+FFFD. Returns the very same object when there is none, so checking is cheap."""
    if value is None:
        return value
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value) if _LONE_SURROGATE.search(value) else value
    if isinstance(value, list | dict):
        # One C-encoded pass finds out whether there is anything to replace (half the cost of
        # walking it in Python); a value JSON cannot hold is walked.
        try:
            text = _UNESCAPED(value)
        except (TypeError, ValueError, RecursionError):
            pass
        else:
            if not _LONE_SURROGATE.search(text):
                return value
    if isinstance(value, list | tuple):
        items = [valid_unicode(v) for v in value]
        changed = any(a is not b for a, b in zip(items, value, strict=True))
        if not changed:
            return value
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        pairs = [(valid_unicode(k), valid_unicode(v)) for k, v in value.items()]
        changed = any(
            k2 is not k or v2 is not v
            for (k2, v2), (k, v) in zip(pairs, value.items(), strict=True)
        )
        return dict(pairs) if changed else value
    return value


MAX_NESTING = 200
"""JSON nested deeper than this (in a tool's input, a model's message) is refused or cut: no
tool needs it, and Python's recursive encoders would fail on it with a raw ``RecursionError``."""


_SEQUENCES = (list, tuple)  # tuples: ``list | tuple`` is built at every call
_CONTAINERS = (dict, list, tuple)


_LEVEL_MAX = 4096  # items in one level of ``nesting``'s walk before it goes depth first


def nesting(value: Any, limit: int = MAX_NESTING) -> int:
    """How deeply lists and dicts nest in ``value`` (0 for a scalar), counted without
    recursion; stops counting past ``limit``.

    Walked a level at a time: the depth is the number of levels that hold a container (half
    the cost of a walk that carries each item's depth with it). A level grows with every
    container that is reached twice — one shared by several parents, or one that holds itself —
    so past ``_LEVEL_MAX`` items the count is made depth first instead (``_deepest``), which
    goes down one path at a time and stops as soon as one is too deep."""
    if type(value) is dict:  # most tool inputs: one level of plain values, told in one pass
        for item in value.values():
            if isinstance(item, _CONTAINERS):
                break
        else:
            return 1
    depth = 0
    level: list[Any] = [value]
    while level:
        below: list[Any] = []
        found = False
        for item in level:
            if isinstance(item, dict):
                below.extend(item.values())
                found = True
            elif isinstance(item, _SEQUENCES):
                below.extend(item)
                found = True
        if not found:
            return depth
        depth += 1
        if depth > limit:
            return depth
        if len(below) > _LEVEL_MAX:
            return _deepest(value, limit)
        level = below
    return depth


def _deepest(value: Any, limit: int) -> int:
    """``nesting`` walked depth first: each item with its depth, the deepest path first."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, _CONTAINERS):
            depth += 1
            deepest = max(deepest, depth)
            if depth > limit:
                return deepest
            children = item.values() if isinstance(item, dict) else item
            stack.extend(zip(children, repeat(depth)))
    return deepest


def shallow(value: Any, limit: int = MAX_NESTING) -> Any:
    """``value`` itself when it nests no deeper than ``limit``; else a copy cut one level below
    it — containers deeper than ``limit + 1`` replaced by a short note — so it can be stored and
    sent, and is still seen (``nesting``) as too deep to use."""
    if nesting(value, limit) <= limit:
        return value
    note = f"(cut: nested more than {limit} levels deep)"

    def cut(item: Any, depth: int) -> Any:
        # ``depth`` is bounded by ``limit``: far below Python's recursion limit.
        if not isinstance(item, dict | list | tuple):
            return item
        if depth > limit + 1:
            return note
        if isinstance(item, dict):
            return {k: cut(v, depth + 1) for k, v in item.items()}
        return [cut(v, depth + 1) for v in item]

    return cut(value, 1)


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, ASCII only: one text per value, whatever produced it.

    Raises ``ValueError``/``TypeError`` for values JSON cannot hold (NaN, sets, cycles).
    """
    return _CANONICAL(value)


_CANONICAL = _one_shot(
    json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
)


def input_hash(value: Any) -> str:
    """``sha256:`` + hex digest of the canonical JSON of a tool input."""
    return "sha256:" + hashlib.sha256(canonical_json(value).encode("ascii")).hexdigest()


def idempotency_key(session_id: str, tool_use_id: str) -> str:
    """A key stable for one ``(session, tool_use_id)`` on every process and machine.

    Forward it downstream (an HTTP ``Idempotency-Key``, an e-mail ``Message-ID``) so the receiver
    can drop a repeat that the ledger could not prevent. 40 hex characters after ``tl-``: short
    enough for any API's key field, long enough never to collide.
    """
    digest = hashlib.sha256(f"{session_id}\x00{tool_use_id}".encode("utf-8", "surrogatepass"))
    return "tl-" + digest.hexdigest()[:40]


def json_text(
    value: Any,
    *,
    separators: tuple[str, str] | None = None,
    allow_nan: bool = False,
    default: Callable[[Any], Any] | None = None,
) -> str:
    """The JSON text of ``value`` that UTF-8 can hold: other scripts as themselves, everything
    ASCII-escaped only when a lone surrogate is in it. One text per value and per set of options,
    so what is stored, re-encoded after a read, or sent to the model matches byte for byte.

    ``separators``, ``allow_nan`` and ``default`` are ``json.dumps``'s; raises what it raises.
    """
    return _sized_json(value, separators, allow_nan, default)[0]


def json_text_with(
    *, separators: tuple[str, str] | None = None, allow_nan: bool = False
) -> Callable[[Any], str]:
    """``json_text`` for one set of options, its encoders found once: for a caller that
    encodes with the same options every time (the SQL stores' transcript JSON, on every
    turn)."""
    plain = _encoder(False, separators, allow_nan, None)
    escaped = _encoder(True, separators, allow_nan, None)

    def text(value: Any) -> str:
        found = plain(value)
        try:
            found.encode("utf-8")
        except UnicodeEncodeError:
            return escaped(value)  # lone surrogates: the escaped form is still the same value
        return found

    return text


def _sized_json(
    value: Any,
    separators: tuple[str, str] | None,
    allow_nan: bool,
    default: Callable[[Any], Any] | None,
) -> tuple[str, int, bool]:
    """``json_text``'s text, its size in UTF-8 bytes, and whether it had to be ASCII-escaped."""
    text = _encoder(False, separators, allow_nan, default)(value)
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        # Lone surrogates cannot be stored as UTF-8; the escaped form is still the same value.
        text = _encoder(True, separators, allow_nan, default)(value)
        return text, len(text), True
    return text, size, False


_Options = tuple[bool, tuple[str, str] | None, bool, Callable[[Any], Any] | None]
_ENCODERS: dict[_Options, Callable[[Any], str]] = {}


def _encoder(
    ascii_only: bool,
    separators: tuple[str, str] | None,
    allow_nan: bool,
    default: Callable[[Any], Any] | None,
) -> Callable[[Any], str]:
    """The ``encode`` of the encoder ``json.dumps`` would build for these options, built once
    per set of options (``json.dumps`` builds one at every call unless every option is its
    default; ``_one_shot``). Of the ``default`` functions, only ours (``_to_jsonable``, a
    tool's result) is kept: a caller's may be any callable — unhashable, or equal to another
    that does something else —, so an encoder for it is built each time."""
    if default is not None and default is not _to_jsonable:
        return json.JSONEncoder(
            ensure_ascii=ascii_only, separators=separators, allow_nan=allow_nan, default=default
        ).encode
    options = (ascii_only, separators, allow_nan, default)
    found = _ENCODERS.get(options)
    if found is None:
        found = _ENCODERS[options] = _one_shot(
            json.JSONEncoder(
                ensure_ascii=ascii_only, separators=separators, allow_nan=allow_nan, default=default
            )
        )
    return found


@dataclass(frozen=True, slots=True)
class EncodedResult:
    """A tool's return value, ready for the ledger and for the model.

    ``stored`` is the JSON text the ledger keeps; ``content`` is what the model receives and is a
    pure function of ``stored`` (see ``content_of``), so a replay answers with the same bytes as
    the first run. ``note`` is set when the value could not be stored in full.
    """

    stored: str
    content: str
    note: str | None = None


def _to_jsonable(value: Any) -> Any:
    """Convert pydantic models and dataclasses; refuse anything else JSON cannot hold, as
    ``json``'s own ``default`` does. (Given back as it was, it would be encoded again, and
    refused as a value that holds itself.)"""
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):  # a model class is not one of its values
        return dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def content_of(stored: str) -> str:
    """The tool_result content for a stored JSON text: a string result is sent as itself,
    anything else as its JSON."""
    value = json.loads(stored)
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return stored
        return value
    return stored


def _note(reason: str, preview: str, size: int | None, sha: str | None) -> str:
    note: dict[str, Any] = {
        "toolledger_note": "result not stored in full",
        "reason": reason,
        "preview": preview[:_PREVIEW_CHARS],
    }
    if size is not None:
        note["size_bytes"] = size
    if sha is not None:
        note["sha256"] = sha
    return json_text(note)


def encode_result(
    value: Any, *, max_bytes: int = DEFAULT_MAX_RESULT_BYTES, tool: str = "?"
) -> EncodedResult:
    """Encode what a tool returned.

    JSON values, pydantic models and dataclasses are stored as JSON. A value that cannot be
    serialised, or whose JSON exceeds ``max_bytes``, is recorded as a *note* (its ``repr`` or a
    preview, its size and hash) with a warning: the effect happened and its record must not be
    lost because the value was awkward. The model receives the note too, so the first answer and
    any replay agree.
    """
    try:
        stored, size, escaped = _sized_json(value, None, False, _to_jsonable)
    except Exception as exc:  # whatever serialising raises (a property, a model's validator)
        reason = f"the result of {tool!r} is not JSON-serialisable ({describe(exc)})"
        logger.warning("%s; recording its repr instead", reason)
        stored = _note(reason, _safe_repr(value), None, None)
        return EncodedResult(stored=stored, content=content_of(stored), note=reason)
    if size > max_bytes:
        reason = (
            f"the result of {tool!r} is {size:,} bytes, over the {max_bytes:,}-byte limit "
            "(raise max_result_bytes to store it)"
        )
        logger.warning("%s; recording a preview instead", reason)
        sha = hashlib.sha256(stored.encode("utf-8")).hexdigest()
        stored = _note(reason, stored, size, sha)
        return EncodedResult(stored=stored, content=content_of(stored), note=reason)
    return EncodedResult(stored=stored, content=_content(value, stored, escaped))


# What ``content_of`` answers for these, without parsing the text back: the JSON of a plain
# string is read back as that string; of a number, list, object, boolean or null, never a string.
_NEVER_A_STRING = frozenset({dict, list, tuple, int, float, bool, type(None)})


def _content(value: Any, stored: str, escaped: bool) -> str:
    """``content_of(stored)`` for the ``stored`` JSON of ``value`` (``escaped``: it had to be
    ASCII-escaped, so the string held a lone surrogate)."""
    kind = type(value)
    if kind is str:
        return stored if escaped else value
    if kind in _NEVER_A_STRING:
        return stored
    return content_of(stored)  # a model or a dataclass: what it became is read back


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception — whose ``__str__`` may itself raise (a tool's own
    exception class): never raises, so a failure is always recorded. A NUL in the message is
    written ``\\x00``: PostgreSQL's text cannot hold one, and the record of the failure (or of
    the call in doubt) would not be written there."""
    try:
        text = str(exc)
    except Exception as inner:
        text = f"(its message could not be read: {type(inner).__name__})"
    text = nul_free(text)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def nul_free(text: str) -> str:
    """``text`` with each NUL written ``\\x00`` (PostgreSQL's text cannot hold one); the very
    same string when it holds none."""
    return text.replace("\x00", "\\x00") if "\x00" in text else text


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)[:_PREVIEW_CHARS]
    except Exception as exc:  # a broken __repr__ must not lose the record
        return f"<{type(value).__name__} whose repr raised {describe(exc)}>"


def shown_as_data(text: str) -> str:
    """``text`` as one JSON string literal, every invisible character escaped: quoted data
    that cannot end its quotes, start a line, or reorder what surrounds it."""
    return escape_invisible(json.dumps(text, ensure_ascii=False))
