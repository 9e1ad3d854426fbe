"""Provides FakeBackend: a model-free Backend with real plan validation and per-sequence KV."""

from __future__ import annotations

import struct
from collections import deque
from enum import Enum
from typing import Callable, Sequence

from backend.protocol import WALL_CLOCK, Clock, DecodeOutcome, DecodeResult, KvStateError, check_plan
from backend.template_fallback import CHATML_MARKERS, TemplateSource, fallback_notice, template_info
from backend.tools import ToolSyntax, generic_messages
from scheduler.cost_model import CostParams
from scheduler.drafts import DraftKind
from scheduler.types import AttentionPath, BatchPlan, Grammar, Message, SamplingParams, Tool

# Token ids: a few specials below 32, then one token per Unicode character (code point < n_vocab).
BOS, EOS, IM_START, IM_END = 1, 2, 3, 4
_SPECIAL_TEXT = {"<s>": BOS, "</s>": EOS, "<|im_start|>": IM_START, "<|im_end|>": IM_END}
_ROLES = ("system", "user", "assistant", "tool")
DEFAULT_REPLY = "The quick brown fox jumps over the lazy dog. "
_STATE_MAGIC = b"FAKEKV1\0"  # a fake sequence state: this, the count, then one int32 per position


class FakeDetokenizer:
    """One character per token; special tokens render as nothing."""

    def feed(self, token: int) -> str:
        return chr(token) if token >= 32 or token in (9, 10) else ""

    def flush(self) -> str:
        return ""


