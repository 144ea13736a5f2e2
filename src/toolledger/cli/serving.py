"""``toolledger console``: the web console, served on this machine unless told otherwise."""

from __future__ import annotations

import argparse
import os

from rich.console import Console

from ..errors import ConfigurationError
from ._command import store_of, url_of
from .render import safe

__all__ = ["cmd_console"]

TOKEN_ENV = "TOOLLEDGER_CONSOLE_TOKEN"  # noqa: S105 - a name, not a secret


def cmd_console(args: argparse.Namespace, console: Console) -> int:
    """Serve the web console: sessions, timelines, in-doubt calls, approvals, verify. It listens
    on 127.0.0.1 unless --host says otherwise, and any other address needs a token (--token or
    $TOOLLEDGER_CONSOLE_TOKEN)."""
    try:
        from ..console import serve
        from ..console.app import listen, shown_url
        from ..console.security import bind_check, public_origin
    except ImportError as exc:
        raise ConfigurationError(
            f"the console needs its extra: pip install 'toolledger[console]' ({exc})"
        ) from exc
    token = args.token or os.environ.get(TOKEN_ENV) or None
    origin = None if args.origin is None else public_origin(args.origin)
    bind_check(args.host, token, origin=origin)
    url = url_of(args)
    with store_of(args):
        pass  # it exists and opens: say so before saying where the console is
    sock = listen(args.host, args.port)  # the port is ours before the console says where it is
    port = sock.getsockname()[1]  # --port 0: the one the system chose
    where = f"[{args.host}]" if ":" in args.host else args.host
    shown = shown_url(url)
    console.print(safe(f"toolledger console for {shown} on http://{where}:{port}/"))
    if origin is not None:
        console.print(safe(f"browsers see it as {origin}/ (its forms are taken from there only)"))
    if token:
        console.print(safe("open it once as /?token=TOKEN (then a cookie carries it)"))
    console.print(safe("Ctrl-C stops it", "dim"))
    serve(url, host=args.host, port=port, token=token, origin=origin, sock=sock)
    return 0
