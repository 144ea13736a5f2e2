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

__all__ = [
    "SETTLING",
    "STORE_ENV",
    "asked",
    "command",
    "command_label",
    "command_parts",
    "commands_in",
    "quote",
    "shown",
    "shown_id",
]

STORE_ENV = "TOOLLEDGER_STORE"
"""The variable naming the store a command line opens without ``--store``."""
SETTLING = frozenset({"approve", "deny", "resolve"})
"""The commands a stop reason names (``toolledger.agent._stops``), the only ones a reason's
words may show as commands (``toolledger._views.overview.reason_parts``)."""


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


def _bytes_of(c: str) -> bytes:
    """The bytes a shell passes for ``c``: its UTF-8, and for a lone surrogate that stands for a
    byte that was not UTF-8 (``\\udc80`` to ``\\udcff``, as Python decodes its arguments and file
    names) that byte, which Python reads back as the same surrogate. Any other lone surrogate
    has no bytes that come back as it: its UTF-8 form is written, and names no such id."""
    try:
        return c.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return c.encode("utf-8", "surrogatepass")


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
            out.append("".join(f"\\x{b:02x}" for b in _bytes_of(c)))
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


def commands_in(text: str) -> list[tuple[int, int, list[str]]]:
    """The commands ``text`` (a stop reason) names: for each `` `toolledger …` ``, its span,
    backticks included, and the arguments the shell would give it. A command ends at the first
    backtick outside its quotes — an id may hold one, quoted (``'a`b'``); one left unclosed, or
    holding what ``quote`` never writes (``;``, ``|``, ``$(``, a raw control), is not one."""
    found: list[tuple[int, int, list[str]]] = []
    at = 0
    while (start := text.find("`toolledger ", at)) >= 0:
        read = _argv(text, start + 1)
        if read is None:  # not one toolledger printed: words, like the rest
            at = start + 1
            continue
        argv, end = read
        found.append((start, end + 1, argv))
        at = end + 1
    return found


def _argv(text: str, i: int) -> tuple[list[str], int] | None:
    """The arguments of the command starting at ``i`` and the index of the backtick ending
    it — ``None`` unless every word is written exactly as ``quote`` writes its argument (so it
    holds nothing the shell would do more with: no ``;``, ``|``, ``$(``, raw control)."""
    n = len(text)
    words: list[str] = []
    word: list[str] = []
    start = i
    while i < n:
        c = text[i]
        if c in "` ":
            if i > start:
                arg = "".join(word)
                if quote(arg) != text[start:i]:
                    return None
                words.append(arg)
            if c == "`":
                return words, i
            word, start, i = [], i + 1, i + 1
            continue
        if text.startswith("$'", i):
            read = _ansi_c(text, i + 2)
            if read is None:
                return None
            part, i = read
            word.append(part)
        elif c == "'":
            close = text.find("'", i + 1)
            if close < 0:
                return None
            word.append(text[i + 1 : close])
            i = close + 1
        elif text.startswith('"\'"', i):  # shlex.quote's quote inside a quoted word
            word.append("'")
            i += 3
        elif c in _PLAIN:
            word.append(c)
            i += 1
        else:
            return None
    return None


def _ansi_c(text: str, i: int) -> tuple[str, int] | None:
    """The text of a ``$'…'`` word whose body starts at ``i``, and the index after it."""
    n = len(text)
    raw = bytearray()
    while i < n and text[i] != "'":
        if text[i] == "\\":
            nxt = text[i + 1 : i + 2]
            if nxt in ("\\", "'"):
                raw += nxt.encode()
                i += 2
                continue
            try:
                raw.append(int(text[i + 2 : i + 4], 16) if nxt == "x" else -1)
            except ValueError:
                return None
            i += 4
        else:
            raw += text[i].encode()
            i += 1
    if i >= n:
        return None
    try:
        return raw.decode(), i + 1
    except UnicodeDecodeError:
        return None


_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-")
"""What ``shlex.quote`` leaves unquoted."""


def command_parts(argv: Sequence[str]) -> tuple[str | None, str, list[str], list[str]]:
    """A printed command's arguments (``commands_in``) as ``command`` put them: the store it
    names (``None``: none), its subcommand, its options and its ids."""
    words = list(argv[1:] if argv[:1] == ["toolledger"] else argv)
    store = None
    if words[:1] == ["--store"] and len(words) > 1:
        store, words = words[1], words[2:]
    if not words:
        return store, "", [], []
    verb, rest = words[0], words[1:]
    if "--" in rest:
        cut = rest.index("--")
        return store, verb, rest[:cut], rest[cut + 1 :]
    return (
        store,
        verb,
        [w for w in rest if w.startswith("-")],
        [w for w in rest if not w.startswith("-")],
    )


def asked(in_doubt: bool) -> str:
    """The option an ``approve``/``deny`` command is printed with, binding it to the question
    asked (``approvals.decide(in_doubt=)``): the re-run of a call in doubt, or a first run.
    Pasted once the request has become the other question, it is refused, not taken for a yes
    to that one."""
    return "--in-doubt=yes" if in_doubt else "--in-doubt=no"


def command_label(argv: Sequence[str]) -> str:
    """What a printed command does, in the words a reason can say it with: its subcommand and
    its options (``resolve --happened``), without the store and the ids it names."""
    _, verb, options, _ = command_parts(argv)
    # ``--in-doubt=no``: what it is bound to, not what it does.
    return " ".join([verb, *(o for o in options if "=" not in o)])
