"""Secrets are masked in everything toolledger shows (the command line, the console, notifications)
unless ``--show-secrets``.

In any JSON value of a tool input, a tool result or an approval request:

* the value of a key whose words include ``password``, ``passwd``, ``pwd``, ``passphrase``,
  ``passcode``, ``secret``, ``token``, ``credential(s)``, ``authorization``, ``auth``,
  ``bearer``, ``jwt``, ``cookie``, or that names an API, access, private or secret key
  (``api_key``, ``apiKey``, ``X-Api-Key``, ``access_key``, ``client_secret`` …) is ``***``.
  Words are split at ``_``, ``-``, other punctuation and camelCase, so ``max_tokens`` is not a
  secret and ``authToken`` is;
* a header given as a pair — ``{"name": "Authorization", "value": "Bearer …"}`` (or ``key`` /
  ``header`` and ``value``) — has its value masked when the name is a secret's;
* a password in a URL (``postgres://user:pw@host``) is ``***``, in any string;
* ``Bearer …`` / ``Basic …`` credentials (8 or more characters, a digit or a symbol among
  them) in any string are ``***``;
* a string that holds a JSON object or array (a tool result, a call's ``arguments`` in OpenAI's
  APIs) is masked as the JSON it holds, and written again as JSON (``json.dumps`` without ASCII
  escapes, unless it holds a lone surrogate, which UTF-8 cannot write).

Masking hides what a reader should not see at a glance; it is not redaction (the store still
holds the values: ``open_store(..., redact=)`` keeps them out of it).
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any, overload

__all__ = ["MASK", "is_secret_key", "masked", "masked_text"]

MASK = "***"
_SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "pwd",
        "passphrase",
        "passcode",
        "secret",
        "token",
        "credential",
        "credentials",
        "authorization",
        "auth",
        "bearer",
        "jwt",
        "cookie",
        "apikey",
        "accesskey",
        "privatekey",
        "secretkey",
    }
)
_SECRET_PAIRS = frozenset({("api", "key"), ("access", "key"), ("private", "key")})
_PAIR_NAMES = ("name", "key", "header")
# A scheme starts where no scheme character precedes it: a match is tried once per run of
# such characters, not at each of them (a long hex string would otherwise cost its square).
_URL_PASSWORD = re.compile(
    r"(?<![a-zA-Z0-9+.-])(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*:)[^/\s@]+(?=@)"
)
# A credential has a digit or a symbol in it: "Basic arithmetic" is prose, not a credential.
_SCHEME_CREDENTIAL = re.compile(
    r"\b(?P<head>(?:Bearer|Basic)\s+)(?=[A-Za-z._~+/=-]*[0-9._~+/=-])[A-Za-z0-9._~+/=-]{8,}"
)


def is_secret_key(key: str) -> bool:
    """Whether a JSON key marks its value secret (see the module docstring)."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", key).lower()
    words = [w for w in re.split(r"[^a-z0-9]+", spaced) if w]
    return any(w in _SECRET_WORDS for w in words) or any(
        pair in _SECRET_PAIRS for pair in itertools.pairwise(words)
    )


def _masked_string(text: str) -> str:
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + MASK, text)
    return _SCHEME_CREDENTIAL.sub(lambda m: m.group("head") + MASK, text)


TOO_DEEP = f"{MASK} (nested too deep to look for secrets in; --show-secrets shows it)"
"""What a value nested past the interpreter's limit is shown as, masked: it cannot be looked
through, and it may hold a secret."""


def masked(value: Any) -> Any:
    """A copy of a JSON value with every secret in it replaced by ``***`` (``TOO_DEEP`` for one
    nested too deep to look through)."""
    try:
        return _masked(value)
    except RecursionError:
        return TOO_DEEP


def _masked(value: Any) -> Any:
    if isinstance(value, dict):
        pair_name = next(
            (value[k] for k in _PAIR_NAMES if isinstance(value.get(k), str) and "value" in value),
            None,
        )
        out = {}
        for k, v in value.items():
            secret = is_secret_key(str(k)) or (
                k == "value" and pair_name is not None and is_secret_key(pair_name)
            )
            out[k] = MASK if secret and v is not None else _masked(v)
        return out
    if isinstance(value, list):
        return [_masked(v) for v in value]
    if isinstance(value, str):
        return _masked_json_or_string(value, canonical=False)
    return value


def _masked_json_or_string(text: str, *, canonical: bool) -> str:
    """A string masked: as the JSON it holds when it is an object or an array, else as text.
    ``canonical``: JSON is written again even when nothing in it was masked (what a display
    shows: its escapes as the characters they are); without, such text is kept as it was — a
    value (an export) keeps its bytes unless a secret was taken out of it."""
    # Only text that starts as an object or an array is parsed: a JSON string or number is
    # masked as the text it is, and prose is not handed to the parser at all.
    if text.lstrip()[:1] in ("{", "["):
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            value = None
        if isinstance(value, dict | list):
            shown = _masked(value)
            if not canonical and shown == value:
                return text
            out = json.dumps(shown, ensure_ascii=False)
            try:
                out.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate: kept as the escape it was stored as
                out = json.dumps(shown)
            return out
    return _masked_string(text)


@overload
def masked_text(text: str) -> str: ...
@overload
def masked_text(text: None) -> None: ...
def masked_text(text: str | None) -> str | None:
    """``text`` with its secrets masked, as ``masked`` masks a string: as JSON when it is a
    JSON object or array, else as a string (URL passwords, bearer credentials)."""
    if text is None:
        return None
    try:
        return _masked_json_or_string(text, canonical=True)
    except RecursionError:
        return TOO_DEEP
