"""Provides StepSampler: a step's logits turned into committed tokens, drafts verified on the way."""

from __future__ import annotations

from backend.protocol import Backend, Clock, DecodeResult
from scheduler.planner import Scheduler
from scheduler.sequence import Sequence
from scheduler.types import DoneReason, ErrorKind

# One token sampled under a grammar past this fails its request: every other sequence's step
# waits on that mask. A whole-vocabulary mask costs a few ms (about 4 on SmolLM2's 49,152 tokens,
# a few times that on 150,000-256,000-token vocabularies); a schema whose grammar keeps thousands
# of alternatives alive at once (a 10,000-value enum sharing its prefixes) took hundreds of ms a
# token, and stalled everyone else's replies for seconds.
MAX_MASK_MS = 500.0
# ... and one whose masks average past this over its first tokens under the grammar: held under
# the single-token limit, it would stall every step by as much, token after token.
MAX_MEAN_MASK_MS, MEAN_AFTER_TOKENS = 100.0, 8


class StepSampler:
    """Samples every sequence whose logits a step produced, with the sequence's own sampler chain.

    A sequence that verified draft tokens is sampled row after row (llama.cpp's sample-and-accept
    rule): the decode row's token first; while the sampled token equals the next draft token, that
    draft row's logits are sampled too. The first token that differs is kept (it is what the
    target model chose) and ends the run, so 1..k+1 tokens are committed per step and, at
    temperature 0, exactly the tokens generation without drafts would give. EOS, a stop string
    or max_tokens inside the run end it there: nothing after is shown or kept.
    """

    def __init__(self, backend: Backend, scheduler: Scheduler, clock: Clock) -> None:
        self.backend = backend
        self.scheduler = scheduler
        self.clock = clock
        self.owner: dict[int, Sequence] = {}  # seq slot -> the request whose sampler it holds
        self.accepted = 0  # draft tokens accepted in the last step

    def sample(self, ready: list[Sequence], result: DecodeResult) -> None:
        emitted: list[tuple[Sequence, int]] = []
        self.accepted = 0
        for seq in ready:
            if seq.is_finished or seq.seq_id is None:
                continue
            n = self._sample_run(seq, result)
            if n:
                emitted.append((seq, n))
        now = self.clock()
        for seq, n in emitted:
            seq.num_gen_steps += 1
            for _ in range(n):
                seq.metrics.on_token(now)

    def _sample_run(self, seq: Sequence, result: DecodeResult) -> int:
        """Sample the sequence's rows in order; return how many tokens it gained."""
        slot, draft, kind = seq.slot, seq.draft, seq.draft_kind
        rows = (result.logit_rows[slot], *result.draft_rows.get(slot, ()))[:1 + len(draft)]
        gained = judged = accepted = 0
        for i, row in enumerate(rows):
            try:
                self._ensure_sampler(seq)
                if seq.grammar is not None:
                    t0 = self.clock()
                    token = self.backend.sample(slot, row)
                    mask_ms = (self.clock() - t0) * 1000.0
                    seq.grammar_ms += mask_ms
                    slow = _too_slow(seq, mask_ms)
                    if slow is not None:
                        self.scheduler.finish(seq, DoneReason.ERROR, slow, ErrorKind.INVALID)
                        break
                else:
                    token = self.backend.sample(slot, row)
            except Exception as e:
                self.scheduler.finish(seq, DoneReason.ERROR, f"sampling failed: {e}")
                break
            gained += self._emit(seq, token)
            if seq.is_finished or i >= len(draft):
                break  # the reply ended inside the run, or the bonus row was the last one
            judged += 1
            if token != draft[i]:
                break  # the target chose otherwise: its token is kept, the rest of the draft is not
            accepted += 1
            self.scheduler.accept_draft(seq)
        if draft:
            assert kind is not None  # a draft always names its source
            self.scheduler.settle_draft(seq, kind, len(draft), judged, accepted)
            self.accepted += accepted
        return gained

    def _emit(self, seq: Sequence, token: int) -> bool:
        """Commit one sampled token (or end the reply on it); True if it became visible output."""
        if self.backend.is_eog(token) and not seq.request.sampling.ignore_eos:
            seq.text_pending += seq.detok.flush()
            self.scheduler.finish(seq, DoneReason.STOP)
            return False
        self.scheduler.append_token(seq, token)
        # Stop strings cut free text only: not what a grammar writes, nor a call being parsed.
        in_call = seq.tool_parser is not None and seq.tool_parser.in_call
        piece = seq.detok.feed(token, match_stops=seq.grammar is None and not in_call)
        if seq.tool_parser is None:
            seq.text_pending += piece
        else:
            self._parse(seq, piece)
        seq.new_tokens_pending += 1
        if seq.detok.stopped:
            self.scheduler.finish(seq, DoneReason.STOP)
        elif len(seq.output) >= seq.max_tokens or seq.num_tokens >= self.scheduler.n_ctx_seq:
            seq.text_pending += seq.detok.flush()
            self.scheduler.finish(seq, DoneReason.LENGTH)
        return True

    @staticmethod
    def _parse(seq: Sequence, piece: str) -> None:
        """Tool calls go to their own list; the first call the model opens by itself (`auto`)
        brings in the grammar of a call, from the next token on."""
        opened = seq.tool_parser.opened
        text, calls = seq.tool_parser.feed(piece)
        seq.text_pending += text
        seq.tool_calls_pending += calls
        seq.called_tools = seq.called_tools or bool(calls)
        if seq.grammar_on_open is not None and seq.tool_parser.opened > opened:
            # Only when the marker ended the piece (whitespace aside): text already past it
            # belongs to no grammar state we could start from, so that call is only parsed.
            if seq.tool_parser.in_call and not seq.tool_parser.pending_call_text().strip():
                seq.grammar, seq.grammar_from = seq.grammar_on_open, len(seq.output)
                seq.sampler_seq = None  # the next sample builds the sampler with the grammar
            seq.grammar_on_open = None

    def _ensure_sampler(self, seq: Sequence) -> None:
        slot = seq.slot
        if seq.sampler_seq == slot:
            return
        owner = self.owner.get(slot)
        if owner is not None and owner is not seq:
            self.backend.free_sampler(slot)
            owner.sampler_seq = None
        if seq.grammar is not None:
            # A grammar restarted mid-reply (a preempted sequence back in a slot, a call opened)
            # first accepts the tokens already written under it.
            self.backend.set_sampler(slot, seq.request.sampling, seq.grammar, tuple(seq.output[seq.grammar_from:]))
        else:
            self.backend.set_sampler(slot, seq.request.sampling)
        self.owner[slot] = seq
        seq.sampler_seq = slot

    def release(self) -> None:
        """Free the sampler of every request that ended or lost its slot (preempted)."""
        for slot, seq in list(self.owner.items()):
            if seq.is_finished or seq.seq_id != slot:
                self.backend.free_sampler(slot)
                seq.sampler_seq = None
                del self.owner[slot]


def _too_slow(seq: Sequence, mask_ms: float) -> str | None:
    """Why the request must end because its grammar masks too slowly (None: it need not)."""
    n = len(seq.output) - seq.grammar_from + 1  # tokens masked so far, this one included
    if mask_ms > MAX_MASK_MS:
        took = f"{mask_ms:,.0f} ms to constrain one token (at most {MAX_MASK_MS:,.0f})"
    elif n >= MEAN_AFTER_TOKENS and seq.grammar_ms / n > MAX_MEAN_MASK_MS:
        took = f"{seq.grammar_ms / n:,.0f} ms a token over {n} tokens (at most {MAX_MEAN_MASK_MS:,.0f} on average)"
    else:
        return None
    where = seq.grammar.source if seq.grammar is not None else "response_format"
    grammar = "the schema's grammar" if where == "response_format" else "the schemas' grammar"
    return (f"{where}: {grammar} took {took}, and every other reply waits on it: simplify the "
            "schema (a large enum, deep nesting, long repeated patterns)")

