"""A worker process of the concurrency torture: forked from the harness, it takes a host identity
and a clock offset of its own, then runs 1-3 threads that pick sessions at random and run them —
``Agent.run``, or a second delivery of a session's pending calls through ``run_tool_uses`` —
until the world says stop. Everything it sees goes into its log (``SharedWorld.log``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._liveness import HOST_ID_ENV
from .._tool_uses import run_tool_uses
from ..adapters.anthropic import read_tool_uses
from ..agent._agent import Agent
from ..approvals._queue import queue
from ..errors import (
    CorruptLedgerError,
    EffectInProgressError,
    LedgerWriteError,
    SessionConflictError,
    StoreError,
)
from ..records import EffectRecord, Status
from ..stores import Store, open_store
from ..tools import ToolSet
from ._concurrent_world import SharedWorld, prompt_of

__all__ = ["NORMAL", "Shared", "WorkerSpec", "alert_hook", "start_worker"]

NORMAL = (SessionConflictError, EffectInProgressError)
"""What a worker meets in the normal course of sharing sessions: the session is busy
(``SessionBusyError``), its lease was taken over (``LeaseLostError``) or it moved on
(``SessionConflictError``), or a call is running elsewhere (``EffectInProgressError``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Shared:
    """What every worker of a run shares, fixed before the first one forks."""

    store_url: str
    model_url: str
    world: SharedWorld
    tools: ToolSet
    lease_ttl: float
    duplicate_fraction: float
    setup: Callable[[], None] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSpec:
    serial: str  # "w0007": this process's name in the logs
    host_id: str | None  # TOOLLEDGER_HOST_ID for a worker "on another host"; None: this host
    offset: float  # its clock's offset, in seconds
    threads: int
    seed: int


def start_worker(spec: WorkerSpec, shared: Shared) -> int:
    """Fork a worker; returns its pid. The child never returns."""
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        _worker(spec, shared)
    except BaseException:
        code = 70
        with contextlib.suppress(BaseException):  # nothing left to tell it to
            shared.world.log("crash", type="worker", msg=traceback.format_exc()[-3000:])
    finally:
        os._exit(code)


def _worker(spec: WorkerSpec, shared: Shared) -> None:
    # The identity first: toolledger reads TOOLLEDGER_HOST_ID when this process first asks who
    # it is, and a forked child asks again (its pid is new).
    if spec.host_id is not None:
        os.environ[HOST_ID_ENV] = spec.host_id
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the harness stops its workers itself
    err = os.open(shared.world.path / "log" / f"{spec.serial}.err", os.O_WRONLY | os.O_CREAT, 0o600)
    os.dup2(err, 2)  # toolledger's warnings and alerts, kept out of the harness's terminal
    shared.world.join(spec.serial, spec.seed)
    if shared.setup is not None:
        shared.setup()
    _log_judgements(shared.world)
    logging.getLogger("toolledger").addHandler(_LoggedAlerts(shared.world))
    offset = spec.offset
    with open_store(
        shared.store_url,
        clock=lambda: time.time() + offset,
        worker_id=f"{spec.host_id or 'this-host'}:{os.getpid()}:{spec.serial}",
    ) as store:
        threads = [
            threading.Thread(
                target=_thread,
                args=(shared, store, random.Random(f"{spec.seed}/{n}")),  # noqa: S311
                name=f"{spec.serial}/{n}",
                daemon=True,
            )
            for n in range(spec.threads)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def _log_judgements(world: SharedWorld) -> None:
    """Log every judgement of this process that an attempt is over (``judged``), with when it
    began (``t0``) and ended: the checks compare the moment a worker judged a same-host attempt
    over with the moment its process died, which the next attempt's start does not tell. Wraps
    whatever ``judge`` the toolledger modules hold now (a broken build's too)."""
    from .. import _liveness as liveness

    held = {
        name: module.judge
        for name, module in list(sys.modules.items())
        if name.startswith("toolledger") and callable(getattr(module, "judge", None))
    }

    def wrap(inner: Callable[..., liveness.Verdict]) -> Callable[..., liveness.Verdict]:
        def judged(record: EffectRecord, **kwargs: Any) -> liveness.Verdict:
            t0 = time.time()
            verdict = inner(record, **kwargs)
            if isinstance(verdict, liveness.Over) and record.status is Status.STARTED:
                holder = record.holder
                world.log(
                    "judged",
                    tid=record.tool_use_id,
                    attempt=record.attempt,
                    t0=t0,
                    of_pid=holder.pid if holder else None,
                    of_host=holder.host if holder else None,
                    why=verdict.why[:200],
                    thread=threading.current_thread().name,
                )
            return verdict

        return judged

    for name, inner in held.items():
        sys.modules[name].judge = wrap(inner)  # type: ignore[attr-defined]


# An alert raised where no run's hook can be called — the background writer finding a kept
# outcome late, after its run returned — goes to the ``toolledger`` logger only, with the
# alert's dict as ``record.toolledger``: logged as the hook logs one.
_ALERT_TYPES = {"late_outcome": "LateOutcomeError", "ledger_write_failed": "LedgerWriteError"}


class _LoggedAlerts(logging.Handler):
    def __init__(self, world: SharedWorld) -> None:
        super().__init__(logging.ERROR)
        self.world = world

    def emit(self, record: logging.LogRecord) -> None:
        alert = getattr(record, "toolledger", None)
        if not isinstance(alert, dict) or alert.get("alert") not in _ALERT_TYPES:
            return
        # Every alert is logged; a run's own also reach its hook (``alert_hook``, "alert"):
        # told apart, so that none is counted twice.
        self.world.log(
            "alert_logged",
            type=_ALERT_TYPES[alert["alert"]],
            sid=alert.get("session_id"),
            tid=alert.get("tool_use_id"),
            attempt=alert.get("attempt"),
        )


def alert_hook(world: SharedWorld) -> Callable[[LedgerWriteError], None]:
    def hook(alert: LedgerWriteError) -> None:
        world.log(
            "alert",
            type=type(alert).__name__,
            sid=alert.session_id,
            tid=alert.tool_use_id,
            attempt=getattr(alert, "attempt", None),
            msg=alert.message[:500],
        )

    return hook


def _thread(shared: Shared, store: Store, rng: random.Random) -> None:
    import anthropic

    world = shared.world
    client = anthropic.Anthropic(
        base_url=shared.model_url, api_key="scripted", max_retries=0, timeout=60
    )
    hook = alert_hook(world)
    agent = Agent(
        client=client,
        model="claude-scripted",
        tools=shared.tools,
        store=store,
        approve=queue,
        lease_ttl=shared.lease_ttl,
        on_alert=hook,
    )
    while not world.stopped():
        names = world.active()
        if not names:
            time.sleep(0.02)
            continue
        name = rng.choice(names)
        again = rng.random() < shared.duplicate_fraction
        try:
            if again:
                what = _deliver_again(store, shared.tools, name, hook)
            else:
                what = agent.run(session=name, prompt=prompt_of(name)).status.value
        except NORMAL as exc:
            what = type(exc).__name__
        except StoreError as exc:
            if isinstance(exc, CorruptLedgerError | LedgerWriteError):
                what = "crash"
                world.log("crash", type=type(exc).__name__, msg=str(exc)[:1000], sid=name)
            else:  # the store was unavailable a while (a paused worker held its lock)
                what = "StoreError"
                world.log("store_error", msg=str(exc)[:300], sid=name)
        except Exception as exc:
            what = "crash"
            world.log(
                "crash",
                type=type(exc).__name__,
                msg=traceback.format_exc()[-3000:],
                sid=name,
            )
        world.log("run", sid=name, what=what, again=again)


def _deliver_again(store: Store, tools: ToolSet, session: str, hook: Any) -> str:
    """Hand the session's pending calls (its last turn, if it has no results yet) to
    ``run_tool_uses`` again, as a queue that delivers a message twice would."""
    messages = store.messages(session)
    last = messages[-1] if messages else None
    if last is None or last.role != "assistant" or not read_tool_uses(last.content):
        return "nothing pending"
    run_tool_uses(last.content, tools, ledger=store.ledger(session), approve=queue, on_alert=hook)
    return "delivered again"
