"""``Agent``: the durable agent loop — killed at any instant, resumed, nothing done twice.

One turn, and what is durable when:

1. call the model;
2. **checkpoint A** — the assistant message (and so its tool_use ids, which exist only in this
   response) and the turn's counters, in one transaction — with the intent of the turn's call
   when it is the common one (``toolledger.engine._straight``). A crash before it loses nothing
   that matters: no tool ran, and the model is simply asked again;
3. ``run_tool_uses`` — intents before unsafe tools, outcomes the instant they return;
4. **checkpoint B** — the tool_result message, in the same transaction as the turn's last outcome.

So a turn with one call costs 2 durable writes (A with its intent, or A alone for a call safe to
re-run; then its outcome with B); a turn with several calls, or whose call must be asked about or
read first, costs one more for A alone, then one per intent; the final turn, with no tool call,
costs 1. (``TOOLLEDGER_GENERAL_PATH=1``: A is always written alone.)

Resuming reads the transcript: a last assistant message with tool_use blocks is a turn whose tools
are *pending*. They go through the ledger again — recorded ones answer from it, never-started
ones run, in-doubt ones follow docs/design.md, rule 6 — and every tool_use gets exactly one
tool_result, first in the next user message. A call nobody can settle stops the run with
``needs_attention`` *before* anything is sent to the model.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Generator, Sequence
from typing import Any

from .._crash import hit as crash_point
from .._liveness import Verdict
from ..adapters import provider_for
from ..adapters._shapes import StreamCutOff, check_fresh_ids
from ..approvals._notify import Notifier, Target, in_doubt_calls, notifier
from ..engine import _leases as leases
from ..engine import _telemetry as telemetry
from ..engine._background import keeper
from ..engine._drivers import (
    AlertHook,
    CallModel,
    Failure,
    Fence,
    IOContext,
    ReadLease,
    ReadMessages,
    ReadSession,
    Request,
    Sleep,
    adrive,
    drive,
    refuse_async_in_loop,
)
from ..engine._outcomes import Batch, CallOutcome, ahead
from ..engine._runner import process_batch
from ..errors import (
    ConfigurationError,
    LedgerWriteError,
    MalformedContentError,
    ModelCallError,
    SessionConflictError,
)
from ..ops import DropLease, Op, PutSession, TakeLease
from ..records import Lease, RunStatus, SessionState, StoredMessage
from ..stores.store import Store, check_session_id
from ..tools import ToolSet
from ._opening import keep, open_session
from ._state import (
    Run,
    Session,
    Usage,
    advance,
    commit_or_raise,
    run_of,
    turn_end,
    turn_start,
)
from ._stops import no_commands
from ._streaming import AgentStream
from ._transcripts import Transcripts, wire_for

__all__ = ["Agent", "Run", "Usage"]


def _http_error(exc: BaseException) -> int | None:
    """The HTTP status of a model API failure, or ``None`` where none was an error: an error the
    API streams after a 200 (Anthropic's ``error`` event, ``overloaded_error`` mid-reply) comes
    as an SDK error carrying that 200, which code that retries on the status reads as success."""
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) and status >= 400 else None


def give_back_later(store: Store, drop: DropLease) -> None:
    """Give back, in the background, a lease take that no run holds (``Agent._take``). Called
    from an ``except`` that may be handling ``GeneratorExit`` at the interpreter's exit, when no
    thread can start: then the lease is left to expire, as the process's end would leave it."""
    with contextlib.suppress(RuntimeError):
        keeper.keep(store, drop.session_id, [drop], [])


class Agent:
    """A tool-using agent whose every step is checkpointed in ``store``.

    ``client`` is ``anthropic.Anthropic`` (use ``run``) or ``anthropic.AsyncAnthropic`` (use
    ``await arun``) — or ``openai.OpenAI`` / ``openai.AsyncOpenAI`` (Chat Completions), or
    ``toolledger.adapters.openai.OpenAIResponses(client)`` (the Responses API): the provider is
    picked from the client (``toolledger.adapters.provider_for``). ``approve`` is asked before
    high-impact calls (see ``toolledger.approvals``); ``on_alert`` receives ledger alerts.
    ``on_in_doubt`` is told of each call left in doubt (a callable, a webhook URL or a
    ``toolledger.notify.Notifier``; see ``toolledger.notify``).
    ``max_turns`` bounds the model calls of one ``run``. ``lease_ttl`` is how long a run's hold on
    its session outlives a worker that stops renewing it (see ``toolledger.engine._leases``).

    An agent keeps the transcripts of the last few sessions it ran in memory: running one of
    them again reads only what the store holds beyond them (nothing, when its state is
    unchanged), never a transcript the store does not hold (``toolledger.agent._transcripts``).
    """

    def __init__(
        self,
        *,
        client: Any,
        model: str,
        tools: ToolSet | Sequence[Any],
        store: Store,
        approve: Any = None,
        system: str | None = None,
        max_turns: int = 20,
        max_tokens: int = 4096,
        on_alert: AlertHook | None = None,
        lease_ttl: float = 30.0,
        on_in_doubt: Notifier | Target | None = None,
    ) -> None:
        if not isinstance(store, Store):
            raise ConfigurationError("store= must be a toolledger Store (toolledger.open_store)")
        if max_turns < 1 or max_tokens < 1 or lease_ttl <= 0:
            raise ConfigurationError("max_turns, max_tokens and lease_ttl must be positive")
        self.provider = provider_for(client)
        self.model = model
        self.tools = tools if isinstance(tools, ToolSet) else ToolSet(tools)
        self.store = store
        self.approve = approve
        self.system = system
        self.max_turns = max_turns
        self.max_tokens = max_tokens
        self.on_alert = on_alert
        self.lease_ttl = lease_ttl
        self.on_in_doubt = notifier(on_in_doubt)
        # The last sessions this agent ran, so opening one again reads only what is new.
        self._transcripts = Transcripts()

    # -- entry points ----------------------------------------------------------------------------

    def run(
        self,
        *,
        session: str,
        prompt: str | None = None,
        on_text: Callable[[str], object] | None = None,
    ) -> Run:
        """Start ``session`` with ``prompt``, or resume it if it exists.

        An unfinished session resumes where it stopped (``prompt`` may repeat the one that
        started it, and is not appended twice). A completed one continues the conversation with
        a new ``prompt``; repeating its last prompt returns it as it is. Raises
        ``ModelCallError`` when the model API fails (the session stays resumable),
        ``StoreError`` when the store does, ``SessionBusyError`` when another worker runs the
        session, ``LeaseLostError`` when this run's lease was taken over, and
        ``EffectInProgressError`` when a call of its pending turn is still being run by an
        attempt that may take effect (a worker whose session this run took over): run it again
        after that attempt's deadline.

        A session held by a worker this process cannot judge by its process table (another
        host or container, a machine without a readable ``/proc``) on a file store is free once
        that worker stops renewing its lease for a whole TTL: ``run`` watches it for up to that
        long (at most its own ``lease_ttl`` or the holder's, whichever is longer), and raises
        ``SessionBusyError`` as soon as it sees a renewal, or when it has watched that long
        (``toolledger._liveness``; a later ``run`` in this process goes on watching).

        ``on_text``, when given, streams the model's replies: it is called with each piece of
        text as the model writes it (Anthropic; OpenAI Chat Completions and the Responses API).
        A reply is checkpointed only once it is complete: a process killed mid-stream loses the
        partial text, and the resumed run asks the model again — ``on_text`` is then given the
        whole reply from its start, after the part it was given before. ``stream`` is the same
        as an iterator.
        """
        if self.provider.is_async:
            raise ConfigurationError("this Agent has an async client: use `await agent.arun(...)`")
        refuse_async_in_loop(self.tools, "Agent.run")
        sid = check_session_id(session)
        self._check_streaming(on_text)
        with telemetry.agent_span(sid, self.model, self._vendor) as span:
            run = drive(self._loop(sid, prompt, on_text), self._io(session))
            telemetry.agent_done(span, run)
            return run

    async def arun(
        self,
        *,
        session: str,
        prompt: str | None = None,
        on_text: Callable[[str], object] | None = None,
    ) -> Run:
        """The async twin of ``run`` (``on_text`` may be a coroutine function)."""
        if not self.provider.is_async:
            raise ConfigurationError("this Agent has a sync client: use `agent.run(...)`")
        sid = check_session_id(session)
        self._check_streaming(on_text)
        with telemetry.agent_span(sid, self.model, self._vendor) as span:
            run = await adrive(self._loop(sid, prompt, on_text), self._io(session))
            telemetry.agent_done(span, run)
            return run

    def stream(self, *, session: str, prompt: str | None = None) -> AgentStream:
        """``run`` as an iterator of the model's text, piece by piece as it is written; the
        ``Run`` is the iterator's ``run`` once it is exhausted (errors are raised from the
        iteration). See ``toolledger.agent._streaming``."""
        if self.provider.is_async:
            raise ConfigurationError("this Agent has an async client: use `agent.arun(on_text=)`")
        self._check_streaming(lambda _: None)
        return AgentStream(
            lambda on_text: self.run(session=session, prompt=prompt, on_text=on_text),
            session=session,
        )

    def _check_streaming(self, on_text: Callable[[str], object] | None) -> None:
        if on_text is not None and not getattr(self.provider, "can_stream", False):
            raise ConfigurationError(
                f"the {self.provider.name} provider does not stream; run without on_text"
            )

    def _io(self, session: str) -> IOContext:
        return IOContext(
            store=self.store,
            session_id=session,
            approve=self.approve,
            on_alert=self.on_alert,
            model=self.provider,
        )

    @property
    def _vendor(self) -> str:
        """The provider as OpenTelemetry names it (``gen_ai.provider.name``)."""
        return self.provider.name.split("-")[0]

    # -- the loop, once --------------------------------------------------------------------------

    def _take(
        self, sid: str, current: Lease | None, state: Verdict
    ) -> Generator[Request, Any, TakeLease]:
        """Take the session's lease from ``current`` (judged ``state``) and hold it."""
        owner = f"{self.store.worker_id}/{uuid.uuid4().hex[:6]}"
        take = leases.take(
            current,
            state,
            session_id=sid,
            owner=owner,
            holder=self.store.runtime.holder,
            now=self.store.now(),
            ttl=self.lease_ttl,
        )
        # This process's run from before the take is durable (as an attempt is in flight before
        # its intent): another thread that reads our lease in between must find it held, not
        # left by a run of this process that ended — and take it over.
        live = self.store.runtime.live_runs
        live.add(owner)
        try:
            yield from commit_or_raise([take])
            yield Fence(take.lease, self.lease_ttl)  # held from here: the driver gives it back
        except BaseException as exc:
            live.discard(owner)  # an interrupt before the driver held it leaves it registered
            if not isinstance(exc, SessionConflictError):
                # The take may have landed (an interrupt, an unknown outcome) with no run to
                # give it back: this host's other processes would find it held for as long as
                # this process lives. Given back in the background, if it is still ours.
                give_back_later(self.store, DropLease(sid, take.lease.token, owner))
            raise
        return take

    def _loop(
        self, sid: str, prompt: str | None, on_text: Callable[[str], object] | None = None
    ) -> Generator[Request, Any, Run]:
        # The lease first: nothing is read that another worker could be changing.
        current: Lease | None = yield ReadLease()
        state = self.store.lease_state(current)
        left = leases.watching(state)
        # Held by a worker no process table here can judge: it is free once it goes a whole
        # time to live unrenewed, watched from here; a renewal seen meanwhile means busy. This
        # run watches for up to its own lease's time to live (or the holder's, if longer).
        ttl = (current.ttl if current is not None else None) or self.lease_ttl
        budget = max(self.lease_ttl, ttl)
        while left is not None and budget > 0:
            pause = min(left, max(0.05, ttl / 10), budget)
            budget -= pause
            yield Sleep(pause)
            current = yield ReadLease()
            state = self.store.lease_state(current)
            left = leases.watching(state)
        take = yield from self._take(sid, current, state)
        token = take.lease.token
        opened = yield from open_session(
            self.provider, self.store, self._transcripts, sid=sid, prompt=prompt, lease=take.lease
        )
        if opened is None:
            return (yield from self._result(sid, ()))
        s, called = opened
        first = len(s.messages)
        alerts: list[LedgerWriteError] = []

        def finish(s: Session) -> Run:
            keep(self.provider, self.store, self._transcripts, s, called=called, first=first)
            return self._finish(s, alerts)

        calls_left = self.max_turns
        head: list[Op] = []  # checkpoint A of the model's last answer, while not yet written
        while True:
            last = s.messages[-1]
            if last.role == "assistant":
                if s.calls is None:
                    s.calls = self.provider.tool_calls(last)
                if not s.calls:
                    if head:
                        yield from ahead(head)
                    if s.state.status is not RunStatus.COMPLETED:
                        s = yield from self._set_status(s, RunStatus.COMPLETED, None)
                    return finish(s)
                s, stop = yield from self._run_tools(s, alerts, token, head)
                head = []
                if stop:
                    return finish(s)
                continue
            if calls_left == 0:
                reason = f"stopped after {self.max_turns} model calls (max_turns)"
                s = yield from self._set_status(s, RunStatus.MAX_TURNS, reason)
                return finish(s)
            calls_left -= 1
            s, head = yield from self._call_model(s, on_text, called=called, first=first)

    def _call_model(
        self,
        s: Session,
        on_text: Callable[[str], object] | None,
        *,
        called: frozenset[str],
        first: int,
    ) -> Generator[Request, Any, tuple[Session, list[Op]]]:
        """The model's next answer: the session with it, and checkpoint A — the writes that make
        it durable before any of its calls runs (``_run_tools``: with the first call's intent,
        when it can carry them). ``called``: the call ids of the first ``first`` messages of
        the transcript, which no new call may reuse."""
        sent, wire = wire_for(self.provider, s.messages, s.wire)
        kwargs = self.provider.request(
            model=self.model,
            max_tokens=self.max_tokens,
            system=self.system,
            tools=self.tools,
            messages=s.messages,
            wire=sent,
        )
        span = telemetry.model_span(self.model, self._vendor, self.max_tokens)
        answer = yield CallModel(kwargs, span, on_text)
        if isinstance(answer, Failure):
            telemetry.model_done(span, error=answer.exc)
            unreadable = isinstance(answer.exc, RecursionError)  # the SDK's JSON decoder gave up
            cut = isinstance(answer.exc, StreamCutOff)  # a reply streamed in part: asked again
            if not (unreadable or cut or self.provider.is_api_error(answer.exc)):
                raise answer.exc
            reason = (
                "the model's response is nested too deep to read"
                if unreadable
                else f"model API error: {answer.exc}"
            )
            yield from self._set_status(s, RunStatus.FAILED, reason)
            raise ModelCallError(
                f"the model API failed for session {s.state.session_id!r}: {reason}. The "
                "session is saved; run it again to retry.",
                session_id=s.state.session_id,
                status_code=_http_error(answer.exc),
            ) from answer.exc
        try:
            turn = self.provider.read_response(answer)
            if turn.calls:
                later = s.messages[first:]
                check_fresh_ids(turn.calls, called, later, self.provider.call_ids)
        except MalformedContentError as exc:
            # A reply it cannot take as it is (cut off at its limit while it wrote a call, an
            # earlier call's id reused, say):
            # nothing of it is stored or run, and the session says why — not "running".
            telemetry.model_done(span, error=exc)
            yield from self._set_status(
                s, RunStatus.FAILED, f"the model's reply was refused: {exc}"
            )
            raise
        except BaseException as exc:
            telemetry.model_done(span, error=exc)
            raise
        telemetry.model_done(span, input_tokens=turn.input_tokens, output_tokens=turn.output_tokens)
        # Checkpoint A: the tool_use ids exist only in this response; they are durable before
        # any tool runs.
        return turn_start(self.provider, s, turn, self.store.clock(), wire)

    def _run_tools(
        self, s: Session, alerts: list[LedgerWriteError], token: int, head: list[Op]
    ) -> Generator[Request, Any, tuple[Session, bool]]:
        """Run (or reconcile) the pending calls of the last assistant message, after (or with)
        checkpoint A when ``head`` holds it; commit checkpoint B with the last outcome. Returns
        the session and whether to stop."""
        last = s.messages[-1]
        calls = s.calls if s.calls is not None else self.provider.tool_calls(last)
        committed: list[Session] = []

        def checkpoint_b(outcomes: list[CallOutcome]) -> list[Op]:
            after, ops = turn_end(self.provider, s, outcomes, self.store.clock(), self.store.url)
            committed.append(after)
            return ops

        ledger = self.store.ledger(s.state.session_id)
        batch: Batch = yield from process_batch(
            calls,
            self.tools,
            ledger,
            can_ask=self.approve is not None,
            tail=checkpoint_b,
            lease_token=token,
            head=head,
        )
        alerts.extend(batch.alerts)
        in_doubt_calls(self.on_in_doubt, s.state.session_id, batch.outcomes)
        error = batch.commit_error
        if error is not None:
            if type(error) is SessionConflictError and error.tool_use_id is not None:
                # A call's record moved on while this run ran it (another attempt, a person):
                # checkpoint B did not land. The turn stays pending; a person looks first.
                reason = "; ".join([error.message, *(a.message for a in batch.alerts)])
                s = yield from self._set_status(s, RunStatus.NEEDS_ATTENTION, reason)
                return s, True
            raise error
        (s,) = committed
        if s.state.status is not RunStatus.RUNNING:
            return s, True
        crash_point("after_checkpoint_b")
        if batch.alerts:
            # The model has the real results; the ledger does not. A person must look before
            # the agent goes on building on an effect the ledger cannot vouch for.
            reason = "; ".join(a.message for a in batch.alerts)
            s = yield from self._set_status(s, RunStatus.NEEDS_ATTENTION, reason)
            return s, True
        return s, False

    # -- helpers ---------------------------------------------------------------------------------

    def _set_status(
        self, s: Session, status: RunStatus, reason: str | None
    ) -> Generator[Request, Any, Session]:
        """The run stops with ``status`` for ``reason``: an error's or an alert's text, data
        (the model API's answer, a store's error, a model-chosen id), no command in it shown as
        one (``_stops.no_commands``) — only a stop for a person (``_stops.stop_reason``) names
        commands."""
        reason = None if reason is None else no_commands(reason)
        new = advance(s.state, self.store.clock(), status=status, reason=reason)
        yield from commit_or_raise([PutSession(new, s.state.version)])
        return Session(new, s.messages, wire=s.wire)

    def _finish(self, s: Session, alerts: list[LedgerWriteError]) -> Run:
        return run_of(self.provider, s, alerts)

    def _result(self, sid: str, alerts: Sequence[LedgerWriteError]) -> Generator[Request, Any, Run]:
        state: SessionState = yield ReadSession()
        messages: list[StoredMessage] = yield ReadMessages(0)
        return self._finish(Session(state, messages), list(alerts))
