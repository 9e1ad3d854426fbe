"""Provides Intake: what has arrived at the engine and is not scheduled yet. It queues commands from
any thread, applies them on the owner thread, and takes submitted requests in as `preparing` until
they are tokenized and handed to the scheduler."""

from __future__ import annotations

import threading
from collections import deque
from typing import Protocol

from backend.protocol import Backend, Clock
from magnitude_tui.engine.context import fit_conversation
from magnitude_tui.engine.events import (
    Cancel,
    CloseSession,
    Command,
    ForgetSession,
    Rejection,
    RejectReason,
    RestoreOutcome,
    RestoreSession,
    SeqUpdate,
    SessionRestored,
    SetPolicy,
    SetSpec,
    Submit,
)
from magnitude_tui.engine.report import seq_update
from magnitude_tui.engine.text import ReplyText
from magnitude_tui.engine.warm import WarmResume
from scheduler.budget import Policy
from scheduler.planner import RequestError
from scheduler.retokenized import aligned_prompt
from scheduler.sequence import Sequence
from scheduler.speculation import SpecMode
from scheduler.types import DoneReason, ErrorKind, Phase, Request
from scheduler.validation import check_request

Queued = tuple[Command, float]  # a command with the time it was queued


class Admission(Protocol):
    """All the intake asks of the scheduler: its context sizes, and the calls that hand it a
    request, end one, or change what it runs."""

    n_ctx: int
    n_ctx_seq: int

    def add(self, seq: Sequence) -> None: ...

    def held_tokens(self) -> list[list[int]]: ...

    def finish(self, seq: Sequence, reason: DoneReason, error: str | None = None,
               kind: ErrorKind | None = None) -> None: ...

    def cancel(self, request_id: str) -> Sequence | None: ...

    def close_session(self, session_id: str) -> list[Sequence]: ...

    def set_policy(self, policy: Policy) -> None: ...

    def set_spec(self, mode: SpecMode) -> None: ...


