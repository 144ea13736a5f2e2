"""The web console: ``toolledger console`` (extra ``console``: Starlette, Jinja2, uvicorn).

Pages: the sessions (filtered by status, refreshed every two seconds), one session's timeline
and tool calls, the calls in doubt (settle them), the approval requests (decide them), and the
integrity checks of ``toolledger verify``. It reads through the command line's own readers, so it
shows what ``toolledger show`` shows, secrets masked the same way; it writes only through
``Ledger.resolve`` and ``approvals.decide``, so the same rules hold. See ``security`` for who may
use it.
"""

from __future__ import annotations

from .app import create_app, serve

__all__ = ["create_app", "serve"]
