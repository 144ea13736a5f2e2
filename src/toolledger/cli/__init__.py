"""The ``toolledger`` command line. All printing lives in this package."""

from __future__ import annotations

from .app import main

__all__ = ["main"]
