"""The ``redact=`` hook: scrub secrets from what a store keeps, before anything is written.

``open_store(url, redact=fn)`` applies ``fn(text) -> text`` to every string the store would keep
of tool *results*, error messages, prompts and the model's text, tool_result contents, and
approval inputs. It never touches tool_use ids, names or inputs in the transcript: a resume
matches pending calls to the ledger by them (the input's hash), and would refuse a transcript whose
inputs were edited. Keep secrets out of tool inputs (pass references, not the secret), or accept
that the transcript holds them.

A replay answers with the stored, redacted result: the model sees the scrubbed text the second
time. That is the trade the hook makes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any, assert_never

from .codec import encode_result
from .ops import (
    AbandonMessages,
    AppendMessages,
    DropLease,
    DropSession,
    HoldLease,
    InsertEffect,
    Op,
    PutApproval,
    PutSession,
    TakeLease,
    UpdateEffect,
)
from .records import ApprovalRecord, EffectRecord, StoredMessage

__all__ = ["Redactor", "redact_ops"]

Redactor = Callable[[str], str]


def _strings(value: Any, fn: Redactor) -> Any:
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, list):
        return [_strings(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: _strings(v, fn) for k, v in value.items()}
    return value


def _effect(record: EffectRecord, fn: Redactor) -> EffectRecord:
    result = record.result
    if result is not None:
        result = encode_result(_strings(json.loads(result), fn), tool=record.tool).stored
    error = fn(record.error) if record.error is not None else None
    return replace(record, result=result, error=error)


def _block(block: Any, fn: Redactor) -> Any:
    if not isinstance(block, dict):
        return block
    kind = block.get("type")
    if kind == "tool_use":
        return block  # ids, names and inputs are what a resume matches on: never rewritten
    if kind == "tool_result":
        return {**block, "content": _strings(block.get("content"), fn)}
    if kind == "text":
        return {**block, "text": fn(block.get("text", ""))}
    return block


def _message(message: StoredMessage, fn: Redactor) -> StoredMessage:
    content = message.content
    if isinstance(content, str):
        content = fn(content)
    elif isinstance(content, list):
        content = [_block(b, fn) for b in content]
    return replace(message, content=content)


def _approval(record: ApprovalRecord, fn: Redactor) -> ApprovalRecord:
    return replace(record, input=_strings(record.input, fn))


def redact_ops(ops: list[Op], fn: Redactor) -> list[Op]:
    out: list[Op] = []
    for op in ops:
        match op:
            case InsertEffect():
                out.append(replace(op, record=_effect(op.record, fn)))
            case UpdateEffect():
                out.append(replace(op, record=_effect(op.record, fn)))
            case AppendMessages():
                out.append(AppendMessages(tuple(_message(m, fn) for m in op.messages)))
            case PutApproval():
                out.append(replace(op, record=_approval(op.record, fn)))
            case (
                PutSession()
                | AbandonMessages()
                | TakeLease()
                | HoldLease()
                | DropLease()
                | DropSession()
            ):
                out.append(op)  # no text a person or a tool wrote: states, seqs, leases
            case _:
                assert_never(op)
    return out
