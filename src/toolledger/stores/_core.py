"""The core of ``Store``, the one door to every backend: the store's clock, verdicts on
attempts and leases, sessions, transcripts, approvals, and ``apply``, through which everything
toolledger writes goes (and so through the ``redact`` hook). ``Store`` and ``Ledger``
(``.store``) and the reads built on it (``._history``, ``.retention``) stand on it.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Generator, Sequence
from functools import partial
from typing import Self

from .._invisible import shown_id
from .._lineage import Branch, made_by_fork
from .._liveness import Over, Running, Runtime, Verdict, judge, lease_state, this_process
from .._nul import nul_free_ops
from .._redact import redact_ops
from ..errors import (
    ConfigurationError,
    EffectInProgressError,
    InvalidSessionIdError,
)
from ..ops import Op
from ..records import (
    ApprovalRecord,
    EffectRecord,
    Lease,
    SessionState,
    Status,
    StoredMessage,
)
from . import _again as again
from . import _copies as copies
from .contract import AsyncBackend, Backend, InlineAsync, Inspectable

__all__ = ["StoreCore", "check_session_id", "in_progress_error", "undecided"]

MAX_SESSION_ID_CHARS = 256

_UNKNOWN = "\x00unknown"  # no session id holds a control character
_ROOT_HOPS = 64  # forks of forks written before roots were kept, walked back to the first
_ROOTS_KEPT = 4096


_CONTROL = re.compile("[\x00-\x1f\x7f]")


def check_session_id(session_id: object) -> str:
    """Session ids are 1-256 characters with no control characters; anything else (``../``,
    ``/``, quotes, any script) is fine and stored safely by every backend."""
    if not isinstance(session_id, str):
        raise InvalidSessionIdError(f"a session id must be a str, not {type(session_id).__name__}")
    if not session_id or len(session_id) > MAX_SESSION_ID_CHARS:
        raise InvalidSessionIdError(
            f"a session id must be 1-{MAX_SESSION_ID_CHARS} characters, got {len(session_id)}"
        )
    if _CONTROL.search(session_id) is not None:
        raise InvalidSessionIdError(
            f"session id {session_id[:40]!r} holds a control character (NUL, newline …)"
        )
    try:
        session_id.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidSessionIdError(
            f"session id {session_id[:40]!r} is not valid Unicode (lone surrogate)"
        ) from None
    return session_id


def undecided(verdict: Verdict) -> bool:
    """Whether only more watching can decide ``verdict`` (``Running.watch``, no renewal seen)."""
    return isinstance(verdict, Running) and verdict.watch is not None and not verdict.renewed


def in_progress_error(
    record: EffectRecord, verdict: Running, *, action: str = "run again"
) -> EffectInProgressError:
    """``record``'s attempt may still take effect, so it cannot be ``action`` now."""
    # Names read from the store, on the error's line: a line break in one is shown escaped
    # (``shown_id``), never starting a line that passes for a command to paste.
    holder = shown_id(record.worker) if record.worker else "another worker"
    until = (
        f" until {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(verdict.until))} at least"
        if verdict.until is not None
        else " for as long as that process lives"
    )
    return EffectInProgressError(
        f"{record.tool!r} ({shown_id(record.tool_use_id)}) in session {record.session_id!r} is in "
        f"progress: attempt {record.attempt} by {holder} may still take effect ({verdict.why})"
        f"{until}. It cannot be {action} now; "
        + (
            "retry later to get its stored result."
            if action == "run again"
            else "look again once its attempt is over (its outcome written, or in doubt)."
        ),
        session_id=record.session_id,
        tool_use_id=record.tool_use_id,
        holder=record.worker,
        until=verdict.until,
    )


def _walk_to_root(session_id: str) -> Generator[str, SessionState | None, str | None]:
    """``StoreCore.lineage_root``'s reads: yields each session whose state it needs, is sent
    that state; returns the root (``None``: ``session_id`` is no fork's)."""
    root = session_id
    for _ in range(_ROOT_HOPS):
        state = yield root
        fork = made_by_fork(state.lineage) if state is not None else None
        if fork is None:
            break
        if fork.root is not None:
            root = fork.root
            break
        root = fork.source  # a fork written before roots were kept: its source's root, if any
    return None if root == session_id else root