class FakeBackend:
    """A Backend with no model: deterministic tokens, exact KV bookkeeping, and the same plan checks
    the llama.cpp backend makes before calling llama_decode.

    The KV cache is unified: `kv_cells_used` counts distinct cells, and `kv_copy` shares the
    source's cells (as llama_memory_seq_cp does), so forks cost no cells until they diverge.
    A decode that needs more free cells than exist returns NO_KV_SLOT and changes nothing.
    """

    kv_shared_pool = True

    def __init__(
        self,
        *,
        n_ctx: int = 4096,
        n_seq_max: int = 8,
        n_batch: int = 512,
        n_ubatch: int = 512,
        n_vocab: int = 0x10000,
        n_ctx_seq: int | None = None,
        reply: str = DEFAULT_REPLY,
        eog_after: int | None = None,
        name: str = "fake",
        max_threads: int = 0,
        base_model: bool = False,
    ) -> None:
        """`base_model`: like a GGUF with no chat template and no ChatML tokens in its vocabulary
        (ChatML stands in, its markers are plain text, and the backend says so in `info`)."""
        self.n_ctx = n_ctx
        self.n_ctx_seq = n_ctx_seq or n_ctx
        self.n_seq_max = n_seq_max
        self.n_batch = n_batch
        self.n_ubatch = n_ubatch
        self.n_vocab = n_vocab
        self.name = name
        self.model_name = name
        self.device_name = name
        self.base_model = base_model
        self.chat_stops: tuple[str, ...] = CHATML_MARKERS if base_model else ()
        self.info: dict = (template_info(TemplateSource.CHATML_FALLBACK, fallback_notice(self.chat_stops))
                           if base_model else {})
        self.clock: Clock = WALL_CLOCK
        self.known_costs: CostParams | None = None
        self.attention_path = AttentionPath.FLASH  # no attention at all: nothing resident costs a row
        self.attention = None  # nothing was probed
        self.state_layout = f"{name}:vocab={n_vocab}"
        self.states_loaded = 0  # kv_load calls that succeeded (tests tell warm from cold by it)
        self.attention_tile_rows = 0
        self.dense_kq_cells = 0
        self.reply = reply
        self.tool_syntax = ToolSyntax.GENERIC
        self.grammars: dict[int, Grammar | None] = {}  # seq id -> the grammar its sampler was given
        # No CPU threads to choose unless a test gives it some (the simulated backend prices them).
        self.max_threads = max_threads
        self.n_threads = max_threads
        self.thread_changes: list[int] = []
        self.eog_after = eog_after  # EOG after this many sampled tokens per sampler; None: never
        self._kv: dict[int, list[int]] = {s: [] for s in range(n_seq_max)}  # position -> cell
        self._kv_tokens: dict[int, list[int]] = {s: [] for s in range(n_seq_max)}
        self._refs: dict[int, int] = {}  # cell -> how many sequences hold it
        self._next_cell = 0
        self._logits: dict[int, tuple[int, ...]] = {}  # seq_id -> batch rows of its logits in the last decode
        self.samplers: dict[int, SamplingParams] = {}
        self._sampled: dict[int, int] = {}
        self._faults: deque[DecodeOutcome] = deque()
        self.fault_when: Callable[[BatchPlan], DecodeOutcome | None] | None = None
        self.decode_calls: list[BatchPlan] = []
        self.closed = False

    # ---- fault injection -----------------------------------------------------------------------

    def fail_next(self, outcome: DecodeOutcome = DecodeOutcome.NO_KV_SLOT, times: int = 1) -> None:
        """Make the next `times` decodes return `outcome` without touching the KV cache."""
        self._faults.extend([outcome] * times)

    def set_n_threads(self, n: int) -> None:
        if not 1 <= n <= max(1, self.max_threads):
            raise ValueError(f"thread count {n} outside 1..{self.max_threads}")
        self.n_threads = n
        self.thread_changes.append(n)

    # ---- text ----------------------------------------------------------------------------------

    def tokenize(self, text: str, *, special: bool = False, add_bos: bool = False) -> list[int]:
        out = [BOS] if add_bos else []
        i = 0
        while i < len(text):
            if special:
                hit = next((t for t in _SPECIAL_TEXT if text.startswith(t, i)), None)
                if hit is not None:
                    out.append(_SPECIAL_TEXT[hit])
                    i += len(hit)
                    continue
            cp = ord(text[i])
            out.append(cp if 32 <= cp < self.n_vocab or cp in (9, 10) else ord("?"))
            i += 1
        return out

    def tokenize_chat(self, messages: Sequence[Message], *, tools: Sequence[Tool] = (),
                      add_generation_prompt: bool = True) -> list[int]:
        """ChatML; the scaffolding is special, the content never is (no injected control tokens).
        Tools and tool turns in the generic format (backend/tools.py), as a template without them."""
        if tools or any(m.role == "tool" or m.tool_calls for m in messages):
            messages = generic_messages(messages, tools)
        out: list[int] = []
        start, end = [IM_START], [IM_END]
        if self.base_model:  # a base model's vocabulary has no ChatML tokens: the markers are text
            start, end = self.tokenize("<|im_start|>"), self.tokenize("<|im_end|>")
        for m in messages:
            if m.role not in _ROLES:
                raise ValueError(f"unknown chat role {m.role!r}: use one of {', '.join(_ROLES)}")
            out += start + self.tokenize(m.role + "\n") + self.tokenize(m.content)
            out += end + self.tokenize("\n")
        if add_generation_prompt:
            out += start + self.tokenize("assistant\n")
        return out

    def detokenizer(self) -> FakeDetokenizer:
        return FakeDetokenizer()

    def is_eog(self, token: int) -> bool:
        return token in (EOS, IM_END)

    def token_bytes(self, token: int) -> bytes:
        return FakeDetokenizer().feed(token).encode("utf-8", "surrogatepass")

    # ---- decode --------------------------------------------------------------------------------

    def validate(self, plan: BatchPlan) -> None:
        """Raise PlanError for anything llama.cpp would assert on (or silently get wrong)."""
        check_plan(plan, n_batch=self.n_batch, n_seq_max=self.n_seq_max, n_ctx_seq=self.n_ctx_seq,
                   n_vocab=self.n_vocab, next_pos=lambda seq: len(self._kv[seq]))

    def decode(self, plan: BatchPlan) -> DecodeResult:
        self.validate(plan)
        self.decode_calls.append(plan)
        fault = self._faults.popleft() if self._faults else None
        if fault is None and self.fault_when is not None:
            fault = self.fault_when(plan)
        if fault is None and len(self._refs) + plan.n_rows > self.n_ctx:
            fault = DecodeOutcome.NO_KV_SLOT
        if fault is not None and fault is not DecodeOutcome.OK:
            code = {DecodeOutcome.NO_KV_SLOT: 1, DecodeOutcome.ABORTED: 2,
                    DecodeOutcome.INVALID_BATCH: -1}.get(fault, -3)
            return DecodeResult(fault, 0.0, {}, code)
        self._logits = {}
        row = 0
        for sl in plan.slices:
            for t in sl.tokens:
                self._kv[sl.seq_id].append(self._new_cell())
                self._kv_tokens[sl.seq_id].append(t)
            row += len(sl.tokens)
            if sl.want_logits:
                self._logits[sl.seq_id] = tuple(range(row - sl.n_logits, row))
        return DecodeResult(DecodeOutcome.OK, 0.0, {s: rows[0] for s, rows in self._logits.items()}, 0,
                            draft_rows={s: rows[1:] for s, rows in self._logits.items() if len(rows) > 1})

    def set_sampler(self, seq_id: int, params: SamplingParams, grammar: Grammar | None = None,
                    replay: Sequence[int] = ()) -> None:
        """A grammar is recorded, not enforced (the scripted reply is what it is). A sampler
        rebuilt for a grammar that starts mid-reply keeps the script's place."""
        self.samplers[seq_id] = params
        self.grammars[seq_id] = grammar
        if grammar is None or seq_id not in self._sampled:
            self._sampled[seq_id] = 0

    def sample(self, seq_id: int, logit_row: int) -> int:
        """The next character of `reply` (cycling), or EOG after `eog_after` tokens."""
        if seq_id not in self.samplers:
            raise RuntimeError(f"seq {seq_id} has no sampler: call set_sampler first")
        if logit_row not in self._logits.get(seq_id, ()):
            raise RuntimeError(f"seq {seq_id}: row {logit_row} holds no logits for it in the last decode")
        n = self._sampled[seq_id]
        self._sampled[seq_id] = n + 1
        return self._reply_token(n)

    def _reply_token(self, n: int) -> int:
        if self.eog_after is not None and n >= self.eog_after:
            return IM_END
        return ord(self.reply[n % len(self.reply)])

    def next_tokens(self, seq_id: int, k: int) -> list[int]:
        """What the next k samples of this sequence will return (scripted drafts guess from it)."""
        n = self._sampled.get(seq_id, 0)
        return [self._reply_token(n + i) for i in range(k)]

    def free_sampler(self, seq_id: int) -> None:
        self.samplers.pop(seq_id, None)
        self._sampled.pop(seq_id, None)

    # ---- KV ------------------------------------------------------------------------------------

    def _new_cell(self) -> int:
        self._next_cell += 1
        self._refs[self._next_cell] = 1
        return self._next_cell

    def _drop(self, cells: list[int]) -> None:
        for c in cells:
            self._refs[c] -= 1
            if self._refs[c] == 0:
                del self._refs[c]

    def kv_remove(self, seq_id: int) -> None:
        self.kv_keep_prefix(seq_id, 0)

    def kv_keep_prefix(self, seq_id: int, n_tokens: int) -> None:
        cells = self._kv[seq_id]
        self._drop(cells[n_tokens:])
        del cells[n_tokens:]
        del self._kv_tokens[seq_id][n_tokens:]
        self._logits.pop(seq_id, None)

    def kv_copy(self, src_seq: int, dst_seq: int, n_tokens: int) -> None:
        if src_seq == dst_seq:
            return
        self.kv_remove(dst_seq)
        shared = self._kv[src_seq][:n_tokens]
        for c in shared:
            self._refs[c] += 1
        self._kv[dst_seq] = list(shared)
        self._kv_tokens[dst_seq] = self._kv_tokens[src_seq][:n_tokens]

    def kv_pos_max(self, seq_id: int) -> int:
        return len(self._kv[seq_id]) - 1

    def kv_cells_used(self) -> int:
        return len(self._refs)

    def kv_save(self, seq_id: int) -> bytes:
        tokens = self._kv_tokens[seq_id]
        return _STATE_MAGIC + struct.pack(f"<I{len(tokens)}i", len(tokens), *tokens)

    def kv_load(self, seq_id: int, state: bytes) -> int:
        """Like llama_state_seq_set_data: the sequence is emptied, then refilled from the state
        into free cells; a state that is not one, or needs more cells than are free, is refused."""
        self.kv_remove(seq_id)
        head = len(_STATE_MAGIC) + 4
        if bytes(state[:len(_STATE_MAGIC)]) != _STATE_MAGIC or len(state) < head:
            raise KvStateError("not a sequence state of this backend")
        (n,) = struct.unpack_from("<I", state, len(_STATE_MAGIC))
        if len(state) != head + 4 * n:
            raise KvStateError(f"the state says {n} positions but holds {(len(state) - head) // 4}")
        if len(self._refs) + n > self.n_ctx:
            raise KvStateError(f"{n} cells needed, {self.n_ctx - len(self._refs)} free")
        tokens = list(struct.unpack_from(f"<{n}i", state, head))
        self._kv[seq_id] = [self._new_cell() for _ in tokens]
        self._kv_tokens[seq_id] = tokens
        self.states_loaded += 1
        return n

    def kv_tokens(self, seq_id: int) -> list[int]:
        """The tokens whose KV the sequence holds (tests compare them with what was planned)."""
        return list(self._kv_tokens[seq_id])

    def close(self) -> None:
        self.closed = True


