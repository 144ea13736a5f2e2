"""Agent sessions as DBOS workflows: a fleet of workers on an engine you already trust.

DBOS (``pip install 'toolledger[dbos]'``) queues each session as a workflow, runs it on one of
its workers, and after a worker dies restarts the workflow from its last recorded step — at
least once. The session's own checkpoints, its lease and the effects ledger keep each tool's
effect at most once inside that (once, for a tool that forwards its idempotency key): a
session run again resumes where it stopped and never repeats a recorded call.

```python
import toolledger as tl
from dbos import DBOS
from toolledger.integrations import dbos as tl_dbos

def make_agent() -> tl.Agent:              # called once per worker process, on first use
    return tl.Agent(client=anthropic.Anthropic(), model=MODEL, tools=TOOLS,
                    store=tl.open_store("postgresql://db/app"))

DBOS(config={"name": "support", "system_database_url": "postgresql://db/app_dbos",
             "executor_id": "worker-3"})   # stable per worker: its restart recovers its sessions
tl_dbos.register(make_agent)               # before DBOS.launch()
DBOS.launch()
tl_dbos.register_queue(worker_concurrency=8)   # after it: DBOS keeps queues in its database

handle = tl_dbos.enqueue(session="outage-42", prompt="...")   # any process; or client=DBOSClient
outcome = handle.get_result()              # a SessionOutcome: status, reason, final_text ...
```

The workflow receives only the agent's registered name, the session id and the prompt; the
worker builds its ``Agent`` from the factory registered under that name. It calls
``agent.run`` as one DBOS step, so a finished run is never repeated by a recovery, and an
unfinished one is resumed by the next. The run's answer ends the workflow: ``completed``,
``max_turns``, or a session that stopped for a person (``needs_attention``,
``awaiting_approval``, with the reason). A session someone else holds (``SessionBusyError``: a
paused or dead worker's lease, a call still in progress elsewhere), a store that went away, or
a model API that is down or overloaded is tried again after a durable ``DBOS.sleep``, with
backoff, for up to ``max_wait`` seconds; any other error ends the workflow with
``SessionWorkflowError``.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

try:
    from dbos import (
        DBOS,
        DBOSClient,
        EnqueueOptions,
        Queue,
        SetEnqueueOptions,
        SetWorkflowID,
        SetWorkflowTimeout,
        WorkflowHandle,
    )
except ImportError as exc:  # pragma: no cover - the extra is installed wherever this is tested
    raise ImportError(
        f"toolledger.integrations.dbos needs DBOS: pip install 'toolledger[dbos]' ({exc})"
    ) from exc

from ..agent._agent import Agent, Run
from ..errors import (
    ConfigurationError,
    EffectInProgressError,
    LeaseLostError,
    ModelCallError,
    SessionBusyError,
    SessionConflictError,
    StoreUnavailableError,
    ToolLedgerError,
)
from ..records import RunStatus
from ..stores.store import check_session_id

__all__ = [
    "DEFAULT_AGENT",
    "QUEUE",
    "WORKFLOW",
    "SessionOutcome",
    "SessionQueuedError",
    "SessionWorkflowError",
    "enqueue",
    "register",
    "register_queue",
]

QUEUE = "toolledger"
"""The queue ``register_queue`` and ``enqueue`` use unless told otherwise."""
WORKFLOW = "toolledger.session"
"""The workflow's registered name (what a ``DBOSClient`` enqueues)."""
DEFAULT_AGENT = "default"
PERSON = frozenset({RunStatus.NEEDS_ATTENTION, RunStatus.AWAITING_APPROVAL})


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionOutcome:
    """What a session workflow returns: where the session stands after its run.

    ``status`` and ``reason`` are the run's (``needs_attention`` and ``awaiting_approval`` mean a
    person must act, then the session be enqueued again). ``attempts`` counts the runs the
    workflow made (more than one when the session was busy or the model API down), ``waited``
    the seconds it slept between them.
    """

    session_id: str
    status: RunStatus
    reason: str | None
    final_text: str
    turns: int
    attempts: int = 1
    waited: float = 0.0

    @property
    def needs_person(self) -> bool:
        return self.status in PERSON

    @classmethod
    def of(cls, run: Run) -> SessionOutcome:
        return cls(
            session_id=run.session_id,
            status=run.status,
            reason=run.reason,
            final_text=run.final_text,
            turns=run.turns,
        )


class SessionWorkflowError(ToolLedgerError):
    """A session workflow ended without an answer: ``agent.run`` raised ``error`` (its class
    name) with ``message``, and it is not worth retrying, or ``max_wait`` ran out. The session
    itself is intact; enqueue it again once the cause is gone."""

    def __init__(self, message: str, *, session_id: str, error: str) -> None:
        super().__init__(message, session_id=session_id)
        self.error = error

    def __reduce__(self) -> tuple[Any, ...]:
        # DBOS pickles a workflow's exception; keyword-only fields need saying how to rebuild.
        return (_workflow_error, (self.message, self.session_id, self.error))


