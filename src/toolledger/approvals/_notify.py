"""Notifications: tell a person the moment toolledger needs one.

Two moments need a person: a high-impact call waits for approval
(``approvals.queue(notify=...)``), and a call is in doubt — nobody knows whether it took effect
(``Agent(on_in_doubt=...)``, ``run_tool_uses(on_in_doubt=...)``). Each sends one JSON event::

    {"type": "approval_requested" | "in_doubt", "id": "<delivery id>", "at": 1764800000.0,
     "session": "...", "tool_use_id": "...", "tool": "send_email",
     "input": "{\\"to\\":\\"...\\"}", "reason": "...", "in_doubt": false,
     "console": "http://127.0.0.1:8765/session?id=..."}

``input`` is a summary: the call's input as JSON with secrets masked (as the command line masks
them) and cut to 500 characters. ``console`` is a link to the session in ``toolledger console``
when the notifier knows where it runs (``console_url=`` or ``TOOLLEDGER_CONSOLE_URL``), else
``null``.

A target is a callable (given the event, as a dict) or a webhook URL. A webhook is POSTed the
event, signed with HMAC-SHA256 over ``"<timestamp>.<body>"`` (``secret=`` or
``TOOLLEDGER_WEBHOOK_SECRET``; a webhook without a secret is refused), in the headers
``X-Toolledger-Signature: sha256=<hex>`` and ``X-Toolledger-Timestamp``; ``verify_signature``
checks one on the receiving side. ``X-Toolledger-Delivery`` is the same on every retry of an
event, so a receiver can drop the repeats.

Delivery never blocks the agent: events go to a queue that one background thread per notifier
works through. A failed delivery (an exception, a network error, a 5xx, 408 or 429) is retried
with exponential backoff, and the events behind it go out meanwhile; one that keeps failing, or
is refused (any other 4xx), is logged on the ``toolledger`` logger and dropped. At exit, the
queue is given a few seconds to drain.
"""

from __future__ import annotations

import atexit
import hashlib
import heapq
import hmac
import itertools
import json
import logging
import os
import queue
import threading
import time
import urllib.error
import urllib.request
import uuid
import weakref
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

from ..engine._batch import CallOutcome, Disposition
from ..errors import ConfigurationError
from ..masking import MASK, masked

__all__ = ["Notifier", "notifier", "verify_signature"]

logger = logging.getLogger("toolledger")

SIGNATURE_HEADER = "X-Toolledger-Signature"
TIMESTAMP_HEADER = "X-Toolledger-Timestamp"
DELIVERY_HEADER = "X-Toolledger-Delivery"
EVENT_HEADER = "X-Toolledger-Event"

_INPUT_CHARS = 500
_QUEUE_SIZE = 1000
_REMEMBERED = 4096  # in-doubt calls already told, per notifier
_RETRYABLE_STATUS = frozenset({408, 429})

Event = dict[str, Any]
Target = Callable[[Event], Any] | str


