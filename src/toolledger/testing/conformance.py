"""The store contract, as one pytest class that runs against every backend.

Subclass ``StoreConformance`` in a test module and provide a ``store_url`` fixture returning a
fresh, empty location for each test (``open_store`` on the same URL must reopen it). Set
``durable = False`` for a backend whose contents do not outlive its handles.

A backend is done when it passes every test here.

Its tests are written in ``_contract_ledger`` (the effects ledger), ``_contract_sessions``
(sessions, transcripts, approvals, leases), ``_contract_retention`` (removing sessions) and
``_contract_branches`` (lineages, abandoned branches, sessions created with records); each
writes through the ``Store``'s own ``apply`` and reads through its readers, which reach the
backend unchanged (no ``redact`` hook is set here).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..stores import Store, open_store
from ._contract_branches import BranchContract
from ._contract_ledger import LedgerContract
from ._contract_retention import RetentionContract
from ._contract_sessions import SessionContract
from ._samples import make_approval, make_message, make_record, make_state

__all__ = ["StoreConformance", "make_approval", "make_message", "make_record", "make_state"]


class StoreConformance(LedgerContract, SessionContract, RetentionContract, BranchContract):
    """Every store passes these. Tests speak the public API plus the backend primitives (through
    ``Store.apply`` and the ``Store`` readers, which hand them to the backend as they are)."""

    durable = True

    @pytest.fixture
    def store_url(self) -> str:
        raise NotImplementedError("subclasses provide a store_url fixture")

    @pytest.fixture
    def store(self, store_url: str) -> Iterator[Store]:
        store = open_store(store_url)
        yield store
        store.close()
