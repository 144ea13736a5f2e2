"""What stands between the console and a browser that should not use it.

* **Where it listens.** 127.0.0.1 by default. Any other address needs a token (``--token`` or
  ``$TOOLLEDGER_CONSOLE_TOKEN``): ``serve`` refuses to start without one (``bind_check``).
* **The token**, when there is one, is checked on every request: an ``Authorization: Bearer``
  header, or the cookie set when a page is first opened as ``/?token=…`` (the browser is then
  sent to the same page without it, so it stays out of the address bar and of the history —
  by a page of the console's own when another site's link began the visit: ``_go_on``).
* **Seen beyond this machine** through a proxy (``--origin`` names a host that is not a
  loopback one), it needs a token too: the proxy's visitors are other machines.
* **Host names.** On a loopback address without a token only ``127.0.0.1``, ``localhost`` and
  ``[::1]`` are answered: a page of another site that re-points its own name at 127.0.0.1 (DNS
  rebinding) gets nothing. With a token any name is answered (a proxy on the same machine may
  pass its own): the token guards it, and a re-pointed name never carries the token's cookie.
* **Its own origin only** (docs/design.md, rule 21). Cookies ignore ports, and a browser counts
  127.0.0.1:3000 and 127.0.0.1:8765 as one *site*, so a page any other local web app serves
  (a dev server, a notebook) would be sent the console's cookies with a form it posts. Every
  state-changing request (anything but GET, HEAD, OPTIONS) is therefore refused — 403, before
  its body is read, nothing written — unless the browser says it comes from the console's own
  pages: ``Origin`` exactly the console's ``scheme://host:port`` (or absent with
  ``Sec-Fetch-Site: same-origin``), and ``Sec-Fetch-Site``, when sent, ``same-origin``.
* **Behind a proxy** that serves the console under another scheme, name or port (TLS in
  front, ``https://ops.example.com``), the browser's ``Origin`` is the proxy's: name it
  (``--origin``, ``public_origin``) and exactly that origin is the console's own — and, on a
  loopback address, its host name is answered too. Without it such a form is refused, and the
  refusal says to name it. A proxy on this machine that sends ``X-Forwarded-Proto`` needs
  nothing: the server takes the scheme from it.
* **CSRF.** Every POST carries the form field ``csrf``: an HMAC, under a secret this process
  drew at start, of this browser's session cookie (itself signed by that secret). A token that
  is missing, forged, stale (an earlier run of the console) or another browser's is refused
  before anything is read or written. ``csrf_protected`` wraps every POST endpoint; GET
  endpoints only read.
* **Cookies over TLS are** ``Secure`` (the request came over https, or ``--origin`` is an
  https one): the token cookie holds the token, and without it the browser would send it with
  any plain-HTTP request to the host name.
* **Cookies name their port** (``toolledger_session_8765``, ``toolledger_token_8765``): two
  consoles on one host keep their own, and neither reads the other's.
* **Headers.** A strict Content-Security-Policy (scripts, styles and requests from the console
  itself only; no inline script; no framing), ``X-Frame-Options: DENY``, ``nosniff``, no referrer
  to other sites, no caching.

Everything read from the store is escaped by the templates (Jinja2 autoescape).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import html
import ipaddress
import secrets
from collections.abc import Awaitable, Callable
from urllib.parse import urlencode, urlsplit

from starlette.datastructures import FormData
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp

from ..errors import ConfigurationError

__all__ = [
    "CSRF_FIELD",
    "HEADERS",
    "SESSION_COOKIE",
    "TOKEN_COOKIE",
    "Guard",
    "bind_check",
    "cookie_name",
    "csrf_protected",
    "is_loopback",
    "middleware_for",
    "public_origin",
]

SESSION_COOKIE = "toolledger_session"
CSRF_FIELD = "csrf"
TOKEN_COOKIE = "toolledger_token"  # noqa: S105 - a name, not a secret
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})

HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    # Not "no-referrer": under it a browser sends "Origin: null" with the console's own forms,
    # and the origin check needs their real one. Other sites are still sent nothing.
    "Referrer-Policy": "same-origin",
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


_DEFAULT_PORTS = {"http": 80, "https": 443}


def public_origin(url: str) -> str:
    """``url`` as a browser writes its origin (``scheme://host[:port]``, lower case, no
    default port), or ``ConfigurationError`` saying what is not an origin in it."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise ConfigurationError(
            f"--origin {url!r}: give the scheme, http:// or https://, as the browser's address "
            "bar shows it (e.g. https://ops.example.com)"
        )
    try:
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise ConfigurationError(f"--origin {url!r}: {exc}") from exc
    if not host:
        raise ConfigurationError(f"--origin {url!r}: no host name")
    if parts.username is not None or parts.password is not None:
        raise ConfigurationError(f"--origin {url!r}: an origin has no user name or password")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigurationError(
            f"--origin {url!r}: an origin has no path: the console is served at the root of "
            "its address (give scheme://host[:port] only)"
        )
    host = _host_as_sent(url, host)
    name = f"[{host}]" if ":" in host else host
    shown = f":{port}" if port is not None and port != _DEFAULT_PORTS[scheme] else ""
    return f"{scheme}://{name}{shown}"


