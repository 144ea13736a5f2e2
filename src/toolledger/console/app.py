"""The console's routes: pages that read (GET) and the two actions (POST, CSRF-checked).

``create_app(store)`` builds the Starlette application; ``serve`` runs it with uvicorn. The
store is a URL (opened for each request, never created) or an open ``Store`` (shared, one
request at a time).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import re
import socket
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import jinja2
import markupsafe
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from .._invisible import escape_char, has_invisible, invisible_parts, shown_id
from .._views.overview import known_session
from ..errors import ConfigurationError, StoreError
from ..masking import MASK, masked_text
from ..stores import Store, open_store
from ..stores._sqlite_files import CommitWatch
from . import views
from .actions import Notice, decide_from, resolve_from
from .security import (
    Guard,
    bind_check,
    csrf_protected,
    is_loopback,
    middleware_for,
)

__all__ = ["create_app", "listen", "serve"]

HERE = Path(__file__).parent


def shown_url(url: str) -> str:
    """A store's URL as the pages and the console's first line show it: a password in it
    masked, as ``Store.url`` masks one (``user:***@``, ``password=***``)."""
    head, asks, rest = url.partition("?")
    query, hash_, fragment = rest.partition("#")
    kept = [
        f"{p.partition('=')[0]}={MASK}" if unquote(p.partition("=")[0]) == "password" else p
        for p in query.split("&")
    ]
    return masked_text(head + asks + "&".join(kept) + hash_ + fragment)


@dataclass(frozen=True)
class _Copy:
    """An earlier release's SQLite store, migrated into memory to be read, and the state of
    its file it was copied from (``CommitWatch.now``)."""

    files: tuple[int, int, int]
    store: Store


class _Source:
    """Where the pages read: a URL opened per request, or one open store behind a lock. A URL
    is opened read-only to read (as the command line's reading commands open it: a store of an
    earlier release is read through a migrated copy, never migrated by a person looking at it)
    and with write access only for an action (``write``).

    Such a copy is the whole file migrated in memory: made again for every page and every
    refresh (every 2 s), a large store would be copied without end. It is kept, and read one
    request at a time, for as long as the file and its write-ahead log are as they were when
    it was made; any commit changes them, and the next page reads a new copy."""

    def __init__(self, store: Store | str) -> None:
        self.store = store
        self.lock = threading.Lock()
        self.url = store.url if isinstance(store, Store) else shown_url(store)
        self._watch: CommitWatch | None = None  # the file, once it was read through a copy
        self._copy: _Copy | None = None

    @contextmanager
    def open(self, *, write: bool = False) -> Iterator[Store]:
        watch = self._watch
        if isinstance(self.store, Store):
            with self.lock:
                yield self.store
        elif write or watch is None:
            with open_store(self.store, create=False, read_only=not write) as store:
                if not write and getattr(store.backend, "copied", False):
                    self._watch_copies(store.backend.path)  # type: ignore[attr-defined]
                yield store
        else:
            with self._kept_copy(watch) as store:
                yield store

    def _watch_copies(self, path: str) -> None:
        """The store at ``path`` is read through a copy: keep the next one while it is as it
        was (``_kept_copy``) — where a connection to watch it can be opened."""
        with self.lock:
            if self._watch is None:
                with contextlib.suppress(sqlite3.Error):
                    # A look that waits a second at most: one that cannot tell copies anew.
                    self._watch = CommitWatch(path, busy_timeout_ms=1000)

    @contextmanager
    def _kept_copy(self, watch: CommitWatch) -> Iterator[Store]:
        """The copy of the store of an earlier release ``watch`` looks at, made again when it
        changed; the file itself once it was migrated (by an action, by a worker)."""
        assert isinstance(self.store, str)
        with self.lock:
            now = watch.now()  # read before copying: a commit meanwhile is seen next time
            kept = self._copy
            if kept is None or now is None or kept.files != now:
                self._copy = None
                if kept is not None:
                    kept.store.close()
                store = open_store(self.store, create=False, read_only=True)
                if not getattr(store.backend, "copied", False):  # migrated since
                    if self._watch is watch:
                        self._watch = None
                        watch.close()
                    with store:
                        yield store
                    return
                if now is None:  # it could not be watched: not kept
                    with store:
                        yield store
                    return
                kept = self._copy = _Copy(now, store)
            yield kept.store

    def call(self, fn: Callable[..., Any], *args: Any, write: bool = False) -> Any:
        with self.open(write=write) as store:
            return fn(store, *args)


_LAYOUT = "\n\t"  # line breaks and tabs lay out a pretty-printed input
_SURROGATE = re.compile("([\ud800-\udfff])")
"""A lone surrogate: Python text may hold one (a file name ``os.listdir`` read, not UTF-8),
UTF-8 cannot write it, and a page holding it could not be sent."""


class Posted(str):
    """A value a form posts back as it is (a hidden field): never shown, never escaped."""

    __slots__ = ()


def _visible(value: Any, *, strict: bool = False) -> Any:
    """Every value a template writes: a string's characters that act on what is around them —
    controls, C1 (``\x9b``), bidirectional overrides and isolates, which would reorder what a
    person reads (``toolledger._invisible``) — and lone surrogates, which UTF-8 cannot write,
    shown escaped (``\u202e``) and marked, the rest HTML-escaped. A ``Posted`` value goes out
    as it is (HTML-escaped by autoescape), so a form posts the real id back. With ``strict``
    (an id: the ``id`` filter), every character that shows nothing — zero-width, joiners,
    variation selectors, tags — too, so two ids never look alike."""
    if not isinstance(value, str) or isinstance(value, Posted | markupsafe.Markup):
        return value
    keep = "" if strict else _LAYOUT
    if not has_invisible(value, keep=keep, strict=strict) and not _SURROGATE.search(value):
        return value
    parts = []
    for part, hidden in invisible_parts(value, keep=keep, strict=strict):
        # In content a lone surrogate is not one of the characters to escape, but it cannot be
        # sent: it is shown escaped too (odd pieces of the split).
        pieces = [part] if hidden else _SURROGATE.split(part)
        for i, piece in enumerate(pieces):
            if hidden or i % 2:
                parts.append(f'<span class="esc">{escape_char(piece)}</span>')
            elif piece:
                parts.append(str(markupsafe.escape(piece)))
    return markupsafe.Markup("".join(parts))  # noqa: S704 - every part escaped above


def _shown_id(value: Any) -> Any:
    """The ``id`` filter: a session's, a call's or a tool's name, every invisible character of
    it shown escaped, in left-to-right order as stored (``<bdo dir="ltr">``): a browser would
    otherwise reorder a run of right-to-left letters with what is around it, and ``run-אב-7``
    read like ``run-7-אב``."""
    if not isinstance(value, str) or isinstance(value, Posted | markupsafe.Markup):
        return value
    shown = _visible(value, strict=True)
    inner = shown if isinstance(shown, markupsafe.Markup) else markupsafe.escape(shown)
    return markupsafe.Markup(f'<bdo dir="ltr">{inner}</bdo>')  # noqa: S704 - escaped above


def _text_id(value: Any) -> Any:
    """The ``text_id`` filter: an id where no markup can go (a page's ``<title>``), as the
    command line shows it (``toolledger._invisible.shown_id``): its escapes in plain text."""
    return shown_id(value) if isinstance(value, str) else value


def _templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every value from the store is text, whatever it holds
        undefined=jinja2.StrictUndefined,
        finalize=_visible,
    )
    env.filters["posted"] = Posted
    env.filters["id"] = _shown_id
    env.filters["text_id"] = _text_id
    return Jinja2Templates(env=env)


def create_app(
    store: Store | str,
    *,
    token: str | None = None,
    loopback: bool = True,
    origin: str | None = None,
) -> Starlette:
    """The console for ``store``. ``token``: required on every request when given (``serve``
    requires one beyond loopback). ``loopback``: it listens on a loopback address, so only the
    loopback host names are answered. ``origin``: where browsers see it, behind a proxy
    (``https://ops.example.com``): its forms come from there (``ConfigurationError`` if it is
    not an origin)."""
    guard = Guard(token=token, loopback=loopback, origin=origin)
    source = _Source(store)
    templates = _templates()

    async def page(
        request: Request,
        name: str,
        context: dict[str, Any],
        *,
        notice: Notice | None = None,
        status: int = 200,
    ) -> Response:
        return templates.TemplateResponse(
            request,
            name,
            {
                **context,
                "store_url": source.url,
                "csrf": guard.csrf_of(request),
                "notice": notice,
                "page": name.removesuffix(".html"),
            },
            status_code=status,
        )

    def refuse(request: Request, why: str) -> Response:
        text = (
            "This request came from another site, not from this console's own pages (the "
            "browser said so in its Origin or Sec-Fetch-Site header). Nothing was changed, "
            "and nothing it sent was read."
            if why == "another site"
            else "This form is stale or did not come from this console (its CSRF token is "
            "missing or wrong). Nothing was changed. Open the page again and retry."
        )
        hint = guard.proxy_hint(request) if why == "another site" else None
        if hint is not None:
            text += (
                " If this console is served to browsers through a proxy at that address, "
                f"start it with {hint} (or have the proxy send X-Forwarded-Proto)."
            )
        html = templates.get_template("message.html").render(
            heading="Refused", text=text, store_url=source.url, notice=None, page=""
        )
        return HTMLResponse(html, status_code=403)

    async def unreadable(request: Request, exc: Exception) -> Response:
        """A store that cannot be opened or read (gone, unreachable, of a newer release): the
        page says why, not a bare server error."""
        said = str(exc)
        if isinstance(source.store, str):  # its URL as the pages show it: a password masked
            said = said.replace(source.store, source.url)
        html = templates.get_template("message.html").render(
            heading="The store cannot be read",
            text=masked_text(f"{said} Nothing was changed."),
            store_url=source.url,
            notice=None,
            page="",
        )
        return HTMLResponse(html, status_code=503)

    async def sessions(request: Request) -> Response:
        ctx = await run_in_threadpool(source.call, views.sessions_view, _status(request))
        return await page(request, "sessions.html", ctx)

    async def sessions_rows(request: Request) -> Response:
        ctx = await run_in_threadpool(source.call, views.sessions_view, _status(request))
        return await page(request, "_sessions_table.html", ctx)

    async def session(request: Request) -> Response:
        sid = request.query_params.get("id", "")
        ctx = await run_in_threadpool(source.call, _session_or_none, sid)
        if ctx is None:
            return await page(
                request,
                "message.html",
                {"heading": "No such session", "text": f"There is no session {sid!r} here."},
                status=404,
            )
        return await page(request, "session.html", ctx)

    async def in_doubt(request: Request) -> Response:
        ctx = await run_in_threadpool(source.call, views.in_doubt_view)
        return await page(request, "in_doubt.html", ctx)

    @csrf_protected(refuse)
    async def resolve(request: Request, form: FormData) -> Response:
        notice = await run_in_threadpool(
            functools.partial(source.call, write=True), resolve_from, form
        )
        ctx = await run_in_threadpool(source.call, views.in_doubt_view)
        return await page(request, "in_doubt.html", ctx, notice=notice, status=_code(notice))

    async def approvals(request: Request) -> Response:
        ctx = await run_in_threadpool(source.call, views.approvals_view)
        return await page(request, "approvals.html", ctx)

    @csrf_protected(refuse)
    async def decide(request: Request, form: FormData) -> Response:
        notice = await run_in_threadpool(
            functools.partial(source.call, write=True), decide_from, form
        )
        ctx = await run_in_threadpool(source.call, views.approvals_view)
        return await page(request, "approvals.html", ctx, notice=notice, status=_code(notice))

    async def favicon(request: Request) -> Response:
        return FileResponse(HERE / "static" / "favicon.svg", media_type="image/svg+xml")

    async def verify(request: Request) -> Response:
        ctx = await run_in_threadpool(source.call, views.verify_view)
        return await page(request, "verify.html", ctx)

    routes = [
        Route("/", sessions, methods=["GET"]),
        Route("/sessions/rows", sessions_rows, methods=["GET"]),
        Route("/session", session, methods=["GET"]),
        Route("/in-doubt", in_doubt, methods=["GET"]),
        Route("/in-doubt/resolve", resolve, methods=["POST"]),
        Route("/approvals", approvals, methods=["GET"]),
        Route("/approvals/decide", decide, methods=["POST"]),
        Route("/verify", verify, methods=["GET"]),
        # Asked for by browsers and tools that do not read the page's <link rel="icon">.
        Route("/favicon.ico", favicon, methods=["GET"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[middleware_for(guard, refuse)],
        exception_handlers={StoreError: unreadable},
    )
    app.state.guard = guard
    return app


def _status(request: Request) -> str | None:
    return request.query_params.get("status") or None


def _code(notice: Notice) -> int:
    return 200 if notice.ok else 409


def _session_or_none(store: Store, session_id: str) -> dict[str, Any] | None:
    if not session_id or not known_session(store, session_id):
        return None
    return views.session_view(store, session_id)


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` (0: a free port the system picks), for ``serve``.
    Bound before the console says where it is, so that a port another program holds is
    ``ConfigurationError`` saying so, not a server's log line after the announcement."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            what = "another program (another console?) holds that port: choose another --port"
        elif exc.errno == errno.EACCES:
            what = "this user may not listen there: choose a --port above 1023"
        else:
            what = "check that --host names an address of this machine, and --port a free port"
        raise ConfigurationError(
            f"the console cannot listen on {host}:{port} ({exc.strerror or exc}): {what}"
        ) from None
    return sock


def serve(
    store_url: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
    origin: str | None = None,
    sock: socket.socket | None = None,
) -> None:
    """Serve the console until interrupted. Refuses (``ConfigurationError``) a non-loopback
    ``host`` without a ``token`` (or an ``origin`` beyond this machine without one), an
    ``origin`` that is not one, and a port it cannot listen on; the store must exist
    (``StoreError`` otherwise). ``sock``: one ``listen(host, port)`` already bound."""
    import uvicorn

    bind_check(host, token, origin=origin)
    with open_store(store_url, read_only=True):
        pass  # it exists and opens (looked at, not migrated): say so now, not on the first page
    app = create_app(store_url, token=token, loopback=is_loopback(host), origin=origin)
    bound = sock if sock is not None else listen(host, port)
    # No access log: a first visit's URL carries the token.
    config = uvicorn.Config(app, host=host, port=port, access_log=False, log_level="warning")
    with bound:
        uvicorn.Server(config).run(sockets=[bound])
