"""Commands a person pastes into a shell: every argument quoted so the shell gets it exactly.

``shlex.quote`` is right for printable text, but an id holding a control character (``\\x9b``, a
C1 CSI) or a bidirectional override (U+202E) would be printed raw — a terminal obeys it, or
shows the text reordered — and escaping it for display would hand the shell a different id. Such
an argument is written in bash's ANSI-C quoting, its UTF-8 bytes as escapes
(``$'…\\xe2\\x80\\xae…'``): printable ASCII on the screen, the real characters in the shell.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence

from ._invisible import escape_char as _escape
from ._invisible import has_invisible, invisible_parts, invisible_spots, shown_id

__all__ = ["STORE_ENV", "command", "command_label", "commands_in", "quote", "shown", "shown_id"]

STORE_ENV = "TOOLLEDGER_STORE"
"""The variable naming the store a command line opens without ``--store``."""


def shown(text: str, *, keep: str = "") -> str:
    """Content (a result, a reason, an error) for display, with every character that acts on
    what is around it (``toolledger._invisible.ACTING_RANGES``: controls, bidirectional marks,
    line separators) written as an escape (``\\x1b``, ``\\u202e``). Characters in ``keep``
    (e.g. a newline in a multi-line value) stay as they are."""
    if not has_invisible(text, keep=keep):
        return text
    return "".join(
        _escape(part) if hidden else part for part, hidden in invisible_parts(text, keep=keep)
    )


def quote(arg: str) -> str:
    """One shell argument that a POSIX shell reads back as ``arg`` — in ANSI-C quoting (bash,
    zsh, ksh) when ``arg`` holds a character that must not reach the screen raw."""
    hidden = invisible_spots(arg, strict=True)
    if not hidden:
        return shlex.quote(arg)
    escaped = set(hidden)
    out = []
    for i, c in enumerate(arg):
        if i in escaped:
            # The UTF-8 bytes, not ``\\u…``: bash reads ``\\u`` only in a UTF-8 locale.
            out.append("".join(f"\\x{b:02x}" for b in c.encode()))
        elif c in "\\'":
            out.append("\\" + c)
        else:
            out.append(c)
    return "$'" + "".join(out) + "'"


def command(
    *argv: str,
    options: Sequence[str] = (),
    url: str | None = None,
    default_url: str | None = None,
) -> str:
    """``toolledger ARGV… OPTIONS…`` whole and quoted, with ``--store URL`` unless ``url`` is
    the default store and ``$TOOLLEDGER_STORE`` names no other (when it does, the default is
    named too: pasted into this shell, the command acts on the store it was printed for, not
    on the variable's). ``argv`` is the command and its positional arguments (ids),
    ``options`` its options. An id that begins with ``-`` would be read as an option (``-rf``,
    ``--help``): then the options come first and ``--`` ends them, so every id is read as the
    id it is."""
    bare = url is not None and url == default_url == (os.environ.get(STORE_ENV) or default_url)
    store = ["--store", url] if url is not None and not bare else []
    name, *ids = argv
    if any(a.startswith("-") for a in ids):
        words = [*store, name, *options, "--", *ids]
    else:
        words = [*store, name, *ids, *options]
    return " ".join(["toolledger", *(quote(a) for a in words)])


def commands_in(text: str) -> list[tuple[int, int]]:
    """Where ``text`` (a stop reason) names commands: the spans of each `` `toolledger …` ``,
    backticks included. A command ends at the first backtick outside its quotes — an id may
    hold one, quoted (``'a`b'``); one left unclosed, or holding what ``quote`` never writes, is
    not a command."""
    spans: list[tuple[int, int]] = []
    at = 0
    while (start := text.find("`toolledger ", at)) >= 0:
        end = _command_end(text, start + 1)
        if end is None:  # not one toolledger printed: words, like the rest
            at = start + 1
            continue
        spans.append((start, end + 1))
        at = end + 1
    return spans


def _command_end(text: str, i: int) -> int | None:
    """The index of the backtick that ends the command starting at ``i`` — ``None`` unless
    every word up to it is one ``quote`` could have written: plain safe characters, a
    ``'…'`` of visible text, a ``$'…'`` of printable ASCII. Anything else (``;``, ``|``, a
    ``$(``, a control) is not a command toolledger printed, and is never shown as one."""
    n = len(text)
    while i < n:
        c = text[i]
        if c == "`":
            return i
        if text.startswith("$'", i):
            i += 2
            while i < n and text[i] != "'":
                if not " " <= text[i] <= "~":
                    return None
                i += 2 if text[i] == "\\" else 1
            if i >= n:
                return None
        elif c == "'":
            close = text.find("'", i + 1)
            if close < 0 or has_invisible(text[i + 1 : close], strict=True):
                return None
            i = close
        elif not (c == " " or c in _PLAIN):
            return None
        i += 1
    return None


_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-")
"""What ``shlex.quote`` leaves unquoted."""


def command_label(text: str) -> str:
    """What a printed command does, in the words a reason can say it with: its subcommand and
    its options (``resolve --happened``), without the store and the ids it names."""
    words = _words(text)
    if words[:1] == ["toolledger"]:
        words = words[1:]
    if words[:1] == ["--store"]:
        words = words[2:]
    if not words:
        return text
    verb, options = words[0], []
    for w in words[1:]:
        if w == "--":
            break
        if w.startswith("-"):
            options.append(w)
    return " ".join([verb, *options])


def _words(text: str) -> list[str]:
    """``text``'s words as printed, split at the blanks outside quotes (the quotes kept: an
    id is never taken for an option)."""
    words: list[str] = []
    start, i, n = 0, 0, len(text)
    while i < n:
        c = text[i]
        if c == " ":
            if i > start:
                words.append(text[start:i])
            start = i + 1
        elif text.startswith("$'", i):
            i += 2
            while i < n and text[i] != "'":
                i += 2 if text[i] == "\\" else 1
        elif c == "'":
            j = text.find("'", i + 1)
            i = n - 1 if j < 0 else j
        i += 1
    if start < n:
        words.append(text[start:])
    return words
