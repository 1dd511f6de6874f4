"""A tiny model that thinks: the qwen2 fixture converted, with a chat template that opens the
reply's `<think>` in the prompt (as Qwen3-Thinking-2507's and DeepSeek-R1's do) and honours
`enable_thinking` (as Qwen3's does). A random tiny model never writes a `<think>` of its own; with
this template everything it writes is thinking, unless the switch is off."""
from __future__ import annotations

import json
from pathlib import Path

from conftest import HF_FIXTURES
from hf_util import copy_fixture

THINKING_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{% else %}{{ '<think>\\n' }}{% endif %}{% endif %}")


def make_thinking_model(folder: Path) -> Path:
    """The HF folder with its tokenizer_config.json's template replaced, then converted."""
    from engine.convert.convert import convert
    src = copy_fixture(HF_FIXTURES / "qwen2", folder / "hf")
    config = json.loads((src / "tokenizer_config.json").read_text())
    (src / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": THINKING_TEMPLATE}))
    return convert(src, folder / "thinker", "keep").path
