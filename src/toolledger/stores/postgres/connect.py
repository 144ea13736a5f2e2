"""A new PostgreSQL connection of ours: its search path, its identity on the server, its idle
transaction deadline and a reading of the server's clock."""

from __future__ import annotations

from typing import Any

from .._sql.plans import Plan, Step
from .call import adrive, drive
from .guards import IDENTIFY, AsyncConn, Conn, ServerClock, identity, our_conns

# Unqualified names in the shared statements then resolve in the store's schema. The name
# travels as a parameter, quoted; it is never pasted into SQL.
SET_SEARCH_PATH = "SELECT set_config('search_path', ?, false)"


def quoted(name: str) -> str:
    """``name`` as an SQL identifier: in double quotes, each double quote doubled (what
    ``sql.Identifier`` and libpq's ``PQescapeIdentifier`` write)."""
    return '"' + name.replace('"', '""') + '"'


def configuring(
    schema: str | None, clock: ServerClock | None, idle_ms: str | None
) -> Plan[tuple[int, Any] | None]:
    """What a new connection runs: its search path; for the pools', its identity on the server
    (returned), its idle transaction deadline (``guards.idle_ms``) and a reading of the
    server's clock."""
    if schema is not None:
        yield Step(SET_SEARCH_PATH, (quoted(schema),))
    ident = None
    if idle_ms is not None:
        found = (yield Step(IDENTIFY, (idle_ms,))).rows
        if found:
            ident = (found[0][0], found[0][1])
    if clock is not None:
        yield from clock.reading()
    return ident


def configure(
    conn: Conn,
    *,
    schema: str | None,
    clock: ServerClock | None = None,
    idle_ms: str | None = None,
) -> None:
    """A new connection (``configuring``)."""
    our_conns.add(conn)
    ident = drive(conn, configuring(schema, clock, idle_ms))
    if ident is not None:
        identity[conn] = ident


async def aconfigure(
    conn: AsyncConn, *, schema: str | None, clock: ServerClock, idle_ms: str
) -> None:
    """``configure`` for a connection of the async pool."""
    our_conns.add(conn)
    ident = await adrive(conn, configuring(schema, clock, idle_ms))
    if ident is not None:
        identity[conn] = ident
