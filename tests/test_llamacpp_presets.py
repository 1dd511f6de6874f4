"""GGUFs that llama.cpp's own tools wrote, one per quantization preset (tests/make_llamacpp_presets.py):
each imports byte for byte, dequantizes as the gguf package does, and computes llama.cpp's
greedy tokens."""
from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
from conftest import TESTS

from engine import quant
from engine.api import Engine
from engine.convert.convert import convert
from engine.convert.gguf_file import unpermute_order
from engine.kernels import cpu
from engine.model_dir import open_model_dir

FIXTURES = TESTS / "fixtures" / "llamacpp_presets"
REF = json.loads((FIXTURES / "reference.json").read_text())
PRESETS = list(REF["presets"])
DENSE_FFN = ("ffn_gate", "ffn_up", "ffn_down")  # stored as expert 0 of a one-expert layer
NOISE = 0.05  # llama.cpp's top-1/top-2 margins below this are not compared (rounding noise)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("presets")
    return {p: convert(FIXTURES / REF["presets"][p]["file"], root / p).path for p in PRESETS}


def _stored(model) -> dict[str, tuple[np.ndarray, quant.QuantType]]:
    out = {}
    for rel in model.files():
        f = model.tensor_file(rel)
        out |= {n: (np.asarray(f.stored(n)), i.qtype.plain) for n, i in f.infos.items()}  # (experts: repacked on disk)
    return out


def test_every_imported_type_appears_in_some_preset():
    """The fixtures hold every type llama.cpp's presets write (the fallbacks included)."""
    seen = set()
    for p in PRESETS:
        seen |= {t.tensor_type.name.lower() for t in gguf.GGUFReader(FIXTURES / REF["presets"][p]["file"]).tensors}
    block_types = {t.name for t in quant.BY_NAME.values() if t.is_block and t.base is None}  # (not the x8 layouts)
    assert block_types <= seen, block_types - seen


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_imports_byte_for_byte(converted, preset):
    reader = gguf.GGUFReader(FIXTURES / REF["presets"][preset]["file"])
    model = open_model_dir(converted[preset], verify=True)
    stored = _stored(model)
    heads = {"attn_q": model.config.num_heads, "attn_k": model.config.num_kv_heads}
    for t in reader.tensors:
        raw = np.asarray(t.data)
        ref = gguf.quants.dequantize(raw, t.tensor_type).astype(np.float32)
        ours = quant.dequantize(raw, int(t.tensor_type))  # real llama.cpp blocks, bit for bit
        assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32)), t.name
        rows, want = raw.reshape(-1, raw.shape[-1]), ref.reshape(-1, ref.shape[-1])
        got = np.empty(want.shape[-1], np.float32)
        for r in range(0, len(rows), 7) if raw.ndim > 1 else ():  # the numba kernel too
            cpu.dequantize_row(np.ascontiguousarray(rows[r]).view(np.uint8), int(t.tensor_type), got)
            assert np.array_equal(got.view(np.uint32), want[r].view(np.uint32)), t.name
        kind = t.name.split(".")[-2]
        if kind in heads and model.config.architecture in ("llama", "mixtral"):  # q/k rows back in HF order
            raw = raw[unpermute_order(heads[kind], raw.shape[0])]
        experts = {f"{t.name[:-len(kind) - 7]}{kind[:-5]}.{e}.weight": raw[e] for e in range(raw.shape[0])} \
            if kind.endswith("_exps") else {t.name.replace(".weight", ".0.weight") if kind in DENSE_FFN else t.name: raw}
        for name, part in experts.items():  # stacked experts: expert e in a file of its own
            data, qtype = stored[name]
            assert qtype.type_id == int(t.tensor_type), name
            assert np.array_equal(data.view(np.uint8).ravel(), part.view(np.uint8).ravel()), name


@pytest.mark.parametrize("preset", PRESETS)
def test_greedy_tokens_equal_llama_cpp(converted, preset):
    """Teacher forced on llama.cpp's greedy runs: our argmax equals llama.cpp's wherever its own
    top-1/top-2 margin is at least NOISE, at >= 98% of those positions; the last prompt
    position's largest logits agree to 5% of the top one."""
    eng = Engine(converted[preset], threads=2, kv_cache_quantize="f32", context_length=256)
    try:
        compared = agreed = 0
        for run in REF["presets"][preset]["runs"]:
            seq = run["prompt_ids"] + run["generated_ids"]
            logits = eng.logits(seq[:-1])
            ours = logits[len(run["prompt_ids"]) - 1:].argmax(-1)
            sure = np.array(run["margins"]) >= NOISE
            compared += int(sure.sum())
            agreed += int((ours == np.array(run["generated_ids"]))[sure].sum())
            top = run["last_prompt_top"]
            last = logits[len(run["prompt_ids"]) - 1]
            np.testing.assert_allclose(last[top["ids"]], top["logits"], atol=0.05 * abs(top["logits"][0]))
    finally:
        eng.close()
    assert compared >= 150
    assert agreed / compared >= 0.98, f"{agreed}/{compared}"


@pytest.mark.parametrize("preset", ["Q4_K_M", "IQ4_XS", "Q2_K", "MXFP4_MOE"])
def test_wizard_sizes_know_every_type(preset):
    """The conversion wizard's plan (app.model_info) sizes a kept model as the GGUF's own tensor
    bytes: the table knows each type's block size."""
    from app.model_info import inspect
    path = FIXTURES / REF["presets"][preset]["file"]
    s = inspect(path).sizes["keep"]
    assert s.dense + s.experts == sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors)
