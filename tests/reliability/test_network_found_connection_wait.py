"""Found by the network fault tests, fixed: ``op_timeout`` bounds a store operation that needs a
new connection too.

The watchdog is armed once the pool has handed a connection over. When the server went silent
(a partition, a black-holed route) the first operation was cut at ``op_timeout`` as documented,
its connection discarded — and every later one waited for a new connection, which could not be
made, for ``pool_timeout`` (10 s by default) whatever ``op_timeout`` said. The wait for a
connection is now bounded by the smaller of the two. (``connect_timeout=2`` only makes the
pool's own attempts give up sooner, so that closing the store here does not wait for one.)
"""

from __future__ import annotations

import time

import pytest

import toolledger as tl

from ..conftest import with_params
from .faultproxy import BLACK_HOLE, running_proxy

pytestmark = pytest.mark.postgres

OP_TIMEOUT = 1.0


def test_op_timeout_bounds_an_operation_that_needs_a_new_connection(
    postgres_url: str, postgres_schema: str
) -> None:
    with running_proxy() as proxy:
        url = with_params(
            proxy.url(postgres_url), schema=postgres_schema, op_timeout="1", connect_timeout="2"
        )
        with tl.open_store(url) as store:
            assert store.backend.read_session("s") is None
            proxy.set_mode("both", BLACK_HOLE)
            try:
                waited: list[float] = []
                # The pool's open connections are cut by the watchdog, one operation each;
                # then an operation needs a new connection.
                while len(waited) < 3 and max(waited, default=0) < OP_TIMEOUT + 1.0:
                    started = time.monotonic()
                    with pytest.raises(tl.StoreUnavailableError):
                        store.backend.read_session("s")
                    waited.append(time.monotonic() - started)
            finally:
                proxy.heal()
        assert max(waited) < OP_TIMEOUT + 1.0, f"store operations waited {waited}"
