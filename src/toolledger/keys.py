"""Keys downstream: forward ``ctx.idempotency_key`` so the receiver can drop a repeat.

The ledger cannot know whether a call that was running when the process died took effect: that
is the in-doubt window (docs/design.md, rule 6). The receiver can, if every attempt of one call
reaches it under one key. ``ctx.idempotency_key`` is that key — the same for one ``(session,
tool_use_id)`` on every process and machine, different for every other call. Forward it, declare
the tool ``forwards_idempotency_key=True``, and a resume simply runs the call again: the receiver
answers the repeat with the first outcome.

* HTTP APIs that honour ``Idempotency-Key`` (payments, ticketing): ``idempotency_headers(ctx)``,
  ``IdempotencyKeyAuth(ctx)`` as ``auth=`` for ``httpx`` or ``requests``, or ``forwarding(ctx)``
  with ``httpx_event_hook`` on a shared client.
* E-mail: ``message_id(ctx, domain)`` as the ``Message-ID`` header; a ``check`` that searches the
  mailbox for it tells whether an in-doubt send went out (e-mail has no de-duplication of its
  own).
* Anything with a client-supplied id (an external id on a ticket, a row's primary key): use the key
  itself, and a ``check`` that looks it up.

Nothing here imports an HTTP library: the helpers touch only ``request.headers``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from .errors import ConfigurationError
from .tools import ToolContext

__all__ = [
    "IDEMPOTENCY_HEADER",
    "IdempotencyKeyAuth",
    "ahttpx_event_hook",
    "current_key",
    "forwarding",
    "httpx_event_hook",
    "idempotency_headers",
    "message_id",
]

IDEMPOTENCY_HEADER = "Idempotency-Key"
"""The header most APIs read (Stripe, Adyen, PayPal's ``PayPal-Request-Id`` aside; the IETF
draft ``draft-ietf-httpapi-idempotency-key-header``)."""

_current: ContextVar[str | None] = ContextVar("toolledger_idempotency_key", default=None)
_DOMAIN = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")

R = TypeVar("R")


def _key(ctx_or_key: ToolContext | str) -> str:
    key = ctx_or_key.idempotency_key if isinstance(ctx_or_key, ToolContext) else ctx_or_key
    if not isinstance(key, str) or not key:
        raise ConfigurationError(f"an idempotency key must be a non-empty string, not {key!r}")
    return key


def idempotency_headers(
    ctx_or_key: ToolContext | str, *, header: str = IDEMPOTENCY_HEADER
) -> dict[str, str]:
    """``{"Idempotency-Key": ctx.idempotency_key}`` — merge it into a request's headers."""
    return {header: _key(ctx_or_key)}


class IdempotencyKeyAuth:
    """``auth=`` for ``httpx`` and ``requests``: sets the key header on the request it is given.

    ```python
    httpx.post(url, json=body, auth=IdempotencyKeyAuth(ctx))
    requests.post(url, json=body, auth=IdempotencyKeyAuth(ctx))
    ```
    Both libraries call an auth callable with the request and send what it returns.
    """

    def __init__(self, ctx_or_key: ToolContext | str, *, header: str = IDEMPOTENCY_HEADER) -> None:
        self.key = _key(ctx_or_key)
        self.header = header

    def __call__(self, request: R) -> R:
        request.headers[self.header] = self.key  # type: ignore[attr-defined]
        return request


@contextmanager
def forwarding(ctx_or_key: ToolContext | str) -> Iterator[str]:
    """Within the block, ``current_key()`` is this call's key, and the ``httpx`` event hooks put
    it on every request. Context-local: concurrent tools (threads, tasks) each see their own."""
    token = _current.set(_key(ctx_or_key))
    try:
        yield _current.get() or ""
    finally:
        _current.reset(token)


def current_key() -> str | None:
    """The key set by the innermost ``forwarding`` block, or ``None``."""
    return _current.get()


def httpx_event_hook(request: Any) -> None:
    """An ``httpx.Client(event_hooks={"request": [httpx_event_hook]})`` hook: inside a
    ``forwarding(ctx)`` block, requests carry ``Idempotency-Key`` (one set explicitly wins)."""
    key = _current.get()
    if key is not None and IDEMPOTENCY_HEADER not in request.headers:
        request.headers[IDEMPOTENCY_HEADER] = key


async def ahttpx_event_hook(request: Any) -> None:
    """The ``httpx.AsyncClient`` twin of ``httpx_event_hook``."""
    httpx_event_hook(request)


def message_id(ctx_or_key: ToolContext | str, domain: str) -> str:
    """An RFC 5322 ``Message-ID`` made from the call's key: ``<tl-…@domain>``.

    Every attempt of one call sends the same Message-ID, so a ``check`` can search the mailbox
    (IMAP ``SEARCH HEADER Message-ID``, a provider's API, the Sent folder) to tell whether an
    in-doubt send went out. ``domain`` is yours (the sending domain).
    """
    if not _DOMAIN.match(domain) or ".." in domain:
        raise ConfigurationError(f"{domain!r} is not a domain name for a Message-ID")
    return f"<{_key(ctx_or_key)}@{domain}>"
