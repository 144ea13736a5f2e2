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

__all__ = ["STORE_ENV", "command", "quote", "shown", "shown_id"]

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
