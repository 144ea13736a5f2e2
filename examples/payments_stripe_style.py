"""A charge through a payments API that honours `Idempotency-Key`, in the style of Stripe.

A `charge` killed after the API took the money and before toolledger recorded it is *in doubt*.
The tool forwards `ctx.idempotency_key` as the `Idempotency-Key` header and is declared
`forwards_idempotency_key=True`, so the resume simply runs it again: the API recognises the key
and answers with the first charge instead of making a second one. No person, no check needed.

The API is a small local HTTP server (127.0.0.1) that behaves as Stripe documents: the first
request with a key is executed and its response saved; a repeat with the same key and the same
parameters gets the saved response (`Idempotent-Replayed: true`); the same key with other
parameters is refused. The first run is a real process, really killed right after the charge:

    python examples/payments_stripe_style.py
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import toolledger as tl

WORK = Path(os.environ.get("PAYMENTS_EXAMPLE_DIR") or tempfile.mkdtemp(prefix="toolledger-pay-"))
STORE = f"sqlite:///{WORK / 'ledger.db'}"


# -- the payments API ---------------------------------------------------------------------------


class PaymentsAPI(BaseHTTPRequestHandler):
    charges: ClassVar[list[dict[str, Any]]] = []  # the API's own books
    saved: ClassVar[dict[str, tuple[str, dict[str, Any]]]] = {}  # key -> (digest, response)
    lock = threading.Lock()

    def do_POST(self) -> None:
        params = json.loads(self.rfile.read(int(self.headers["content-length"])))
        digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()
        key = self.headers.get("Idempotency-Key")
        with self.lock:
            if key is not None and key in self.saved:
                first_digest, response = self.saved[key]
                if first_digest != digest:
                    self.reply(
                        400,
                        {
                            "error": {
                                "type": "idempotency_error",
                                "message": (
                                    "Keys for idempotent requests can only be used with the same "
                                    "parameters they were first used with."
                                ),
                            }
                        },
                    )
                    return
                self.reply(200, response, replayed=True)
                return
            charge = {"id": "ch_" + uuid.uuid4().hex[:14], "object": "charge", **params}
            self.charges.append(charge)
            if key is not None:
                self.saved[key] = (digest, charge)
        self.reply(200, charge)

    def reply(self, status: int, body: dict[str, Any], *, replayed: bool = False) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        if replayed:
            self.send_header("Idempotent-Replayed", "true")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return


# -- the tool -------------------------------------------------------------------------------------


@tl.tool(effect="non_idempotent", forwards_idempotency_key=True, high_impact=True)
def charge(customer: str, amount_cents: int, currency: str, ctx: tl.ToolContext) -> dict[str, Any]:
    """Charge a customer's card."""
    request = urllib.request.Request(
        os.environ["PAYMENTS_API"] + "/v1/charges",
        data=json.dumps(
            {"customer": customer, "amount": amount_cents, "currency": currency}
        ).encode(),
        headers={"content-type": "application/json", **tl.keys.idempotency_headers(ctx)},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        body: dict[str, Any] = json.loads(response.read())
        body["replayed"] = response.headers.get("Idempotent-Replayed") == "true"
        return body


MESSAGE = [
    {
        "type": "tool_use",
        "id": "toolu_01",
        "name": "charge",
        "input": {"customer": "cus_acme", "amount_cents": 4200, "currency": "eur"},
    }
]


def approve(request: tl.ApprovalRequest) -> bool:
    return True  # a person approved the charge (tl.approvals.terminal in real life)


def run_once() -> list[dict[str, Any]]:
    with tl.open_store(STORE) as store:
        return tl.run_tool_uses(MESSAGE, [charge], ledger=store.ledger("order-7"), approve=approve)


def main() -> None:
    if sys.argv[1:] == ["--child"]:
        run_once()  # killed at before_record: the API charged, the outcome is not recorded
        return
    server = ThreadingHTTPServer(("127.0.0.1", 0), PaymentsAPI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    os.environ["PAYMENTS_API"] = f"http://127.0.0.1:{server.server_address[1]}"
    env = {**os.environ, "PAYMENTS_EXAMPLE_DIR": str(WORK), "TOOLLEDGER_CRASH_AT": "before_record"}
    child = subprocess.run([sys.executable, __file__, "--child"], env=env, check=False)
    print(f"first run: killed by signal {-child.returncode} right after the charge")
    with tl.open_store(STORE) as store:
        (doubt,) = store.ledger("order-7").in_doubt()
        print(
            f"in doubt: {doubt.tool} ({doubt.tool_use_id}); charges at the API so far: "
            f"{len(PaymentsAPI.charges)}"
        )

    (result,) = run_once()  # the resume: same call, same key, the API replays the first charge
    answer = json.loads(str(result["content"]))
    print(
        f"resume: {answer['id']} for {answer['amount']} {answer['currency']}, "
        f"replayed by the API: {answer['replayed']}"
    )
    print(f"charges at the API: {len(PaymentsAPI.charges)}")
    server.shutdown()
    if child.returncode != -9 or len(PaymentsAPI.charges) != 1 or not answer["replayed"]:
        sys.exit("the customer was not charged exactly once")


if __name__ == "__main__":
    main()
