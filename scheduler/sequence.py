"""Provides Sequence (one request's live state) and Session (one conversation's resident KV)."""

from __future__ import annotations

from collections.abc import Sequence as SequenceABC
from typing import Any

from scheduler.drafts import DraftKind
from scheduler.metrics import RequestMetrics
from scheduler.speculation import SpecState
from scheduler.types import DoneReason, ErrorKind, Phase, Priority, Request


class Sequence:
    """One request from submit to done: its tokens, how many of them are in the KV cache, its phase.

    One uniform rule (vLLM v1's) covers prompt, decode and recompute after preemption:
    `tokens = prompt + output`, and the rows still to evaluate are `tokens[num_computed:]`.
    A single pending row after some output is a decode row; anything longer is prefill.
    """

    def __init__(self, request: Request, prompt: list[int], *, t_submit: float) -> None:
        self.request = request
        self.prompt = prompt
        self.output: list[int] = []
        self.seq_id: int | None = None
        self.last_seq_id: int | None = None  # kept after the slot is released, for reports
        self.phase = Phase.PREPARING
        self.num_computed = 0  # rows committed to this sequence's KV (positions 0..num_computed-1)
        self.num_cached = 0  # rows reused from a session or fork parent at the latest admission
        self.admit_order = -1
        self.error_kind: ErrorKind | None = None
        self.num_preemptions = 0  # times its KV was taken away (it recomputes each time)
        self.done_reason: DoneReason | None = None
        self.error: str | None = None
        self.waiting_reason: str | None = None
        self.metrics = RequestMetrics(t_submit=t_submit)
        # Engine-side companions, kept here so one object follows the request around.
        self.detok: Any = None
        self.sampler_seq: int | None = None
        self.text_pending = ""
        self.new_tokens_pending = 0
        self.last_reported: tuple | None = None
        self.dropped_messages = 0  # oldest messages left out so the conversation fits its sequence
        # Speculation: the draft tokens the step in flight verifies after its decode row (its KV
        # rows stay uncommitted until sampling accepts them), their source, and totals.
        self.draft: tuple[int, ...] = ()
        self.draft_kind: DraftKind | None = None
        self.spec = SpecState()
        self.num_drafted = 0  # draft tokens verified
        self.num_accepted = 0  # of them accepted
        self.num_gen_steps = 0  # steps that gave it tokens while generating
        # A running request whose prompt shares a long prefix with this one and is evaluating it:
        # this one waits to copy that prefix instead of evaluating it again (admission.py).
        self.sharer: Sequence | None = None
        self.copies_from: Sequence | None = None  # the last sharer it waited for: its donor
        self.yielding = False  # an agent whose decode row sat out the last plan for a person's prompt
        self.shared_prefix: dict[int, int] = {}  # a sharer's admit order -> prompt prefix in common
        # Constrained replies (docs/design/tools.md): the grammar in force (a backend Grammar) and
        # the output index it began at, one that takes over when the model opens a tool call, the
        # parser taking calls out of the text, the calls parsed since the last report, and the
        # time sampling under a grammar took.
        self.grammar: Any = None
        self.grammar_from = 0
        self.grammar_on_open: Any = None
        self.tool_parser: Any = None
        self.tool_calls_pending: list = []
        self.called_tools = False  # the reply called a tool: its caller comes back with results
        self.grammar_ms = 0.0

    # ---- identity ------------------------------------------------------------------------------

    @property
    def priority(self) -> Priority:
        return self.request.priority


    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def session_id(self) -> str:
        return self.request.session_id

    @property
    def slot(self) -> int:
        """The seq id of a sequence that holds one (callers that know it is running)."""
        if self.seq_id is None:
            raise RuntimeError(f"{self!r} holds no seq slot")
        return self.seq_id

    @property
    def constrained(self) -> bool:
        """Samples under a grammar now or may soon (a tool call it opens): it never drafts."""
        return self.grammar is not None or self.grammar_on_open is not None or self.tool_parser is not None

    @property
    def mask_ms_per_token(self) -> float:
        """What sampling one token under its grammar has cost this reply so far, on average."""
        return self.grammar_ms / max(1, len(self.output) - self.grammar_from)

    @property
    def max_tokens(self) -> int:
        return self.request.sampling.max_tokens

    def drop_draft(self) -> None:
        """No draft rows in flight any more: verified, failed with their step, or its slot went."""
        self.draft, self.draft_kind = (), None

    # ---- derived counts ------------------------------------------------------------------------

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def num_pending(self) -> int:
        return self.num_tokens - self.num_computed

    @property
    def is_decoding(self) -> bool:
        return bool(self.output) and self.num_pending == 1

    @property
    def is_finished(self) -> bool:
        return self.phase is Phase.DONE

    @property
    def prompt_done(self) -> int:
        return min(self.num_computed, len(self.prompt))

    def token_range(self, start: int, end: int) -> tuple[int, ...]:
        """Tokens at positions [start, end) of prompt + output, without joining the lists."""
        n_prompt = len(self.prompt)
        if end <= n_prompt:
            return tuple(self.prompt[start:end])
        if start >= n_prompt:
            return tuple(self.output[start - n_prompt : end - n_prompt])
        return tuple(self.prompt[start:]) + tuple(self.output[: end - n_prompt])

    def committed_tokens(self) -> list[int]:
        """What this sequence's KV holds now (positions 0..num_computed-1)."""
        return list(self.token_range(0, self.num_computed))

    def all_tokens(self) -> list[int]:
        return self.prompt + self.output

    def tokens_view(self) -> TokenView:
        """Prompt + output, read in place: what a draft source is shown every step without a copy."""
        return TokenView(self.prompt, self.output)

    def refresh_phase(self) -> None:
        """Running sequences show prefill until their first token, then generating."""
        if self.seq_id is None or self.is_finished:
            return
        self.phase = Phase.GENERATING if self.is_decoding else Phase.PREFILL

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, seq={self.seq_id}, {self.phase.value}, "
            f"computed={self.num_computed}/{self.num_tokens}, out={len(self.output)})"
        )


