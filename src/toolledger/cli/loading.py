"""Importing what a command names as ``MODULE:ATTRIBUTE``."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import Any

from ..errors import ConfigurationError, ToolLedgerError


def load_object(target: str, *, shape: str = "MODULE:ATTRIBUTE", example: str) -> Any:
    """The object ``MODULE:ATTRIBUTE`` names (dots walk attributes), imported with the working
    directory on the path. Raises ``ConfigurationError`` saying what was expected."""
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigurationError(f"expected {shape} (e.g. {example}), got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r}: {exc}") from exc
    value: Any = module
    for part in attribute.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise ConfigurationError(f"{module_name!r} has no attribute {attribute!r}") from None
    return value


def refused_arguments(function: Any, *args: Any) -> str | None:
    """``function``'s signature when it cannot be called with ``args`` (a command names
    ``json:loads`` where it calls a factory with ``args``), so the command says so instead of
    calling it into a ``TypeError``; ``None`` when it can, or has no signature to read."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None  # some builtins: the call itself will tell
    try:
        signature.bind(*args)
    except TypeError:
        return str(signature)
    return None


def built(function: Any, target: str, what: str, *args: Any) -> Any:
    """``function(*args)``, the factory a command named as ``target``: an error it raises that
    is not toolledger's (``json:loads`` handed a store) becomes a ``ConfigurationError`` naming
    the factory and what it was to build, not a traceback."""
    try:
        return function(*args)
    except ToolLedgerError:
        raise
    except Exception as exc:
        raise ConfigurationError(
            f"{target} raised {type(exc).__name__} while building {what}: {exc}. Name a "
            f"factory that returns {what}."
        ) from exc
