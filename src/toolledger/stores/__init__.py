"""Stores: where ledgers live. ``open_store(url)`` picks the backend from the URL scheme.

| URL                          | backend                                               |
|------------------------------|-------------------------------------------------------|
| ``sqlite:///rel/path.db``    | SQLite file, relative path (the default store)        |
| ``sqlite:////abs/path.db``   | SQLite file, absolute path                            |
| ``json:///dir``              | one ``effects.json`` per session in ``dir``           |
| ``memory://`` / ``memory://name`` | this process's memory, not durable (tests)       |
| ``postgresql://…``           | PostgreSQL (``pip install 'toolledger[postgres]'``),  |
|                              | ``?schema=NAME`` to keep its tables in one schema     |
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlsplit

from ..errors import ConfigurationError, StoreUnavailableError
from ._core import checked_worker_id
from .store import Ledger, Store

__all__ = ["DEFAULT_STORE_URL", "Ledger", "Store", "open_store"]

DEFAULT_STORE_URL = "sqlite:///toolledger.db"

_SCHEMES = "sqlite:///, json:///, memory://, postgresql://, postgres://"


def _file_path(url: str, scheme: str) -> str:
    """SQLAlchemy's convention: ``scheme:///rel`` is relative, ``scheme:////abs`` absolute."""
    prefix = f"{scheme}:///"
    if not url.startswith(prefix) or len(url) == len(prefix):
        raise ConfigurationError(
            f"{url!r}: expected {prefix}relative/path or {prefix}/absolute/path"
        )
    path = url[len(prefix) :].split("?", 1)[0]
    return unquote(path)


def open_store(
    url: str = DEFAULT_STORE_URL,
    *,
    clock: Callable[[], float] = time.time,
    worker_id: str | None = None,
    redact: Callable[[str], str] | None = None,
    create: bool = True,
    read_only: bool = False,
) -> Store:
    """Open (creating if needed) the store named by ``url``.

    ``redact`` scrubs every string the store would keep of results, text and approval inputs
    before anything is written (see ``toolledger._redact``). ``clock`` and ``worker_id`` are
    injectable for tests. ``create=False`` opens only a store that exists (what the command
    line's reading commands do): a missing one is ``StoreUnavailableError("no store at …")``.
    ``read_only=True`` (the reading commands too) never writes and never migrates: SQLite opens
    the file ``mode=ro`` (``immutable=1`` where it has no write-ahead log to read), so a store
    on read-only media, or owned by someone else, can be looked at, and reads an older
    release's file through a migrated copy in memory; a write raises ``StoreUnavailableError``.
    PostgreSQL's schema is not migrated either (an older one is an error saying how). It
    implies ``create=False``.
    An SQLite file or a JSON directory that holds someone else's data and no toolledger store
    is refused with ``StoreUnavailableError`` ("not a toolledger store"), written to by neither.
    Raises ``ConfigurationError`` for a URL we cannot use and ``StoreError`` for a store we
    cannot open.
    """
    if not isinstance(url, str):
        raise ConfigurationError(f"a store URL must be a str, not {type(url).__name__}")
    checked_worker_id(worker_id)  # refused before anything is opened (or left open)
    options: dict[str, Any] = {"clock": clock, "worker_id": worker_id, "redact": redact}
    scheme = urlsplit(url).scheme.lower()
    if scheme == "sqlite":
        from .sqlite import SQLiteBackend

        path = (
            ":memory:" if url in ("sqlite://", "sqlite:///:memory:") else _file_path(url, "sqlite")
        )
        return Store(SQLiteBackend(path, url=url, create=create, read_only=read_only), **options)
    if scheme == "json":
        from .jsonfile import JSONBackend

        directory = _file_path(url, "json")
        return Store(
            JSONBackend(directory, url=url, create=create and not read_only, read_only=read_only),
            **options,
        )
    if scheme == "memory":
        from .memory import MemoryBackend

        name = url[len("memory://") :] if url.startswith("memory://") else ""
        if not create or read_only:
            opened = MemoryBackend.opened(name)
            if opened is None:
                raise StoreUnavailableError(
                    f"no store at {url}: a memory:// store lives in the memory of the process "
                    "that opened it, and this one opened none by that name (a command line "
                    "never sees a program's). Give the program a store that lasts, and name "
                    "that one (--store or $TOOLLEDGER_STORE): sqlite:///FILE, json:///DIR or "
                    "postgresql://….",
                    url=url,
                )
            return Store(opened, **options)
        return Store(MemoryBackend.open(name), **options)
    if scheme in ("postgresql", "postgres"):
        from .postgres import open_backends  # raises ConfigurationError without psycopg

        pg_backend, pg_async_backend = open_backends(
            url, create=create and not read_only, read_only=read_only
        )
        return Store(pg_backend, async_backend=pg_async_backend, **options)
    raise ConfigurationError(f"unknown store URL {url!r}; use one of {_SCHEMES}")
