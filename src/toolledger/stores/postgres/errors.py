"""What a driver error means: run the operation again, or which error of ours to raise."""

from __future__ import annotations

import psycopg
import psycopg_pool
from psycopg import errors as pg_errors

from ...errors import ClockMovedError, StoreError, StoreUnavailableError
from .._sql.statements import CLOCK_REFUSED, CLOCK_TOLERANCE

# 57P01 admin_shutdown (pg_terminate_backend too), 57P02 crash_shutdown, 57P03
# cannot_connect_now, 57P05 idle_session_timeout, 25P03 idle_in_transaction_session_timeout
# (the server ended a transaction whose client had gone quiet: a paused worker's); class 08.
_LOST_STATES = ("57P01", "57P02", "57P03", "57P05", "25P03")
# The server rolled the transaction back to break a tie; running it again is the remedy.
_RETRY_STATES = ("40001", "40P01")
RETRIES = 2


def connection_lost(exc: BaseException) -> bool:
    if isinstance(exc, psycopg_pool.PoolTimeout | psycopg_pool.PoolClosed):
        return False
    state = getattr(exc, "sqlstate", None)
    if state in _LOST_STATES:
        return True
    if not isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return False
    return state is None or state.startswith("08")


def failure(
    exc: psycopg.Error | UnicodeEncodeError,
    *,
    url: str,
    action: str,
    attempt: int,
    committing: bool = False,
    single: bool = False,
) -> StoreError | None:
    """What a driver error means for a plan: ``None`` to run it again, else the error to raise.

    Running again is safe only when nothing can have been committed: the error came before the
    COMMIT was sent (and every statement is conditional anyway). A connection lost *during* the
    COMMIT leaves the outcome unknown, so that is never retried blindly. ``single``: a write of
    one autocommit statement, whose sending is its commit — it is sent again (the resend checks
    whether the first landed), but a loss that ends the retries leaves its outcome unknown.
    """
    if isinstance(exc, UnicodeEncodeError):
        return StoreError(
            f"{url}: {action} failed: a text value holds a lone surrogate, which PostgreSQL "
            f"cannot store ({exc}); nothing was written",
            url=url,
        )
    if (
        attempt < RETRIES
        and not committing
        and (connection_lost(exc) or exc.sqlstate in _RETRY_STATES)
    ):
        return None
    return translate(exc, url=url, action=action, committing=committing or single)


# What a server that answered says when it refuses a connection for something in the URL
# (libpq gives these no SQLSTATE), and what to check. Anything else — too many clients, a
# server starting or shutting down — is the server's state: "check that it is up" stands.
_REFUSALS = (
    ("does not exist", "Check the URL's user and database"),
    ("password authentication failed", "Check the URL's user and password"),
    ("no pg_hba.conf entry", "Check the server's pg_hba.conf allows this user and host"),
    ("authentication failed", "Check the URL's user and password"),
    ("permission denied for database", "Grant this user CONNECT on the database"),
)


def _refused(text: str) -> str | None:
    """What to check when ``text`` is a server's refusal of the URL's user or database."""
    if "FATAL:" not in text:
        return None
    return next((what for said, what in _REFUSALS if said in text), None)


def translate(exc: psycopg.Error, *, url: str, action: str, committing: bool = False) -> StoreError:
    """A driver error in our tree, saying what happened and what to do."""
    lost = connection_lost(exc)
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return StoreUnavailableError(
            f"{url}: no PostgreSQL connection became free or could be opened while {action} "
            f"({exc}). Check that the server is up and reachable; if it is merely busy, raise "
            "?pool_max= or ?pool_timeout= in the store URL.",
            url=url,
        )
    if isinstance(exc, psycopg_pool.PoolClosed):
        return StoreError(f"{url}: the store is closed ({action}); open it again", url=url)
    if lost and committing:
        return StoreUnavailableError(
            f"{url}: the connection to PostgreSQL was lost during COMMIT while {action} ({exc}). "
            "The write may or may not have been committed: read the ledger before going on.",
            url=url,
            outcome_unknown=True,
        )
    refused = _refused(str(exc)) if lost else None
    if refused is not None:  # the server answered, and refused this connection
        return StoreUnavailableError(
            f"{url}: PostgreSQL refused the connection while {action}: {str(exc).strip()}. "
            f"Nothing was written. {refused}, then retry.",
            url=url,
        )
    if lost:
        return StoreUnavailableError(
            f"{url}: cannot reach PostgreSQL while {action}: {str(exc).strip()}. Nothing was "
            "written. Check that the server is up and the URL (host, port, user, password, "
            "database) is right, then retry.",
            url=url,
        )
    if getattr(exc, "sqlstate", None) == CLOCK_REFUSED:
        return ClockMovedError(
            f"{url}: the PostgreSQL server's clock is more than {CLOCK_TOLERANCE:g}s away from "
            f"this process's reading of it while {action}: it was stepped since that reading "
            "(an NTP correction, a restored VM). Nothing was written. The clock has been read "
            "again: retry.",
            url=url,
        )
    if isinstance(exc, pg_errors.UndefinedTable):
        return StoreError(
            f"{url}: the toolledger tables are missing while {action} ({exc}). Was the schema "
            "dropped? open_store() creates them.",
            url=url,
        )
    if isinstance(exc, pg_errors.ReadOnlySqlTransaction):
        return StoreUnavailableError(
            f"{url}: PostgreSQL takes no writes on this connection while {action} ({exc}): "
            "default_transaction_read_only is on (for the database, the user, or in the URL's "
            "options), or the server is a standby. Nothing was written. Point the URL at the "
            "primary (target_session_attrs=read-write), or turn default_transaction_read_only "
            "off, then retry.",
            url=url,
        )
    if isinstance(exc, pg_errors.QueryCanceled | pg_errors.LockNotAvailable):
        # Not our own deadline (op_timeout cuts the connection: ``timed_out``): the server's.
        # A cancelled statement, or COMMIT, rolls its transaction back.
        return StoreUnavailableError(
            f"{url}: PostgreSQL cancelled a statement while {action} ({str(exc).strip()}): "
            "a statement_timeout or lock_timeout set for the database, the user or in the "
            "URL's options ran out (while another transaction held a lock on a toolledger "
            "table, say), or someone cancelled it. Nothing was written. toolledger bounds each "
            "operation itself (?op_timeout=): leave the server's timeouts to it for this user "
            "(statement_timeout=0, lock_timeout=0) or set them above it, then retry.",
            url=url,
        )
    if isinstance(exc, pg_errors.InsufficientPrivilege):
        return StoreError(
            f"{url}: permission denied while {action} ({exc}). Grant this user SELECT, INSERT, "
            "UPDATE and DELETE on the toolledger tables (DELETE for rewinds and prune; CREATE "
            "on the schema to migrate it).",
            url=url,
        )
    return StoreError(f"{url}: {action} failed: {exc}", url=url)


def timed_out(url: str, action: str, seconds: float, *, unknown: bool) -> StoreError:
    more = (
        " The write may or may not have landed: it is read back before the run goes on."
        if unknown
        else " Nothing was written."
    )
    return StoreUnavailableError(
        f"{url}: PostgreSQL did not answer within {seconds:g}s while {action} (op_timeout); the "
        f"connection was cut and discarded.{more}",
        url=url,
        outcome_unknown=unknown,
    )
