"""``postgresql://`` — PostgreSQL through psycopg 3: a thread-safe sync backend and a native async
twin (``Store.async_backend``), each over its own connection pool.

``postgresql://user:password@host:5432/db?schema=NAME&pool_min=1&pool_max=10&pool_timeout=10``
takes any libpq parameter besides toolledger's own (``sslmode=``, ``connect_timeout=`` …).
``schema`` puts every table in that schema, created if absent, so tenants or test runs can share
one database.

Every state change is one short transaction of conditional statements (insert-if-absent,
compare-and-set): two workers cannot both win a transition, and a crash leaves either the old
rows or the new ones. A commit is as durable as the server makes it: keep ``synchronous_commit``
on (``integrity_check()`` says when it is off).

A dropped connection is retried on a fresh one only when nothing can have been committed; one
lost *during* COMMIT raises ``StoreUnavailableError`` saying the outcome is unknown, because a
conditional write sent twice would report "someone else got there first" about our own row.

Each read and each commit is one round trip: statements prepared once per connection, a batch
of several sent as one transaction ahead of its answers (``wire``).

The package: ``settings`` (the URL), ``errors`` (driver errors in our tree), ``guards``
(deadlines, orphaned transactions, the server's clock), ``connect``, ``schema`` (migrating),
``wire`` (what goes to the server and back), ``call`` (carrying a plan out; the retry and
timeout decisions), ``backend`` and ``async_backend`` (thin shells over the plans of
``stores._sql``).
"""

from __future__ import annotations

from ...errors import ConfigurationError

try:
    import psycopg
    import psycopg_pool  # noqa: F401
except ImportError as exc:  # the optional driver is missing or broken
    raise ConfigurationError(
        f"the postgresql:// store needs psycopg 3 and psycopg-pool ({exc}): "
        "pip install 'toolledger[postgres]'"
    ) from exc

if not psycopg.Pipeline.is_supported():
    raise ConfigurationError(
        "the postgresql:// store needs libpq 14 or newer (pipeline mode: one round trip per "
        f"operation); psycopg found libpq {psycopg.pq.version()}: pip install 'psycopg[binary]'"
    )

from .async_backend import AsyncPostgresBackend
from .backend import PostgresBackend
from .schema import migrate

__all__ = ["AsyncPostgresBackend", "PostgresBackend", "migrate", "open_backends"]


def open_backends(
    url: str, *, create: bool = True, read_only: bool = False
) -> tuple[PostgresBackend, AsyncPostgresBackend]:
    """The two faces of one store: closing either one (``Store.close()`` or ``aclose()``)
    releases both pools. ``create=False``: a schema without toolledger's tables is an error.
    ``read_only=True``: the schema is never migrated (an older one is an error that says so)."""
    backend = PostgresBackend(url, create=create, read_only=read_only)
    twin = AsyncPostgresBackend(url, clock=backend.server_clock, orphans=backend.orphans)
    backend._twin, twin._twin = twin, backend
    return backend, twin
