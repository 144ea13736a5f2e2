"""What stands between the console and a browser that should not use it.

* **Where it listens.** 127.0.0.1 by default. Any other address needs a token (``--token`` or
  ``$TOOLLEDGER_CONSOLE_TOKEN``): ``serve`` refuses to start without one (``bind_check``).
* **The token**, when there is one, is checked on every request: an ``Authorization: Bearer``
  header, or the cookie set when a page is first opened as ``/?token=…`` (the browser is then
  sent to the same page without it, so it stays out of the address bar and of the history).
* **Host names.** On a loopback address without a token only ``127.0.0.1``, ``localhost`` and
  ``[::1]`` are answered: a page of another site that re-points its own name at 127.0.0.1 (DNS
  rebinding) gets nothing. With a token any name is answered (a proxy on the same machine may
  pass its own): the token guards it, and a re-pointed name never carries the token's cookie.
* **CSRF.** Every POST carries the form field ``csrf`` equal to the ``toolledger_csrf`` cookie,
  and that value is signed with a secret this process drew at start: a missing, forged or stale
  one (from an earlier run of the console) is refused before anything is read or written.
  ``csrf_protected`` wraps every POST endpoint; GET endpoints only read.
* **Headers.** A strict Content-Security-Policy (scripts, styles and requests from the console
  itself only; no inline script; no framing), ``X-Frame-Options: DENY``, ``nosniff``, no referrer,
  no caching.

Everything read from the store is escaped by the templates (Jinja2 autoescape).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Awaitable, Callable
from urllib.parse import urlencode

from starlette.datastructures import FormData
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp

from ..errors import ConfigurationError

__all__ = [
    "CSRF_COOKIE",
    "CSRF_FIELD",
    "HEADERS",
    "TOKEN_COOKIE",
    "Guard",
    "bind_check",
    "csrf_protected",
    "is_loopback",
    "middleware_for",
]

CSRF_COOKIE = "toolledger_csrf"
CSRF_FIELD = "csrf"
TOKEN_COOKIE = "toolledger_token"  # noqa: S105 - a name, not a secret
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})

HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` serves this machine only."""
    if host.strip("[]") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def bind_check(host: str, token: str | None) -> None:
    """Refuse to serve a non-loopback address without a token (``ConfigurationError``)."""
    if not is_loopback(host) and not token:
        raise ConfigurationError(
            f"the console listens on {host!r}, beyond this machine: give it a token "
            "(--token or $TOOLLEDGER_CONSOLE_TOKEN), or listen on 127.0.0.1"
        )


class Guard:
    """This process's secrets: the access token (if any) and the key that signs CSRF tokens.
    ``loopback``: the console listens on a loopback address, so only loopback host names are
    answered."""

    def __init__(self, *, token: str | None, loopback: bool) -> None:
        self.token = token or None
        self.loopback = loopback
        self._key = secrets.token_bytes(32)

    # -- CSRF --------------------------------------------------------------------------------

    def new_csrf(self) -> str:
        nonce = secrets.token_urlsafe(18)
        return f"{nonce}.{self._sign(nonce)}"

    def csrf_valid(self, value: str | None) -> bool:
        if not value or value.count(".") != 1:
            return False
        nonce, signature = value.split(".")
        return hmac.compare_digest(signature, self._sign(nonce))

    def _sign(self, nonce: str) -> str:
        return hmac.new(self._key, nonce.encode(), hashlib.sha256).hexdigest()

    def csrf_of(self, request: Request) -> str:
        """The CSRF token of this browser: its cookie when valid, else a new one (set on the
        response by the middleware)."""
        current = request.cookies.get(CSRF_COOKIE)
        if self.csrf_valid(current):
            assert current is not None
            return current
        fresh: str = getattr(request.state, "new_csrf", None) or self.new_csrf()
        request.state.new_csrf = fresh
        return fresh

    def post_allowed(self, request: Request, form: FormData) -> bool:
        field = form.get(CSRF_FIELD)
        cookie = request.cookies.get(CSRF_COOKIE)
        return (
            isinstance(field, str)
            and cookie is not None
            and hmac.compare_digest(field, cookie)
            and self.csrf_valid(cookie)
        )

    # -- access -----------------------------------------------------------------------------

    def token_ok(self, given: str | None) -> bool:
        return self.token is None or (
            given is not None and hmac.compare_digest(given.encode(), self.token.encode())
        )

    def host_ok(self, request: Request) -> bool:
        if not self.loopback or self.token is not None:
            return True  # the token guards it (a re-pointed name never carries its cookie)
        host = request.headers.get("host", "")
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        return name in LOOPBACK_NAMES


class GuardMiddleware(BaseHTTPMiddleware):
    """Host names, the token, the CSRF cookie and the security headers, on every response."""

    def __init__(self, app: ASGIApp, guard: Guard) -> None:
        super().__init__(app)
        self.guard = guard

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        guard = self.guard
        response: Response
        if not guard.host_ok(request):
            response = PlainTextResponse("unknown host name", status_code=400)
        elif guard.token is not None and not self._authorised(request):
            offered = request.query_params.get("token")
            if offered is not None and guard.token_ok(offered) and request.method == "GET":
                rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
                target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
                response = RedirectResponse(target, status_code=303)
                response.set_cookie(
                    TOKEN_COOKIE, offered, httponly=True, samesite="strict", path="/"
                )
            else:
                response = PlainTextResponse(
                    "this console needs its token: open it once as /?token=TOKEN, or send "
                    "'Authorization: Bearer TOKEN'",
                    status_code=401,
                )
        else:
            response = await call_next(request)
            fresh = getattr(request.state, "new_csrf", None)
            if fresh:
                response.set_cookie(CSRF_COOKIE, fresh, httponly=True, samesite="strict", path="/")
        for name, value in HEADERS.items():
            response.headers[name] = value
        return response

    def _authorised(self, request: Request) -> bool:
        header = request.headers.get("authorization", "")
        if header[:7].lower() == "bearer ":
            return self.guard.token_ok(header[7:].strip())
        return self.guard.token_ok(request.cookies.get(TOKEN_COOKIE))


Endpoint = Callable[[Request], Awaitable[Response]]


def csrf_protected(
    refuse: Callable[[Request], Response],
) -> Callable[[Callable[[Request, FormData], Awaitable[Response]]], Endpoint]:
    """Wrap a POST endpoint: its form is read, and handed on only if its CSRF token is this
    browser's and was signed by this process; otherwise ``refuse(request)`` answers and nothing
    else runs."""

    def wrap(fn: Callable[[Request, FormData], Awaitable[Response]]) -> Endpoint:
        @functools.wraps(fn)
        async def endpoint(request: Request) -> Response:
            guard: Guard = request.app.state.guard
            form = await request.form()
            if not guard.post_allowed(request, form):
                return refuse(request)
            return await fn(request, form)

        endpoint.csrf_protected = True  # type: ignore[attr-defined]
        return endpoint

    return wrap


def middleware_for(guard: Guard) -> Middleware:
    """The ``Middleware`` entry that installs the guard."""
    return Middleware(GuardMiddleware, guard=guard)
