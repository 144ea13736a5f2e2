"""What both torture harnesses set up alike: the backends they run on and their stores' URLs, the
PostgreSQL schema dropped after a run, the scratch directory kept when a run fails, and their
command-line options for all of it."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = [
    "BACKENDS",
    "DEFAULT_POSTGRES_URL",
    "POSTGRES_URL_ENV",
    "add_backend_options",
    "add_keep_options",
    "admin_url",
    "check_backend",
    "drop_schema",
    "scratch_dir",
    "store_url",
]

BACKENDS = ("sqlite", "json", "postgres")
POSTGRES_URL_ENV = "TOOLLEDGER_TEST_POSTGRES_URL"
DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"


def check_backend(kind: str) -> None:
    if kind not in BACKENDS:
        raise ValueError(f"unknown backend {kind!r}; one of {', '.join(BACKENDS)}")


def admin_url(postgres_url: str | None) -> str:
    """The PostgreSQL database to make schemas in: given, else ``$TOOLLEDGER_TEST_POSTGRES_URL``,
    else the local default."""
    return postgres_url or os.environ.get(POSTGRES_URL_ENV, DEFAULT_POSTGRES_URL)


def store_url(kind: str, folder: Path, admin: str, schema: str) -> str:
    """A store of ``kind``: a SQLite file or JSON directory in ``folder``, or ``schema`` of the
    PostgreSQL database ``admin``."""
    if kind == "sqlite":
        return f"sqlite:///{folder / 'ledger.db'}"
    if kind == "json":
        return f"json:///{folder / 'ledger'}"
    sep = "&" if "?" in admin else "?"
    return f"{admin}{sep}schema={schema}"


def drop_schema(admin: str, schema: str) -> None:
    import psycopg  # the postgres extra: only a PostgreSQL run needs it

    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@contextlib.contextmanager
def scratch_dir(prefix: str, passed: Callable[[], bool]) -> Iterator[Path]:
    """A temporary directory, removed afterwards unless the run failed (``passed()`` is false)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        if passed():
            shutil.rmtree(path, ignore_errors=True)


def add_backend_options(parser: argparse.ArgumentParser) -> None:
    """``--backend`` and ``--seed``."""
    parser.add_argument("--backend", choices=BACKENDS, default="sqlite")
    parser.add_argument("--seed", type=int, default=None, help="default: random, and printed")


def add_keep_options(parser: argparse.ArgumentParser, *, dir_help: str) -> None:
    """``--dir`` (what is kept there: ``dir_help``), ``--postgres-url`` and ``--quiet``."""
    parser.add_argument("--dir", default=None, help=dir_help)
    parser.add_argument(
        "--postgres-url",
        default=None,
        help=f"default: ${POSTGRES_URL_ENV} or {DEFAULT_POSTGRES_URL}",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