_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789.-_")


def _host_as_sent(url: str, host: str) -> str:
    """``host`` (lower case) as a browser writes it in ``Origin`` and ``Host``: an IP address in
    its usual form (an IPv6 one compressed), a name in ASCII — a name in another script is sent
    in punycode (``xn--…``), which is for the person to give (``ConfigurationError``)."""
    try:
        return ipaddress.ip_address(host).compressed
    except ValueError:
        pass
    if not host.isascii():
        raise ConfigurationError(
            f"--origin {url!r}: give the host name as browsers send it, in ASCII: a name in "
            "another script in its punycode form (xn--…, as the address bar's URL copies it)"
        )
    if not set(host) <= _NAME_CHARS:
        raise ConfigurationError(f"--origin {url!r}: {host!r} is not a host name")
    return host


def bind_check(host: str, token: str | None, *, origin: str | None = None) -> None:
    """Refuse to serve a non-loopback address without a token (``ConfigurationError``) — or a
    public ``origin`` beyond this machine: the browsers of other machines use the console
    through that proxy as surely as if it listened there."""
    if not is_loopback(host) and not token:
        raise ConfigurationError(
            f"the console listens on {host!r}, beyond this machine: give it a token "
            "(--token or $TOOLLEDGER_CONSOLE_TOKEN), or listen on 127.0.0.1"
        )
    seen = None if origin is None else urlsplit(public_origin(origin)).hostname
    if seen is not None and not is_loopback(seen) and not token:
        raise ConfigurationError(
            f"browsers see the console at {public_origin(origin or '')}, beyond this machine: "
            "give it a token (--token or $TOOLLEDGER_CONSOLE_TOKEN); anyone who reaches that "
            "address could otherwise approve and settle calls"
        )


def cookie_name(base: str, request: Request) -> str:
    """``base`` for the console serving ``request``: suffixed with the port it listens on (the
    socket's, not the request's word for it), since cookies ignore ports."""
    server = request.scope.get("server")
    port = server[1] if server else None
    return f"{base}_{port}" if port else base


