"""Optional dependencies, imported where they are needed, and the error that names the extra
that brings one: ``pip install 'toolledger[EXTRA]'``."""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import ConfigurationError

__all__ = ["require"]


def require(module: str, extra: str, *, what: str) -> ModuleType:
    """``import module``, or ``ConfigurationError`` saying that ``what`` needs the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package = module.split(".", maxsplit=1)[0]
        raise ConfigurationError(
            f"{what} needs {package} ({exc}): pip install 'toolledger[{extra}]'"
        ) from exc
