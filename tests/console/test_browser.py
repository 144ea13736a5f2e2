"""The console in a real browser: Debian's headless Chromium, driven through its own
chromedriver (Selenium), against ``toolledger console`` running as a separate process.

A person lists the sessions (the list refreshes itself), opens one, approves and denies requests,
settles calls in doubt — and each session goes on at its next run, checked by what its tools
really did. A store holding HTML shows it as text; a forged cross-site POST, a page on another
local port posting with the console's cookies and a valid token, and a stale page change
nothing. Screenshots go to ``$TOOLLEDGER_SCREENSHOTS`` (else a temporary directory);
``TOOLLEDGER_CONSOLE_README_SHOT=docs/console.png`` also writes the README's.

Without /usr/bin/chromium these tests skip — except under ``CI=true``, where they fail:
``make test`` installs the browser first (``.ci/install-browser``).
"""

from __future__ import annotations

import html as html_lib
import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

import toolledger as tl
from toolledger.records import ApprovalStatus, Status
from toolledger.testing.scripted import Reply, ScriptedModel, ToolUse
from toolledger.testing.world import AgentSpec, World, run_agent

from .scene import PAY, SECRET, XSS_SESSION, Scene, build, forms_of

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")

pytestmark = [pytest.mark.browser, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _need_browser() -> None:
    if CHROMIUM.exists() and CHROMEDRIVER.exists():
        return
    missing = "Debian's chromium and chromium-driver (.ci/install-browser installs them)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"the browser tests cannot run without {missing}")
    pytest.skip(f"needs {missing}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Console:
    """``toolledger console`` in a process of its own."""

    def __init__(self, url: str, port: int, token: str | None = None) -> None:
        self.url, self.port, self.token = url, port, token
        self.base = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [sys.executable, "-m", "toolledger.cli", "console", "--store", self.url]
        argv += ["--port", str(self.port)] + (["--token", self.token] if self.token else [])
        self.process = subprocess.Popen(argv)
        ready = urllib.request.Request(self.base + "/verify")
        if self.token:
            ready.add_header("Authorization", f"Bearer {self.token}")
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(ready, timeout=5) as answer:
                    assert answer.status == 200
                    return
            except OSError:
                assert self.process.poll() is None, "the console exited"
                assert time.monotonic() < deadline, "the console did not answer"
                time.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


@dataclass
class Stage:
    scene: Scene
    console: Console
    world: World
    specs: dict[str, AgentSpec]
    shots: Path


TICKET_SCRIPT = [Reply(tool_uses=[ToolUse("create_ticket", {"title": "Outage"})]), Reply("done")]


@pytest.fixture(scope="module")
def stage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stage]:
    _need_browser()
    root = tmp_path_factory.mktemp("browser")
    # The console runs in another process, which sees this one alive: a call this process
    # interrupted would be in progress there. The calls in doubt come from killed processes.
    scene = build(root, in_doubt=False, waiting=("pay-1", "pay-2", "pay-3", "pay-4"))
    world = World(root / "world")
    specs: dict[str, AgentSpec] = {}
    with ScriptedModel(TICKET_SCRIPT) as model:
        for session, crash_at in (("ticket-ran", "before_record"), ("ticket-not", "after_intent")):
            spec = AgentSpec(
                store_url=scene.url, base_url=model.url, world=str(world.path), session=session
            )
            assert run_agent(spec, crash_at=crash_at)[0] == -9
            outcome = run_agent(spec)[1]
            assert outcome is not None and outcome["status"] == "needs_attention"
            specs[session] = spec
        console = Console(scene.url, free_port())
        console.start()
        shots = Path(os.environ.get("TOOLLEDGER_SCREENSHOTS") or root / "screenshots")
        shots.mkdir(parents=True, exist_ok=True)
        try:
            yield Stage(scene, console, world, specs, shots)
        finally:
            console.stop()
            print(f"\nconsole screenshots: {shots}")


@pytest.fixture(scope="module")
def browser(stage: Stage) -> Iterator[Any]:
    os.environ.setdefault("SE_OFFLINE", "true")  # never download a driver or a browser
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.add_argument("--window-size=1400,1000")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()


# -- helpers -------------------------------------------------------------------------------------


def wait_for(condition: Any, what: str, timeout: float = 15) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"waited {timeout}s for {what}"
        time.sleep(0.1)


def open_page(driver: Any, stage: Stage, path: str) -> None:
    driver.get(stage.console.base + path)
    wait_for(lambda: driver.execute_script("return document.readyState") == "complete", path)


def card(driver: Any, css: str, session: str) -> Any:
    """The card (in doubt, approval) of ``session``."""
    from selenium.webdriver.common.by import By

    found = [
        c
        for c in driver.find_elements(By.CSS_SELECTOR, css)
        if c.find_element(By.CSS_SELECTOR, "a.id").text == session
    ]
    assert len(found) == 1, f"one card for {session}, found {len(found)}"
    return found[0]


def shot(driver: Any, stage: Stage, name: str) -> Path:
    path = stage.shots / f"{name}.png"
    driver.save_screenshot(str(path))
    return path


def body_text(driver: Any) -> str:
    """What the page shows now (read by script: no element reference to go stale while the
    browser moves to the next page)."""
    return str(driver.execute_script("return document.body ? document.body.innerText : ''"))


def csp_violations(driver: Any) -> list[str]:
    return [
        e["message"] for e in driver.get_log("browser") if "Content Security Policy" in e["message"]
    ]


def approval_of(stage: Stage, session: str) -> tl.ApprovalRecord:
    with tl.open_store(stage.scene.url) as store:
        (record,) = store.approvals(session)
    return record


# -- the tests -----------------------------------------------------------------------------------


def test_the_list_filters_and_refreshes_itself(browser: Any, stage: Stage) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    open_page(browser, stage, "/")
    rows = browser.find_elements(By.CSS_SELECTOR, "table.sessions tbody tr")
    ids = {r.find_element(By.CSS_SELECTOR, "td.id").text for r in rows}
    assert {"pay-1", "pay-2", "pay-3", "ticket-ran", "ticket-not", "batch", XSS_SESSION} <= ids
    path = shot(browser, stage, "01-sessions")
    readme = os.environ.get("TOOLLEDGER_CONSOLE_README_SHOT")
    if readme:
        shutil.copyfile(path, readme)

    # A session that appears while the page is open shows up without a reload (htmx polling).
    marker = browser.find_element(By.TAG_NAME, "h1")
    stage.scene.run("late-arrival", "fetch_page", {"url": "https://late"})
    wait_for(lambda: "late-arrival" in body_text(browser), "the list to refresh itself")
    assert marker.is_displayed(), "the same page, refreshed in place"

    Select(browser.find_element(By.NAME, "status")).select_by_value("needs_attention")
    browser.find_element(By.CSS_SELECTOR, "form.filter button").click()
    wait_for(lambda: "status=needs_attention" in browser.current_url, "the filter")
    shown = {
        r.find_element(By.CSS_SELECTOR, "td.id").text
        for r in browser.find_elements(By.CSS_SELECTOR, "table.sessions tbody tr")
    }
    assert shown == {"ticket-ran", "ticket-not"}
    assert csp_violations(browser) == [], "htmx runs under the Content-Security-Policy"


def test_open_a_session(browser: Any, stage: Stage) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, stage, "/")
    browser.find_element(By.LINK_TEXT, "pay-1").click()
    wait_for(lambda: "Session pay-1" in body_text(browser), "the session page")
    text = body_text(browser)
    assert "model asks: wire" in text and "approval pending" in text
    assert SECRET not in browser.page_source and '"api_key": "***"' in text
    shot(browser, stage, "02-session")


