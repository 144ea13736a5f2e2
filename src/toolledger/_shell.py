"""Commands a person pastes into a shell: every argument quoted so the shell gets it exactly.

``shlex.quote`` is right for printable text, but an id holding a control character (``\\x9b``, a
C1 CSI) or a bidirectional override (U+202E) would be printed raw — a terminal obeys it, or
shows the text reordered — and escaping it for display would hand the shell a different id. Such
an argument is written in bash's ANSI-C quoting, its UTF-8 bytes as escapes
(``$'…\\xe2\\x80\\xae…'``): printable ASCII on the screen, the real characters in the shell.
"""

from __future__ import annotations

import shlex

__all__ = ["UNSAFE", "command", "quote", "shown"]

# C0 and C1 controls, DEL, and the invisible formatting characters that reorder or hide text:
# bidirectional embeddings, overrides and isolates, marks, zero-width joiners and the BOM.
UNSAFE = frozenset(
    [
        *range(0x20),
        0x7F,
        *range(0x80, 0xA0),
        0x061C,
        0x200B,
        0x200C,
        0x200D,
        0x200E,
        0x200F,
        *range(0x202A, 0x202F),
        *range(0x2066, 0x206A),
        0xFEFF,
    ]
)


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


def shown(text: str, *, keep: str = "") -> str:
    """``text`` with every unsafe character written as an escape (``\\x1b``, ``\\u202e``), for
    display. Characters in ``keep`` (e.g. a newline in a multi-line value) stay as they are."""
    if not any(ord(c) in UNSAFE and c not in keep for c in text):
        return text
    return "".join(_escape(c) if ord(c) in UNSAFE and c not in keep else c for c in text)


def quote(arg: str) -> str:
    """One shell argument that a POSIX shell reads back as ``arg`` — in ANSI-C quoting (bash,
    zsh, ksh) when ``arg`` holds a character that must not reach the screen raw."""
    if not any(ord(c) in UNSAFE for c in arg):
        return shlex.quote(arg)
    out = []
    for c in arg:
        if ord(c) in UNSAFE:
            # The UTF-8 bytes, not ``\\u…``: bash reads ``\\u`` only in a UTF-8 locale.
            out.append("".join(f"\\x{b:02x}" for b in c.encode()))
        elif c in "\\'":
            out.append("\\" + c)
        else:
            out.append(c)
    return "$'" + "".join(out) + "'"


def command(*argv: str, url: str | None = None, default_url: str | None = None) -> str:
    """``toolledger ARGV…`` whole and quoted, with ``--store URL`` when ``url`` is not the
    default store."""
    store = ["--store", url] if url is not None and url != default_url else []
    return " ".join(["toolledger", *(quote(a) for a in [*store, *argv])])