def _same(given: str, expected: str) -> bool:
    """``given`` is ``expected``, compared in constant time. Compared as UTF-8 bytes: a cookie
    or a field another page set may hold any character, and ``hmac.compare_digest`` raises on
    a string that is not ASCII — every page would fail (a cookie another local page can set
    for the console's name)."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode())


class Guard:
    """This process's secrets: the access token (if any) and the key that signs browser
    sessions and their CSRF tokens. ``loopback``: the console listens on a loopback address, so
    only loopback host names are answered."""

    def __init__(self, *, token: str | None, loopback: bool, origin: str | None = None) -> None:
        self.token = token or None
        self.loopback = loopback
        self.origin = None if origin is None else public_origin(origin)
        """Where the browser sees the console, behind a proxy (``public_origin``)."""
        self._key = secrets.token_bytes(32)

    # -- the browser's session and its CSRF token -----------------------------------------------

    def new_session(self) -> str:
        nonce = secrets.token_urlsafe(18)
        return f"{nonce}.{self._sign('session', nonce)}"

    def session_valid(self, value: str | None) -> bool:
        """Signed by this process (a cookie from an earlier run of the console is not)."""
        if not value or value.count(".") != 1:
            return False
        nonce, signature = value.split(".")
        return _same(signature, self._sign("session", nonce))

    def csrf_for(self, session: str) -> str:
        """The CSRF token of the browser whose session cookie is ``session``."""
        return self._sign("csrf", session)

    def _sign(self, purpose: str, value: str) -> str:
        message = f"{purpose}\x00{value}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def session_of(self, request: Request) -> str:
        """This browser's session: its cookie when valid, else a new one (set on the response
        by the middleware)."""
        current = request.cookies.get(cookie_name(SESSION_COOKIE, request))
        if self.session_valid(current):
            assert current is not None
            return current
        fresh: str = getattr(request.state, "new_session", None) or self.new_session()
        request.state.new_session = fresh
        return fresh

    def csrf_of(self, request: Request) -> str:
        """The CSRF token the console's forms carry for this browser."""
        return self.csrf_for(self.session_of(request))

    def post_allowed(self, request: Request, form: FormData) -> bool:
        """The form's token is the one this process gave this very browser's session."""
        field = form.get(CSRF_FIELD)
        session = request.cookies.get(cookie_name(SESSION_COOKIE, request))
        return (
            isinstance(field, str)
            and session is not None
            and self.session_valid(session)
            and _same(field, self.csrf_for(session))
        )

    # -- where a request comes from ----------------------------------------------------------

    def own_origin(self, request: Request) -> bool:
        """The browser says the request comes from the console's own pages: ``Origin`` is
        exactly the console's ``scheme://host:port`` — the public origin when one is named —
        (or absent, with ``Sec-Fetch-Site: same-origin``), and ``Sec-Fetch-Site``, when sent, is
        ``same-origin``. A request that says neither (no browser sends a form so) is not taken
        for the console's."""
        site = request.headers.get("sec-fetch-site")
        if site is not None and site != "same-origin":
            return False
        origin = request.headers.get("origin")
        if origin is None:
            return site == "same-origin"
        return origin.lower() == self._own(request)

    def _own(self, request: Request) -> str:
        if self.origin is not None:
            return self.origin
        return f"{request.url.scheme}://{request.headers.get('host', '')}".lower()

    def proxy_hint(self, request: Request) -> str | None:
        """For a form refused as another site's: the option that makes it the console's own,
        when it looks like the console's pages seen through a TLS proxy — the browser's origin
        names exactly the host and port the request was sent to (its ``Host``), under another
        scheme. Another port of the same name is another web app of this host (a dev server,
        a notebook): the very origin the check keeps out, never hinted."""
        origin = request.headers.get("origin")
        if origin is None or self.origin is not None:
            return None
        try:
            seen = public_origin(origin)
        except ConfigurationError:
            return None
        scheme, _, where = seen.partition("://")
        host = request.headers.get("host", "").lower().removesuffix(f":{_DEFAULT_PORTS[scheme]}")
        if where != host or scheme == request.url.scheme:
            return None
        return f"--origin {seen}"

    def over_tls(self, request: Request) -> bool:
        """The browser sees the console over https — the request came so (or its proxy said so:
        ``X-Forwarded-Proto``), or the public origin named is https — so its cookies are
        ``Secure``: the token cookie holds the token, and a browser sends a cookie without it
        with any plain-HTTP request to the host name, whatever the port."""
        return request.url.scheme == "https" or (
            self.origin is not None and self.origin.startswith("https://")
        )

    # -- access -----------------------------------------------------------------------------

    def token_ok(self, given: str | None) -> bool:
        return self.token is None or (given is not None and _same(given, self.token))

    def host_ok(self, request: Request) -> bool:
        if not self.loopback or self.token is not None:
            return True  # the token guards it (a re-pointed name never carries its cookie)
        host = request.headers.get("host", "")
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        return name in LOOPBACK_NAMES or (
            self.origin is not None and name.strip("[]").lower() == urlsplit(self.origin).hostname
        )


