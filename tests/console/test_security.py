"""Who may use the console, and what a page from the store can do in it: nothing.

Store data is escaped; a state-changing request that does not come from the console's own origin
(``Origin``, ``Sec-Fetch-Site``) is refused before anything is read; a POST without the CSRF
token of this browser's session, signed by this process, changes nothing (the database is
compared row by row); GET never writes; cookies name the console's port; a token, when there is
one, is needed on every request; a non-loopback address needs one to start."""

from __future__ import annotations

import asyncio
import contextlib
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from markupsafe import escape
from starlette.routing import Route
from starlette.testclient import TestClient

import toolledger as tl
from toolledger._shell import command
from toolledger.cli.app import main
from toolledger.console import create_app
from toolledger.console.security import HEADERS, SESSION_COOKIE, bind_check, is_loopback
from toolledger.records import ApprovalStatus

from .scene import XSS_RESULT, XSS_SESSION, Scene, browser, build, csrf_of, forms_of

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PAGES = ["/", "/sessions/rows", "/in-doubt", "/approvals", "/verify", "/session?id=pay-1"]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Scene:
    """One scene for the tests that only read or only try (and fail) to write."""
    return build(tmp_path_factory.mktemp("security"))


@pytest.fixture
def client(built: Scene) -> TestClient:
    return browser(create_app(built.url))


# The TestClient's server: the console's cookies name its port.
SESSION = f"{SESSION_COOKIE}_80"


def scripts_and_handlers(page: str) -> tuple[list[str], list[str]]:
    """The script elements of a page, and any element with an event-handler attribute."""
    return re.findall(r"<script[^>]*>", page), re.findall(r"<[a-z]+[^>]*\son[a-z]+=", page)


@pytest.mark.parametrize("path", [*PAGES, "/session?id=" + quote(XSS_SESSION, safe="")])
def test_store_data_is_text_on_every_page(client: TestClient, path: str) -> None:
    page = client.get(path).text
    scripts, handlers = scripts_and_handlers(page)
    htmx = [] if path.startswith("/sessions/rows") else ['<script src="/static/htmx.min.js">']
    assert scripts == htmx, "htmx, from the console only (a fragment has none)"
    assert handlers == []
    assert "<img" not in page


def test_a_session_id_and_a_tool_result_with_html_show_as_text(client: TestClient) -> None:
    listed = client.get("/").text
    assert str(escape(XSS_SESSION)) in listed
    page = client.get("/session", params={"id": XSS_SESSION})
    assert page.status_code == 200
    assert str(escape(XSS_SESSION)) in page.text
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in page.text  # the tool result
    assert XSS_RESULT not in page.text and XSS_SESSION not in page.text


@pytest.mark.parametrize("path", [*PAGES, "/static/htmx.min.js", "/nowhere"])
def test_every_response_carries_the_security_headers(client: TestClient, path: str) -> None:
    response = client.get(path)
    for name, value in HEADERS.items():
        assert response.headers[name] == value
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert "frame-ancestors 'none'" in csp and response.headers["x-frame-options"] == "DENY"


def test_get_never_changes_the_store(client: TestClient, built: Scene) -> None:
    before = built.dump()
    for path in PAGES:
        assert client.get(path).status_code == 200
    # GET on the actions, with every field an action would take: not allowed, nothing done.
    (form,) = [f for f in forms_of(client.get("/approvals").text) if f["session"] == "pay-1"]
    for action in ("/approvals/decide", "/in-doubt/resolve"):
        asked = client.get(action, params={**form, "by": "x", "decision": "approve"})
        assert asked.status_code == 405
    assert built.dump() == before


def test_every_post_route_checks_its_csrf_token() -> None:
    app = create_app("memory://nothing")
    posts = [r for r in app.routes if isinstance(r, Route) and "POST" in (r.methods or ())]
    assert [r.path for r in posts] == ["/in-doubt/resolve", "/approvals/decide"]
    for route in posts:
        assert getattr(route.endpoint, "csrf_protected", False), route.path
        assert "GET" not in (route.methods or ())