def decide_in_browser(browser: Any, stage: Stage, session: str, name: str, button: str) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, stage, "/approvals")
    section = card(browser, "section.approval", session)
    assert "api_key" in section.text and '"***"' in section.text and SECRET not in section.text
    section.find_element(By.NAME, "by").send_keys(name)
    section.find_element(By.CSS_SELECTOR, f"button.{button}").click()
    wait_for(lambda: browser.find_elements(By.ID, "notice"), "the notice")


def test_approve_and_the_next_run_runs_it_once(browser: Any, stage: Stage) -> None:
    from selenium.webdriver.common.by import By

    decide_in_browser(browser, stage, "pay-1", "ana", "yes")
    assert "approved by ana" in browser.find_element(By.ID, "notice").text
    shot(browser, stage, "03-approved")
    assert approval_of(stage, "pay-1").status is ApprovalStatus.APPROVED
    before = stage.scene.ran["wire"]
    assert stage.scene.run("pay-1", "wire", PAY).status is tl.RunStatus.COMPLETED
    assert stage.scene.ran["wire"] == before + 1
    open_page(browser, stage, "/session?id=pay-1")
    assert "ledger: wire → succeeded" in body_text(browser)


def test_deny_and_the_next_run_runs_nothing(browser: Any, stage: Stage) -> None:
    from selenium.webdriver.common.by import By

    decide_in_browser(browser, stage, "pay-2", "bo", "no")
    assert "denied by bo" in browser.find_element(By.ID, "notice").text
    before = stage.scene.ran["wire"]
    assert stage.scene.run("pay-2", "wire", PAY).status is tl.RunStatus.COMPLETED
    assert stage.scene.ran["wire"] == before
    assert approval_of(stage, "pay-2").decided_by == "bo"