def _workflow_error(message: str, session_id: str, error: str) -> SessionWorkflowError:
    return SessionWorkflowError(message, session_id=session_id, error=error)


class SessionQueuedError(SessionConflictError):
    """``enqueue`` found the session queued or running already, with another prompt: the new
    prompt was not enqueued (a session runs one workflow at a time). ``workflow_id`` names the
    one in the way; enqueue again when it has finished."""

    def __init__(self, message: str, *, session_id: str, workflow_id: str) -> None:
        super().__init__(message, session_id=session_id)
        self.workflow_id = workflow_id


# -- the workers' side -------------------------------------------------------------------------


@dataclass
class _Registered:
    factory: Callable[[], Agent]
    retry_interval: float
    max_retry_interval: float
    max_wait: float
    agent: Agent | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self) -> Agent:
        with self.lock:  # the factory runs once per process, whichever workflow comes first
            if self.agent is None:
                self.agent = self.factory()
            return self.agent

    def backoff(self, attempt: int) -> float:
        return float(min(self.max_retry_interval, self.retry_interval * 2 ** (attempt - 1)))


_AGENTS: dict[str, _Registered] = {}


def register(
    agent: Agent | Callable[[], Agent],
    *,
    name: str = DEFAULT_AGENT,
    retry_interval: float = 1.0,
    max_retry_interval: float = 30.0,
    max_wait: float = 3600.0,
) -> None:
    """Make this process a worker for sessions enqueued under ``name``.

    ``agent`` is an ``Agent`` or a function returning one, called once, on the first session
    this process runs (so a worker forked or started later builds its own client and store).
    Call it in every worker before ``DBOS.launch()``, which recovers this executor's
    unfinished sessions. A busy session, a store away or a model API failing is tried again
    after ``retry_interval`` seconds, doubling up to ``max_retry_interval``, until ``max_wait``
    seconds of waiting have passed. Registering ``name`` again replaces it.
    """
    if retry_interval <= 0 or max_retry_interval < retry_interval or max_wait < 0:
        raise ConfigurationError(
            "need 0 < retry_interval <= max_retry_interval and max_wait >= 0, got "
            f"{retry_interval}, {max_retry_interval}, {max_wait}"
        )
    factory: Callable[[], Agent] = (lambda: agent) if isinstance(agent, Agent) else agent
    _AGENTS[name] = _Registered(factory, retry_interval, max_retry_interval, max_wait)


def register_queue(
    name: str = QUEUE,
    *,
    worker_concurrency: int | None = None,
    concurrency: int | None = None,
    limit: int | None = None,
    period: float | None = None,
    polling_interval_sec: float = 1.0,
) -> Queue:
    """Declare the sessions' queue in DBOS's system database (after ``DBOS.launch()``).

    ``worker_concurrency`` caps the sessions one worker runs at once, ``concurrency`` the whole
    fleet's; ``limit`` sessions may start per ``period`` seconds. A session waiting out a busy
    lease keeps its slot while it sleeps. Idempotent: every worker may call it.
    """
    if (limit is None) != (period is None):
        raise ConfigurationError("limit and period go together")
    return DBOS.register_queue(
        name,
        worker_concurrency=worker_concurrency,
        global_concurrency=concurrency,
        limiter=None if limit is None or period is None else {"limit": limit, "period": period},
        polling_interval_sec=polling_interval_sec,
    )


@dataclass(frozen=True, slots=True)
class _Attempt:
    """One step's answer (recorded by DBOS, so a recovery replays it): the outcome, or the
    error and whether it is worth another try."""

    outcome: SessionOutcome | None = None
    error: str | None = None
    message: str = ""
    retry: bool = False


def _retryable(exc: ToolLedgerError) -> bool:
    if isinstance(exc, SessionBusyError | LeaseLostError | EffectInProgressError):
        return True  # someone else holds the session or one of its calls: wait for them
    if isinstance(exc, StoreUnavailableError):
        return True
    if isinstance(exc, ModelCallError):  # no answer, a timeout, overloaded, a server error
        code = exc.status_code
        return code is None or code >= 500 or code in (408, 409, 429)
    return False


@DBOS.step(name="toolledger.agent_run")
def _agent_run(agent_name: str, session: str, prompt: str | None) -> _Attempt:
    registered = _AGENTS.get(agent_name)
    if registered is None:
        return _Attempt(
            error="ConfigurationError",
            message=f"no agent registered as {agent_name!r} in this worker "
            "(toolledger.integrations.dbos.register before DBOS.launch)",
        )
    try:
        agent = registered.get()
        if agent.provider.is_async:
            run = asyncio.run(agent.arun(session=session, prompt=prompt))
        else:
            run = agent.run(session=session, prompt=prompt)
    except ToolLedgerError as exc:
        return _Attempt(error=type(exc).__name__, message=str(exc), retry=_retryable(exc))
    return _Attempt(outcome=SessionOutcome.of(run))


