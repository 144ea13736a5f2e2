"""What a ``postgresql://`` URL asks for: toolledger's own parameters split from libpq's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from ...errors import ConfigurationError

OWN_PARAMS = ("schema", "pool_min", "pool_max", "pool_timeout", "op_timeout")
DEFAULT_OP_TIMEOUT = 10.0
MAX_IDENTIFIER_BYTES = 63  # NAMEDATALEN - 1: PostgreSQL silently truncates longer names


@dataclass(frozen=True, slots=True)
class Settings:
    """What ``postgresql://…?schema=&pool_min=&pool_max=&pool_timeout=&op_timeout=`` asks for."""

    conninfo: str
    """The URL for libpq, without toolledger's own parameters."""
    display: str
    """The URL with any password masked: for messages and ``Store.url``."""
    schema: str | None
    pool_min: int
    pool_max: int
    pool_timeout: float
    op_timeout: float
    """How long one store operation may wait for the server before its connection is cut and
    discarded: a reply lost on the network never hangs a worker (docs/design.md, rule 16)."""
    connect_kwargs: dict[str, Any]
    """Connection defaults the URL did not set (``connect_timeout``, ``application_name``, TCP
    keepalives, ``tcp_user_timeout``)."""


def parse_url(url: str) -> Settings:
    """Split toolledger's parameters from libpq's. Raises ``ConfigurationError``.

    The other parameters are passed on byte for byte: libpq decodes ``%XX`` but not ``+``, so
    decoding and re-encoding them could change a password or an ``options`` value.
    """
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("postgresql", "postgres"):
        raise ConfigurationError(f"{url!r} is not a postgresql:// URL")
    own: dict[str, str] = {}
    kept: list[str] = []
    for piece in parts.query.split("&") if parts.query else []:
        key, _, value = piece.partition("=")
        if unquote(key) in OWN_PARAMS:
            own[unquote(key)] = unquote(value)
        else:
            kept.append(piece)
    conninfo = urlunsplit((parts.scheme, parts.netloc, parts.path, "&".join(kept), ""))
    defaults: dict[str, Any] = {}
    libpq_keys = {unquote(p.partition("=")[0]) for p in kept}
    if "connect_timeout" not in libpq_keys:
        defaults["connect_timeout"] = 10  # libpq waits for ever on a black-holed host
    if "application_name" not in libpq_keys:
        defaults["application_name"] = "toolledger"
    pool_min = _int_param(url, own, "pool_min", 1, low=0)
    pool_max = _int_param(url, own, "pool_max", max(10, pool_min), low=1)
    if pool_max < pool_min:
        raise ConfigurationError(f"{_mask(url)}: pool_max={pool_max} is below pool_min={pool_min}")
    pool_timeout = _seconds_param(url, own, "pool_timeout", 10.0)
    op_timeout = _seconds_param(url, own, "op_timeout", DEFAULT_OP_TIMEOUT)
    if op_timeout * 1000 >= 2**31:  # libpq's and the server's settings in ms are 32-bit
        raise ConfigurationError(f"{_mask(url)}: op_timeout must be under 24 days")
    # A peer that vanishes without a RST (a black hole, a half-open connection) is noticed by
    # the kernel: keepalive probes when idle, tcp_user_timeout when sent data goes unacknowledged.
    for option, setting in (
        ("keepalives", 1),
        ("keepalives_idle", 5),
        ("keepalives_interval", 2),
        ("keepalives_count", 3),
        ("tcp_user_timeout", int(op_timeout * 1000)),
    ):
        if option not in libpq_keys:
            defaults[option] = setting
    return Settings(
        conninfo=conninfo,
        display=_mask(url),
        schema=_schema_param(url, own.get("schema")),
        pool_min=pool_min,
        pool_max=pool_max,
        pool_timeout=pool_timeout,
        op_timeout=op_timeout,
        connect_kwargs=defaults,
    )


def _seconds_param(url: str, own: dict[str, str], key: str, default: float) -> float:
    try:
        value = float(own.get(key, default))
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise ConfigurationError(f"{_mask(url)}: {key} must be a positive number of seconds")
    return value


def _int_param(url: str, own: dict[str, str], key: str, default: int, *, low: int) -> int:
    raw = own.get(key)
    if raw is None:
        return default
    if not raw.isdigit() or int(raw) < low:
        raise ConfigurationError(f"{_mask(url)}: {key} must be an integer >= {low}, not {raw!r}")
    return int(raw)


def _schema_param(url: str, schema: str | None) -> str | None:
    if schema is None:
        return None
    size = len(schema.encode("utf-8", "surrogatepass"))
    if not schema or size > MAX_IDENTIFIER_BYTES or "\x00" in schema:
        raise ConfigurationError(
            f"{_mask(url)}: schema must be 1-{MAX_IDENTIFIER_BYTES} bytes without NUL "
            "(PostgreSQL would silently shorten a longer name)"
        )
    return schema


def _mask(url: str) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        userinfo, _, host = netloc.rpartition("@")
        netloc = f"{userinfo.partition(':')[0]}:***@{host}"
    query = "&".join(
        f"{p.partition('=')[0]}=***" if unquote(p.partition("=")[0]) == "password" else p
        for p in (parts.query.split("&") if parts.query else [])
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