def resolve_in_browser(browser: Any, stage: Stage, session: str, button: str, result: str) -> str:
    from selenium.webdriver.common.by import By

    open_page(browser, stage, "/in-doubt")
    section = card(browser, "section.doubt", session)
    tool_use_id = section.find_element(By.CSS_SELECTOR, "p.id").text
    section.find_element(By.NAME, "by").send_keys("carla")
    if result:
        section.find_element(By.NAME, "result").send_keys(result)
    section.find_element(By.CSS_SELECTOR, f"button.{button}").click()
    wait_for(lambda: browser.find_elements(By.ID, "notice"), "the notice")
    return str(tool_use_id)


def test_in_progress_calls_are_shown_and_cannot_be_settled(browser: Any, stage: Stage) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, stage, "/in-doubt")
    (running,) = browser.find_elements(By.CSS_SELECTOR, "section.running")
    # Another machine's worker, without a lease: in progress until watched for its timeout.
    assert "toolu_running" in running.text and "watched for its whole timeout" in running.text
    assert running.find_elements(By.TAG_NAME, "form") == []
    assert len(browser.find_elements(By.CSS_SELECTOR, "section.doubt form")) == 2
    shot(browser, stage, "04-in-doubt")


def test_resolve_it_happened_and_the_next_run_does_not_run_it_again(
    browser: Any, stage: Stage
) -> None:
    from selenium.webdriver.common.by import By

    tickets = len(stage.world.tickets())
    call = resolve_in_browser(browser, stage, "ticket-ran", "yes", '{"ticket": "T-1"}')
    assert "recorded succeeded by carla" in browser.find_element(By.ID, "notice").text
    with tl.open_store(stage.scene.url) as store:
        record = store.ledger("ticket-ran").get(call)
    assert record is not None and record.status is Status.SUCCEEDED
    assert record.error == "resolved by carla: happened"
    outcome = run_agent(stage.specs["ticket-ran"])[1]
    assert outcome is not None and outcome["status"] == "completed"
    assert len(stage.world.tickets()) == tickets, "it happened: never opened twice"


def test_resolve_it_did_not_happen_and_the_next_run_runs_it(browser: Any, stage: Stage) -> None:
    from selenium.webdriver.common.by import By

    tickets = len(stage.world.tickets())
    resolve_in_browser(browser, stage, "ticket-not", "no", "")
    assert "recorded not_happened by carla" in browser.find_element(By.ID, "notice").text
    outcome = run_agent(stage.specs["ticket-not"])[1]
    assert outcome is not None and outcome["status"] == "completed"
    assert len(stage.world.tickets()) == tickets + 1, "it had not happened: it ran, once"


def test_html_from_the_store_is_shown_as_text(browser: Any, stage: Stage) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, stage, "/")
    browser.find_element(By.LINK_TEXT, XSS_SESSION).click()
    wait_for(lambda: "Session " in body_text(browser), "the session page")
    text = body_text(browser)
    assert XSS_SESSION in text, "the session id, as text"
    assert "<script>window.__pwned=1</script>" in text, "the tool result, as text"
    assert browser.execute_script("return window.__pwned === undefined") is True
    assert browser.execute_script("return document.images.length") == 0
    scripts = browser.execute_script(
        "return Array.from(document.scripts).map(s => s.getAttribute('src'))"
    )
    assert scripts == ["/static/htmx.min.js"]
    shot(browser, stage, "05-html-as-text")


class _Attacker(http.server.BaseHTTPRequestHandler):
    """Another site: its page posts a form to the console as soon as it loads."""

    page = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, *args: object) -> None:
        pass


