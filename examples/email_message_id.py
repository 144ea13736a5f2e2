"""An e-mail whose Message-ID comes from the call's idempotency key, and a check that finds it.

E-mail has no de-duplication: a `send_email` killed after the server accepted the message and
before its result was recorded is *in doubt*, and running it again sends a second e-mail. Here
every attempt of one call carries the same Message-ID (`tl.keys.message_id(ctx, domain)`), so
the tool's `check` can search the mailbox for it and settle the doubt without sending again.

The mail server is a local Maildir (`mailbox.Maildir`), so this runs offline; with a real one
the check is an IMAP `SEARCH HEADER Message-ID <…>` on the Sent folder, or the provider's API.
The first run is a real process, really killed (`SIGKILL`) right after the send:

    python examples/email_message_id.py
"""

from __future__ import annotations

import mailbox
import os
import subprocess
import sys
import tempfile
from email.message import EmailMessage
from pathlib import Path

import toolledger as tl

DOMAIN = "support.example.com"
WORK = Path(os.environ.get("EMAIL_EXAMPLE_DIR") or tempfile.mkdtemp(prefix="toolledger-mail-"))
MAILDIR = WORK / "maildir"
STORE = f"sqlite:///{WORK / 'ledger.db'}"


def smtp_send(message: EmailMessage) -> None:
    """Stands for `smtplib.SMTP(...).send_message(message)`: the server keeps what it accepts."""
    mailbox.Maildir(MAILDIR, create=True).add(message)


@tl.tool(effect="non_idempotent")  # every run puts one more message in the inbox
def send_email(to: str, subject: str, body: str, ctx: tl.ToolContext) -> dict[str, str]:
    """E-mail a customer."""
    message = EmailMessage()
    message["From"] = f"support@{DOMAIN}"
    message["To"] = to
    message["Subject"] = subject
    message["Message-ID"] = tl.keys.message_id(ctx, DOMAIN)  # the same on every attempt
    message.set_content(body)
    smtp_send(message)
    return {"status": "sent", "message_id": message["Message-ID"]}


@send_email.check
def _(to: str, subject: str, body: str, ctx: tl.ToolContext) -> dict[str, str] | None:
    """Did this call's e-mail go out? Look for its Message-ID."""
    wanted = tl.keys.message_id(ctx, DOMAIN)
    for message in mailbox.Maildir(MAILDIR, create=True):
        if message["Message-ID"] == wanted:
            return {"status": "sent", "message_id": wanted, "found_by": "check"}
    return None


MESSAGE = [
    {
        "type": "tool_use",
        "id": "toolu_01",
        "name": "send_email",
        "input": {
            "to": "customer@acme.test",
            "subject": "Checkout outage",
            "body": "We are on it.",
        },
    }
]


def run_once() -> list[dict[str, object]]:
    with tl.open_store(STORE) as store:
        return tl.run_tool_uses(MESSAGE, [send_email], ledger=store.ledger("outage-42"))


def main() -> None:
    if sys.argv[1:] == ["--child"]:
        run_once()  # killed at before_record: the e-mail is out, its outcome not recorded
        return
    env = {**os.environ, "EMAIL_EXAMPLE_DIR": str(WORK), "TOOLLEDGER_CRASH_AT": "before_record"}
    child = subprocess.run([sys.executable, __file__, "--child"], env=env, check=False)
    print(f"first run: killed by signal {-child.returncode} right after the send")
    with tl.open_store(STORE) as store:
        (doubt,) = store.ledger("outage-42").in_doubt()
        print(f"in doubt: {doubt.tool} ({doubt.tool_use_id}), attempt {doubt.attempt}")

    (result,) = run_once()  # the resume: the check finds the e-mail by its Message-ID
    print(f"resume: {result['content']}")
    sent = len(mailbox.Maildir(MAILDIR, create=True))
    print(f"e-mails in the mailbox: {sent}")
    if child.returncode != -9 or sent != 1 or result.get("is_error"):
        sys.exit("the e-mail was not sent exactly once")


if __name__ == "__main__":
    main()