class TokenView(SequenceABC):
    """A read-only view of prompt + output: its length, one token or a slice cost what they read,
    never the whole context (a per-step `prompt + output` copied every drafting sequence's context)."""

    __slots__ = ("_prompt", "_output")

    def __init__(self, prompt: list[int], output: list[int]) -> None:
        self._prompt, self._output = prompt, output

    def __len__(self) -> int:
        return len(self._prompt) + len(self._output)

    @property
    def prompt_len(self) -> int:
        """Where the reply starts: the tokens before it (what a replayed trace indexes by)."""
        return len(self._prompt)

    def __getitem__(self, index):  # int -> token, slice -> list of tokens
        n_prompt, n = len(self._prompt), len(self)
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            if stop <= start:
                return []
            if stop <= n_prompt:
                return self._prompt[start:stop]
            if start >= n_prompt:
                return self._output[start - n_prompt:stop - n_prompt]
            return self._prompt[start:] + self._output[:stop - n_prompt]
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError("token index out of range")
        return self._prompt[i] if i < n_prompt else self._output[i - n_prompt]


class Session:
    """A conversation's claim on the native context: a seq slot and the tokens its KV holds.

    Between turns the slot and KV stay resident (an idle session) so the next turn prefills only
    what is new; an idle session is the first thing evicted when a slot or KV room is needed.
    """

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.seq_id: int | None = None
        self.tokens: list[int] = []  # KV content while idle (while live, the live seq's is current)
        self.live: Sequence | None = None  # the request currently holding this conversation
        self.last_used = 0
        self.rent_ms = 0.0  # what its resident cells cost other rows since it went idle
        # Its last reply called tools: an agent that will be back with the results (a parent
        # waiting on its subagents too), evicted after every idle conversation that is not.
        self.awaits_tools = False

    @property
    def slot(self) -> int:
        """The seq id of a session that holds one (callers that know it is resident)."""
        if self.seq_id is None:
            raise RuntimeError(f"{self!r} holds no seq slot")
        return self.seq_id

    @property
    def is_idle(self) -> bool:
        return self.live is None

    def committed_tokens(self) -> list[int]:
        """The tokens whose KV this session's slot holds right now."""
        if self.live is not None and self.live.seq_id is not None:
            return self.live.committed_tokens()
        return self.tokens if self.seq_id is not None else []

    def __repr__(self) -> str:
        live = self.live.request_id if self.live else None
        return f"Session({self.session_id!r}, seq={self.seq_id}, cached={len(self.tokens)}, live={live})"


# common_prefix_len compares this many tokens at a time to start with, and at most _PREFIX_BLOCK_MAX.
_PREFIX_BLOCK = 32
_PREFIX_BLOCK_MAX = 4096


def common_prefix_len(a: SequenceABC[int], b: SequenceABC[int]) -> int:
    """How many leading tokens `a` and `b` share.

    Admission weighs every resident and saved conversation against each waiting prompt every step,
    and agents' histories share thousands of tokens: the comparison runs on slices (compared in C),
    in blocks that double while they match, then halves the block that differs down to a few
    tokens, instead of a Python loop over every token."""
    n = min(len(a), len(b))
    if n == 0 or a[0] != b[0]:
        return 0
    if type(a) is not type(b):  # a list slice never equals a tuple slice
        a, b = list(a), list(b)
    lo, block = 0, _PREFIX_BLOCK
    while lo < n:
        hi = min(n, lo + block)
        if a[lo:hi] != b[lo:hi]:
            break
        lo, block = hi, min(block * 2, _PREFIX_BLOCK_MAX)
    else:
        return n
    while hi - lo > _PREFIX_BLOCK:  # a[:lo] == b[:lo]; they differ before hi
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    while lo < hi and a[lo] == b[lo]:
        lo += 1
    return lo
