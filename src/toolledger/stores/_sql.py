"""SQL shared by the SQLite and PostgreSQL backends: statements, row mapping, migrations.

Statements are written once with ``?`` placeholders; the PostgreSQL backend rewrites them to
``%s``. Only our own constants ever reach SQL text; every value travels as a parameter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..records import EffectRecord, Status
from .base import InsertEffect, UpdateEffect

EFFECT_COLUMNS = (
    "session_id, tool_use_id, tool, input_hash, status, attempt, result, error, "
    "created_at, updated_at, approved_by, worker"
)

INSERT_EFFECT = (
    f"INSERT INTO effects ({EFFECT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (session_id, tool_use_id) DO NOTHING"
)

# Compare-and-set: the WHERE clause is the whole concurrency story. A writer that lost the race
# (or a stale one) matches no row and learns it from the row count.
UPDATE_EFFECT = (
    "UPDATE effects SET tool = ?, input_hash = ?, status = ?, attempt = ?, result = ?, "
    "error = ?, created_at = ?, updated_at = ?, approved_by = ?, worker = ? "
    "WHERE session_id = ? AND tool_use_id = ? AND status = ? AND attempt = ?"
)

SELECT_EFFECTS = f"SELECT {EFFECT_COLUMNS} FROM effects WHERE session_id = ?"
SELECT_EFFECT = f"SELECT {EFFECT_COLUMNS} FROM effects WHERE session_id = ? AND tool_use_id = ?"
SELECT_SESSION_IDS = "SELECT DISTINCT session_id FROM effects"


def insert_params(op: InsertEffect) -> tuple[Any, ...]:
    r = op.record
    return (
        r.session_id,
        r.tool_use_id,
        r.tool,
        r.input_hash,
        r.status.value,
        r.attempt,
        r.result,
        r.error,
        r.created_at,
        r.updated_at,
        r.approved_by,
        r.worker,
    )


def update_params(op: UpdateEffect) -> tuple[Any, ...]:
    r = op.record
    return (
        r.tool,
        r.input_hash,
        r.status.value,
        r.attempt,
        r.result,
        r.error,
        r.created_at,
        r.updated_at,
        r.approved_by,
        r.worker,
        r.session_id,
        r.tool_use_id,
        op.expect_status.value,
        op.expect_attempt,
    )


def row_to_record(row: Sequence[Any]) -> EffectRecord:
    return EffectRecord(
        session_id=row[0],
        tool_use_id=row[1],
        tool=row[2],
        input_hash=row[3],
        status=Status(row[4]),
        attempt=int(row[5]),
        result=row[6],
        error=row[7],
        created_at=float(row[8]),
        updated_at=float(row[9]),
        approved_by=row[10],
        worker=row[11],
    )
