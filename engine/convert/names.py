"""Tensor names: one table per source format, internal name -> source name(s).

Internal names are GGUF's vocabulary with one tensor per expert (`blk.{L}.ffn_gate.{E}.weight`).
A source name ending in `[{E}]` is slice E of a stacked tensor (experts along the first axis);
`[{E}]#p/n` is part p of n equal row blocks of that slice (transformers 5 fuses gate and up
projections as `gate_up_proj` [E, 2·F, D], gate rows first). Where a row lists several source
names, the first one present in the checkpoint is used.
"""
from __future__ import annotations

import functools
import re

from engine.families.spec import Family, Rows

# Present in some checkpoints, derived by the engine: consumed without being stored.
HF_IGNORED = (re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq"),)

_B = "blk.{L}"
# internal name -> GGUF name(s) where GGUF's is not the same name (llama.cpp's names are one
# vocabulary for every family): stacked experts first, old per-expert second
GGUF_NAMES: Rows = (
    ("output_norm.weight",               ("output_norm.weight", "token_embd_norm.weight")),  # (the second: LFM2)
    ("blk.{L}.ffn_norm.weight",          (f"{_B}.ffn_norm.weight", f"{_B}.post_attention_norm.weight")),
    ("blk.{L}.ffn_gate.{E}.weight",      (f"{_B}.ffn_gate_exps.weight[{{E}}]", f"{_B}.ffn_gate.{{E}}.weight",
                                          f"{_B}.ffn_gate_up_exps.weight[{{E}}]#0/2")),  # (the third: Gemma 4)
    ("blk.{L}.ffn_up.{E}.weight",        (f"{_B}.ffn_up_exps.weight[{{E}}]", f"{_B}.ffn_up.{{E}}.weight",
                                          f"{_B}.ffn_gate_up_exps.weight[{{E}}]#1/2")),
    ("blk.{L}.ffn_down.{E}.weight",      (f"{_B}.ffn_down_exps.weight[{{E}}]", f"{_B}.ffn_down.{{E}}.weight")),
    # a shared expert, or (second) a leading dense layer's MLP in an MoE model (LFM2-MoE, Gemma 4)
    ("blk.{L}.ffn_gate_shexp.weight",    (f"{_B}.ffn_gate_shexp.weight", f"{_B}.ffn_gate.weight")),
    ("blk.{L}.ffn_up_shexp.weight",      (f"{_B}.ffn_up_shexp.weight", f"{_B}.ffn_up.weight")),
    ("blk.{L}.ffn_down_shexp.weight",    (f"{_B}.ffn_down_shexp.weight", f"{_B}.ffn_down.weight")),
)
# A dense GGUF model's MLP is our expert 0.
_GGUF_DENSE: Rows = tuple((f"blk.{{L}}.ffn_{p}.0.weight", (f"{_B}.ffn_{p}.weight",)) for p in ("gate", "up", "down"))


def _pattern(internal: str) -> re.Pattern[str]:
    return re.compile("^" + re.escape(internal).replace(r"\{L\}", r"(?P<L>\d+)").replace(r"\{E\}", r"(?P<E>\d+)") + "$")


@functools.cache
def _compiled(rows: Rows) -> list[tuple[re.Pattern[str], tuple[str, ...]]]:
    return [(_pattern(i), srcs) for i, srcs in rows]


def _match(internal: str, rows: Rows) -> list[str] | None:
    for pat, srcs in _compiled(rows):
        if m := pat.match(internal):
            return [t.format(**m.groupdict()) for t in srcs]
    return None


def hf_names(internal: str, family: Family) -> list[str]:
    """Candidate Hugging Face names for an internal tensor name, from the family's table."""
    return _match(internal, family.hf_tensors) or []


def gguf_names(internal: str, dense: bool) -> list[str]:
    """Candidate GGUF names (possibly `name[E]` slices) for an internal tensor name."""
    return _match(internal, (_GGUF_DENSE if dense else ()) + GGUF_NAMES) or [internal]


def split_transforms(source_name: str) -> tuple[str, tuple[int, int] | None, bool, str | None]:
    """"x[3]~0/2'" -> ("x[3]", (0, 2), True, None): columns 0::2 of the slice, then transposed;
    "x@plus1" -> ("x", None, False, "plus1"): the values mapped (SourceTensor.mapped)."""
    m = re.fullmatch(r"(.*?)(?:~(\d+)/(\d+))?('?)(?:@(\w+))?", source_name)
    cols = (int(m.group(2)), int(m.group(3))) if m.group(2) else None
    return m.group(1), cols, bool(m.group(4)), m.group(5)


def split_slice(source_name: str) -> tuple[str, int | None, tuple[int, int] | None]:
    """'x.gate_up_proj[3]#1/2' -> ('x.gate_up_proj', 3, (1, 2)); plain names -> (name, None, None)."""
    m = re.fullmatch(r"(.*)\[(\d+)\](?:#(\d+)/(\d+))?", source_name)
    if not m:
        return source_name, None, None
    part = (int(m.group(3)), int(m.group(4))) if m.group(3) else None
    return m.group(1), int(m.group(2)), part
