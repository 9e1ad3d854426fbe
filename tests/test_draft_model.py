"""The draft-model source: with the model as its own draft it proposes exactly the model's greedy
continuation, stays in step with committed tokens through accepts, rejects and rewrites, frees its
KV on forget, and refuses a draft model with another vocabulary."""

from __future__ import annotations

from dataclasses import replace

import pytest

from backend.draft_model import TAIL_CHECK, DraftModelSource, _kept_prefix
from backend.draft_vocab import DraftModelError, check_draft_vocab, read_vocab_facts, vocab_mismatch
from scheduler.drafts import DraftWant
from scheduler.types import BatchPlan, SeqSlice
from tests.counting_list import CountingList
from tests.gguf_files import with_u32_key
from tests.needs import need_real_model

pytestmark = pytest.mark.slow

PROMPTS = [
    "<|im_start|>user\nList the days of the week.<|im_end|>\n<|im_start|>assistant\n",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b =",
    "The keeper climbed the stairs of the lighthouse every evening, and",
]


@pytest.fixture(scope="module")
def pair():
    need_real_model()
    from backend.llama_backend import LlamaBackend
    from backend.llama_load import default_model_path

    target = LlamaBackend.load(model_path=default_model_path(), device="cpu", n_ctx=1024, n_seq_max=4,
                               n_batch=256, n_threads=1, flash_attn="off")
    source = DraftModelSource.load(target.model_path, target, device="cpu", flash_attn="off")
    yield target, source
    source.close()
    target.close()


def greedy(target, tokens: list[int], n: int) -> list[int]:
    """The target's own greedy continuation, on its last slot (prompt in one chunk, then one row a step)."""
    slot = target.n_seq_max - 1
    target.kv_remove(slot)
    out, pos, feed = [], 0, list(tokens)
    for _ in range(n):
        r = target.decode(BatchPlan(0, (SeqSlice(slot, pos, tuple(feed), True, not out),), target.n_batch))
        pos += len(feed)
        out.append(target.sample(slot, r.logit_rows[slot]))
        feed = [out[-1]]
    target.kv_remove(slot)
    return out


def held_positions(source: DraftModelSource, key: int) -> int:
    return source._b.kv_pos_max(source._held[key].slot) + 1


def test_own_draft_proposes_the_greedy_continuation_for_every_sequence_at_once(pair):
    target, source = pair
    prompts = [target.tokenize(p, special=True) for p in PROMPTS]
    steps0 = source.stats.steps
    drafts = source.propose_many([DraftWant(i, p, 6) for i, p in enumerate(prompts)])
    # One catch-up decode plus 5 draft steps, shared by the three sequences.
    assert source.stats.steps - steps0 == 6
    for i, p in enumerate(prompts):
        assert drafts[i] == greedy(target, p, 6), PROMPTS[i]
        assert held_positions(source, i) == len(p)  # draft positions removed, committed ones kept
    for i in range(len(prompts)):
        source.forget(i)


def test_stays_in_step_after_accepts_rejects_and_rewrites(pair):
    target, source = pair
    tokens = target.tokenize(PROMPTS[1], special=True)
    draft = source.propose(7, tokens, 4)
    # The target accepted two drafts and then sampled its own token.
    other = target.tokenize(" 42", special=False)[-1]
    tokens = tokens + draft[:2] + [other]
    fed0 = source.stats.fed
    assert source.propose(7, tokens, 4) == greedy(target, tokens, 4)
    assert source.stats.fed - fed0 == 3  # only the newly committed tokens were fed
    assert held_positions(source, 7) == len(tokens)
    # Everything accepted: the four drafts are committed, then one more step.
    tokens = tokens + greedy(target, tokens, 4)
    assert source.propose(7, tokens, 3) == greedy(target, tokens, 3)
    # A rewrite (a new turn replaced the tail): the common prefix is kept, the rest re-fed.
    rewritten = tokens[:10] + target.tokenize(" something else entirely")
    fed0 = source.stats.fed
    assert source.propose(7, rewritten, 3) == greedy(target, rewritten, 3)
    assert source.stats.fed - fed0 == len(rewritten) - 10
    # Nothing new committed (the same tokens again): still a proposal, from the last token re-fed.
    assert source.propose(7, rewritten, 2) == greedy(target, rewritten, 2)
    source.forget(7)


