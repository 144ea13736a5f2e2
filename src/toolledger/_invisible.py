"""Characters that must not reach a screen raw, and how each is shown instead.

A session id, a tool's name, a result: everything read from a store, a tool or the model is data,
and a person reads it on a terminal, in a pipe or in the console. One definition of what is
escaped serves all of them (``toolledger._shell``, ``toolledger.codec.shown_as_data``, the
console), so two ids that differ only by such a character never print alike anywhere.
"""

from __future__ import annotations

import json
import re
import unicodedata

__all__ = [
    "ACTING_RANGES",
    "INVISIBLE_CLASS",
    "INVISIBLE_RANGES",
    "escape_char",
    "escape_invisible",
    "has_invisible",
    "invisible_parts",
    "invisible_spots",
    "json_invisible_escaped",
    "shown_id",
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
# ``json_invisible_escaped``'s: those, and the lone surrogates ``ensure_ascii=False`` leaves raw —
# a code point UTF-8 cannot hold, which a file or a strict standard output refuses to write.
_JSON_ESCAPED = re.compile(INVISIBLE_CLASS[:-1] + "\\ud800-\\udfff]")
_ACTING = re.compile("[" + "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in ACTING_RANGES) + "]")


# In an id, besides: what prints like something else. A space that is not U+0020 (no-break,
# thin, ideographic … — Unicode's other space separators) prints as a space; a space at either
# end, or beside another, disappears from a table's cell or a web page. And an id that is not
# in Unicode's composed form (NFC) prints like the one that is: ``cafe`` + U+0301 (a combining
# acute) as ``café``, U+212B (the angstrom sign) as U+00C5. In such an id every combining mark,
# and every character the composed form replaces, is escaped too. (Letters of other scripts
# that look alike — the Cyrillic a, U+0430 — are other letters, and print as they are.)
_BLANK = re.compile("[\u00a0\u1680\u2000-\u200a\u202f\u205f\u2800\u3000]")  # and braille's
_LOST_SPACE = re.compile("^ +| +$| {2,}")
_UNDRAWN = frozenset({"Co", "Cn", "Cs"})
_JAMO = re.compile("[\u1100-\u11ff\ua960-\ua97f\ud7b0-\ud7ff]")  # Hangul's, which NFC joins


def invisible_spots(text: str, *, strict: bool = False) -> list[int]:
    """Where ``text`` holds a character to escape, in order: with ``strict`` (an id) every one
    of ``INVISIBLE_RANGES`` and every one that prints like something else (above), else one of
    ``ACTING_RANGES``. In an id, a combining mark that would sit on an escape, a space or what
    is printed before the id is escaped too: ``\\u200e`` and a raw acute print as
    ``\\u200é``."""
    if not strict:
        return [m.start() for m in _ACTING.finditer(text)]
    spots = {m.start() for m in _INVISIBLE.finditer(text)}
    if " " in text:
        for m in _LOST_SPACE.finditer(text):
            spots.update(range(m.start(), m.end()))
    if not text.isascii():
        spots.update(m.start() for m in _BLANK.finditer(text))
        # Private-use, unassigned and surrogate code points: most fonts draw them all as one
        # box, or as nothing.
        spots.update(i for i, c in enumerate(text) if unicodedata.category(c) in _UNDRAWN)
        if not unicodedata.is_normalized("NFC", text):
            spots.update(i for i, c in enumerate(text) if _composing(c))
        for i, c in enumerate(text):
            if (i == 0 or i - 1 in spots or text[i - 1] == " ") and unicodedata.category(c)[
                0
            ] == "M":
                spots.add(i)
    return sorted(spots)


def _composing(c: str) -> bool:
    """A character Unicode's composed form (NFC) may join to the one before it or replace: a
    combining mark, a Hangul jamo, or one NFC maps to another."""
    return (
        unicodedata.category(c)[0] == "M"
        or _JAMO.match(c) is not None
        or unicodedata.normalize("NFC", c) != c
    )


def has_invisible(text: str, *, keep: str = "", strict: bool = False) -> bool:
    """Whether ``text`` holds a character to escape (but those in ``keep``): with ``strict``
    (an id: two ids must never print alike) any of ``INVISIBLE_RANGES`` or one that prints like
    something else (a space that is not U+0020, one a table or a page would lose, a mark of an
    id not in composed form), else one of ``ACTING_RANGES``."""
    if not strict:
        if not keep:
            return _ACTING.search(text) is not None
        return any(m.group() not in keep for m in _ACTING.finditer(text))
    return any(text[i] not in keep for i in invisible_spots(text, strict=strict))


def invisible_parts(text: str, *, keep: str = "", strict: bool = False) -> list[tuple[str, bool]]:
    """``text`` cut into runs, each with whether it is one character to escape (as
    ``has_invisible`` tells them): the plain runs to show as they are, the others escaped."""
    parts: list[tuple[str, bool]] = []
    at = 0
    for i in invisible_spots(text, strict=strict):
        if text[i] in keep:
            continue
        if i > at:
            parts.append((text[at:i], False))
        parts.append((text[i], True))
        at = i + 1
    if at < len(text):
        parts.append((text[at:], False))
    return parts


def escape_invisible(text: str, *, keep: str = "") -> str:
    """Content (``text``) with every character that acts on what is around it
    (``ACTING_RANGES``; but those in ``keep``, e.g. ``"\n"``) written as its ``\\uXXXX``
    escape (``\\UXXXXXXXX`` beyond the BMP): what a person or a model reads is what the text
    holds. An id is shown with ``shown_id``."""
    return _ACTING.sub(lambda m: _escaped(m.group(), keep), text)


def escape_char(c: str) -> str:
    """One character as the escape an id shows it as: ``\\x1b`` below U+0100, ``\\u202e`` in
    the BMP, ``\\U000e0041`` beyond."""
    code = ord(c)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


# A backslash in an id that a reader could take for the start of an escape ``shown_id``
# writes: before one, or before another backslash (one before an escaped character is found
# by its place).
_ESCAPE_LIKE = re.compile(r"\\(?=\\|x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8})")


def shown_id(text: str) -> str:
    """An id (a session's, a call's, a tool's name) as text, on one line, never alike another's:
    every character ``invisible_spots`` finds in it (invisible ones — controls, tabs and line
    breaks included — and those that print like another) written as its escape
    (``escape_char``), and a backslash that could be read as the start of one doubled —
    ``acct\\x9bx`` (a C1 control) and ``acct\\\\x9bx`` (the text with a backslash) print
    differently, while ``C:\\tmp`` prints as it is. For a terminal, a pipe, a page's title, a
    note to the model."""
    hidden = invisible_spots(text, strict=True)
    if not hidden and not _ESCAPE_LIKE.search(text):
        return text
    escaped = set(hidden)
    out: list[str] = []
    for i, c in enumerate(text):
        if i in escaped:
            out.append(escape_char(c))
        elif c == "\\" and (i + 1 in escaped or _ESCAPE_LIKE.match(text, i)):
            out.append("\\\\")
        else:
            out.append(c)
    return "".join(out)


def _escaped(c: str, keep: str) -> str:
    if c in keep:
        return c
    code = ord(c)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def json_invisible_escaped(text: str) -> str:
    """JSON text (``json.dumps(..., ensure_ascii=False)``) with every invisible character
    (``INVISIBLE_RANGES``) in its strings written as its ``\\uXXXX`` escape — the same JSON,
    loading to the same value, that shows a person what it holds — and every lone surrogate too,
    so the text is UTF-8 whatever it holds. Its layout (line breaks and indents between values)
    is kept: ``json.dumps`` writes no raw control inside a string."""
    return _JSON_ESCAPED.sub(_json_escaped, text)


def _json_escaped(m: re.Match[str]) -> str:
    c = m.group()
    return c if c in "\n\r\t" else json.dumps(c)[1:-1]