def stale_session(built: Scene) -> tuple[str, str]:
    """A session and its token another run of the console signed (and gave this browser)."""
    earlier = browser(create_app(built.url))
    token = csrf_of(earlier.get("/approvals").text)
    return earlier.cookies[SESSION], token


@pytest.mark.parametrize(
    "how", ["missing", "forged", "stale", "cookie only", "field only", "unsigned session"]
)
@pytest.mark.parametrize("action", ["/approvals/decide", "/in-doubt/resolve"])
def test_a_post_without_this_browsers_token_changes_nothing(
    client: TestClient, built: Scene, how: str, action: str
) -> None:
    page = "/approvals" if action == "/approvals/decide" else "/in-doubt"
    session = "pay-1" if page == "/approvals" else "mail-1"
    (form,) = [f for f in forms_of(client.get(page).text) if f["session"] == session]
    good = form.pop("csrf")
    data = {**form, "by": "mallory", "decision": "approve", "happened": "no"}
    if how == "forged":
        data["csrf"] = "0" * 64
    elif how == "stale":
        session, data["csrf"] = stale_session(built)
        client.cookies.clear()
        client.cookies.set(SESSION, session)
    elif how == "cookie only":
        pass  # the browser's cookie is sent, the form has no token
    elif how == "field only":
        data["csrf"] = good
        client.cookies.clear()
    elif how == "unsigned session":
        # A session cookie set by someone else (another local app can set cookies for
        # 127.0.0.1): its token is the HMAC of a value this process never signed.
        client.cookies.clear()
        client.cookies.set(SESSION, "chosen.by-mallory")
        data["csrf"] = good
    before = built.dump()
    refused = client.post(action, data=data)
    assert refused.status_code == 403 and "Nothing was changed" in refused.text
    assert built.dump() == before


def test_a_post_with_the_token_of_another_browser_changes_nothing(
    built: Scene, client: TestClient
) -> None:
    """Both tokens are signed by this process; the form's is bound to another session."""
    other = browser(client.app)
    (form,) = [f for f in forms_of(client.get("/approvals").text) if f["session"] == "pay-1"]
    mine = form["csrf"]
    form["csrf"] = csrf_of(other.get("/approvals").text)
    assert form["csrf"] != mine and other.cookies[SESSION] != client.cookies[SESSION]
    before = built.dump()
    refused = client.post("/approvals/decide", data={**form, "by": "m", "decision": "approve"})
    assert refused.status_code == 403
    assert built.dump() == before


ANOTHER_PORT = {"Origin": "http://127.0.0.1:3000"}  # a dev server, a notebook, on this host


@pytest.mark.parametrize(
    ("headers", "why"),
    [
        (ANOTHER_PORT, "another port of this host: the same site, not the same origin"),
        ({**ANOTHER_PORT, "Sec-Fetch-Site": "same-site"}, "the browser's own word for it"),
        ({"Origin": "http://localhost"}, "another host name for this machine"),
        ({"Origin": "https://127.0.0.1"}, "another scheme"),
        ({"Origin": "null"}, "an opaque origin (a sandboxed frame, a data: URL)"),
        ({"Origin": "http://127.0.0.1", "Sec-Fetch-Site": "cross-site"}, "says cross-site"),
        ({"Sec-Fetch-Site": "same-site"}, "no Origin, and not same-origin"),
        ({}, "nothing says where it comes from"),
    ],
)
@pytest.mark.parametrize("action", ["/approvals/decide", "/in-doubt/resolve"])
def test_a_request_from_another_origin_is_refused_before_it_is_read(
    built: Scene, headers: dict[str, str], why: str, action: str
) -> None:
    """Cookies ignore ports and SameSite counts 127.0.0.1:3000 as the console's own site, so the
    browser sends the console's cookies — and a valid token, had the page one — with a form
    another local app posts. The browser says where it comes from; the console listens."""
    app = create_app(built.url)
    own = browser(app)
    page = "/approvals" if action == "/approvals/decide" else "/in-doubt"
    session = "pay-1" if page == "/approvals" else "mail-1"
    (form,) = [f for f in forms_of(own.get(page).text) if f["session"] == session]
    data = {**form, "by": "mallory", "decision": "approve", "happened": "no"}
    other = TestClient(app, base_url="http://127.0.0.1", headers=headers)
    other.cookies.set(SESSION, own.cookies[SESSION])  # the console's cookie, sent along
    before = built.dump()
    refused = other.post(action, data=data)
    assert refused.status_code == 403, why
    assert "came from another site" in refused.text and "Nothing was changed" in refused.text
    assert built.dump() == before


