"""Provides with_chat_template: the test model's GGUF with another chat template (a Hermes-style one
that renders tools, for the tool-call paths a template without tools never takes)."""

from __future__ import annotations

import struct
from pathlib import Path

from tests.base_model_gguf import _STRING, _Reader, _string, write_gguf

# ChatML with tools in the system turn, calls in <tool_call> tags and results in <tool_response>
# tags, the layout Hermes- and Qwen-style templates use (written here for the tests).
HERMES_TEMPLATE = """{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

You may call functions. Their signatures are within <tools></tools>:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

For each call, write a JSON object with the function's name and arguments within <tool_call></tool_call> tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'system' %}
{%- elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{{ m.content }}{% for c in m.tool_calls %}<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def with_chat_template(src: Path, dst: Path, template: str) -> Path:
    """Copy `src` with `tokenizer.chat_template` set to `template` (added when missing)."""
    data = Path(src).read_bytes()
    r = _Reader(data)
    magic, version, n_tensors, n_kv = r.take("<4sIQQ")
    assert magic == b"GGUF", f"{src} is not a GGUF file"
    kvs: list[bytes] = []
    alignment = 32
    for _ in range(n_kv):
        start = r.pos
        name = r.string().decode()
        kind = r.take("<I")
        value_at = r.pos
        r.skip_value(kind)
        if name == "tokenizer.chat_template":
            continue
        if name == "general.alignment":
            alignment = struct.unpack_from("<I", data, value_at)[0]
        kvs.append(data[start:r.pos])
    kvs.append(_string(b"tokenizer.chat_template") + struct.pack("<I", _STRING) + _string(template.encode()))
    return write_gguf(dst, data, r, (magic, version, n_tensors), kvs, alignment)
