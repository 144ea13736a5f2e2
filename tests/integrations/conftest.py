"""The integrations' frameworks are optional: a test module whose framework is missing is skipped
with a loud reason — except under ``CI=true``, where it fails (``make test`` installs them)."""

from __future__ import annotations

import importlib
import os

import pytest


def require(module: str, extra: str, what: str | None = None) -> None:
    """Skip the calling test module unless ``module`` imports; fail instead under CI=true."""
    try:
        importlib.import_module(module)
    except ImportError as exc:
        reason = (
            f"{(what or extra).upper()} INTEGRATION NOT TESTED: {module} does not import ({exc}). "
            f"pip install 'toolledger[{extra}]' (make test installs it)."
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason} Under CI=true a skipped integration is a failure.")
        pytest.skip(reason, allow_module_level=True)
