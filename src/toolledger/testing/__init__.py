"""Public helpers for testing code built on toolledger.

* ``toolledger.testing.conformance.StoreConformance`` — the contract every store backend passes
  (a plain pytest class; subclass it with a ``store_url`` fixture to test your own backend).
* ``Counter`` — a thread-safe count of real executions, per tool.

This package imports nothing from pytest unless you import ``conformance``.
"""

from __future__ import annotations

from .fakes import Counter

__all__ = ["Counter"]
