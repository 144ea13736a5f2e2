"""The brief's ledger, ported: one ``effects.json`` per session, rewritten whole for every record.

The brief (the lesson this project started from: docs/design.md) loads the JSON, adds ``{name,
result, at}`` under the ``tool_use_id``, writes ``effects.json.tmp`` and renames it over the old
file. As written there it is *not durable*: nothing is fsynced, so after a power loss the rename
may survive with an empty or partial file behind it. Our port adds what durability needs — fsync of
the ``.tmp`` before the rename and of the directory after it — so it is compared like for like with
the others. It keeps the brief's ``JSON.stringify(effects, null, 2)`` (indent 2).
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


class WholeFileLedger:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp = path.with_name(path.name + ".tmp")

    def load(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.path.read_text("utf-8"))
        except FileNotFoundError:
            return {}
        return data

    def save(self, effects: dict[str, Any]) -> None:
        fd = os.open(self.tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        try:
            os.write(fd, json.dumps(effects, indent=2).encode("utf-8"))
            os.fsync(fd)  # not in the brief: without it the rename can outlive the data
        finally:
            os.close(fd)
        os.replace(self.tmp, self.path)
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)  # not in the brief: makes the rename itself durable
        finally:
            os.close(dfd)

    def record(self, tool_use_id: str, name: str, result: Any) -> None:
        """One record, as the brief writes it: load, add, write .tmp, rename."""
        effects = self.load()
        effects[tool_use_id] = {"name": name, "result": result, "at": _now()}
        self.save(effects)

    def prefill(self, ids: list[str]) -> None:
        """Setup, not measured: add many records with one rewrite."""
        effects = self.load()
        at = _now()
        for tool_use_id in ids:
            effects[tool_use_id] = {"name": "noop_effect", "result": "ok", "at": at}
        self.save(effects)

    def size(self) -> int:
        return len(self.load())


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")
