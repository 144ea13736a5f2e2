"""The chaos of the concurrency torture (``toolledger._harness.concurrent_torture``), played by
the harness's own process: it starts the worker processes, pauses them (``SIGSTOP``) for a
random time — shorter than the lease, longer than it, or longer than every tool's timeout — and
continues them, kills them (``SIGKILL``) and replaces them; half of it aimed at a worker inside a
tool without a forwarded key, and some at a worker that has just begun a call's second attempt.
What it did goes into ``chaos.jsonl`` in the world, for a person reading a failed run.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._concurrent_evidence import WorkerInfo
from ._concurrent_worker import Shared, WorkerSpec, start_worker
from ._concurrent_world import UNSAFE_TOOLS, LogTail

if TYPE_CHECKING:
    from ._concurrent_report import ConcurrentReport

__all__ = ["Chaos"]

PAUSE_EVERY_S = 0.3  # mean time between two pauses
KILL_EVERY_S = 1.0  # mean time between two kills
AIM_AGAIN = 0.5  # how often a second attempt at a call without a forwarded key is killed
AIM_FIRST = 0.2  # until a kill has landed inside a tool: how often a first attempt is killed
STOP_WAIT_S = 8.0  # how long workers may take to finish their run once told to stop
PROGRESS_EVERY_S = 10.0


@dataclass(slots=True)
class _Slot:
    host_id: str | None  # None: this host
    worker: WorkerInfo | None = None
    paused_until: float | None = None  # monotonic


class Chaos:
    """The parent's loop: start the workers, pause and continue them, kill and replace them."""

    def __init__(
        self,
        report: ConcurrentReport,
        rng: random.Random,
        shared: Shared,
        *,
        workers: int,
        other_hosts: int,
        max_timeout: float,
        this_host: str,
        forking: threading.Lock,
    ) -> None:
        self.report = report
        self.rng = rng
        self.shared = shared
        self.tail = LogTail(shared.world)
        self.max_timeout = max_timeout
        self.this_host = this_host
        self.forking = forking
        self.slots = [
            _Slot(f"torture-host-{n + 1}" if n < other_hosts else None) for n in range(workers)
        ]
        self.all: dict[str, WorkerInfo] = {}
        self.aimed: list[tuple[float, str]] = []  # (when, worker): kills aimed at second attempts
        # The first three pauses are one of each kind (short, past the lease, past every
        # timeout), in an order of the seed's: however short the run, each kind happens.
        self._first_kinds = rng.sample([0.2, 0.6, 0.9], 3)
        self._log = os.open(
            shared.world.path / "chaos.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600
        )
        for slot in self.slots:
            self._spawn(slot)

    def _spawn(self, slot: _Slot) -> None:
        serial = f"w{len(self.all):04d}"
        offset = self.rng.choice(
            [0.0, self.rng.uniform(-5, 5), self.rng.uniform(-3600, 3600), -86400 * 365]
        )
        spec = WorkerSpec(
            serial=serial,
            host_id=slot.host_id,
            offset=offset,
            threads=self.rng.randint(1, 3),
            seed=self.rng.randrange(2**32),
        )
        pid = start_worker(spec, self.shared)
        info = WorkerInfo(
            serial=serial,
            pid=pid,
            host=slot.host_id or self.this_host,
            offset=offset,
            threads=spec.threads,
            started=time.time(),
        )
        slot.worker, slot.paused_until = info, None
        self.all[serial] = info
        self.note("start", info, host=info.host, offset=offset, threads=spec.threads)
        self.report.workers += 1
        self.report.other_host_workers += slot.host_id is not None
        self.report.threads += spec.threads
        self.report.clock_offsets.append(offset)

    def note(self, what: str, info: WorkerInfo, **fields: Any) -> None:
        """What the chaos did, for a person reading a failed run (``chaos.jsonl``)."""
        line = {"t": time.time(), "what": what, "w": info.serial, "pid": info.pid, **fields}
        os.write(self._log, (json.dumps(line) + "\n").encode())

    def run(self, seconds: float, progress: Callable[[ConcurrentReport], None] | None) -> None:
        started = time.monotonic()
        end = started + seconds
        told = started
        next_pause = time.monotonic() + self.rng.expovariate(1 / PAUSE_EVERY_S)
        next_kill = time.monotonic() + self.rng.expovariate(1 / KILL_EVERY_S)
        while (now := time.monotonic()) < end:
            self._continue_due(now)
            self._reap()
            self._respawn()
            for e in self.tail.poll():
                self._aim(e, now)
            if now >= next_pause:
                self._pause(now)
                next_pause = now + self.rng.expovariate(1 / PAUSE_EVERY_S)
            if now >= next_kill:
                self._kill(self._pick([s for s in self.slots if s.worker]))
                next_kill = now + self.rng.expovariate(1 / KILL_EVERY_S)
            for due, serial in [a for a in self.aimed if a[0] <= now]:
                self.aimed.remove((due, serial))
                self._kill(
                    next((s for s in self.slots if s.worker and s.worker.serial == serial), None)
                )
            if progress is not None and now - told >= PROGRESS_EVERY_S:
                told = now
                self.report.phases["chaos"] = now - started
                progress(self.report)
            time.sleep(0.005)

    def _aim(self, start: dict[str, Any], now: float) -> None:
        """Now and then, kill a worker that has just begun a second attempt at a call without a
        forwarded key — before or after its effect — so that calls are in doubt twice. And,
        until one kill has landed inside such a tool, now and then one that has just begun a
        first attempt, at once: a tool naps for milliseconds, and the kills drawn at random
        instants may all fall outside one (a run that never killed a worker mid-effect proved
        less than it says)."""
        if start["tool"] not in UNSAFE_TOOLS:
            return
        if start["attempt"] > 1:
            if self.rng.random() < AIM_AGAIN:
                self.aimed.append((now + self.rng.uniform(0.0, 0.05), start["w"]))
        elif not self.report.kills_in_tool and not self.aimed and self.rng.random() < AIM_FIRST:
            self.aimed.append((now, start["w"]))

    def _pick(self, candidates: list[_Slot]) -> _Slot | None:
        """A slot at random — half the time one whose worker is inside an unsafe tool, and
        then, if one is, one running a second attempt (a call in doubt twice)."""
        inside = [s for s in candidates if s.worker and self.tail.in_unsafe_tool(s.worker.serial)]
        again = [
            s for s in inside if s.worker and self.tail.in_unsafe_tool(s.worker.serial, again=True)
        ]
        pool = (again or inside) if inside and self.rng.random() < 0.5 else candidates
        return self.rng.choice(pool) if pool else None

    def _pause(self, now: float) -> None:
        running = [s for s in self.slots if s.worker and s.paused_until is None]
        if len(running) <= 1:
            return  # keep one worker going
        slot = self._pick(running)
        assert slot is not None and slot.worker is not None
        lease = self.shared.lease_ttl
        kind = self._first_kinds.pop() if self._first_kinds else self.rng.random()
        if kind < 0.45:
            duration = self.rng.uniform(0.02, 0.8 * lease)
        elif kind < 0.75:
            duration = self.rng.uniform(1.1 * lease, 1.1 * lease + 0.5)
        else:
            duration = self.rng.uniform(self.max_timeout + 0.1, self.max_timeout + 1.0)
        with contextlib.suppress(ProcessLookupError):
            os.kill(slot.worker.pid, signal.SIGSTOP)
        slot.paused_until = now + duration
        self.report.pauses += 1
        self.note("stop", slot.worker, seconds=duration)
        self.report.pauses_past_lease += duration > lease
        self.report.pauses_past_timeout += duration > self.max_timeout

    def _continue_due(self, now: float) -> None:
        for slot in self.slots:
            if slot.worker and slot.paused_until is not None and slot.paused_until <= now:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.worker.pid, signal.SIGCONT)
                slot.paused_until = None
                self.note("continue", slot.worker)

    def _kill(self, slot: _Slot | None) -> None:
        if slot is None or slot.worker is None:
            return
        info = slot.worker
        self.report.kills_in_tool += self.tail.in_unsafe_tool(info.serial)
        info.ended, info.killed = time.time(), True  # alive, for sure, until this instant only
        with contextlib.suppress(ProcessLookupError):
            os.kill(info.pid, signal.SIGKILL)
        os.waitpid(info.pid, 0)
        self.report.kills += 1
        self.note("kill", info)
        slot.worker, slot.paused_until = None, None

    def _respawn(self) -> None:
        """Replace the workers that are gone — never while the operator acts: a fork then would
        hand the child a copy of whatever store lock the operator holds (a JSON store's
        ``flock`` is held until every copy of its descriptor is closed)."""
        empty = [s for s in self.slots if s.worker is None]
        if empty and self.forking.acquire(blocking=False):
            try:
                for slot in empty:
                    self._spawn(slot)
            finally:
                self.forking.release()

    def _reap(self) -> None:
        for slot in self.slots:
            info = slot.worker
            if info is None:
                continue
            pid, status = os.waitpid(info.pid, os.WNOHANG)
            if pid:  # it ended by itself: a crash (its log says why); a fresh one replaces it
                info.ended, info.exit_code = time.time(), os.waitstatus_to_exitcode(status)
                self.note("exited", info, code=info.exit_code)
                slot.worker = None

    def stop(self) -> None:
        """Continue every paused worker, tell all to finish, kill those that do not."""
        for slot in self.slots:
            if slot.worker and slot.paused_until is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.worker.pid, signal.SIGCONT)
                slot.paused_until = None
        self.shared.world.stop()
        deadline = time.monotonic() + STOP_WAIT_S
        for slot in self.slots:
            info = slot.worker
            if info is None:
                continue
            while True:
                pid, status = os.waitpid(info.pid, os.WNOHANG)
                if pid:
                    info.ended, info.exit_code = time.time(), os.waitstatus_to_exitcode(status)
                    break
                if time.monotonic() > deadline:
                    info.ended, info.killed = time.time(), True
                    os.kill(info.pid, signal.SIGKILL)
                    os.waitpid(info.pid, 0)
                    self.note("kill", info)
                    self.report.kills += 1
                    break
                time.sleep(0.01)
            slot.worker = None
        os.close(self._log)