class Notifier:
    """Sends events to ``target`` — a callable or a webhook URL — from a background thread.

    ``attempts`` deliveries at most per event, ``backoff`` seconds before the second, doubling
    up to ``max_backoff``; ``timeout`` bounds one webhook request; ``exit_wait`` is how long the
    process waits at exit for events still queued.
    """

    def __init__(
        self,
        target: Target,
        *,
        secret: str | bytes | None = None,
        console_url: str | None = None,
        attempts: int = 6,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        timeout: float = 10.0,
        exit_wait: float = 5.0,
    ) -> None:
        if attempts < 1 or backoff < 0 or max_backoff < 0 or timeout <= 0 or exit_wait < 0:
            raise ConfigurationError(
                "attempts must be at least 1, timeout positive and the waits not negative"
            )
        if isinstance(target, str):
            parts = urlsplit(target)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ConfigurationError(
                    f"a notification target must be a callable or an http(s) URL, not {target!r}"
                )
            secret = secret if secret is not None else os.environ.get("TOOLLEDGER_WEBHOOK_SECRET")
            if not secret:
                raise ConfigurationError(
                    "a webhook needs a secret to sign its events: pass secret=... or set "
                    "TOOLLEDGER_WEBHOOK_SECRET (the receiver checks it with "
                    "toolledger.notify.verify_signature)"
                )
        elif not callable(target):
            raise ConfigurationError(
                f"a notification target must be a callable or an http(s) URL, not "
                f"{type(target).__name__}"
            )
        self.target = target
        self._secret = secret.encode() if isinstance(secret, str) else secret
        base = console_url if console_url is not None else os.environ.get("TOOLLEDGER_CONSOLE_URL")
        self.console_url = base.rstrip("/") if base else None
        self.attempts = attempts
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.timeout = timeout
        self.exit_wait = exit_wait
        self._queue: queue.Queue[Event] = queue.Queue(_QUEUE_SIZE)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._told: dict[tuple[str, str, int | None], None] = {}  # attempts told, oldest first
        _live.add(self)

    def __repr__(self) -> str:
        shown = _where(self.target) if isinstance(self.target, str) else repr(self.target)
        return f"Notifier({shown!r})"

    def _said(self, exc: BaseException) -> str:
        """``exc``'s text for a log line, the webhook URL's secrets in it masked (``_where``)."""
        text = str(exc)
        if isinstance(self.target, str):
            for secret in _secrets_of(self.target):
                text = text.replace(secret, MASK)
        return text

    # -- what the library calls ------------------------------------------------------------------

    def approval_requested(
        self,
        *,
        session_id: str,
        tool_use_id: str,
        tool: str,
        input: Any,
        reason: str | None,
        in_doubt: bool,
    ) -> None:
        """A request was queued for a person to approve or deny."""
        self.send(
            self.event(
                "approval_requested",
                session_id=session_id,
                tool_use_id=tool_use_id,
                tool=tool,
                input=input,
                reason=reason,
                in_doubt=in_doubt,
            )
        )

    def in_doubt(
        self,
        *,
        session_id: str,
        tool_use_id: str,
        tool: str,
        input: Any,
        reason: str,
        attempt: int | None = None,
    ) -> None:
        """A call is in doubt. Told once per attempt for the life of this notifier: a run that
        meets the same unsettled attempt again does not repeat it; a re-run a person allowed
        that ends in doubt too (``attempt``: the attempt in doubt) is a new question."""
        key = (session_id, tool_use_id, attempt)
        with self._lock:
            if key in self._told:
                return
            self._told[key] = None
            if len(self._told) > _REMEMBERED:
                del self._told[next(iter(self._told))]
        self.send(
            self.event(
                "in_doubt",
                session_id=session_id,
                tool_use_id=tool_use_id,
                tool=tool,
                input=input,
                reason=reason,
                in_doubt=True,
            )
        )

    def event(
        self,
        kind: str,
        *,
        session_id: str,
        tool_use_id: str,
        tool: str,
        input: Any,
        reason: str | None,
        in_doubt: bool,
    ) -> Event:
        return {
            "type": kind,
            "id": uuid.uuid4().hex,
            "at": time.time(),
            "session": session_id,
            "tool_use_id": tool_use_id,
            "tool": tool,
            "input": input_summary(input),
            "reason": reason,
            "in_doubt": in_doubt,
            "console": self.link(session_id),
        }

    def link(self, session_id: str) -> str | None:
        if self.console_url is None:
            return None
        return f"{self.console_url}/session?id={quote(session_id, safe='')}"

    # -- delivery --------------------------------------------------------------------------------

    def send(self, event: Event) -> None:
        """Queue ``event``; returns at once. A full queue drops it, with an error logged."""
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            logger.error(
                "toolledger: notification %s for session %r dropped: %d events are waiting to "
                "be delivered to %r",
                event.get("type"),
                event.get("session"),
                _QUEUE_SIZE,
                self,
            )
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._work, name="toolledger-notify", daemon=True
                )
                self._thread.start()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued event was delivered or given up on; ``False`` if ``timeout``
        seconds passed first."""
        end = time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if time.monotonic() >= end:
                return False
            time.sleep(0.01)
        return True

    def _work(self) -> None:
        """Deliver events as they come; one whose delivery failed waits for its retry in
        ``retries`` (due time, order, event, deliveries made) while later events go out, so a
        failing event never holds up the next one for its whole backoff."""
        retries: list[tuple[float, int, Event, int]] = []
        order = itertools.count()
        while True:
            now = time.monotonic()
            if retries and retries[0][0] <= now:
                _, _, event, made = heapq.heappop(retries)
            else:
                try:
                    event = self._queue.get(timeout=retries[0][0] - now if retries else None)
                except queue.Empty:
                    continue  # a retry is due
                made = 0
            wait = self._deliver(event, made + 1)
            if wait is None:
                self._queue.task_done()  # delivered, or given up on
            else:
                heapq.heappush(retries, (time.monotonic() + wait, next(order), event, made + 1))

    def _deliver(self, event: Event, attempt: int) -> float | None:
        """Delivery ``attempt`` of ``event``: ``None`` when it is over (delivered, refused,
        given up on), else the seconds to wait before the next."""
        try:
            self._once(event)
            return None
        except _Refused as exc:
            logger.error(
                "toolledger: notification %s for session %r refused by %r: %s; not retried",
                event["type"],
                event["session"],
                self,
                self._said(exc),
            )
            return None
        except Exception as exc:
            if attempt == self.attempts:
                logger.error(
                    "toolledger: notification %s for session %r failed %d times (last: "
                    "%s); given up",
                    event["type"],
                    event["session"],
                    attempt,
                    self._said(exc),
                )
                return None
            wait: float = min(self.backoff * 2.0 ** (attempt - 1), self.max_backoff)
            logger.warning(
                "toolledger: notification %s for session %r failed (%s); retrying in %.1fs",
                event["type"],
                event["session"],
                self._said(exc),
                wait,
            )
            return wait

    def _once(self, event: Event) -> None:
        if not isinstance(self.target, str):
            self.target(dict(event))
            return
        assert self._secret is not None
        body = json.dumps(event, sort_keys=True, separators=(",", ":")).encode()
        stamp = str(int(time.time()))
        # The scheme was checked to be http(s) when the notifier was made.
        request = urllib.request.Request(  # noqa: S310
            self.target,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "User-Agent": "toolledger",
                EVENT_HEADER: event["type"],
                DELIVERY_HEADER: event["id"],
                TIMESTAMP_HEADER: stamp,
                SIGNATURE_HEADER: "sha256=" + _sign(self._secret, stamp, body),
            },
        )
        try:
            # An opener of this delivery's: the proxies of the environment as it is now (set
            # after import, as ``load_dotenv`` does), and no redirect followed.
            opener = urllib.request.build_opener(_NoRedirects)
            with opener.open(request, timeout=self.timeout) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:
                where = _where(urljoin(self.target, exc.headers.get("Location") or ""))
                raise _Refused(
                    f"HTTP {exc.code}: it redirects to {where}; give the notifier that URL (a "
                    "redirected POST is not sent again as one)"
                ) from exc
            if 400 <= exc.code < 500 and exc.code not in _RETRYABLE_STATUS:
                raise _Refused(f"HTTP {exc.code}") from exc
            raise


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A webhook's redirect is not followed: urllib would send the POST again as a GET without
    its body (301, 302, 303), and that GET's answer would be taken for a delivery."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class _Refused(Exception):
    """The receiver said no in a way a retry will not change (a 4xx)."""


def notifier(target: Notifier | Target | None) -> Notifier | None:
    """``target`` as a ``Notifier`` (``None`` stays ``None``)."""
    if target is None or isinstance(target, Notifier):
        return target
    return Notifier(target)


def input_summary(value: Any) -> str:
    """The input as compact JSON with its secrets masked, cut to 500 characters."""
    try:
        text = json.dumps(masked(value), ensure_ascii=False, separators=(",", ":"), default=str)
    except (TypeError, ValueError, RecursionError):
        text = "(an input that is not JSON)"
    return text if len(text) <= _INPUT_CHARS else text[: _INPUT_CHARS - 1] + "…"


def _sign(secret: bytes, timestamp: str, body: bytes) -> str:
    return hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def verify_signature(
    secret: str | bytes,
    body: bytes,
    timestamp: str,
    signature: str,
    *,
    tolerance: float = 300.0,
    now: float | None = None,
) -> bool:
    """Whether a webhook delivery is genuine: ``signature`` (the ``X-Toolledger-Signature``
    header) signs ``body`` and ``timestamp`` (``X-Toolledger-Timestamp``) with ``secret``, and
    the timestamp is within ``tolerance`` seconds of ``now`` (a replayed old delivery fails)."""
    key = secret.encode() if isinstance(secret, str) else secret
    try:
        sent = int(timestamp)
    except ValueError:
        return False
    if abs((time.time() if now is None else now) - sent) > tolerance:
        return False
    if not signature.isascii():  # never one of ours, and compare_digest refuses such text
        return False
    expected = "sha256=" + _sign(key, timestamp, body)
    return hmac.compare_digest(expected, signature)


def in_doubt_calls(
    notify: Notifier | None, session_id: str, outcomes: Iterable[CallOutcome]
) -> None:
    """Tell ``notify`` of each call the batch left in doubt."""
    if notify is None:
        return
    for o in outcomes:
        if o.disposition is Disposition.IN_DOUBT:
            notify.in_doubt(
                session_id=session_id,
                tool_use_id=o.call.tool_use_id,
                tool=o.call.name,
                input=o.call.input,
                reason=o.content,
                attempt=o.attempt,
            )


def _secrets_of(url: str) -> list[str]:
    """What of a webhook URL an error's text must not show, longest first: the URL, its path,
    query and user info — as parsed, as written (``urlsplit`` drops a tab or a newline from
    them, and the request — ``http.client``'s error — keeps it), and as ``repr`` quotes them
    (``http.client`` quotes a path it refuses for a control character, escaped) — and its user
    name and password alone when they are long enough to be told from the words around them
    (``_TOLD``): "e" would be taken out of every word of the line."""
    parts = urlsplit(url)
    after = url.partition("://")[2]
    # The host ends at the first "/", "?" or "#"; the fragment is never sent (nor quoted).
    host_end = min((i for i in map(after.find, "/?#") if i >= 0), default=len(after))
    raw_path, _, raw_query = after[host_end:].partition("#")[0].partition("?")
    found = {url, parts.netloc.rpartition("@")[0], parts.query, raw_query}
    found |= {p for p in (parts.path, raw_path) if len(p) > 1}
    found |= {s for s in (parts.username, parts.password) if s and len(s) >= _TOLD}
    found -= {""}
    found |= {repr(s)[1:-1] for s in found}
    return sorted(found, key=len, reverse=True)


_TOLD = 4
"""How long a webhook URL's user name or password must be to be masked wherever an error's text
has it (``Notifier._said``); shorter, it is masked where the URL writes it."""


def _where(url: str) -> str:
    """A webhook URL as a log shows it: where it goes — scheme, host, port — and neither its
    path nor its query nor its credentials (a chat service's webhook path is its secret)."""
    parts = urlsplit(url)
    try:
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        port = ""
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    rest = "/…" if len(parts.path) > 1 or parts.query else ""
    return f"{parts.scheme}://{host}{port}{rest}"


_live: weakref.WeakSet[Notifier] = weakref.WeakSet()


@atexit.register
def _drain_at_exit() -> None:
    for n in list(_live):
        if n._queue.unfinished_tasks and not n.flush(n.exit_wait):
            logger.error(
                "toolledger: %d notification(s) to %r not delivered before exit",
                n._queue.unfinished_tasks,
                n,
            )
