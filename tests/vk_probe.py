"""Run as a script: load the default model on a device, print a JSON line with top-1 and a greedy continuation.

Separate process because GGML_VK_VISIBLE_DEVICES must be set before ggml initialises Vulkan.
"""

from __future__ import annotations

import json
import sys
import time

from backend.llama_backend import LlamaBackend
from scheduler.types import Message
from tests.greedy import greedy


def main(device: str, n_tokens: int) -> None:
    b = LlamaBackend.load(device=device, n_ctx=512, n_seq_max=2, n_batch=128, n_ubatch=128,
                          flash_attn="off")  # no attention probe: on lavapipe it would take minutes
    # A prompt whose first greedy choice is clear (top-2 logit margin ~2.5 on CPU), so that the
    # comparison tests the backend, not which side of a near-tie each kernel's rounding lands on.
    prompt = b.tokenize_chat([Message("user", "Hi!")])
    margins: dict = {}
    t0 = time.perf_counter()
    out = greedy(b, {0: prompt}, n_tokens, margins)[0]
    print(json.dumps({
        "device": b.device_name,
        "tokens": out,
        "text": "".join(b.detokenizer().feed(t) for t in out),
        "seconds": time.perf_counter() - t0,
        "margins": [round(m, 3) for m in margins[0]],
    }))
    b.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