def test_a_cross_site_post_changes_nothing(browser: Any, stage: Stage) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, stage, "/approvals")  # the browser has the console's cookie
    request = approval_of(stage, "pay-3")
    fields = {
        "csrf": "forged.0000",
        "session": "pay-3",
        "tool_use_id": request.tool_use_id,
        "input_hash": request.input_hash,
        "in_doubt": "yes" if request.in_doubt else "no",
        "attempt": str(request.attempt),
        "by": "mallory",
        "decision": "approve",
    }
    inputs = "".join(f'<input type="hidden" name="{k}" value="{v}">' for k, v in fields.items())
    _Attacker.page = (
        f'<form id="f" method="post" action="{stage.console.base}/approvals/decide">{inputs}'
        "</form><script>document.getElementById('f').submit()</script>"
    ).encode()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Attacker)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        browser.get(f"http://localhost:{server.server_address[1]}/")
        wait_for(lambda: "Refused" in body_text(browser), "the console's answer")
    finally:
        server.shutdown()
        server.server_close()
    assert "Nothing was changed" in browser.find_element(By.TAG_NAME, "main").text
    assert approval_of(stage, "pay-3") == request, "still pending, decided by nobody"


class _Neighbour(http.server.BaseHTTPRequestHandler):
    """Another web app on this host — a dev server, a notebook, one with an XSS. Cookies ignore
    ports and SameSite counts it as the console's own site, so what it sets for 127.0.0.1 the
    browser sends to the console too. It holds a session and its CSRF token the console gave it
    (any local process can open the console's page), hands the browser that session's cookie,
    and has the browser post the approve form with the token the moment its page loads."""

    cookies: ClassVar[list[str]] = []  # Set-Cookie values, as the console gave them
    page = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        for cookie in self.cookies:
            self.send_header("Set-Cookie", cookie)
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, *args: object) -> None:
        pass


def test_a_page_on_another_local_port_cannot_approve(browser: Any, stage: Stage) -> None:
    """The request carries the console's cookies and a valid CSRF pair; the browser says it
    comes from 127.0.0.1:<another port>, and the console refuses it before reading it. (Before
    the console read ``Origin`` and ``Sec-Fetch-Site``, this approved the wire transfer.)"""
    from selenium.webdriver.common.by import By

    request = approval_of(stage, "pay-4")
    with urllib.request.urlopen(stage.console.base + "/approvals", timeout=10) as answer:
        html = answer.read().decode()
        cookies = answer.headers.get_all("Set-Cookie") or []
    assert cookies, "the console gave this neighbour a session"
    (form,) = [f for f in forms_of(html) if f["session"] == "pay-4"]
    fields = {**form, "by": "mallory", "decision": "approve"}
    inputs = "".join(
        f'<input type="hidden" name="{k}" value="{html_lib.escape(v)}">' for k, v in fields.items()
    )
    _Neighbour.cookies = cookies
    _Neighbour.page = (
        f'<form id="f" method="post" action="{stage.console.base}/approvals/decide">{inputs}'
        "</form><script>document.getElementById('f').submit()</script>"
    ).encode()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Neighbour)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        browser.get(f"http://127.0.0.1:{server.server_address[1]}/")
        wait_for(lambda: "Refused" in body_text(browser), "the console's answer")
    finally:
        server.shutdown()
        server.server_close()
    main = browser.find_element(By.TAG_NAME, "main").text
    assert "came from another site" in main and "Nothing was changed" in main
    assert approval_of(stage, "pay-4") == request, "still pending, decided by nobody"
    shot(browser, stage, "06-another-port-refused")

    # The console's own form, in the same browser, still approves.
    decide_in_browser(browser, stage, "pay-4", "ana", "yes")
    assert "approved by ana" in browser.find_element(By.ID, "notice").text
    assert approval_of(stage, "pay-4").status is ApprovalStatus.APPROVED


def test_a_stale_page_changes_nothing_until_it_is_opened_again(browser: Any, stage: Stage) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, stage, "/approvals")
    request = approval_of(stage, "pay-3")
    stage.console.stop()  # a new run of the console: a new secret, the page's token is stale
    stage.console.start()
    section = card(browser, "section.approval", "pay-3")
    section.find_element(By.NAME, "by").send_keys("ana")
    section.find_element(By.CSS_SELECTOR, "button.yes").click()
    wait_for(lambda: "Refused" in body_text(browser), "the refusal")
    assert approval_of(stage, "pay-3") == request
    shot(browser, stage, "06-stale-refused")

    decide_in_browser(browser, stage, "pay-3", "ana", "yes")  # opened again: it goes through
    assert approval_of(stage, "pay-3").status is ApprovalStatus.APPROVED


