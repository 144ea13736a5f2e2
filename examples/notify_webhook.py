"""A person is told the moment an agent needs one: a signed webhook for each queued approval.

A high-impact ``wire_money`` call is queued for approval; the queue's notifier POSTs the event
to a webhook (here a receiver on 127.0.0.1 started by this script), signed with HMAC-SHA256. The
receiver checks the signature with ``toolledger.notify.verify_signature`` and prints the event.
Secrets in the input are masked in what it receives.

    python examples/notify_webhook.py
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import toolledger as tl
from toolledger.notify import Notifier, verify_signature

SECRET = "shared-with-the-receiver"
received: list[dict[str, Any]] = []


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        genuine = verify_signature(
            SECRET,
            body,
            self.headers["X-Toolledger-Timestamp"],
            self.headers["X-Toolledger-Signature"],
        )
        self.send_response(204 if genuine else 401)
        self.end_headers()
        if genuine:
            received.append(json.loads(body))

    def log_message(self, *args: Any) -> None:
        pass


@tl.tool(effect="non_idempotent", high_impact=True)
def wire_money(to: str, amount: int, api_key: str) -> str:
    """Send money."""
    return f"sent {amount} to {to}"


def main() -> int:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    hook = f"http://127.0.0.1:{server.server_address[1]}/toolledger"

    notify = Notifier(hook, secret=SECRET, console_url="http://127.0.0.1:8765")
    approve = tl.approvals.queue(notify=notify)
    call = {
        "type": "tool_use",
        "id": "toolu_01",
        "name": "wire_money",
        "input": {"to": "ACME", "amount": 500, "api_key": "sk-live-0123456789"},
    }
    with (
        tempfile.TemporaryDirectory() as tmp,
        tl.open_store(f"sqlite:///{Path(tmp) / 'ledger.db'}") as store,
    ):
        ledger = store.ledger("payroll")
        (result,) = tl.run_tool_uses([call], [wire_money], ledger=ledger, approve=approve)
        print("the model is told:", result["content"])
    notify.flush(10)  # delivery is in the background; wait for it here, at the end
    server.shutdown()
    (event,) = received
    print("the webhook received:", json.dumps(event, indent=2))
    assert event["type"] == "approval_requested" and "sk-live" not in event["input"]
    return 0


if __name__ == "__main__":
    sys.exit(main())