def test_the_consoles_own_form_still_goes_through(built: Scene) -> None:
    app = create_app(built.url)
    for headers in (
        {"Origin": "http://127.0.0.1", "Sec-Fetch-Site": "same-origin"},
        {"Sec-Fetch-Site": "same-origin"},  # Origin left out: same-origin says it
        {"Origin": "http://127.0.0.1"},  # no Fetch Metadata (an older browser)
    ):
        person = TestClient(app, base_url="http://127.0.0.1", headers=headers)
        (form,) = [f for f in forms_of(person.get("/approvals").text) if f["session"] == "pay-1"]
        # An unknown session is ignored, not changed: decide asks about a pending request only.
        answer = person.post(
            "/approvals/decide",
            data={**form, "session": "nobody", "by": "ana", "decision": "approve"},
        )
        assert answer.status_code == 409 and "Refused" not in answer.text, headers


def test_cookies_name_the_consoles_port(built: Scene) -> None:
    """Two consoles on one host, one browser (its cookies ignore ports): each console sets and
    reads its own cookie, so opening one does not log the other's forms out."""
    first = browser(create_app(built.url), "http://127.0.0.1:8765")
    second = browser(create_app(built.url), "http://127.0.0.1:8766")
    (form,) = [f for f in forms_of(first.get("/approvals").text) if f["session"] == "pay-1"]
    second.cookies.update(first.cookies)  # one cookie jar, as in a browser
    second.get("/approvals")
    first.cookies.update(second.cookies)
    assert sorted(c.name for c in first.cookies.jar) == [
        "toolledger_session_8765",
        "toolledger_session_8766",
    ]
    answer = first.post(
        "/approvals/decide", data={**form, "session": "nobody", "by": "a", "decision": "deny"}
    )
    assert answer.status_code == 409 and "Refused" not in answer.text, "still this console's"


def test_a_cookie_or_a_field_another_page_set_to_any_text_is_only_refused(built: Scene) -> None:
    """A page on another port of this host shares the console's cookies and knows their name:
    one that sets the session cookie — or posts a CSRF field, or a token — holding characters
    that are not ASCII gets a fresh session and a refusal, never an error on every page (the
    console made useless until the cookie is cleared)."""
    client = TestClient(
        create_app(built.url), base_url="http://127.0.0.1", raise_server_exceptions=False
    )
    for value in ("a.\u00e9", "\u00e9.\u00e9", "nonce.\u0301sig"):
        cookie = f"{SESSION}={value}".encode()  # as the browser sends what the page set
        for path in PAGES:
            assert client.get(path, headers={"cookie": cookie}).status_code == 200, (value, path)
    (form,) = [f for f in forms_of(client.get("/approvals").text) if f["session"] == "pay-1"]
    posted = {**form, "csrf": "\u00e9" * 64, "by": "a", "decision": "deny"}
    answer = client.post("/approvals/decide", data=posted, headers={"Origin": "http://127.0.0.1"})
    assert answer.status_code == 403, answer.text
    guarded = TestClient(
        create_app(built.url, token="t0ken"),
        base_url="http://127.0.0.1",
        raise_server_exceptions=False,
    )
    bearer = "Bearer t\u00e9ken".encode()
    assert guarded.get("/", headers={"Authorization": bearer}).status_code == 401