def test_catching_up_reads_the_new_tokens_not_the_whole_context():
    held = list(range(5000))
    CountingList.reads = 0
    # The sequence grew by three tokens since the slot was fed: it keeps all it holds.
    assert _kept_prefix(held, CountingList(held + [7, 8, 9])) == 5000
    assert CountingList.reads <= TAIL_CHECK  # the old scan compared all 5000
    # Nothing new: the last committed token is fed again (its logits give the first guess).
    assert _kept_prefix(held, CountingList(held)) == 4999
    # A rewrite inside the checked tail, and one before it that changes the tail's positions
    # (a new turn): the prefix is found token by token.
    assert _kept_prefix(held, held[:4990] + [1, 2, 3]) == 4990
    assert _kept_prefix(held, held[:100] + held[101:]) == 100
    assert _kept_prefix([], [1, 2]) == 0 and _kept_prefix([1], [1]) == 0


def test_forget_frees_the_slot_and_its_kv(pair):
    target, source = pair
    tokens = target.tokenize(PROMPTS[2])
    source.propose(3, tokens, 2)
    slot = source._held[3].slot
    assert source._b.kv_pos_max(slot) == len(tokens) - 1
    source.forget(3)
    assert source._b.kv_pos_max(slot) == -1
    assert slot in source._free and 3 not in source._held
    source.forget(3)  # forgetting twice is harmless


def test_more_sequences_than_slots_evicts_the_least_recently_drafted(pair):
    target, source = pair
    tokens = target.tokenize(PROMPTS[2])
    n = source._b.n_seq_max
    for key in range(n + 1):
        assert source.propose(100 + key, tokens[: 5 + key], 1)
    assert 100 not in source._held and len(source._held) == n
    assert source._b.kv_cells_used() == sum(5 + key for key in range(1, n + 1))
    for key in range(n + 1):
        source.forget(100 + key)
    assert source._b.kv_cells_used() == 0


def test_draft_cost_is_measured_and_grows_with_k(pair):
    _, source = pair
    assert source.draft_ms(0, 4) == 0.0
    assert 0 < source.draft_ms(1, 1) < source.draft_ms(2, 1) <= source.draft_ms(2, 4)


def test_a_draft_model_with_another_vocabulary_is_refused(tmp_path, other_vocab):
    from backend.llama_load import default_model_path

    target = default_model_path()
    facts = read_vocab_facts(target)
    assert vocab_mismatch(facts, facts) is None
    assert vocab_mismatch(facts, replace(facts, n_vocab=facts.n_vocab + 1)).startswith("its vocabulary has")
    assert "tokenizes a probe text differently" in vocab_mismatch(facts, replace(facts, probe=facts.probe[:-1]))
    with pytest.raises(DraftModelError, match="eos token"):
        check_draft_vocab(target, other_vocab)
    with pytest.raises(DraftModelError, match="not found"):
        check_draft_vocab(target, str(tmp_path / "missing.gguf"))


@pytest.fixture(scope="module")
def other_vocab(tmp_path_factory):
    """The default model with another EOS id: loadable, but its drafts would mean other things."""
    need_real_model()
    from backend.llama_load import default_model_path

    target = default_model_path()
    eos = read_vocab_facts(target).eos
    return str(with_u32_key(target, tmp_path_factory.mktemp("draft") / "other-eos.gguf",
                            "tokenizer.ggml.eos_token_id", eos + 1))


@pytest.mark.parametrize("command", [[], ["generate", "hello"]])
@pytest.mark.parametrize("case", ["other vocabulary", "truncated"])
def test_cli_refuses_a_bad_draft_model_in_one_line(monkeypatch, tmp_path, other_vocab, command, case):
    from typer.testing import CliRunner

    import magnitude_tui.app
    import magnitude_tui.generate
    from magnitude_tui.cli import app

    started = []
    monkeypatch.setattr(magnitude_tui.app, "run_app", lambda config, **kw: started.append(config))
    monkeypatch.setattr(magnitude_tui.generate, "run_generate", lambda *a, **kw: started.append(a) or 0)
    path, says = other_vocab, "its eos token is"
    if case == "truncated":
        path, says = str(tmp_path / "cut.gguf"), "is truncated"
        with open(other_vocab, "rb") as f:
            (tmp_path / "cut.gguf").write_bytes(f.read(1 << 20))
    result = CliRunner().invoke(app, [*command, "--draft-model", path])
    assert result.exit_code == 2 and not started, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("magnitude-tui: --draft-model: ") and says in lines[0], lines


