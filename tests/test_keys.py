"""Keys downstream: the helpers put ``ctx.idempotency_key`` on real ``httpx`` and ``requests``
requests, and make a Message-ID of it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import toolledger as tl
from toolledger.codec import idempotency_key

CTX = tl.ToolContext(
    session_id="s", tool_use_id="toolu_1", idempotency_key=idempotency_key("s", "toolu_1")
)


def test_headers_and_message_id() -> None:
    assert tl.keys.idempotency_headers(CTX) == {"Idempotency-Key": CTX.idempotency_key}
    assert tl.keys.idempotency_headers("k-1", header="X-Request-Id") == {"X-Request-Id": "k-1"}
    assert (
        tl.keys.message_id(CTX, "mail.example.com") == f"<{CTX.idempotency_key}@mail.example.com>"
    )
    for bad in ("", "a b", "x@y", "<x>", "a..b"):
        with pytest.raises(tl.ConfigurationError):
            tl.keys.message_id(CTX, bad)
    with pytest.raises(tl.ConfigurationError):
        tl.keys.idempotency_headers("")


def test_the_key_is_the_same_for_one_call_everywhere() -> None:
    again = tl.ToolContext(
        session_id="s",
        tool_use_id="toolu_1",
        idempotency_key=idempotency_key("s", "toolu_1"),
        in_doubt=True,
        attempt=2,
    )
    assert tl.keys.idempotency_headers(again) == tl.keys.idempotency_headers(CTX)
    assert idempotency_key("s", "toolu_2") != CTX.idempotency_key


@pytest.mark.parametrize("library", ["httpx", "httpx2"])  # httpx2 comes with the openai SDK
def test_httpx_auth_and_event_hooks(library: str) -> None:
    httpx = pytest.importorskip(library)
    seen: list[str | None] = []

    def handler(request: Any) -> Any:
        seen.append(request.headers.get("Idempotency-Key"))
        return httpx.Response(200, json={"ok": True})

    transport = httpx.MockTransport(handler)
    with httpx.Client(transport=transport) as client:
        client.post("https://api.test/charges", auth=tl.keys.IdempotencyKeyAuth(CTX))
    hooked = httpx.Client(transport=transport, event_hooks={"request": [tl.keys.httpx_event_hook]})
    with hooked:
        hooked.post("https://api.test/charges")  # outside forwarding: no key
        with tl.keys.forwarding(CTX) as key:
            assert key == tl.keys.current_key() == CTX.idempotency_key
            hooked.post("https://api.test/charges")
            hooked.post("https://api.test/charges", headers={"Idempotency-Key": "mine"})
        assert tl.keys.current_key() is None

    async def run_async() -> None:
        async with httpx.AsyncClient(
            transport=transport, event_hooks={"request": [tl.keys.ahttpx_event_hook]}
        ) as client:
            with tl.keys.forwarding("k-async"):
                await client.post("https://api.test/charges")

    asyncio.run(run_async())
    assert seen == [CTX.idempotency_key, None, CTX.idempotency_key, "mine", "k-async"]


def test_requests_auth() -> None:
    requests = pytest.importorskip("requests")
    prepared = requests.Request(
        "POST", "https://api.test/charges", json={"amount": 5}, auth=tl.keys.IdempotencyKeyAuth(CTX)
    ).prepare()
    assert prepared.headers["Idempotency-Key"] == CTX.idempotency_key