class Acceptance(Enum):
    """What ScriptedDrafts' guesses let the target accept."""

    ALL = "all"  # every guess is the token the fake will sample
    NONE = "none"  # the first guess is already wrong
    HALF = "half"  # the first half of each guess is right, the rest wrong


class ScriptedDrafts:
    """A DraftSource for tests: it knows what the FakeBackend will sample next and guesses it
    right or wrong as scripted, so acceptance patterns can be asserted token by token."""

    def __init__(self, backend: FakeBackend, acceptance: Acceptance = Acceptance.ALL, *,
                 kind: DraftKind = DraftKind.DRAFT_MODEL, ms: float = 0.0) -> None:
        self.backend, self.acceptance, self.kind, self.ms = backend, acceptance, kind, ms
        self.proposed: list[tuple[int, int]] = []  # (key, k) per proposal
        self.forgotten: list[int] = []

    def propose(self, key: int, tokens: Sequence[int], k: int) -> list[int]:
        truth = self.backend.next_tokens(key, k)  # the decode row's sample comes first
        good = {Acceptance.ALL: k, Acceptance.NONE: 0, Acceptance.HALF: k // 2}[self.acceptance]
        self.proposed.append((key, k))
        return [t if i < good else ord("#") for i, t in enumerate(truth)]

    def draft_ms(self, k: int, n_sequences: int) -> float:
        return self.ms * k if n_sequences else 0.0

    def forget(self, key: int) -> None:
        self.forgotten.append(key)
