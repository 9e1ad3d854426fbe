"""A prompt that spells a held conversation's text in other tokens reuses that conversation's KV
(scheduler/retokenized.py): the rules on a made-up vocabulary, then the engine on the real model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.retokenized import MIN_SHARED, aligned_prompt
from scheduler.sequence import common_prefix_len
from scheduler.types import Message

# A made-up vocabulary: 0 is a control token (no text), 1..26 single letters, then longer pieces.
PIECES: dict[int, bytes] = {0: b""}
PIECES.update({i: bytes([96 + i]) for i in range(1, 27)})  # 1 -> b"a" ... 26 -> b"z"
WORDS = {100: b" `", 101: b"_", 102: b" `_", 103: b"pass", 104: b"age", 105: b"\xe2\x82", 106: b"\xac",
         107: b"\xe2\x82\xac", 108: b"<|end|>", 109: b"<|", 110: b"end", 111: b"|>"}
PIECES.update(WORDS)
CTRL = 0
HEAD = list(range(1, MIN_SHARED + 2))  # a shared opening, long enough to be looked at


def text(tokens: list[int]) -> bytes:
    return b"".join(PIECES[t] for t in tokens)


def test_the_held_spelling_replaces_the_prompts_and_the_prompt_goes_on_after_it():
    held = HEAD + [100, 101, 103, 104]  # " `" "_" "pass" "age": what the model generated
    prompt = HEAD + [102, 103, 104, 5, 6]  # " `_" "pass" "age": the same text tokenized again
    assert common_prefix_len(held, prompt) == len(HEAD)
    out = aligned_prompt(prompt, [held], PIECES.__getitem__)
    assert out == held + [5, 6]
    assert text(out) == text(prompt)


def test_two_partings_in_one_reply_are_both_mended_and_a_split_character_counts_by_its_bytes():
    held = HEAD + [100, 101, 3, 105, 106, 4]
    prompt = HEAD + [102, 3, 107, 4, 9]
    assert aligned_prompt(prompt, [held], PIECES.__getitem__) == held + [9]


def test_a_control_token_is_matched_only_as_itself_never_by_the_text_that_spells_its_name():
    # The held conversation ends its turn with a control token; the prompt spells "<|end|>" as text.
    held = HEAD + [100, 101, CTRL, 5]
    prompt = HEAD + [102, 108, 5]
    out = aligned_prompt(prompt, [held], PIECES.__getitem__)
    assert CTRL not in out
    assert out == HEAD + [100, 101, 108, 5]  # the reply's spelling is taken; the text stays text
    # And the other way round: a control token in the prompt is not matched by held text.
    held2, prompt2 = HEAD + [100, 101, 108, 5], HEAD + [102, CTRL, 5]
    assert aligned_prompt(prompt2, [held2], PIECES.__getitem__) == HEAD + [100, 101, CTRL, 5]


def test_different_text_a_short_shared_opening_or_a_longer_result_than_allowed_change_nothing():
    prompt = HEAD + [102, 103, 7]
    assert aligned_prompt(prompt, [HEAD + [104, 103]], PIECES.__getitem__) == prompt  # "age" is not " `_"
    # Text shared only up to where the tokens' ends first meet is taken up to there, no further.
    assert aligned_prompt(prompt, [HEAD + [100, 101, 104]], PIECES.__getitem__) == HEAD + [100, 101, 103, 7]
    short = HEAD[:MIN_SHARED - 1]
    assert aligned_prompt(short + [102, 103], [short + [100, 101, 103]], PIECES.__getitem__) == short + [102, 103]
    held = HEAD + [100, 101, 103]
    assert aligned_prompt(prompt, [held], PIECES.__getitem__, max_len=len(prompt)) == prompt  # one token longer
    assert aligned_prompt(prompt, [held], PIECES.__getitem__, max_len=len(prompt) + 1) == held + [7]
    assert aligned_prompt(prompt, [], PIECES.__getitem__) == prompt


def test_of_several_held_conversations_the_one_covering_most_of_the_prompt_is_taken():
    near = HEAD + [100, 101, 103]  # spells the prompt's first word differently, then the same
    far = HEAD + [102, 103, 104, 11]  # already shares more tokens as they are
    prompt = HEAD + [102, 103, 104, 12]
    assert aligned_prompt(prompt, [near, far], PIECES.__getitem__) == prompt
    longer = HEAD + [100, 101, 103, 104, 12, 13]
    assert aligned_prompt(prompt, [near, longer], PIECES.__getitem__) == longer[:-1]


# Any two spellings of one text: letters as single tokens or as words of 2-4 letters.
LETTERS = st.text(alphabet="abcd", min_size=1, max_size=60)


def _spell(s: str, cuts: list[int], vocab: dict[bytes, int]) -> list[int]:
    out, i = [], 0
    for c in [*cuts, len(s)]:
        if c > i:
            piece = s[i:c].encode()
            out.append(vocab.setdefault(piece, 1000 + len(vocab)))
            i = c
    return out


@settings(max_examples=300, deadline=None)
@given(LETTERS, st.data())
def test_any_two_spellings_keep_the_prompts_bytes_and_never_share_less(s, data):
    vocab: dict[bytes, int] = {}
    cuts_a = sorted(data.draw(st.sets(st.integers(1, max(1, len(s) - 1)), max_size=len(s))))
    cuts_b = sorted(data.draw(st.sets(st.integers(1, max(1, len(s) - 1)), max_size=len(s))))
    keep = data.draw(st.integers(1, len(s)))
    head = list(range(1, MIN_SHARED + 1))
    held = head + _spell(s[:keep], [c for c in cuts_a if c < keep], vocab)
    prompt = head + _spell(s, cuts_b, vocab) + [26]
    fine = head + _spell(s, list(range(1, len(s))), vocab) + [26]
    pieces = dict(PIECES)
    pieces.update({t: p for p, t in vocab.items()})
    out = aligned_prompt(prompt, [held], pieces.__getitem__)
    assert b"".join(pieces[t] for t in out) == b"".join(pieces[t] for t in prompt)
    assert common_prefix_len(held, out) >= common_prefix_len(held, prompt)
    # Where every letter of the prompt is a token of its own, all the held text is shared.
    assert common_prefix_len(held, aligned_prompt(fine, [held], pieces.__getitem__)) == len(held)


# ---- the engine on the real model --------------------------------------------------------------


def _respelled(backend, tokens: list[int]) -> list[int]:
    """`tokens` with a word of the user's message (past the first MIN_SHARED + 8 tokens) written
    as two tokens: text the tokenizer would never produce, as a model's sampled reply may be."""
    for k, t in enumerate(tokens):
        if k < MIN_SHARED + 8:
            continue
        piece = backend.token_bytes(t)
        if len(piece) < 2 or not piece.isascii() or not piece.strip().isalpha():
            continue
        split = backend.tokenize(piece[:1].decode()) + backend.tokenize(piece[1:].decode())
        if len(split) == 2 and b"".join(backend.token_bytes(x) for x in split) == piece:
            return tokens[:k] + split + tokens[k + 1:]
    raise AssertionError("no token to respell")


