"""A new PostgreSQL connection of ours: its search path, its identity on the server, its idle
transaction deadline and a reading of the server's clock."""

from __future__ import annotations

from psycopg import sql

from .guards import IDENTIFY, AsyncConn, Conn, ServerClock, identity, our_conns


def search_path(schema: str) -> sql.Composed:
    """Unqualified names in the shared statements then resolve in ``schema`` (the name is quoted
    by psycopg, never pasted)."""
    return sql.SQL("SET search_path TO {}").format(sql.Identifier(schema))


def configure(
    conn: Conn,
    *,
    schema: str | None,
    clock: ServerClock | None = None,
    idle_ms: str | None = None,
) -> None:
    """A new connection: its search path; for the pool's, its identity on the server, its idle
    transaction deadline (``guards.idle_ms``) and a reading of the server's clock."""
    our_conns.add(conn)
    if schema is not None:
        conn.execute(search_path(schema))
    if idle_ms is not None:
        row = conn.execute(IDENTIFY, (idle_ms,)).fetchone()
        if row is not None:
            identity[conn] = (row[0], row[1])
    if clock is not None:
        clock.read(conn)


async def aconfigure(
    conn: AsyncConn, *, schema: str | None, clock: ServerClock, idle_ms: str
) -> None:
    """``configure`` for a connection of the async pool."""
    our_conns.add(conn)
    if schema is not None:
        await conn.execute(search_path(schema))
    row = await (await conn.execute(IDENTIFY, (idle_ms,))).fetchone()
    if row is not None:
        identity[conn] = (row[0], row[1])
    await clock.aread(conn)