def test_loopback_answers_loopback_host_names_only(built: Scene) -> None:
    app = create_app(built.url)
    for host in ("127.0.0.1", "localhost", "127.0.0.1:8765", "[::1]:8765"):
        assert TestClient(app, base_url=f"http://{host}").get("/").status_code == 200, host
    rebound = TestClient(app, base_url="http://attacker.example")
    assert rebound.get("/").status_code == 400, "a re-pointed name gets nothing (DNS rebinding)"
    guarded = create_app(built.url, token="t0ken")  # a proxy may pass its own name: the token
    proxied = TestClient(guarded, base_url="http://console.example")
    assert proxied.get("/").status_code == 401
    assert proxied.get("/", headers={"Authorization": "Bearer t0ken"}).status_code == 200


def test_a_token_is_needed_on_every_request(built: Scene) -> None:
    app = create_app(built.url, token="s3cret-token", loopback=False)
    anonymous = TestClient(app, base_url="http://console.example")
    before = built.dump()
    for path in [*PAGES, "/static/htmx.min.js"]:
        assert anonymous.get(path).status_code == 401, path
    assert anonymous.get("/", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert anonymous.get("/?token=wrong").status_code == 401
    assert anonymous.post("/approvals/decide", data={"by": "m"}).status_code == 401
    assert built.dump() == before
    assert anonymous.get("/", headers={"Authorization": "Bearer s3cret-token"}).status_code == 200

    person = TestClient(
        app,
        base_url="http://console.example",
        follow_redirects=False,
        headers={"Origin": "http://console.example"},
    )
    first = person.get("/approvals?token=s3cret-token")
    assert first.status_code == 303 and first.headers["location"] == "/approvals"
    for path in ("//evil.example/x", "/\\evil.example/x", "///evil.example"):
        status, location = _first_visit(app, path, "token=s3cret-token")
        assert status == 303 and location.startswith("/"), (path, location)
        assert not location.startswith(("//", "/\\")), "not a network path: another site"
        assert location.endswith(("evil.example/x", "evil.example"))
    assert first.headers["set-cookie"].startswith("toolledger_token_80=")
    assert "httponly" in first.headers["set-cookie"].lower()
    assert "samesite=strict" in first.headers["set-cookie"].lower()
    page = person.get("/approvals")
    assert page.status_code == 200
    (form,) = [f for f in forms_of(page.text) if f["session"] == "pay-2"]
    denied = person.post("/approvals/decide", data={**form, "by": "ana", "decision": "deny"})
    assert denied.status_code == 200
    with tl.open_store(built.url) as store:
        (decided,) = store.approvals("pay-2")
    assert decided.status is ApprovalStatus.DENIED and decided.decided_by == "ana"


def test_a_first_visit_another_site_began_goes_on_through_a_page_of_the_console(
    built: Scene,
) -> None:
    """``?token=`` opened from a link on another site (``Sec-Fetch-Site: cross-site``): a
    ``SameSite=Strict`` cookie is not sent along that navigation, its redirect included, so
    the console answers a page of its own that goes on (a refresh and a link: a navigation its
    own site begins), the cookie set. The page names the address without the token, escaped;
    it is the console's page, with every header the others have."""
    app = create_app(built.url, token="s3cret-token", loopback=False)
    person = TestClient(app, base_url="http://console.example", follow_redirects=False)
    first = person.get(
        '/session?id=pay-1&x="><script>&token=s3cret-token',
        headers={"Sec-Fetch-Site": "cross-site"},
    )
    assert first.status_code == 200, first.status_code
    assert first.headers["set-cookie"].startswith("toolledger_token_80=s3cret-token;")
    assert "samesite=strict" in first.headers["set-cookie"].lower()
    assert "s3cret-token" not in first.text
    assert "<script>" not in first.text and "%3Cscript%3E" in first.text
    target = "/session?id=pay-1&amp;x=%22%3E%3Cscript%3E"
    assert f'<meta http-equiv="refresh" content="0; url={target}">' in first.text
    assert f'<a href="{target}">' in first.text
    assert '<meta name="referrer" content="no-referrer">' in first.text  # no token in a Referer
    assert first.headers["content-security-policy"].startswith("default-src 'none'")
    page = person.get("/session?id=pay-1", headers={"Sec-Fetch-Site": "same-origin"})
    assert page.status_code == 200 and "pay-1" in page.text
    for site in ("same-origin", "none"):  # typed, a bookmark: a redirect, as before
        again = person.get("/?token=s3cret-token", headers={"Sec-Fetch-Site": site})
        assert again.status_code == 303 and again.headers["location"] == "/"


def _first_visit(app: Any, path: str, query: str) -> tuple[int, str]:
    """A GET of exactly ``path`` (as a raw request line carries it, which an HTTP client would
    normalise) with ``query``: the status and the Location the console answers."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", b"console.example")],
        "client": ("127.0.0.1", 5000),
        "server": ("console.example", 80),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers.get("location", "")


def test_beyond_loopback_the_console_refuses_to_start_without_a_token(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.com")
    bind_check("127.0.0.1", None)
    bind_check("0.0.0.0", "t")
    with pytest.raises(tl.ConfigurationError, match="give it a token"):
        bind_check("0.0.0.0", None)
    monkeypatch.delenv("TOOLLEDGER_CONSOLE_TOKEN", raising=False)
    url = f"sqlite:///{tmp_path / 'none.db'}"
    assert main(["console", "--store", url, "--host", "0.0.0.0"]) == 1
    assert "give it a token" in " ".join(capsys.readouterr().err.split())
    assert main(["console", "--store", url]) == 1, "on loopback, but there is no store"
    out, err = capsys.readouterr()
    assert "no store at" in err and out == ""


PROXIED = "https://ops.example.com"  # a TLS proxy in front, forwarding Host but no scheme


def _plain_http(app: Any) -> Any:
    """``app`` behind a TLS proxy: the browser speaks https (and keeps its ``Secure`` cookies
    for it), the console is handed plain HTTP, with the Host the browser sent."""

    async def proxy(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await app({**scope, "scheme": "http"} if scope["type"] == "http" else scope, receive, send)

    return proxy


def _through_proxy(app: Any, origin: str = PROXIED) -> TestClient:
    """A browser on ``PROXIED``: the proxy hands the console plain HTTP with the public Host
    and no X-Forwarded-Proto; the browser's Origin is the public one."""
    return TestClient(
        _plain_http(app), base_url="https://ops.example.com", headers={"Origin": origin}
    )


def test_behind_a_proxy_the_refusal_says_how_to_name_the_public_origin(built: Scene) -> None:
    """Its own forms came back refused as another site's, with nothing saying why: the scheme
    the browser used (https) is not the one the console was handed (http)."""
    person = _through_proxy(create_app(built.url, token="t0ken"))
    person.headers["Authorization"] = "Bearer t0ken"
    (form,) = [f for f in forms_of(person.get("/approvals").text) if f["session"] == "pay-1"]
    before = built.dump()
    refused = person.post("/approvals/decide", data={**form, "by": "ana", "decision": "deny"})
    assert refused.status_code == 403 and "Nothing was changed" in refused.text
    assert "--origin https://ops.example.com" in refused.text
    assert built.dump() == before


@pytest.mark.parametrize(
    "declared", [PROXIED, PROXIED + "/", PROXIED + ":443", "HTTPS://OPS.example.com"]
)
def test_a_declared_public_origin_is_the_consoles_own(built: Scene, declared: str) -> None:
    app = create_app(built.url, origin=declared)  # loopback, no token: the proxy is local
    person = _through_proxy(app)
    (form,) = [f for f in forms_of(person.get("/approvals").text) if f["session"] == "pay-1"]
    answer = person.post(
        "/approvals/decide", data={**form, "session": "nobody", "by": "a", "decision": "deny"}
    )
    assert answer.status_code == 409 and "Refused" not in answer.text, declared
    # Only that origin: the scheme the console sees, another port, another site are not.
    for other in ("http://ops.example.com", "https://ops.example.com:8443", "https://evil.example"):
        before = built.dump()
        refused = _through_proxy(app, other).post("/approvals/decide", data=form)
        assert refused.status_code == 403, other
        assert built.dump() == before
    assert TestClient(app, base_url="http://attacker.example").get("/").status_code == 400


@pytest.mark.parametrize(
    ("declared", "says"),
    [
        ("ops.example.com", "scheme"),
        ("ftp://ops.example.com", "scheme"),
        ("https://", "host"),
        ("https://ops.example.com/console", "path"),
        ("https://ops.example.com/?x=1", "path"),
        ("https://ana@ops.example.com", "user"),
        # Never the origin a browser sends: it writes a name in punycode, and has no spaces.
        ("https://b\u00fccher.example", "xn--"),
        ("https://ops example.com", "host name"),
        ("https://ops.example.com>", "host name"),
    ],
)
def test_a_public_origin_that_is_not_one_is_refused_at_start(
    declared: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(tl.ConfigurationError, match=says):
        create_app("memory://", origin=declared)
    url = f"sqlite:///{tmp_path / 'none.db'}"
    assert main(["console", "--store", url, "--origin", declared]) == 1
    out, err = capsys.readouterr()
    assert f"--origin {declared!r}" in " ".join(err.split()) and out == ""


@pytest.mark.parametrize(
    ("console", "page"),
    [
        ("http://127.0.0.1:8765", "http://127.0.0.1:3000"),  # a dev server on this machine
        ("http://localhost:8765", "https://localhost:8888"),  # a notebook, under TLS
        ("http://devbox.example:8765", "http://devbox.example:8080"),  # with a token: any name
    ],
)
def test_a_form_another_app_of_this_host_posts_is_not_hinted_as_the_consoles_origin(
    built: Scene, console: str, page: str
) -> None:
    """The refusal of a form posted by a page of another web app on this host (the same name,
    another port) named that app as the ``--origin`` to start the console with: the very origin
    the check keeps out, and starting so would refuse the console's own forms. A TLS proxy in
    front sends the host and port the browser asked for: only another scheme is hinted."""
    app = create_app(built.url, token="t0ken")
    other = TestClient(
        app, base_url=console, headers={"Origin": page, "Authorization": "Bearer t0ken"}
    )
    before = built.dump()
    refused = other.post("/approvals/decide", data={"by": "mallory", "decision": "approve"})
    assert refused.status_code == 403 and "came from another site" in refused.text
    assert "--origin" not in refused.text
    assert built.dump() == before
    # The proxy's own signature is still hinted: the host and port asked for, another scheme.
    host = console.split("//", 1)[1]
    proxied = TestClient(
        app,
        base_url=console,
        headers={"Origin": f"https://{host}", "Authorization": "Bearer t0ken"},
    )
    hinted = proxied.post("/approvals/decide", data={"by": "ana", "decision": "deny"})
    assert hinted.status_code == 403 and f"--origin https://{host}" in hinted.text


def test_an_address_given_as_origin_is_written_as_a_browser_writes_it(built: Scene) -> None:
    """A browser writes an IPv6 address compressed, in lower case: an origin given in another
    spelling of it never matched, and every form of the console was refused."""
    app = create_app(built.url, token="t0ken", origin="https://[2001:DB8:0:0::1]:8443")
    assert app.state.guard.origin == "https://[2001:db8::1]:8443"
    person = TestClient(
        _plain_http(app),
        base_url="https://[2001:db8::1]:8443",
        headers={"Origin": "https://[2001:db8::1]:8443", "Authorization": "Bearer t0ken"},
    )
    (form,) = [f for f in forms_of(person.get("/approvals").text) if f["session"] == "pay-1"]
    answer = person.post(
        "/approvals/decide", data={**form, "session": "nobody", "by": "a", "decision": "deny"}
    )
    assert answer.status_code == 409 and "Refused" not in answer.text


PG_URL = "postgresql://ana:hunter2@db.example:5432/ledger?sslmode=require&password=hunter3"


def test_a_password_in_the_store_url_is_never_shown(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every page names its store, and so does the line the console starts with (a terminal, a
    service's log): the URL as given, its password in it."""
    app = create_app(PG_URL)
    page = TestClient(app, base_url="http://127.0.0.1").post("/approvals/decide", data={})
    assert page.status_code == 403  # a page that does not open the store: its header names it
    assert "db.example" in page.text
    assert "hunter2" not in page.text and "hunter3" not in page.text
    for url in (PG_URL, "sqlite:////nonexistent/x.db?password=hunter2"):  # nor why it failed
        failed = TestClient(create_app(url), base_url="http://127.0.0.1").get("/")
        assert failed.status_code == 503 and "The store cannot be read" in failed.text, url
        assert "hunter2" not in failed.text and "hunter3" not in failed.text, failed.text

    import toolledger.console
    from toolledger.cli import serving

    served: dict[str, Any] = {}
    monkeypatch.setattr(serving, "store_of", lambda args: contextlib.nullcontext())
    monkeypatch.setattr(toolledger.console, "serve", lambda url, **kw: served.update(url=url))
    assert main(["console", "--store", PG_URL, "--port", "0"]) == 0
    assert served["url"] == PG_URL, "the console is handed the real URL"
    out = capsys.readouterr().out
    assert "db.example" in out and "hunter2" not in out and "hunter3" not in out


def test_the_token_leaves_the_address_bar_on_every_visit(built: Scene) -> None:
    """A link or a bookmark with ``?token=`` opened again, the cookie already set: the page was
    answered at that address, so the token stayed in the address bar and the history."""
    app = create_app(built.url, token="s3cret-token", loopback=False)
    person = TestClient(app, base_url="http://console.example", follow_redirects=False)
    first = person.get("/?token=s3cret-token")
    assert first.status_code == 303 and first.headers["location"] == "/"
    assert person.get("/").status_code == 200, "the cookie carries it"
    again = person.get("/session?id=pay-1&token=s3cret-token")
    assert again.status_code == 303 and again.headers["location"] == "/session?id=pay-1"
    assert "s3cret-token" not in again.text


@pytest.mark.parametrize(
    ("base", "origin"),
    [
        ("https://console.example", None),  # TLS to the console, or a proxy's X-Forwarded-Proto
        ("https://ops.example.com", PROXIED),  # a TLS proxy that forwards plain HTTP
    ],
)
def test_cookies_of_a_console_seen_over_https_are_sent_over_https_only(
    built: Scene, base: str, origin: str | None
) -> None:
    """The token cookie holds the token itself. Without ``Secure`` the browser also sends it
    with any plain-HTTP request to that host name, any port (a link, a redirect a network
    attacker injects): the token in the clear, and the console is theirs."""
    app = create_app(built.url, token="s3cret-token", loopback=False, origin=origin)
    person = TestClient(
        app if origin is None else _plain_http(app), base_url=base, follow_redirects=False
    )
    first = person.get("/?token=s3cret-token")
    assert first.status_code == 303
    assert "secure" in first.headers["set-cookie"].lower()
    page = person.get("/approvals", headers={"Authorization": "Bearer s3cret-token"})
    assert page.status_code == 200
    assert "secure" in page.headers["set-cookie"].lower(), "the session cookie too"
    # A console on plain HTTP, not behind TLS: a Secure cookie would never be sent back.
    plain = TestClient(create_app(built.url, token="s3cret-token", loopback=False))
    kept = plain.get("/?token=s3cret-token", follow_redirects=False)
    assert "secure" not in kept.headers["set-cookie"].lower()


def test_a_public_origin_beyond_this_machine_needs_a_token(
    built: Scene, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Named at ``https://ops.example.com``, the console is used by browsers of other machines,
    through the proxy, as surely as if it listened there: without a token anyone who reaches
    the proxy could approve and settle calls (the console's own forms, CSRF token and all, are
    theirs to load). Listening beyond loopback needs a token; so does being seen beyond it."""
    import uvicorn

    from toolledger.console import serve

    monkeypatch.delenv("TOOLLEDGER_CONSOLE_TOKEN", raising=False)
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: None)
    with pytest.raises(tl.ConfigurationError, match="give it a token"):
        bind_check("127.0.0.1", None, origin=PROXIED)
    with pytest.raises(tl.ConfigurationError, match="give it a token"):
        serve(built.url, origin=PROXIED, port=0)
    assert main(["console", "--store", built.url, "--origin", PROXIED, "--port", "0"]) == 1
    assert "give it a token" in " ".join(capsys.readouterr().err.split())
    # A token, or a proxy this machine's own browser uses, and it starts.
    serve(built.url, origin=PROXIED, token="t0ken", port=0)
    serve(built.url, origin="https://localhost:8443", port=0)
    bind_check("127.0.0.1", None, origin="https://127.0.0.1:8443")


def test_an_id_a_form_cannot_post_back_exactly_gets_commands_not_a_form(tmp_path: Path) -> None:
    """A store written otherwise than through toolledger (which refuses such ids) may hold a
    call whose id has a carriage return, a line feed or a NUL: an HTML form would post another
    id back — another call's: ``call\\r`` read as ``call\\n`` and sent as ``call\\r\\n`` — or
    the page could not be sent (a lone surrogate). Such a card has no form, only the commands
    that decide it, whole; the others keep theirs, and nothing is decided on the way."""
    from toolledger.codec import input_hash
    from toolledger.ops import InsertEffect, PutApproval
    from toolledger.records import ApprovalRecord
    from toolledger.testing.conformance import make_record

    url = f"sqlite:///{tmp_path / 'ids.db'}"

    def request(tid: str, tool: str) -> PutApproval:
        record = ApprovalRecord(
            session_id="s1",
            tool_use_id=tid,
            tool=tool,
            input_hash=input_hash({"n": 5}),
            input={"n": 5},
            in_doubt=False,
            reason="high-impact",
            status=ApprovalStatus.PENDING,
            requested_at=1.0,
        )
        return PutApproval(record, None)

    with tl.open_store(url) as store:
        store.backend.apply(
            "s1", [request("call\r", "lookup"), request("call\r\n", "wire"), request("ok", "ok")]
        )
        store.backend.apply("s1", [InsertEffect(make_record("s1", "doubt\n", at=1.0))])
    client = browser(create_app(url))
    page = client.get("/approvals").text
    forms = forms_of(page)
    assert [f["tool_use_id"] for f in forms] == ["ok"], forms
    for tid in ("call\r", "call\r\n"):
        for verb in ("approve", "deny"):
            shown = escape(command(verb, "s1", tid, options=["--in-doubt=no"], url=url))
            assert f'<pre class="command">{shown}</pre>' in page, (verb, tid)
    doubt = client.get("/in-doubt").text
    assert forms_of(doubt) == []
    for option in ("--happened", "--not-happened"):
        shown = escape(command("resolve", "s1", "doubt\n", options=[option], url=url))
        assert f'<pre class="command">{shown}</pre>' in doubt, option
    with tl.open_store(url) as store:
        assert {a.status for a in store.approvals("s1")} == {ApprovalStatus.PENDING}
    # A lone surrogate (a byte that was not UTF-8, as Python reads one): a json store can hold
    # it. The page is sent, and its command names the id as bash passes it back to Python.
    json_url = f"json:///{tmp_path / 'ids'}"
    with tl.open_store(json_url) as store:
        store.backend.apply("s1", [request("call\udcff", "wire")])
    page = browser(create_app(json_url)).get("/approvals")
    assert page.status_code == 200 and forms_of(page.text) == []
    assert "toolledger --store" in page.text and "approve s1 $&#39;call\\xff&#39;" in page.text