class GuardMiddleware(BaseHTTPMiddleware):
    """Host names, the token, where a state-changing request comes from, the session cookie and
    the security headers, on every response. ``refuse`` answers a request from another origin
    (403)."""

    def __init__(self, app: ASGIApp, guard: Guard, refuse: Refusal) -> None:
        super().__init__(app)
        self.guard = guard
        self.refuse = refuse

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        guard = self.guard
        response: Response
        if not guard.host_ok(request):
            response = PlainTextResponse("unknown host name", status_code=400)
        elif guard.token is not None and (offered := self._offered(request)) is not None:
            # The token in the address (a first visit's ``?token=``, or a bookmark's with the
            # cookie already set): the browser goes on without it, so it stays out of the
            # address bar and of the history.
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            # This console's own path: ``//host`` or ``/\host`` at its start would send the
            # browser to another site (a Location read as a network path).
            path = "/" + request.url.path.lstrip("/\\")
            target = path + (f"?{urlencode(rest)}" if rest else "")
            response = _go_on(request, target)
            response.set_cookie(
                cookie_name(TOKEN_COOKIE, request),
                offered,
                httponly=True,
                samesite="strict",
                path="/",
                secure=guard.over_tls(request),
            )
        elif guard.token is not None and not self._authorised(request):
            response = PlainTextResponse(
                "this console needs its token: open it once as /?token=TOKEN, or send "
                "'Authorization: Bearer TOKEN'",
                status_code=401,
            )
        elif request.method not in SAFE_METHODS and not guard.own_origin(request):
            # Before the body is read: nothing of a request another site made is looked at.
            response = self.refuse(request, "another site")
        else:
            response = await call_next(request)
            fresh = getattr(request.state, "new_session", None)
            if fresh:
                response.set_cookie(
                    cookie_name(SESSION_COOKIE, request),
                    fresh,
                    httponly=True,
                    samesite="strict",
                    path="/",
                    secure=guard.over_tls(request),
                )
        for name, value in HEADERS.items():
            response.headers[name] = value
        return response

    def _offered(self, request: Request) -> str | None:
        """The right token, given in a GET's address (``?token=``)."""
        offered = request.query_params.get("token")
        if request.method == "GET" and offered is not None and self.guard.token_ok(offered):
            return offered
        return None

    def _authorised(self, request: Request) -> bool:
        header = request.headers.get("authorization", "")
        if header[:7].lower() == "bearer ":
            return self.guard.token_ok(header[7:].strip())
        return self.guard.token_ok(request.cookies.get(cookie_name(TOKEN_COOKIE, request)))


def _go_on(request: Request, target: str) -> Response:
    """Where a first visit's ``?token=`` goes on to ``target``, its token cookie set. A redirect,
    unless another site began the navigation (``Sec-Fetch-Site: cross-site``: a link in a chat or
    a wiki): a ``SameSite=Strict`` cookie is not sent along it, a redirect of it included, and
    the console would answer "needs its token". Then a page of its own goes on instead — a
    navigation the console's own site begins, which carries the cookie (a refresh at once,
    which replaces the page in the history, and a link)."""
    if request.headers.get("sec-fetch-site") != "cross-site":
        return RedirectResponse(target, status_code=303)
    where = html.escape(target, quote=True)
    page = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        # The next request's Referer would hold this address, the token in it.
        '<meta name="referrer" content="no-referrer">'
        f'<meta http-equiv="refresh" content="0; url={where}"><title>toolledger console</title>'
        f'</head><body><p><a href="{where}">Open the console</a></p></body></html>'
    )
    return HTMLResponse(page)


Endpoint = Callable[[Request], Awaitable[Response]]
Refusal = Callable[[Request, str], Response]
"""Answers a refused request (403): ``why`` is ``"another site"`` (its origin) or ``"csrf"``."""


def csrf_protected(
    refuse: Refusal,
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
                return refuse(request, "csrf")
            return await fn(request, form)

        endpoint.csrf_protected = True  # type: ignore[attr-defined]
        return endpoint

    return wrap


def middleware_for(guard: Guard, refuse: Refusal) -> Middleware:
    """The ``Middleware`` entry that installs the guard."""
    return Middleware(GuardMiddleware, guard=guard, refuse=refuse)