def test_cli_passes_a_good_draft_model_to_the_engine(monkeypatch):
    need_real_model()
    from typer.testing import CliRunner

    import magnitude_tui.app
    from backend.llama_load import default_model_path
    from magnitude_tui.cli import app

    started = []
    monkeypatch.setattr(magnitude_tui.app, "run_app", lambda config, **kw: started.append(config))
    result = CliRunner().invoke(app, ["--draft-model", default_model_path()])
    assert result.exit_code == 0, result.output
    assert started[0].backend.draft_model == default_model_path()
    result = CliRunner().invoke(app, ["--draft-model", default_model_path(), "--check"])
    assert result.exit_code == 0 and f"draft model {default_model_path()}" in result.stdout


def test_the_engine_verifies_the_draft_models_guesses_for_all_sequences_in_one_batch(pair):
    """--spec draft with the model as its own draft: the same greedy replies as without, nearly
    every guess accepted, one draft step per draft position for all sequences, nothing left over."""
    from magnitude_tui.engine.core import Engine
    from scheduler.drafts import DraftKind
    from scheduler.types import Request, SamplingParams

    target, source = pair
    prompts = [tuple(target.tokenize(p, special=True)) for p in PROMPTS]

    def run(mode: str) -> tuple[list[str], int]:
        for s in range(target.n_seq_max):
            target.kv_remove(s)
        engine = Engine(target, policy="fixed:512", coalesce_ms=0.0, spec=mode,
                        drafts={DraftKind.DRAFT_MODEL: source})
        for i, p in enumerate(prompts):
            engine.submit(Request(f"r{i}", f"s{i}", (), SamplingParams(temperature=0.0, max_tokens=12),
                                  prompt_tokens=p))
        texts, accepted = [""] * len(prompts), 0
        while engine.has_work():
            report = engine.step()
            if report is not None:
                accepted += report.draft_accepted
                for u in report.updates:
                    assert u.error is None, u.error
                    texts[int(u.request_id[1:])] += u.text_delta
        for i in range(len(prompts)):
            engine.close_session(f"s{i}")
        engine.step()
        assert engine.leaks() == []
        return texts, accepted

    off, _ = run("off")
    proposals0, steps0 = source.stats.proposals, source.stats.steps
    draft, accepted = run("draft")
    assert draft == off
    assert accepted >= 2 * len(prompts)
    proposals, steps = source.stats.proposals - proposals0, source.stats.steps - steps0
    # Drafting sequence by sequence would take about 8 draft steps per proposal; batched, the
    # three sequences share them.
    assert steps * 2 < proposals * 8, (steps, proposals)
    assert not source._held and source._b.kv_cells_used() == 0  # every finished sequence forgotten


def test_a_full_draft_cache_gives_up_the_slots_not_drafting_now():
    need_real_model()
    from backend.llama_backend import LlamaBackend
    from backend.llama_load import default_model_path

    backend = LlamaBackend.load(model_path=default_model_path(), device="cpu", n_ctx=256, n_seq_max=2,
                                n_batch=256, n_threads=1, flash_attn="off")
    source = DraftModelSource(backend)
    try:
        text = " ".join(f"word{i}" for i in range(200))
        first, second = backend.tokenize(text)[:150], backend.tokenize(text)[150:300]
        assert len(source.propose(1, first, 2)) == 2
        # 150 + 150 positions do not fit 256 cells: the catch-up fails ("no KV slot"), key 1 (not
        # asked for now) gives its slot up, and the catch-up runs again, then one draft step.
        steps = source.stats.steps
        assert len(source.propose(2, second, 2)) == 2
        assert source.stats.steps - steps == 3
        assert 1 not in source._held and held_positions(source, 2) == len(second)
        assert backend.kv_cells_used() == len(second)
    finally:
        source.close()