def test_no_page_asks_for_what_is_not_there(browser: Any, stage: Stage) -> None:
    """Every page loads whole: its stylesheet, script and icon, nothing that 404s."""
    browser.get_log("browser")  # what earlier tests left
    for path in ("/", "/session?id=pay-1", "/in-doubt", "/approvals", "/verify"):
        open_page(browser, stage, path)
    missing = [e["message"] for e in browser.get_log("browser") if "404" in e["message"]]
    assert missing == []
    icon = browser.execute_script(
        "return document.querySelector('link[rel=icon]').getAttribute('href')"
    )
    for url in (icon, "/favicon.ico"):
        with urllib.request.urlopen(stage.console.base + url, timeout=5) as answer:
            assert answer.status == 200 and answer.headers["Content-Type"] == "image/svg+xml"


def test_an_approval_card_keeps_every_field_in_view(browser: Any, stage: Stage) -> None:
    """A long body no longer pushes ``to`` out of view: the fields in the model's order, each
    value's start on one line, the body folded until it is opened."""
    from selenium.webdriver.common.by import By

    letter = {
        "to": "ops@example.com",
        "body": "Dear customer,\n" + "we are sorry for the outage. " * 60,
        "amount": 5,
        "api_key": SECRET,
    }

    @tl.tool(effect="non_idempotent", high_impact=True)
    def send_letter(to: str, body: str, amount: int, api_key: str) -> str:
        """Send a letter with a refund."""
        return "sent"

    script = [Reply(tool_uses=[ToolUse("send_letter", letter)]), Reply(text="done")]
    with ScriptedModel(script) as model, tl.open_store(stage.scene.url) as store:
        agent = tl.Agent(
            client=model.client(),
            model="claude-test",
            tools=[send_letter],
            store=store,
            approve=tl.approvals.queue,
        )
        agent.run(session="letter", prompt="wire and write")
    open_page(browser, stage, "/approvals")
    section = card(browser, "section.approval", "letter")
    names = [dt.text for dt in section.find_elements(By.TAG_NAME, "dt")]
    assert names == ["to", "body", "amount", "api_key"], "as the model wrote them"
    to = section.find_element(By.XPATH, ".//dt[text()='to']/following-sibling::dd[1]")
    top = section.location["y"]
    assert to.is_displayed() and to.text == '"ops@example.com"'
    assert to.location["y"] - top < 200, "in view at the top of the card"
    (folded,) = section.find_elements(By.TAG_NAME, "details")
    assert folded.get_attribute("open") is None and folded.text.endswith("…")
    folded.find_element(By.TAG_NAME, "summary").click()
    assert "we are sorry for the outage." * 1 in folded.text
    assert SECRET not in section.text
    shot(browser, stage, "07-approval-card")


def test_a_link_to_a_console_with_a_token_opens_it_from_another_site(
    browser: Any, stage: Stage
) -> None:
    """A console that needs its token, opened by a link on another site (a chat, a wiki) as
    ``/?token=…``: the browser shows the console, not "this console needs its token". Its
    token cookie is ``SameSite=Strict``, which a browser does not send along a navigation
    another site began — a redirect of it included — so the first answer is a page of the
    console's own that goes on to it. The token is not left in the address."""
    console = Console(stage.scene.url, free_port(), token="t0ken-for-the-link")
    console.start()
    _Neighbour.cookies = []
    _Neighbour.page = (
        f'<a id="go" href="{console.base}/approvals?token={console.token}">the console</a>'
    ).encode()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Neighbour)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        browser.get(f"http://localhost:{server.server_address[1]}/")  # another site
        browser.find_element("id", "go").click()
        shown = lambda: browser.execute_script(  # noqa: E731
            "return document.querySelector('main h1')?.textContent"
        )
        wait_for(lambda: shown() == "Approvals", "the approvals page", timeout=20)
        assert "needs its token" not in body_text(browser)
        assert browser.current_url == f"{console.base}/approvals", browser.current_url
        browser.refresh()
        wait_for(lambda: shown() == "Approvals", "the approvals page, reloaded")
        browser.back()  # the address with the token was replaced: back is the other site
        wait_for(lambda: browser.current_url.startswith("http://localhost:"), "the other site")
    finally:
        server.shutdown()
        server.server_close()
        console.stop()