def default_worker_id() -> str:
    """``host:pid:random`` — who wrote a record; unique per process."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def checked_worker_id(worker_id: object) -> str | None:
    """``worker_id`` when a store can keep it; raises ``ConfigurationError``."""
    if worker_id is None or (isinstance(worker_id, str) and worker_id.isprintable()):
        return worker_id
    # Written on every record this worker makes, compared by its clean-ups and printed: a NUL
    # fails every write on PostgreSQL, and a control character shows a person another worker.
    raise ConfigurationError(
        f"worker_id {worker_id!r} must be text without control or invisible characters "
        "(or None: host, process id and a random part)"
    )


class StoreCore:
    """What every reader and writer of a store goes through (``Store`` is this and the reads
    built on it): the backend, the store's clock, liveness verdicts, ``apply``."""

    def __init__(
        self,
        backend: Backend,
        *,
        async_backend: AsyncBackend | None = None,
        clock: Callable[[], float] = time.time,
        worker_id: str | None = None,
        redact: Callable[[str], str] | None = None,
        runtime: Runtime | None = None,
    ) -> None:
        self.backend = backend
        self.async_backend: AsyncBackend = async_backend or InlineAsync(backend)
        self.clock = clock
        """This worker's clock: the timestamps people read (``created_at``, ``updated_at``).
        Nothing that decides liveness uses it: that is ``now()``, the store's clock."""
        self.worker_id = checked_worker_id(worker_id) or default_worker_id()
        self.redact = redact
        self.runtime = runtime or this_process()
        """This process as liveness sees it (identity, attempts in flight, leases watched)."""
        self.place: str = getattr(backend, "place", None) or backend.url
        """The database itself, whatever the spelling of its URL (a backend's ``place``: its
        file's device and inode, its directory's, its server and schema; else its URL): the
        attempts this process runs are registered, and the leases it watches kept, by it."""
        self.shared_clock = bool(getattr(backend, "shared_clock", False))
        self._fresh_now: Callable[[], float] | None = getattr(backend, "fresh_now", None)
        self.checks_clock = bool(getattr(backend, "checks_clock", False))
        """The backend refuses an intent whose deadline was set on a reading of its clock that
        the clock no longer agrees with (``UpdateEffect.at``): PostgreSQL's."""
        """Whether ``now()`` is one clock every worker reads (a database server's) rather than
        each machine's own (a file store's): on a shared clock a lease expires by its expiry;
        on machines' own clocks, only once it was watched unrenewed for its time to live."""
        self._before_close: list[Callable[[], None]] = []
        self._closed = False
        self._hooks_lock = threading.Lock()
        self._roots: dict[str, str | None] = {}

    def before_close(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` when this store is closed, before its backend is (used to write what a
        failed commit left behind one last time). On a store closed already, ``fn`` runs now:
        its close does not come again."""
        with self._hooks_lock:  # a close in another thread sees the hook, or runs it now
            now = self._closed
            if not now and fn not in self._before_close:
                self._before_close.append(fn)
        if now:
            fn()

    def _closing(self) -> None:
        with self._hooks_lock:
            self._closed = True
            hooks, self._before_close = self._before_close, []
        for fn in hooks:
            fn()

    def now(self) -> float:
        """The store's clock (``Backend.now``): lease expiries and deadlines are on it."""
        return self.backend.now()

    def judge(self, record: EffectRecord, lease: Lease | None = None) -> Verdict:
        """Whether a ``started`` record's attempt may still take effect (``Running``) or is
        over (``Over``): see ``toolledger._liveness``. Reads the session's lease unless given."""
        if record.status is not Status.STARTED:
            return Over(f"it is {record.status.value}")
        if record.copied:  # a branch's copy: its attempt is its origin's, judged as the origin's
            return copies.verdict_of(self.backend, record, self._judge_own)
        return self._judge_own(record, lease)

    def _judge_own(self, record: EffectRecord, lease: Lease | None) -> Verdict:
        if lease is None and record.lease_token is not None:
            lease = self.backend.read_lease(record.session_id)
        return self.judge_with(record, lease)

    def judge_with(self, record: EffectRecord, lease: Lease | None) -> Verdict:
        """``record``'s verdict with ``lease`` as the caller read it (``None``: the session
        holds none), as ``judged`` makes it."""
        return self.judged(
            partial(
                judge,
                record,
                lease=lease,
                runtime=self.runtime,
                url=self.place,
                shared_clock=self.shared_clock,
            )
        )

    def fresh_now(self) -> float:
        """``now``, read afresh where the store's clock is a shared one carried forward between
        readings (``Backend.fresh_now``): for judging that something is over."""
        return self._fresh_now() if self._fresh_now is not None else self.now()

    def judged(self, at: Callable[..., Verdict]) -> Verdict:
        """``at(now=…)``, a judgement on the store's clock; an ``Over`` the clock decided
        (``Over.clocked``), on a reading of a shared clock that may be stale, is judged again
        on a fresh one (``Backend.fresh_now``): the clock may have stepped back since, and the
        attempt still be running."""
        verdict = at(now=self.now())
        if isinstance(verdict, Over) and verdict.clocked and self._fresh_now is not None:
            return at(now=self._fresh_now())
        return verdict

    def lineage_root(self, session_id: str) -> str | None:
        """The session whose ledger claims every call made on a branch of ``session_id``'s
        lineage, once for all of them (``toolledger.engine._claims``): the first session of
        the lineage, for a session a fork made; ``None`` for one no fork made (its own ledger
        is that place). A session's root is fixed when it is made, so it is read once per store
        (a fork written before roots were kept: its source's, found the same way)."""
        known = self._roots.get(session_id, _UNKNOWN)
        if known is not _UNKNOWN:
            return known
        walk = _walk_to_root(session_id)
        try:
            source = next(walk)
            while True:
                source = walk.send(self.backend.read_session(source))
        except StopIteration as done:
            return self._knew(session_id, done.value)

    def known_lineage_root(self, session_id: str) -> tuple[bool, str | None]:
        """``lineage_root`` if this store knows it without reading: ``(True, root)``, else
        ``(False, None)``."""
        known = self._roots.get(session_id, _UNKNOWN)
        return (False, None) if known is _UNKNOWN else (True, known)

    async def alineage_root(self, session_id: str) -> str | None:
        """``lineage_root`` on the store's async backend."""
        known = self._roots.get(session_id, _UNKNOWN)
        if known is not _UNKNOWN:
            return known
        walk = _walk_to_root(session_id)
        try:
            source = next(walk)
            while True:
                source = walk.send(await self.async_backend.read_session(source))
        except StopIteration as done:
            return self._knew(session_id, done.value)

    def note_lineage(self, session_id: str, lineage: tuple[Branch, ...]) -> None:
        """Keep what a state read for another reason says of ``session_id``'s lineage root
        (``lineage``: its ``SessionState.lineage``; ``()`` for a session made now, or none),
        so ``lineage_root`` reads nothing for it."""
        fork = made_by_fork(lineage)
        if fork is None:
            self._knew(session_id, None)
        elif fork.root is not None:
            self._knew(session_id, fork.root)

    def _knew(self, session_id: str, root: str | None) -> str | None:
        if len(self._roots) >= _ROOTS_KEPT:
            self._roots.clear()
        self._roots[session_id] = root
        return root

    def listed_elsewhere(self, record: EffectRecord) -> bool:
        """Whether ``record`` is a branch's copy of a call its origin still holds: listed, and
        settled, in the origin session, once for the whole lineage."""
        return copies.listed_elsewhere(self.backend, record)

    def lease_state(self, lease: Lease | None) -> Verdict:
        """Whether a session's lease is held (``Running``) or may be taken (``Over``): see
        ``toolledger._liveness.lease_state``. One that is neither missing nor given back is
        judged as ``judged`` says: an ``Over`` on a stale reading of a shared clock is judged
        again on a fresh one."""
        at = partial(
            lease_state, lease, runtime=self.runtime, url=self.place, shared_clock=self.shared_clock
        )
        if lease is None or lease.expires_at <= 0:
            return at(now=self.now())
        return self.judged(at)

    def apply(self, session_id: str, ops: Sequence[Op]) -> list[bool]:
        """Commit ``ops`` through the backend, after the ``redact`` hook (see
        ``toolledger._redact``), with a NUL of their free text written ``\\x00`` (see
        ``toolledger._nul``). Everything toolledger writes goes through here."""
        return self.backend.apply(session_id, self._prepare(ops))

    async def aapply(self, session_id: str, ops: Sequence[Op]) -> list[bool]:
        return await self.async_backend.apply(session_id, self._prepare(ops))

    def _prepare(self, ops: Sequence[Op]) -> list[Op]:
        # The redact hook first: its text, too, must be text every backend can keep.
        if self.redact is not None:
            ops = redact_ops(list(ops), self.redact)
        return nul_free_ops(ops)

    @property
    def url(self) -> str:
        return self.backend.url

    @property
    def durable(self) -> bool:
        """False for ``memory://``: nothing survives the process."""
        return self.backend.durable

    def sessions(self) -> list[str]:
        """Every session id with a ledger record or an agent state, sorted."""
        return sorted(self.backend.session_ids())

    def holds(self, session_id: str) -> bool:
        """Whether the store holds ``session_id``: an agent state or a ledger record."""
        return self.backend.read_session(session_id) is not None or bool(
            self.backend.read_effect_ids(session_id)
        )

    def session(self, session_id: str) -> SessionState | None:
        """An agent session's state, or ``None``."""
        return self.backend.read_session(session_id)

    def session_states(self) -> list[SessionState]:
        """Every agent session's state."""
        return self.backend.list_sessions()

    def messages(self, session_id: str, since: int = 0) -> list[StoredMessage]:
        """A session's transcript, from ``seq`` ``since`` on."""
        return self.backend.read_messages(session_id, since)

    def abandoned(self, session_id: str) -> dict[int, list[StoredMessage]]:
        """A rewound session's abandoned branches, by number: the messages a rewind took out of
        its transcript, each with the seq it had (``toolledger.branches._branching``)."""
        return self.backend.read_abandoned(session_id)

    def approvals(self, session_id: str | None = None) -> list[ApprovalRecord]:
        """The approval requests of one session, or of all."""
        return self.backend.read_approvals(session_id)

    def lease(self, session_id: str) -> Lease | None:
        """A session's lease, as stored (``toolledger._liveness`` judges it)."""
        return self.backend.read_lease(session_id)

    def integrity(self) -> list[str] | None:
        """What the backend's own check finds wrong (an empty list: sound), or ``None`` when it
        has no such check."""
        if not isinstance(self.backend, Inspectable):
            return None
        return list(self.backend.integrity_check())

    def started(
        self, *, watch: float = 0.0, sleep: Callable[[float], None] = time.sleep
    ) -> list[tuple[EffectRecord, Verdict]]:
        """Every ``started`` record of every session with its verdict, oldest first: ``Running``
        (in progress: leave it alone) or ``Over`` (in doubt: a person may settle it).

        A verdict that only watching can decide (a worker this process cannot judge by its
        process table, on a file store: ``Running.watch``) is watched for up to ``watch``
        seconds — its lease renewed meanwhile, or not for a whole time to live — before the
        list is returned."""
        found = self._started()
        left = watch  # counted by what it slept, so it ends whatever the clocks do
        while True:
            pending = [
                v.watch for _, v in found if isinstance(v, Running) and undecided(v) and v.watch
            ]
            if not pending or left <= 0:
                return found
            pause = min(max(pending), left, 1.0)
            left -= pause
            sleep(pause)
            found = self._started()

    def _started(self) -> list[tuple[EffectRecord, Verdict]]:
        records = sorted(self.backend.in_doubt(), key=lambda r: (r.created_at, r.session_id))
        leases: dict[str, Lease | None] = {}
        out: list[tuple[EffectRecord, Verdict]] = []
        for r in records:
            if copies.listed_elsewhere(self.backend, r):
                continue  # one call, listed once: where its lineage made it
            if r.session_id not in leases:
                leases[r.session_id] = self.backend.read_lease(r.session_id)
            out.append((r, self.judge(r, leases[r.session_id])))
        return again.confirmed(self, out)

    def current(
        self, record: EffectRecord, lease: Lease | None = None
    ) -> tuple[EffectRecord, Verdict | None]:
        """A ``started`` record as it is now, judged (``None``: it finished) — read again when
        judged over (``toolledger.stores._again``)."""
        return again.current(self, record, lease)

    def shown(self, record: EffectRecord, lease: Lease | None = None) -> Verdict:
        """The verdict for a view of ``record`` as it was read (``toolledger.stores._again``)."""
        return again.shown(self, record, lease)

    def in_doubt(self, *, watch: float = 0.0) -> list[EffectRecord]:
        """Every in-doubt call of every session — started, and its attempt provably over —
        oldest first. Calls still in progress are in ``started()`` (``watch``: as there)."""
        return [r for r, verdict in self.started(watch=watch) if isinstance(verdict, Over)]

    def close(self) -> None:
        self._closing()
        self.backend.close()

    async def aclose(self) -> None:
        self._closing()
        await self.async_backend.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<Store {self.url}{'' if self.durable else ' (not durable)'}>"
