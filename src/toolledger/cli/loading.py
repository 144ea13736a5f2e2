"""Importing what a command names as ``MODULE:ATTRIBUTE``."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError, ToolLedgerError


def load_object(target: str, *, shape: str = "MODULE:ATTRIBUTE", example: str) -> Any:
    """The object ``MODULE:ATTRIBUTE`` names (dots walk attributes), imported with the working
    directory on the path. Raises ``ConfigurationError`` saying what was expected."""
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigurationError(f"expected {shape} (e.g. {example}), got {target!r}")
    file_name = os.sep in module_name or "/" in module_name
    if file_name or (module_name.endswith(".py") and Path(module_name).is_file()):
        # A file's name: importing ``tools.py`` would run ``tools`` first, then fail on ``py``.
        raise ConfigurationError(f"{_a_file(module_name, attribute)} Nothing was imported.")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f" {_a_file(module_name, attribute)}" if module_name.endswith(".py") else ""
        raise ConfigurationError(f"cannot import {module_name!r}: {exc}.{hint}") from exc
    except SystemExit as exc:  # a script, run as it was imported, that ended the program
        raise ConfigurationError(
            f"importing {module_name!r} called sys.exit({exc.code!r}){_where(exc)}: it is a "
            "program, not a module to import. Name a module that defines the object and "
            "imports without running a program."
        ) from exc
    # Anything else its own code raised as it was imported goes up with its traceback: an
    # error in a user's own code is theirs to read whole.
    value: Any = module
    for part in attribute.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise ConfigurationError(f"{module_name!r} has no attribute {attribute!r}") from None
    return value


def _a_file(module_name: str, attribute: str) -> str:
    stem = Path(module_name).stem
    return (
        f"{module_name!r} is a file's name; name its module instead, as Python imports it (e.g. "
        f"{stem}:{attribute} from the directory that holds {stem}.py, or with that directory on "
        "PYTHONPATH)."
    )


def _where(exc: BaseException) -> str:
    """`` (at FILE:LINE)``: the last line of the program's own code that ran before ``exc`` —
    not Python's or an installed package's line that raised it (``json.loads`` handed bad
    text) — or the last line of all when none of it ran; empty when there is no line."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    installed = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})
    own = [
        f for f in frames if not f.filename.startswith(installed) and not f.filename.startswith("<")
    ]
    line = (own or frames)[-1]
    return f" (at {line.filename}:{line.lineno})"


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