class Intake:
    """Commands queued from any thread; requests submitted and not yet reported done (`live`).

    Only `queue` and `pending` may be called from other threads; the rest runs on the owner thread.
    """

    def __init__(self, backend: Backend, scheduler: Admission, clock: Clock, warm: WarmResume | None,
                 notice_chars: int | None) -> None:
        self.backend = backend
        self.scheduler = scheduler
        self.clock = clock
        self.warm = warm
        # A request whose messages hold this many characters is announced as `preparing` in a
        # report of its own before the chat template and tokenizer run (None: never).
        self.notice_chars = notice_chars
        self._lock = threading.Lock()
        self._commands: deque[Queued] = deque()
        self.live: dict[str, Sequence] = {}  # submitted and not yet reported done
        self._extra: list[SeqUpdate] = []  # updates for requests that never became live
        self._rejected: list[Rejection] = []  # submits refused before they became requests
        self._sessions_seen: set[str] = set()  # conversations a request named (until closed)
        self._intake: list[Sequence] = []  # submitted, not yet tokenized (phase `preparing`), FIFO
        self._noticed = False  # the last step only announced slow requests; tokenize them now
        self._notices: list[SessionRestored] = []  # answers to RestoreSession, for take_notices()

    # ---- any thread ----------------------------------------------------------------------------

    def queue(self, command: Command) -> None:
        t = self.clock()  # a submit's queue time and TTFT count from here
        with self._lock:
            self._commands.append((command, t))

    def pending(self) -> bool:
        """Commands queued and not applied yet."""
        with self._lock:
            return bool(self._commands)

    # ---- owner thread --------------------------------------------------------------------------

    @property
    def unprepared(self) -> bool:
        """Requests taken in and not tokenized yet."""
        return bool(self._intake)

    def take_extra(self) -> list[SeqUpdate]:
        extra, self._extra = self._extra, []
        return extra

    def take_rejected(self) -> list[Rejection]:
        rejected, self._rejected = self._rejected, []
        return rejected

    def take_notices(self) -> list[SessionRestored]:
        notices, self._notices = self._notices, []
        return notices

    def apply(self, cancellations_only: bool = False) -> None:
        with self._lock:
            if not self._commands:
                return  # the usual step: nothing was sent since the last one
            if cancellations_only:
                todo, keep = split_cancellations(self._commands)
                self._commands = deque(keep)
            else:
                todo = list(self._commands)
                self._commands.clear()
        for cmd, t in todo:
            if isinstance(cmd, Submit):
                self._take(cmd.request, t)
            elif isinstance(cmd, Cancel):
                self._cancel(cmd.request_id)
            elif isinstance(cmd, CloseSession):
                self._close(cmd.session_id)
            elif isinstance(cmd, ForgetSession):
                self._close(cmd.session_id)
                if self.warm is not None:
                    self.warm.forget(cmd.session_id)
            elif isinstance(cmd, SetPolicy):
                self.scheduler.set_policy(cmd.policy)
            elif isinstance(cmd, RestoreSession):
                self._restore(cmd)
            elif isinstance(cmd, SetSpec):
                self.scheduler.set_spec(cmd.mode)

    def announce(self) -> bool:
        """Whether this step should only report slow requests as `preparing` (once in a row), so
        the user sees it while the next step tokenizes them."""
        if not self._noticed and any(self.slow_to_prepare(q) for q in self._intake
                                     if q.last_reported is None):
            self._noticed = True
            return True
        self._noticed = False
        return False

    def slow_to_prepare(self, seq: Sequence) -> bool:
        """Long messages: the chat template and tokenizer take long enough for the user to see."""
        limit = self.notice_chars
        req = seq.request
        return (limit is not None and req.prompt_tokens is None
                and sum(len(m.content) for m in req.messages) >= limit)

    def prepare_all(self) -> None:
        intake, self._intake = self._intake, []
        for seq in intake:
            if not seq.is_finished:
                self._prepare(seq)

    def _take(self, req: Request, t_submit: float) -> None:
        """Accept a submitted request as `preparing`; it is tokenized before the next schedule.
        A malformed one ends here, alone, with its error."""
        rid, sid = getattr(req, "request_id", None), getattr(req, "session_id", None)
        ids_ok = all(isinstance(x, str) and x for x in (rid, sid))
        if ids_ok and rid in self.live:
            self._reject(req, RejectReason.DUPLICATE_ID,
                         f"request id {rid!r} is already in use by a live request; use a new id")
            return
        try:
            check_request(req)
            if req.fork_from is not None and req.fork_from not in self._sessions_seen:
                raise RequestError(
                    f"fork_from {req.fork_from!r} names no conversation this engine knows (never "
                    "submitted, or closed); send the request without fork_from to start cold")
        except RequestError as e:
            if not ids_ok:
                self._reject(req, RejectReason.BAD_ID if isinstance(req, Request)
                             else RejectReason.MALFORMED, str(e))
                return
            seq = Sequence(req, [], t_submit=t_submit)
            seq.phase, seq.done_reason, seq.error = Phase.DONE, DoneReason.ERROR, str(e)
            seq.error_kind = e.kind
            self._extra.append(seq_update(seq, t_submit))
            return
        self._sessions_seen.add(req.session_id)  # checked: the ids are text
        self.live[req.request_id] = Sequence(req, [], t_submit=t_submit)
        self._intake.append(self.live[req.request_id])

    def _restore(self, cmd: RestoreSession) -> None:
        if self.warm is None:
            notice = SessionRestored(cmd.session_id, RestoreOutcome.UNSUPPORTED, detail="this engine saves no KV")
        else:
            notice = self.warm.restore(cmd)
        if notice.outcome is RestoreOutcome.RESTORED:
            self._sessions_seen.add(cmd.session_id)  # a known conversation: subagents may fork it
        self._notices.append(notice)

    def _reject(self, req: object, reason: RejectReason, message: str) -> None:
        rid, sid = getattr(req, "request_id", None), getattr(req, "session_id", None)
        self._rejected.append(Rejection(
            request_id=rid if isinstance(rid, str) else repr(rid)[:80],
            session_id=sid if isinstance(sid, str) else None, reason=reason, message=message))

    def _cancel(self, request_id: str) -> None:
        seq = self.live.get(request_id)
        if seq is not None and seq in self._intake:
            self._intake.remove(seq)
            self.scheduler.finish(seq, DoneReason.CANCELLED)
        else:
            self.scheduler.cancel(request_id)

    def _close(self, session_id: str) -> None:
        for seq in [q for q in self._intake if q.session_id == session_id]:
            self._intake.remove(seq)
            self.scheduler.finish(seq, DoneReason.CANCELLED)
        self.scheduler.close_session(session_id)
        self._sessions_seen.discard(session_id)

    def _chat_tokenizer(self, req: Request):
        if req.tools:
            return lambda ms: list(self.backend.tokenize_chat(ms, tools=req.tools))
        return lambda ms: list(self.backend.tokenize_chat(ms))

    def _constrain(self, seq: Sequence) -> None:
        """A request with tools or a response schema gets its grammar and its call parser."""
        req = seq.request
        if not req.tools and req.response_schema is None:
            return
        from backend.grammar import GrammarError, reply_constraint  # the converter loads llama_cpp
        from backend.tools import ToolCallParser

        try:
            constraint = reply_constraint(req, self.backend.tool_syntax)
        except GrammarError as e:
            raise RequestError(str(e)) from None
        seq.grammar, seq.grammar_on_open = constraint.grammar, constraint.on_open
        if constraint.syntax is not None:
            seq.tool_parser = ToolCallParser(constraint.syntax)

    def _prepare(self, seq: Sequence) -> None:
        """Tokenize an accepted request and queue it; a bad request fails alone, right here."""
        req = seq.request
        try:
            chat = req.prompt_tokens is None and req.prompt is None
            # A model without a chat template: the ChatML fallback's markers end a reply as text.
            stops = req.sampling.stop + (self.backend.chat_stops if chat else ())
            seq.detok = ReplyText(self.backend.detokenizer(), stops)
            if req.prompt_tokens is not None:
                prompt = list(req.prompt_tokens)
            elif req.prompt is not None:
                # Raw completion: the text as typed (special-token parsing off), BOS if the vocab adds one.
                prompt = self.backend.tokenize(req.prompt, add_bos=True)
            else:
                # A conversation that outgrew its sequence drops its oldest turns (context.py).
                limit = min(self.scheduler.n_ctx_seq, self.scheduler.n_ctx)
                fitted = fit_conversation(req.messages, self._chat_tokenizer(req),
                                          limit, seq.max_tokens, may_drop=req.drop_oldest_turns)
                prompt, seq.dropped_messages = fitted.prompt, fitted.dropped
                # A reply sent back as text may tokenize otherwise than the model wrote it: its
                # conversation's held tokens stand for that text (scheduler/retokenized.py).
                prompt = aligned_prompt(prompt, self.scheduler.held_tokens(), self.backend.token_bytes,
                                        max_len=limit - 1)
            bad = [t for t in prompt if not 0 <= t < self.backend.n_vocab]
            if bad:
                raise RequestError(f"token id {bad[0]} is outside the model's vocabulary "
                                   f"(0..{self.backend.n_vocab - 1})")
            seq.prompt = prompt
            self._constrain(seq)
            seq.metrics.on_prepared(self.clock())  # preparing ends here; queue time starts
            self.scheduler.add(seq)
        except RequestError as e:
            self.scheduler.finish(seq, DoneReason.ERROR, str(e), e.kind)
        except Exception as e:  # a template or tokenizer failure belongs to this request only
            self.scheduler.finish(seq, DoneReason.ERROR, f"could not prepare the prompt: {e}",
                                  ErrorKind.INVALID)


def split_cancellations(commands) -> tuple[list[Queued], list[Queued]]:
    """The cancel/close commands that can run now, and the rest in order. A cancel (or close)
    that follows a still-pending submit for its request (or session) must wait its turn, or the
    submit would run after it and the cancel would be lost."""
    todo, keep = [], []
    rids, sids = set(), set()
    for entry in commands:
        cmd = entry[0]
        if isinstance(cmd, Submit):
            # A malformed request may carry anything as its ids; it is rejected when taken in.
            rids.add(str(getattr(cmd.request, "request_id", None)))
            sids.add(str(getattr(cmd.request, "session_id", None)))
            keep.append(entry)
        elif ((isinstance(cmd, Cancel) and cmd.request_id not in rids)
              or (isinstance(cmd, CloseSession) and cmd.session_id not in sids)):
            todo.append(entry)
        else:
            keep.append(entry)
    return todo, keep
