"""What every command shares: the store it looks at (``--store``, ``$TOOLLEDGER_STORE``, the
default), its JSON output, and the answer to a session that is not there."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Any

from rich.console import Console

from .._invisible import json_invisible_escaped
from .._shell import STORE_ENV
from ..errors import ConfigurationError
from ..stores import DEFAULT_STORE_URL, Store, open_store
from .output import Out
from .render import command, safe, safe_id

__all__ = ["Handler", "emit_json", "no_session", "store_of", "url_of"]

Handler = Callable[[argparse.Namespace, Console], int]


def url_of(args: argparse.Namespace) -> str:
    """``--store``, else ``$TOOLLEDGER_STORE``, else the default. The variable set but empty
    (``TOOLLEDGER_STORE=$URL`` with ``$URL`` unset) is refused, as an empty ``--store`` is
    (``app._no_empty_store``): not taken for the default store."""
    if args.store:
        return str(args.store)
    env = os.environ.get(STORE_ENV)
    if env is not None and not env.strip():
        raise ConfigurationError(
            f'${STORE_ENV} is set but empty (an unset variable in {STORE_ENV}="$URL"?). Name '
            f"the store in it or with --store, or unset it for the default, {DEFAULT_STORE_URL}."
        )
    return env or DEFAULT_STORE_URL


def store_of(args: argparse.Namespace, *, write: bool = False) -> Store:
    """The store the command looks at. It must exist: looking never creates one (a forgotten
    ``--store`` says "no store at …", it does not leave an empty ``toolledger.db`` behind).
    A command that only looks opens it read-only (``write=False``): it works on read-only media
    and never migrates."""
    return open_store(url_of(args), create=False, read_only=not write)


def no_session(console: Console, args: argparse.Namespace, store: Store) -> int:
    if args.json:
        emit_json({"error": "NoSuchSession", "message": f"no session {args.session!r}"})
    else:
        console.print(
            safe("no session '", "red")
            .append_text(safe_id(args.session, "red"))
            .append_text(safe(f"' in {store.url}; the sessions it holds are listed by:", "red")),
            soft_wrap=True,  # the program never breaks an id
            highlight=False,
        )
        Out(console).command(command("sessions", url=store.url))
    return 1


def emit_json(value: Any) -> None:
    """``value`` as JSON, every invisible character in it written as a ``\\u`` escape."""
    print(json_invisible_escaped(json.dumps(value, indent=2, ensure_ascii=False)))