@pytest.mark.slow
def test_real_model_next_turn_and_fork_reuse_a_history_held_in_other_tokens(clean_llama):
    from magnitude_tui.engine.core import Engine
    from tests.engine_driver import Driver, close_and_assert_empty

    engine = Engine(clean_llama, policy="target:100")
    engine.calibrate()
    d = Driver(engine)
    first = [Message("system", "You are a careful code reviewer."),
             Message("user", "What does the function passage_tokens in scheduler/sequence.py return?")]
    canonical = clean_llama.tokenize_chat(first)
    held = _respelled(clean_llama, canonical)
    assert held != canonical and len(held) == len(canonical) + 1
    d.submit("t1", "conv", prompt_tokens=held, max_tokens=12)
    d.run_until_done("t1")
    follow = first + [Message("assistant", d.seen["t1"].text), Message("user", "And what does it take?")]
    d.submit("t2", "conv", follow, max_tokens=4)
    d.run_until_done("t2")
    t2 = d.seen["t2"].last
    print(f"\nheld {len(held)} tokens (+{d.seen['t1'].last.generated}); turn 2: {t2.prompt_total} prompt tokens, "
          f"{t2.cached_tokens} cached")
    # The whole first prompt is reused, though the text tokenizes otherwise: without the held
    # spelling the cache would part from the prompt inside the first user message.
    assert t2.cached_tokens >= len(held)
    assert common_prefix_len(held, canonical) < len(held) - 8
    # A subagent forked from that conversation shares it the same way.
    d.submit("sub", "sub-1", follow[:-1] + [Message("user", "List its callers.")], max_tokens=4, fork_from="conv")
    d.run_until_done("sub")
    assert d.seen["sub"].last.cached_tokens >= len(held)
    assert d.seen["t2"].done and d.seen["sub"].done
    close_and_assert_empty(engine, "conv", "sub-1")


@pytest.mark.slow
def test_real_model_warm_resume_restores_a_history_held_in_other_tokens(clean_llama, tmp_path):
    from magnitude_tui.engine.core import Engine
    from magnitude_tui.engine.events import RestoreOutcome
    from magnitude_tui.engine.warm_store import WarmStore
    from scheduler.types import Request, SamplingParams

    first = [Message("user", "Say what the function passage_tokens in scheduler/sequence.py returns.")]
    held = _respelled(clean_llama, clean_llama.tokenize_chat(first))
    store = lambda: WarmStore(tmp_path / "kv", layout=clean_llama.state_layout, budget_bytes=1 << 30)  # noqa: E731
    engine = Engine(clean_llama, policy="fixed:512", warm=store())
    engine.submit(Request("t1", "s1", (), SamplingParams(temperature=0.0, max_tokens=8), prompt_tokens=tuple(held)))
    reply = "".join(u.text_delta for r in engine.run_until_idle() for u in r.updates)
    engine.shutdown()  # the app quits: the idle conversation is saved
    engine.close_session("s1")
    engine.run_until_idle()

    resumed = Engine(clean_llama, policy="fixed:512", warm=store())
    resumed.restore_session("s1", first + [Message("assistant", reply)])
    resumed.step()
    [notice] = resumed.take_notices()
    assert notice.outcome is RestoreOutcome.RESTORED, notice
    # All of the saved prompt comes back, though its text tokenizes otherwise.
    assert notice.tokens >= len(held), notice
    resumed.close_session("s1")
    resumed.run_until_idle()
    assert resumed.is_empty(), resumed.leaks()
