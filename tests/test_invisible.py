"""The characters that never reach a screen raw (``toolledger._invisible``), and how the
command line shows and quotes text that holds them (``toolledger._shell``)."""

from __future__ import annotations

import json
import re
import sys
import unicodedata

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from toolledger._invisible import (
    INVISIBLE_CLASS,
    INVISIBLE_RANGES,
    escape_invisible,
    has_invisible,
    json_invisible_escaped,
)
from toolledger._shell import command, quote, shown, shown_id
from toolledger.codec import shown_as_data

from .cli.test_widths import shell_words

# Unicode's default-ignorable code points that are not controls or format characters: they
# render as nothing (Hangul fillers, variation selectors, the combining grapheme joiner …).
IGNORABLE = [0x034F, 0x115F, 0x1160, 0x17B4, 0x180B, 0x3164, 0xFE0F, 0xFFA0, 0xE0100, 0xE0FFF]


def _covered(code: int) -> bool:
    return any(a <= code <= b for a, b in INVISIBLE_RANGES)


def test_every_control_format_and_separator_character_is_invisible() -> None:
    missing = [
        f"U+{c:04X}"
        for c in range(sys.maxunicode + 1)
        if unicodedata.category(chr(c)) in {"Cc", "Cf", "Zl", "Zp"} and not _covered(c)
    ]
    assert missing == [], f"not escaped: {missing} (Unicode {unicodedata.unidata_version})"
    assert all(_covered(c) for c in IGNORABLE)
    for c in [*IGNORABLE, 0x202E, 0x9B, 0x2028]:
        assert has_invisible(f"a{chr(c)}b", strict=True)


@pytest.mark.parametrize("c", ["\x1b", "\x9b", "\u202e", "\u2066", "\u2028", "\u200b", "\ufeff"])
def test_what_acts_on_the_text_around_it_is_escaped_in_content_too(c: str) -> None:
    assert has_invisible(f"a{c}b")
    assert c not in shown(f"a{c}b")


@pytest.mark.parametrize("text", ["✔\ufe0f done", "🏴\U000e0067\U000e0062\U000e007f"])
def test_content_keeps_its_emoji_and_an_id_shows_them_escaped(text: str) -> None:
    assert shown(text) == text
    assert not has_invisible(shown_id(text), strict=True)


@pytest.mark.parametrize(
    "text", ["plain", "with space", "é中文", "naïve", "😀", "C:\\tmp", "a|b;c", "q\u0323\u0307"]
)
def test_what_a_person_sees_is_left_as_it_is(text: str) -> None:
    assert not has_invisible(text)
    assert escape_invisible(text) == text
    assert shown(text) == text == shown_id(text)


def test_json_keeps_its_value_and_its_layout() -> None:
    value = {"id": "inv\u202eoice\x9b2J\u200b", "tag": "\U000e0041", "text": "a\nb"}
    text = json_invisible_escaped(json.dumps(value, indent=2, ensure_ascii=False))
    assert json.loads(text) == value
    assert re.search(INVISIBLE_CLASS, text.replace("\n", "")) is None, text
    assert "\n  " in text, "the layout is kept"


PAIRS = [
    ("café", "cafe\u0301"),  # composed, and decomposed
    ("\u00c5", "\u212b"),  # Å, and the angstrom sign
    ("q\u0323\u0307", "q\u0307\u0323"),  # two marks, in canonical order and not
    ("a b", "a\u00a0b"),  # a space, and a no-break space
    ("a b", "a\u3000b"),  # an ideographic space
    ("s", "s "),  # a space a table's cell or a web page drops
    ("s", " s"),
    ("a b", "a  b"),  # two spaces a web page makes one
    ("a\\\u00a0", "a\\xa0"),  # a backslash before an escaped space, and the text
    ("\u200e\u0301", "\\u200\u00e9"),  # a mark that would sit on an escape's last digit
    ("\x9e\u0301", "\\x9\u00e9"),
    ("\u1100\u1161", "\uac00"),  # Hangul jamo, and the syllable NFC makes of them
    ("\uac00\u11a8", "\uac01"),
    ("a\u2800b", "a b"),  # braille's blank pattern
    ("\u0301x", "\u00b4x"),  # a mark before anything: it would sit on what precedes the id
    ("x \u0301y", "x\u00b4y"),  # a mark on a space reads as an accent alone
    ("acct\ue000", "acct\ue001"),  # private use: one box, or nothing, in most fonts
    ("acct\u0378", "acct\ue000"),  # unassigned
    ("acct\x9bx", "acct\\x9bx"),
    ("a\u202e", "a\\u202e"),
    ("t\U000e0041", "t\\U000e0041"),
    ("a\\\u202e", "a\\\\u202e"),
    ("prod", "prod\u2060"),
]


def _as_seen(text: str) -> str:
    """What a person tells apart: text as a web page or a table's cell shows it — spaces at the
    ends dropped, runs of spaces one — in the composed form fonts draw alike."""
    return unicodedata.normalize("NFC", " ".join(text.split()))


@pytest.mark.parametrize(("one", "other"), PAIRS)
def test_two_ids_never_show_alike(one: str, other: str) -> None:
    assert one != other
    assert _as_seen(shown_id(one)) != _as_seen(shown_id(other))
    assert not has_invisible(shown_id(one), strict=True)
    assert not has_invisible(shown_id(other), strict=True)


@pytest.mark.parametrize(
    "arg",
    [
        "-rf",
        "--help",
        "a\u202eb",
        "it's",
        "$(touch x)",
        "`id`",
        "\\x41",
        "a\nb",
        "\u2060",
        "s ",
        "a\u00a0b",
        "cafe\u0301",
    ],
)
def test_a_quoted_argument_reaches_the_shell_as_it_is(arg: str) -> None:
    line = command("resolve", arg, "toolu_1", options=["--happened"])
    words = shell_words(line)
    if arg.startswith("-"):
        assert words == ["resolve", "--happened", "--", arg, "toolu_1"]
    else:
        assert words == ["resolve", arg, "toolu_1", "--happened"]
    assert quote(arg) in line


@pytest.mark.parametrize(
    ("text", "shows"),
    [
        ("a\u2800b", "a\\u2800b"),
        ("\u0301x", "\\u0301x"),
        ("x \u0301y", "x \\u0301y"),
        ("acct\ue000", "acct\\ue000"),
        ("acct\u0378", "acct\\u0378"),
        ("q\u0307", "q\u0307"),
    ],
)
def test_what_prints_blank_or_on_what_precedes_an_id_is_escaped(text: str, shows: str) -> None:
    """Braille's blank pattern prints as a space; a mark first in an id lands on the cell's
    padding or the space before it, and one after a space reads as an accent alone; most fonts
    draw private-use and unassigned code points as one box. A mark on a letter of an id in
    composed form is text."""
    assert shown_id(text) == shows


@settings(max_examples=300, deadline=None)
@example("\\u200b\u200b")  # the literal six characters, then the character
@given(
    st.text(
        alphabet=st.one_of(st.sampled_from('\\u200bx"\n\x9b\u202e\u2028\ufeff'), st.characters())
    )
)
def test_data_told_to_the_model_is_json_that_reads_back_as_it_was(text: str) -> None:
    """``shown_as_data`` (a note's results, quoted for the model) hides nothing and confuses
    nothing: no character that acts on the text around it is left raw, and the literal is JSON
    that loads back to the very text — a literal ``\\u200b`` and a zero-width space stay two."""
    shown = shown_as_data(text)
    assert not has_invisible(shown)
    assert json.loads(shown) == text
