"""A call judged over is read once more before anyone is told it is in doubt, as a run does
before it settles one (``toolledger.engine._started``): an attempt leaves flight, and its
process exits, only after its outcome committed, so a record still the same when read again is
truly over, and one that changed finished (or moved to another attempt) in between. Listings
(``in_doubt``, ``started``), ``verify``, ``history``, timelines, the console and a fork's
effects left behind all judge through here."""

from __future__ import annotations

from typing import Protocol

from .._liveness import Over, Running, Verdict
from ..records import EffectRecord, Lease, Status
from .contract import Backend

__all__ = ["confirmed", "current", "shown"]


class Judging(Protocol):
    """What a re-read needs of a store (``StoreCore``): its backend, and its judgement."""

    @property
    def backend(self) -> Backend: ...

    def judge(self, record: EffectRecord, lease: Lease | None = None) -> Verdict: ...


ROUNDS = 3


def confirmed(
    store: Judging,
    judged: list[tuple[EffectRecord, Verdict]],
    left: dict[tuple[str, str], EffectRecord | None] | None = None,
) -> list[tuple[EffectRecord, Verdict]]:
    """``judged`` (``started`` records with their verdicts) with every ``Over`` verdict
    confirmed: a record unchanged when read again stays; one that finished is left out (into
    ``left``, if given, as it was read: ``None`` if it was removed); one that moved to another
    attempt is judged again, for ``ROUNDS`` rounds at most — a call still moving after them is
    listed running. The order is kept."""
    out = list(judged)
    for _ in range(ROUNDS):
        over = [k for k, (_, v) in enumerate(out) if isinstance(v, Over)]
        if not over:
            return out
        now = _read(store, [out[k][0] for k in over])
        moved = False
        gone: set[int] = set()
        for k in over:
            r = out[k][0]
            found = now.get((r.session_id, r.tool_use_id))
            if found == r:
                continue
            if found is None or found.status is not Status.STARTED:
                gone.add(k)  # it finished (or was settled) meanwhile
                if left is not None:
                    left[(r.session_id, r.tool_use_id)] = found
            else:
                out[k] = (found, store.judge(found))
                moved = True
        out = [pair for k, pair in enumerate(out) if k not in gone]
        if not moved:
            return out
    return [
        (r, Running("it kept moving as it was read") if isinstance(v, Over) else v) for r, v in out
    ]


def current(
    store: Judging, record: EffectRecord, lease: Lease | None = None
) -> tuple[EffectRecord, Verdict | None]:
    """``record`` (``started``) as it is now, with its verdict — ``None`` when it finished (the
    record returned is then not ``started``): a verdict ``Over`` is confirmed first
    (``confirmed``). A record removed meanwhile (a prune) is not called in doubt."""
    left: dict[tuple[str, str], EffectRecord | None] = {}
    kept = confirmed(store, [(record, store.judge(record, lease))], left)
    if kept:
        return kept[0]
    found = left.get((record.session_id, record.tool_use_id))  # as the re-read found it
    if found is None or found.status is Status.STARTED:
        return record, Running("it was removed, or moved on, as it was read; look again")
    return found, None


def shown(store: Judging, record: EffectRecord, lease: Lease | None = None) -> Verdict:
    """The verdict for a view that shows ``record`` as it was read: a record that changed once
    judged over was still going when it was read."""
    now, verdict = current(store, record, lease)
    if verdict is None or now != record:
        return Running("it moved on as it was read; look again")
    return verdict


def _read(store: Judging, records: list[EffectRecord]) -> dict[tuple[str, str], EffectRecord]:
    """``records`` read again: one read a session."""
    by_session: dict[str, list[str]] = {}
    for r in records:
        by_session.setdefault(r.session_id, []).append(r.tool_use_id)
    out: dict[tuple[str, str], EffectRecord] = {}
    for sid, ids in by_session.items():
        for tid, found in store.backend.read_effects(sid, ids).items():
            out[(sid, tid)] = found
    return out