@DBOS.workflow(name=WORKFLOW)
def _session_workflow(agent_name: str, session: str, prompt: str | None) -> SessionOutcome:
    # Deterministic on replay: every decision below depends only on recorded step answers and
    # the attempt count, and DBOS.sleep replays its recorded wake-up time.
    registered = _AGENTS.get(agent_name)
    waited = 0.0
    attempts = 0
    while True:
        attempts += 1
        answer = _agent_run(agent_name, session, prompt)
        if answer.outcome is not None:
            return replace(answer.outcome, attempts=attempts, waited=waited)
        pause = registered.backoff(attempts) if registered is not None else 0.0
        if not answer.retry or registered is None or waited + pause > registered.max_wait:
            gave_up = f" (gave up after {attempts} attempts, {waited:.0f}s)" if answer.retry else ""
            raise SessionWorkflowError(
                f"session {session!r}: {answer.error}: {answer.message}{gave_up}",
                session_id=session,
                error=answer.error or "",
            )
        DBOS.sleep(pause)
        waited += pause


# -- any process's side ------------------------------------------------------------------------


def enqueue(
    *,
    session: str,
    prompt: str | None = None,
    agent: str = DEFAULT_AGENT,
    queue: str = QUEUE,
    client: DBOSClient | None = None,
    priority: int | None = None,
    timeout: float | None = None,
) -> WorkflowHandle[SessionOutcome]:
    """Queue a run of ``session`` (started with ``prompt``, resumed, or continued with a new
    ``prompt``) and return its workflow handle; ``handle.get_result()`` is a ``SessionOutcome``.

    From a process where DBOS is launched, or through ``client`` (a ``DBOSClient`` on the same
    system database, with the workers' application name) from any other. The session id is the
    queue's deduplication id, so a session has at most one workflow queued or running on
    ``queue``: enqueuing it again while one is (a retried request, a second web handler) returns
    that workflow's handle when the prompt is the same or ``None``, and raises
    ``SessionQueuedError`` when it is another prompt, which would otherwise be lost. Once the
    workflow has finished, ``enqueue`` starts a new one: after a person resolved an in-doubt call
    or decided an approval, ``enqueue(session=...)`` continues the session.

    ``priority`` orders the queue (1 first); ``timeout`` (seconds from the workflow's start) has
    DBOS cancel the workflow at its next step — a run already inside ``agent.run`` goes on to its
    end, and the session stays resumable.
    """
    sid = check_session_id(session)
    workflow_id = f"{sid}#{uuid.uuid4().hex[:12]}"
    args = (agent, sid, prompt)
    handle: WorkflowHandle[SessionOutcome]
    if client is not None:
        options: EnqueueOptions = {
            "workflow_name": WORKFLOW,
            "queue_name": queue,
            "workflow_id": workflow_id,
            "deduplication_id": sid,
            "duplication_policy": "return-existing",
        }
        if priority is not None:
            options["priority"] = priority
        if timeout is not None:
            options["workflow_timeout"] = timeout
        handle = client.enqueue(options, *args)
    else:
        found = DBOS.retrieve_queue(queue)
        if found is None:
            raise ConfigurationError(
                f"no DBOS queue {queue!r}: call register_queue() after DBOS.launch()"
            )
        with (
            SetWorkflowID(workflow_id),
            SetWorkflowTimeout(timeout) if timeout is not None else nullcontext(),
            SetEnqueueOptions(
                deduplication_id=sid, duplication_policy="return-existing", priority=priority
            ),
        ):
            handle = found.enqueue(_session_workflow, *args)
    existing = handle.get_workflow_id()
    if existing != workflow_id and prompt is not None:
        theirs = _inputs(existing, client)
        if theirs is not None and theirs != args:
            raise SessionQueuedError(
                f"session {sid!r} is already queued or running as workflow {existing!r} "
                "with another prompt; enqueue again once it has finished",
                session_id=sid,
                workflow_id=existing,
            )
    return handle


def _inputs(workflow_id: str, client: DBOSClient | None) -> tuple[Any, ...] | None:
    """The ``(agent, session, prompt)`` a queued session workflow was given (``None``: it is
    gone, or its inputs are not ours to read)."""
    lister = client.list_workflows if client is not None else DBOS.list_workflows
    found = lister(workflow_ids=[workflow_id], load_input=True)
    if not found or found[0].input is None:
        return None
    given = found[0].input.get("args")
    return tuple(given) if given is not None else None
