"""Carrying out a simulated worker's requests: each one its run yields (reads, commits, tool
invocations, model calls, approvals, alerts, fences, sleeps, background writes) is done against the
shared store at the current simulated instant, and its answer delivered after a simulated latency.
"""

from __future__ import annotations

import contextlib
from typing import Any

from ...adapters.anthropic import pairing_errors
from ...engine._background import moved_on
from ...engine._drivers import (
    Alert,
    Ask,
    CallModel,
    Commit,
    Failure,
    Fence,
    Invoke,
    IOContext,
    ReadEffectIds,
    ReadEffects,
    ReadLease,
    ReadLineageRoot,
    ReadMessages,
    ReadSession,
    Remember,
    Sleep,
)
from ...errors import SessionConflictError, StoreError, StoreUnavailableError, ToolLedgerError
from ...ops import DropLease
from ._cluster import Worker
from ._truth import Truth

__all__ = ["Requests"]


class Requests(Truth):
    """The workers' side of the simulation: stepping their runs, one request at a time."""

    def _deliver(
        self, w: Worker, gen: Any, answer: Any, *, throw: BaseException | None = None
    ) -> None:
        """Hand ``answer`` to the worker once its process runs (a paused thread waits)."""
        p = w.process
        if w.gen is not gen or not p.alive:
            return  # crashed meanwhile: the answer goes nowhere
        if not p.runnable:
            self._at(
                p.paused_until - self.t + 0.0001, lambda: self._deliver(w, gen, answer, throw=throw)
            )
            return
        self._step(w, answer, throw=throw)

    def _step(self, w: Worker, answer: Any, *, throw: BaseException | None = None) -> None:
        assert w.gen is not None
        self.steps += 1
        w.busy_since = None
        self._current = w  # whose writes these are, for the checks
        try:
            try:
                request = w.gen.throw(throw) if throw is not None else w.gen.send(answer)
            except StopIteration as stop:
                self._finish(w, stop.value, None)
                return
            except (ToolLedgerError, OSError) as exc:
                self._finish(w, None, exc)
                return
            self._handle(w, request)
        finally:
            self._current = None

    def _finish(self, w: Worker, value: Any, exc: BaseException | None) -> None:
        what = (
            type(exc).__name__
            if exc is not None
            else getattr(getattr(value, "status", None), "value", "done")
        )
        self.stats[f"run_{what}"] += 1
        self.note(f"{w.name} ends: {what}")
        io = w.io
        w.gen, w.io = None, None
        if io is not None and io.fence is not None:  # the driver's give-back
            lease = io.fence.lease
            io.fence = None
            w.process.runtime.live_runs.discard(lease.owner)
            with contextlib.suppress(ToolLedgerError):
                drop = DropLease(lease.session_id, lease.token, lease.owner)
                w.process.store.apply(lease.session_id, [drop])
        self._at(self.rng.uniform(0.01, 0.3), lambda: self._start_job(w))

    def _latency(self) -> float:
        return self.rng.expovariate(1 / 0.002)

    def _handle(self, w: Worker, request: Any) -> None:
        gen, io, p = w.gen, w.io, w.process
        assert io is not None
        sid = w.session
        if isinstance(
            request,
            (ReadEffects, ReadEffectIds, ReadSession, ReadMessages, ReadLease, ReadLineageRoot),
        ):
            self._read(w, request)
            return
        if isinstance(request, Commit):
            w.busy_since = self.t
            answer: Any = self._commit(w, request)
            cut = isinstance(answer, Failure) and isinstance(answer.exc, StoreUnavailableError)
            # A commit cut off, or whose answer was lost, hangs until its deadline cuts it.
            delay = self.config.op_timeout if cut else self._latency()
            self._at(delay, lambda: self._deliver(w, gen, answer))
            return
        if isinstance(request, Invoke):
            self._invoke(w, request)
            return
        if isinstance(request, CallModel):
            answer = self._model(w, request.kwargs)
            self._at(self.rng.uniform(0.02, 0.4), lambda: self._deliver(w, gen, answer))
            return
        if isinstance(request, Ask):
            try:
                decision = self.ask(p, request.request)
            except StoreError as exc:
                self._finish(w, None, exc)
                return
            self.note(
                f"{w.name} asks about {request.request.tool_use_id}"
                f"{' (in doubt)' if request.request.in_doubt else ''}: "
                f"{'pending' if decision.pending else decision.approved}"
            )
            self._at(self._latency(), lambda: self._deliver(w, gen, decision))
            return
        if isinstance(request, Alert):
            a = request.alert
            self.alerts.append((type(a).__name__, a.session_id or "", a.tool_use_id or ""))
            self.note(f"{w.name} ALERT {type(a).__name__} {a.session_id}/{a.tool_use_id}")
            self._at(0, lambda: self._deliver(w, gen, None))
            return
        if isinstance(request, Fence):
            io.fence = request
            io.renewed_at = p.runtime.monotonic()
            p.runtime.live_runs.add(request.lease.owner)
            self._heartbeat(w, io, request)
            self._at(0, lambda: self._deliver(w, gen, None))
            return
        if isinstance(request, Sleep):
            self._at(request.seconds, lambda: self._deliver(w, gen, None))
            return
        if isinstance(request, Remember):
            p.kept += 1
            self._keep(w, sid, request, 1.0)
            self._at(0, lambda: self._deliver(w, gen, None))
            return
        raise AssertionError(f"unknown request {request!r}")

    def _read(
        self,
        w: Worker,
        request: ReadEffects
        | ReadEffectIds
        | ReadSession
        | ReadMessages
        | ReadLease
        | ReadLineageRoot,
    ) -> None:
        gen, backend, sid = w.gen, w.process.store.backend, w.session
        w.busy_since = self.t
        try:
            if isinstance(request, ReadEffects):
                answer: Any = backend.read_effects(request.session or sid, request.tool_use_ids)
            elif isinstance(request, ReadEffectIds):
                answer = backend.read_effect_ids(sid)
            elif isinstance(request, ReadSession):
                answer = backend.read_session(request.session or sid)
            elif isinstance(request, ReadMessages):
                answer = backend.read_messages(request.session or sid, request.since)
            elif isinstance(request, ReadLineageRoot):
                answer = w.process.store.lineage_root(sid)
            else:
                answer = backend.read_lease(request.session or sid)
        except StoreError as exc:
            failed: StoreError = exc  # cut off: it hangs until its deadline cuts it
            self._at(self.config.op_timeout, lambda: self._deliver(w, gen, None, throw=failed))
            return
        self._at(self._latency(), lambda: self._deliver(w, gen, answer))

    def _commit(self, w: Worker, request: Commit) -> Any:
        io = w.io
        assert io is not None
        p = w.process
        ops = io.fenced(request.ops, request.fenced)
        try:
            flags = p.store.apply(request.session or w.session, ops)
        except (StoreError, SessionConflictError) as exc:
            return Failure(exc)
        io.landed(ops)
        if self.t < p.lose_replies_until:
            self.stats["lost_replies"] += 1
            self.note(f"{w.name} commit landed, answer lost")
            return Failure(
                StoreUnavailableError(
                    f"{p.store.url}: the connection was lost during COMMIT (simulated): the write "
                    "may or may not have been committed",
                    url=p.store.url,
                    outcome_unknown=True,
                )
            )
        return io.unfenced(flags, request.fenced)

    def give_back_later(self, store: Any, drop: DropLease) -> None:
        """``Agent._take``'s background give-back of a take no run holds, on simulated time:
        the process's own background writer (``_keep``), lost with the process."""
        worker = next((w for p in self.processes if p.store is store for w in p.workers), None)
        if worker is None or not worker.process.alive:
            return  # a crashed process's generator, finalised: its writer died with it
        worker.process.kept += 1
        self._keep(worker, drop.session_id, Remember([drop], []), 1.0)

    def _keep(self, w: Worker, sid: str, request: Remember, delay: float) -> None:
        """The process's background writer (``background.Keeper``): retry until the store takes
        it; a crash loses it. Its writes are the worker's own, deferred (for the checks)."""
        p = w.process

        def again() -> None:
            if not p.alive:
                return
            if not p.runnable:
                self._at(p.paused_until - self.t + 0.001, again)
                return
            self._current = w
            try:
                flags = p.store.apply(sid, request.ops)
            except StoreError:
                self._current = None
                self._keep(w, sid, request, min(delay * 2, 30.0))
                return
            except SessionConflictError:
                flags = [False] * len(request.ops)
            try:
                p.kept -= 1
                self.stats["kept_writes"] += 1
                for key in request.keys:
                    p.runtime.in_flight.discard(key)
                # As the real writer does: an outcome refused because its record moved on is
                # kept in the record (``Remember.moved``), its reads and writes the worker's own.
                if request.moved is not None:
                    for n in moved_on(p.store, sid, request.ops, flags):
                        with contextlib.suppress(ToolLedgerError):
                            request.moved(n)
            finally:
                self._current = None

        self._at(delay, again)

    def _heartbeat(self, w: Worker, io: IOContext, fence: Fence) -> None:
        def beat() -> None:
            if io.fence is not fence or not w.process.alive:
                return
            if not w.process.runnable:
                self._at(w.process.paused_until - self.t + 0.001, beat)
                return
            stuck = w.busy_since
            if stuck is not None and self.t - stuck > fence.ttl / 3:
                # As background.Heartbeats: a run stuck on the store stops being renewed.
                self.stats["renewals_withheld"] += 1
                self._at(fence.ttl / 3, beat)
                return
            try:
                ops = io.fenced([])
                w.process.store.apply(io.session_id, ops)
                io.landed(ops)
            except SessionConflictError:
                return
            except StoreError:  # cut off: the renewal hung until its deadline
                self._at(max(fence.ttl / 3, self.config.op_timeout), beat)
                return
            self._at(fence.ttl / 3, beat)

        self._at(fence.ttl / 3, beat)

    # -- tools ------------------------------------------------------------------------------------

    def _invoke(self, w: Worker, request: Invoke) -> None:
        gen, p = w.gen, w.process
        ctx = request.ctx
        if ctx is None and not request.check:  # (not an ``assert``: kept under ``python -O``)
            raise AssertionError("a simulated tool takes its ToolContext: how its attempt is told")
        key = (ctx.session_id, ctx.tool_use_id, ctx.attempt) if ctx is not None else None
        if key is not None and not request.check:
            w.invoking = key
        self.stats["checks" if request.check else "tool_runs"] += 1

        def send() -> None:
            if w.gen is not gen or not p.alive:
                return  # crashed before sending: no effect
            if not p.runnable:
                self._at(p.paused_until - self.t + 0.0001, send)
                return
            self.world.who = p.name
            self.world.local_time = p.local_time()
            self.world.honours_deadline = not p.sloppy
            before = len(self.world.effects)
            try:
                answer: Any = request.fn()
            except Exception as exc:
                answer = Failure(exc)
            if len(self.world.effects) > before:
                self._effect_made(self.world.effects[-1], w.session)
            if key is not None and not request.check and key in self.attempts:
                self.attempts[key].effect_done = True
            self._at(self.rng.uniform(0.001, 0.3), lambda: returned(answer))

        def returned(answer: Any) -> None:
            if w.gen is not gen or not p.alive:
                return
            if key is not None and not request.check:
                w.invoking = None
                attempt = self.attempts.get(key)
                if attempt is not None:
                    attempt.over = True
            self._deliver(w, gen, answer)

        self._at(self.rng.uniform(0.001, 0.6), send)

    def _model(self, w: Worker, kwargs: dict[str, Any]) -> Any:
        messages = kwargs["messages"]
        problems = pairing_errors(messages)
        if problems:
            self.violation(f"{w.session}: the model was sent a broken transcript: {problems}")
        turn = sum(1 for m in messages if m["role"] == "assistant")
        script = self.scripts[w.session]
        self.stats["model_calls"] += 1
        cached = self.replayed(w.session, turn)
        if cached is not None:
            return cached
        if turn >= len(script):
            return {
                "content": [{"type": "text", "text": "All done."}],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": 1, "output_tokens": 1},
            }
        blocks: list[dict[str, Any]] = [{"type": "text", "text": f"turn {turn}"}]
        for name, title in script[turn]:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_{w.session}_{turn}_{next(self._minted)}",
                    "name": name,
                    "input": {"title": title},
                }
            )
        return {
            "content": blocks,
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }
