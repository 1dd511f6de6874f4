"""The GGUFs llama.cpp's converter made from the arch fixtures (tests/fixtures/arch_llamacpp): every
tensor maps back to the HF checkpoint's by the table in arch_gguf.py, the metadata alone gives the
config a forward pass needs, and that forward pass over the GGUF agrees with transformers and with
llama.cpp's own runs of the same file."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from arch_gguf import config_from_gguf, hf_from_gguf, read_gguf
from arch_reference import ARCH_FIXTURES, ARCHS, Model
from hf_util import read_folder

GGUFS = Path(__file__).resolve().parent / "fixtures" / "arch_llamacpp"


@pytest.fixture(scope="module")
def from_gguf():
    cache = {}

    def get(arch: str):
        if arch not in cache:
            path = GGUFS / f"{arch}-f16.gguf"
            tensors = read_gguf(path)
            cfg = config_from_gguf(arch, path, tensors)
            hf, used = hf_from_gguf(arch, tensors, json.loads((ARCH_FIXTURES / arch / "config.json").read_text()))
            cache[arch] = tensors, cfg, hf, used
        return cache[arch]
    return get


@pytest.mark.parametrize("arch", ARCHS)
def test_every_gguf_tensor_maps_to_the_hf_checkpoint(from_gguf, arch):
    tensors, _, hf, used = from_gguf(arch)
    assert set(tensors) - used == set(), "GGUF tensors no table row consumed"
    want = read_folder(ARCH_FIXTURES / arch)
    assert set(want) - set(hf) == set(), "HF tensors the GGUF does not give back"
    assert set(hf) - set(want) == set()
    for name, a in want.items():
        assert hf[name].shape == a.shape, name
        np.testing.assert_allclose(hf[name], a, rtol=2e-3, atol=1e-6, err_msg=name)  # bf16 -> f16: exact but subnormals


def same(a, b) -> bool:
    return abs(a - b) <= 1e-6 * abs(b) if isinstance(a, float) else a == b


@pytest.mark.parametrize("arch", ARCHS)
def test_gguf_metadata_gives_the_config(from_gguf, arch):
    _, cfg, _, _ = from_gguf(arch)
    hf = json.loads((ARCH_FIXTURES / arch / "config.json").read_text())
    for key, value in cfg.items():
        if key in ("rope_parameters", "per_layer_config", "vocab_size"):
            continue
        assert same(value, hf[key]), (key, value, hf[key])
    rp, hrp = cfg["rope_parameters"], hf["rope_parameters"]
    for kind, params in (rp.items() if arch == "gemma4" else [(None, rp)]):
        want = hrp[kind] if kind else hrp
        for key, value in params.items():
            assert same(value, want.get(key, value)), (kind, key, value, want.get(key))


@pytest.mark.parametrize("arch", ARCHS)
def test_forward_over_the_gguf_matches_transformers_and_llamacpp(from_gguf, arch):
    _, cfg, hf, _ = from_gguf(arch)
    m = Model(arch, weights=hf, cfg=cfg)
    ref = np.load(ARCH_FIXTURES / arch / "reference.npz")
    logits = m.forward(ref["input_ids"])
    assert np.abs(logits - ref["logits"]).max() <= 1e-4 * np.abs(ref["logits"]).max()
    rec = json.loads((ARCH_FIXTURES / arch / "llamacpp.json").read_text())
    for name, run in rec["runs"].items():
        m.reset()
        ours = m.forward(np.array(run["ids"])).argmax(-1)
        confident = np.array(run["margins"]) >= 0.05
        assert (ours == np.array(run["argmax"]))[confident].mean() >= 0.98, name
    m.reset()
    got = [int(m.forward(ref["input_ids"])[-1].argmax())]
    while len(got) < 8:
        got.append(int(m.forward(np.array([got[-1]]))[-1].argmax()))
    assert got == rec["runs"]["prompt"]["greedy_ids"][:8]


def test_qwen3_5_gguf_runs_as_stored_with_tiled_value_heads(from_gguf):
    """The DeltaNet kernel's tiled order runs llama.cpp's reordered value heads without undoing it."""
    tensors, cfg, hf, _ = from_gguf("qwen3_5_moe")
    raw = dict(hf)
    for i, t in enumerate(cfg["layer_types"]):
        if t != "linear_attention":
            continue
        b, pre = f"blk.{i}.", f"model.layers.{i}.linear_attn."
        raw[pre + "in_proj_qkv.weight"] = tensors[b + "attn_qkv.weight"]
        raw[pre + "in_proj_z.weight"] = tensors[b + "attn_gate.weight"]
        raw[pre + "in_proj_b.weight"] = tensors[b + "ssm_beta.weight"]
        raw[pre + "in_proj_a.weight"] = tensors[b + "ssm_alpha.weight"]
        raw[pre + "A_log"] = np.log(-tensors[b + "ssm_a"])
        raw[pre + "dt_bias"] = tensors[b + "ssm_dt.bias"]
        raw[pre + "conv1d.weight"] = tensors[b + "ssm_conv1d.weight"][:, None, :]
        raw[pre + "out_proj.weight"] = tensors[b + "ssm_out.weight"]
    ref = np.load(ARCH_FIXTURES / "qwen3_5_moe" / "reference.npz")
    logits = Model("qwen3_5_moe", weights=raw, cfg=cfg, tiled=True).forward(ref["input_ids"])
    assert np.abs(logits - ref["logits"]).max() <= 1e-4 * np.abs(ref["logits"]).max()
    wrong = Model("qwen3_5_moe", weights=raw, cfg=cfg, tiled=False).forward(ref["input_ids"])
    assert np.abs(wrong - ref["logits"]).max() > 1e-2 * np.abs(ref["logits"]).max()  # the order matters
