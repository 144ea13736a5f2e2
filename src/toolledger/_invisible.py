"""Characters that must not reach a screen raw, and how each is shown instead.

A session id, a tool's name, a result: everything read from a store, a tool or the model is data,
and a person reads it on a terminal, in a pipe or in the console. One definition of what is
escaped serves all of them (``toolledger._shell``, ``toolledger.codec.shown_as_data``, the
console), so two ids that differ only by such a character never print alike anywhere.
"""

from __future__ import annotations

import json
import re

__all__ = [
    "ACTING_RANGES",
    "INVISIBLE_CLASS",
    "INVISIBLE_RANGES",
    "escape_invisible",
    "has_invisible",
    "invisible_parts",
    "json_invisible_escaped",
]

# Characters that change how text around them reads without being seen, or are not seen at
# all: every control (Unicode category Cc: C0, DEL and C1 — ``\x9b`` is a terminal's CSI, like
# ``\x1b[``), every format character (Cf: the bidirectional marks, embeddings, overrides —
# U+202E turns "exe.txt" into what looks like "txt.exe" — and isolates; zero-width spaces and
# joiners, the soft hyphen, the word joiner, the BOM, tag characters), the line and paragraph
# separators (Zl, Zp), and the rest of Unicode's default-ignorable code points, which render as
# nothing (variation selectors, Hangul fillers, the combining grapheme joiner). Two ids that
# differ only by one of them must never print alike. ``tests/test_invisible.py`` checks the
# ranges against the running Python's Unicode database.
INVISIBLE_RANGES = (
    (0x0000, 0x001F),
    (0x007F, 0x009F),
    (0x00AD, 0x00AD),
    (0x034F, 0x034F),
    (0x0600, 0x0605),
    (0x061C, 0x061C),
    (0x06DD, 0x06DD),
    (0x070F, 0x070F),
    (0x0890, 0x0891),
    (0x08E2, 0x08E2),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x200B, 0x200F),
    (0x2028, 0x202E),
    (0x2060, 0x206F),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFFB),
    (0x110BD, 0x110BD),
    (0x110CD, 0x110CD),
    (0x13430, 0x1343F),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)
INVISIBLE_CLASS = "[" + "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in INVISIBLE_RANGES) + "]"
"""``INVISIBLE_RANGES`` as a regular expression's character class."""

# Of those, the ones that act on what is around them even in content — a result, a reason, an
# error: every control (a terminal obeys them; a line break starts a line), the bidirectional
# marks, overrides and isolates (they reorder text), the line and paragraph separators, the
# zero-width space, non-joiner and joiner, and the BOM. The others (variation selectors, tags,
# the word joiner, the soft hyphen) have their place in text — an emoji is a sequence of them —
# and are escaped in ids alone.
ACTING_RANGES = (
    (0x0000, 0x001F),
    (0x007F, 0x009F),
    (0x061C, 0x061C),
    (0x200B, 0x200F),
    (0x2028, 0x202E),
    (0x2066, 0x2069),
    (0xFEFF, 0xFEFF),
)
_INVISIBLE = re.compile(INVISIBLE_CLASS)
_ACTING = re.compile("[" + "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in ACTING_RANGES) + "]")


def _pattern(strict: bool) -> re.Pattern[str]:
    return _INVISIBLE if strict else _ACTING


def has_invisible(text: str, *, keep: str = "", strict: bool = False) -> bool:
    """Whether ``text`` holds a character to escape (but those in ``keep``): with ``strict``
    (an id: two ids must never print alike) any of ``INVISIBLE_RANGES``, else one of
    ``ACTING_RANGES``."""
    pattern = _pattern(strict)
    if not keep:
        return pattern.search(text) is not None
    return any(m.group() not in keep for m in pattern.finditer(text))


def invisible_parts(text: str, *, keep: str = "", strict: bool = False) -> list[tuple[str, bool]]:
    """``text`` cut into runs, each with whether it is one character to escape (as
    ``has_invisible`` tells them): the plain runs to show as they are, the others escaped."""
    parts: list[tuple[str, bool]] = []
    at = 0
    for m in _pattern(strict).finditer(text):
        if m.group() in keep:
            continue
        if m.start() > at:
            parts.append((text[at : m.start()], False))
        parts.append((m.group(), True))
        at = m.end()
    if at < len(text):
        parts.append((text[at:], False))
    return parts


def escape_invisible(text: str, *, keep: str = "", strict: bool = False) -> str:
    """``text`` with every character to escape (as ``has_invisible`` tells them; but those in
    ``keep``, e.g. ``"\n"``) written as its ``\\uXXXX`` escape (``\\UXXXXXXXX`` beyond the
    BMP): what a person or a model reads is what the text holds."""
    return _pattern(strict).sub(lambda m: _escaped(m.group(), keep), text)


def _escaped(c: str, keep: str) -> str:
    if c in keep:
        return c
    code = ord(c)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def json_invisible_escaped(text: str) -> str:
    """JSON text (``json.dumps(..., ensure_ascii=False)``) with every invisible character
    (``INVISIBLE_RANGES``) in its strings written as its ``\\uXXXX`` escape — the same JSON,
    loading to the same value, that shows a person what it holds. Its layout (line breaks and
    indents between values) is kept: ``json.dumps`` writes no raw control inside a string."""
    return _INVISIBLE.sub(_json_escaped, text)


def _json_escaped(m: re.Match[str]) -> str:
    c = m.group()
    return c if c in "\n\r\t" else json.dumps(c)[1:-1]
