"""The real model rewritten as a base model (no chat template, ChatML markers only as text): the
load says so, a chat reply stops where the model writes the end marker as text, and a raw prompt
is continued without the template."""

from __future__ import annotations

import logging

import pytest

from backend.template_fallback import CHATML_MARKERS, INFO_NOTICE, INFO_TEMPLATE, TemplateSource
from magnitude_tui.engine.core import Engine
from scheduler.types import DoneReason, Message, Request, SamplingParams
from tests.base_model_gguf import base_model_copy
from tests.engine_driver import Driver, Seen, close_and_assert_empty
from tests.needs import need_real_model

pytestmark = pytest.mark.slow
MAX_TOKENS = 64


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    need_real_model()
    from backend.llama_backend import LlamaBackend
    from backend.llama_load import default_model_path

    path = base_model_copy(default_model_path(), tmp_path_factory.mktemp("base") / "base.gguf")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("backend.chat").addHandler(handler)
    try:
        backend = LlamaBackend.load(model_path=str(path), device="cpu", n_ctx=2048, n_seq_max=2, n_batch=512,
                                    flash_attn="off")
    finally:
        logging.getLogger("backend.chat").removeHandler(handler)
    backend.load_log = [r.getMessage() for r in records]
    yield backend
    backend.close()


def _run(engine: Engine, request: Request) -> Seen:
    d = Driver(engine)
    d.seen[request.request_id] = Seen()
    engine.submit(request)
    d.run_until_done(request.request_id)
    return d.seen[request.request_id]


def test_the_load_says_chatml_stands_in_and_why_replies_stop(base):
    assert base.info[INFO_TEMPLATE] == TemplateSource.CHATML_FALLBACK.value
    assert base.chat_stops == CHATML_MARKERS  # neither marker is a token of this vocabulary
    assert base.info[INFO_NOTICE] in base.load_log  # the engine log says it too
    assert len(base.tokenize("<|im_end|>", special=True)) > 1


def test_a_chat_reply_stops_at_the_end_marker_written_as_text(base):
    engine = Engine(base, policy="fixed:64", coalesce_ms=0)
    seen = _run(engine, Request("c", "chat", (Message("user", "What is the capital of France?"),),
                                SamplingParams(max_tokens=MAX_TOKENS)))
    # Trained on ChatML, the model ends its turn with the token that is now the text " <|im_end|>".
    assert seen.last.done_reason is DoneReason.STOP and seen.last.generated < MAX_TOKENS
    assert seen.text.strip() and "<|im" not in seen.text
    close_and_assert_empty(engine, "chat")


def test_a_raw_prompt_is_continued_without_the_template(base):
    engine = Engine(base, policy="fixed:64", coalesce_ms=0)
    prompt = "The capital of France is"
    seen = _run(engine, Request("r", "raw", (), SamplingParams(max_tokens=8), prompt=prompt))
    assert seen.last.prompt_total == len(base.tokenize(prompt, add_bos=True))
    assert seen.last.done_reason in (DoneReason.LENGTH, DoneReason.STOP) and seen.text
    close_and_assert_empty(engine, "raw")
