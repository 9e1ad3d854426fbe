"""Provides what a backend says and does when its model carries no chat template (ChatML stands in)."""

from __future__ import annotations

from enum import Enum
from typing import Callable

# The fallback template's turn markers (backend/chat.py's CHATML renders exactly these).
CHATML_MARKERS = ("<|im_end|>", "<|im_start|>")
# Keys of a backend's `info` (EngineReady.info) the app reads.
INFO_TEMPLATE = "chat_template"
INFO_NOTICE = "template_notice"


class TemplateSource(str, Enum):
    """Where the chat template a backend renders conversations with comes from."""

    MODEL = "model"  # the GGUF's own tokenizer.chat_template
    CHATML_FALLBACK = "chatml fallback"  # the GGUF has none: a base model, most likely


def text_markers(tokenize_special: Callable[[str], list[int]]) -> tuple[str, ...]:
    """The ChatML markers the vocabulary has no single token for: a model can only write them as
    text, so no end-of-generation token ever ends its turn and the engine must stop on the text."""
    return tuple(m for m in CHATML_MARKERS if len(tokenize_special(m)) != 1)


def fallback_notice(stops: tuple[str, ...]) -> str:
    """What the user (and the log) is told at load when ChatML stands in for a missing template."""
    how = (f"; {' and '.join(stops)} are not tokens of its vocabulary, so replies stop where the "
           "model writes them as text" if stops else "")
    return (f"The model has no chat template: conversations are rendered as ChatML{how}. A base "
            "model may not follow it; type /raw in a pane to complete its text as is, or use "
            "POST /v1/completions.")


def template_info(source: TemplateSource, notice: str | None) -> dict[str, str]:
    """The entries a backend adds to its `info` about its chat template."""
    return {INFO_TEMPLATE: source.value, **({INFO_NOTICE: notice} if notice else {})}
