"""Tests of the GGUF fixture writer (tests/gguf_fixtures.py) and K-quant reference (tests/kquant_ref.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import gguf
import numpy as np
import pytest

import gguf_fixtures as gf
import kquant_ref as kq
from gguf_fixtures import Q

HF_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "hf"

BUDGET = {Q.Q4_K: 0.08, Q.Q5_K: 0.04, Q.Q6_K: 0.02}
FORCED_F32_SUFFIXES = ("_norm.weight", ".bias", "ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight")
KIND_ARCH = {"llama": "llama", "mistral": "llama", "mixtral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
             "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "olmoe": "olmoe"}


def rel_rms(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(b**2)))


# ---------------------------------------------------------------------------------------
# K-quants
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K, Q.Q6_K])
def test_kquant_error_budget_and_size(qtype):
    x = np.random.default_rng(1).standard_normal((48, 512)).astype(np.float32)
    raw = kq.quantize(x, qtype)
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    assert block == 256
    assert raw.dtype == np.uint8 and raw.shape == (48, 512 // 256 * type_size)
    assert raw.shape == gguf.quant_shape_to_byte_shape(x.shape, qtype)
    y = gguf.quants.dequantize(raw, qtype)
    assert y.shape == x.shape
    err = rel_rms(y, x)
    print(f"{qtype.name}: relative RMS error {err:.4f}")
    assert err < BUDGET[qtype]


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K, Q.Q6_K])
def test_kquant_edge_cases(qtype):
    rng = np.random.default_rng(2)
    assert not gguf.quants.dequantize(kq.quantize(np.zeros((2, 256), np.float32), qtype), qtype).any()
    const = np.full((1, 256), -3.0, np.float32)
    assert np.allclose(gguf.quants.dequantize(kq.quantize(const, qtype), qtype), const, atol=2e-3)
    x3 = rng.standard_normal((3, 4, 256)).astype(np.float32) * 40  # 3-D (experts) and a large scale
    raw = kq.quantize(x3, qtype)
    assert raw.shape == (3, 4, gguf.GGML_QUANT_SIZES[qtype][1])
    assert rel_rms(gguf.quants.dequantize(raw, qtype), x3) < BUDGET[qtype]
    with pytest.raises(ValueError):
        kq.quantize(np.zeros((2, 96), np.float32), qtype)


def test_simple_types_go_through_gguf():
    x = np.random.default_rng(3).standard_normal((4, 64)).astype(np.float32)
    for qt in (Q.Q4_0, Q.Q4_1, Q.Q8_0):
        assert np.array_equal(kq.quantize(x, qt), gguf.quants.quantize(x, qt))


# ---------------------------------------------------------------------------------------
# llama transforms
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("n_head,n_kv,hd", [(4, 4, 16), (4, 2, 16), (8, 1, 8)])
def test_llama_permute_roundtrip(n_head, n_kv, hd):
    rng = np.random.default_rng(4)
    q = rng.standard_normal((n_head * hd, 24)).astype(np.float32)
    k = rng.standard_normal((n_kv * hd, 24)).astype(np.float32)
    for w, args in ((q, (n_head, n_head)), (k, (n_head, n_kv)), (q[:, 0], (n_head, n_head))):
        p = gf.llama_permute(w, *args)
        assert not np.array_equal(p, w)
        assert np.array_equal(np.sort(p, axis=0), np.sort(w, axis=0))  # a pure row permutation
        assert np.array_equal(gf.llama_unpermute(p, *args), w)


def test_llama_permute_turns_neox_rope_into_norm_rope():
    """HF rotates halves (NEOX); llama.cpp's llama arch rotates adjacent pairs (NORM) on permuted rows."""
    hd, pos, theta = 16, 7, 10000.0
    rng = np.random.default_rng(5)
    x = rng.standard_normal(hd)
    ang = pos * theta ** (-np.arange(0, hd, 2) / hd)
    c, s = np.cos(ang), np.sin(ang)
    x1, x2 = x[: hd // 2], x[hd // 2:]
    neox = np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s])
    xp = gf.llama_permute(x, 1)
    norm = np.empty(hd)
    norm[0::2] = xp[0::2] * c - xp[1::2] * s
    norm[1::2] = xp[1::2] * c + xp[0::2] * s
    assert np.allclose(gf.llama_unpermute(norm, 1), neox)


def test_llama3_rope_factors_match_hf_formula():
    hd, theta, factor, lo, hi, orig = 16, 10000.0, 8.0, 1.0, 4.0, 32
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    wavelen = 2 * math.pi / inv
    hf = np.where(wavelen > orig / lo, inv / factor, inv)
    smooth = (orig / wavelen - lo) / (hi - lo)
    mid = ~(wavelen < orig / hi) & ~(wavelen > orig / lo)
    hf = np.where(mid, (1 - smooth) * hf / factor + smooth * hf, hf)
    got = gf.llama3_rope_factors(hd, theta, factor, lo, hi, orig)
    assert got.dtype == np.float32 and got.shape == (hd // 2,)
    assert np.allclose(inv / got, hf, rtol=1e-5)


# ---------------------------------------------------------------------------------------
# conversion of HF folders
# ---------------------------------------------------------------------------------------

def expected_names(kind: str, cfg: dict, has_output: bool, rope_freqs: bool) -> set[str]:
    names = {"token_embd.weight", "output_norm.weight"}
    if has_output:
        names.add("output.weight")
    if rope_freqs:
        names.add("rope_freqs.weight")
    for i in range(cfg["num_hidden_layers"]):
        b = f"blk.{i}."
        names |= {b + n for n in ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                                   "attn_output.weight", "ffn_norm.weight")}
        if kind in ("qwen2", "qwen2_moe"):
            names |= {b + "attn_q.bias", b + "attn_k.bias", b + "attn_v.bias"}
        if kind in ("qwen3", "qwen3_moe", "olmoe"):
            names |= {b + "attn_q_norm.weight", b + "attn_k_norm.weight"}
        if kind in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe"):
            names |= {b + n for n in ("ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight",
                                       "ffn_down_exps.weight")}
        else:
            names |= {b + "ffn_gate.weight", b + "ffn_up.weight", b + "ffn_down.weight"}
        if kind == "qwen2_moe":
            names |= {b + n for n in ("ffn_gate_inp_shexp.weight", "ffn_gate_shexp.weight",
                                       "ffn_up_shexp.weight", "ffn_down_shexp.weight")}
    return names


def check_written(hf_dir: Path, out: Path, kind: str, qtypes=None) -> gf.GGUFPlan:
    cfg = json.loads((hf_dir / "config.json").read_text())
    raw = gf.load_hf_tensors(hf_dir)
    plan = gf.convert_hf(hf_dir, qtypes=qtypes)
    plan.write(out)
    s = gf.read_gguf(out)
    arch = KIND_ARCH[kind]
    assert s.arch == arch == plan.arch
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    llama3 = arch == "llama" and rope.get("rope_type") == "llama3"
    names = expected_names(kind, cfg, "lm_head.weight" in raw, llama3)
    assert set(s.tensors) == names
    # metadata
    m = s.metadata
    assert m[f"{arch}.block_count"] == cfg["num_hidden_layers"]
    assert m[f"{arch}.embedding_length"] == cfg["hidden_size"]
    assert m[f"{arch}.attention.head_count"] == cfg["num_attention_heads"]
    assert m[f"{arch}.attention.head_count_kv"] == cfg["num_key_value_heads"]
    assert m["tokenizer.ggml.model"] == "gpt2"
    assert len(m["tokenizer.ggml.tokens"]) == len(m["tokenizer.ggml.token_type"]) == cfg["vocab_size"]
    assert m["tokenizer.ggml.merges"]
    assert "tokenizer.chat_template" in m
    if kind in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe"):
        assert m[f"{arch}.expert_count"] == (cfg.get("num_local_experts") or cfg.get("num_experts"))
        assert m[f"{arch}.expert_used_count"] == cfg["num_experts_per_tok"]
    if arch in ("qwen2moe", "qwen3moe"):
        assert m[f"{arch}.expert_feed_forward_length"] == cfg["moe_intermediate_size"]
    if kind == "qwen2_moe":
        assert m[f"{arch}.expert_shared_feed_forward_length"] == cfg["shared_expert_intermediate_size"]
    # types and values as planned
    for name, (shape, qt) in s.tensors.items():
        spec = plan.tensors[name]
        assert shape == spec.shape and qt == spec.qtype, name
        if len(shape) == 1 or name.endswith(FORCED_F32_SUFFIXES):
            assert qt == Q.F32, name
        assert np.array_equal(s.tensor(name), spec.dequantized()), name
    # q/k permutation (llama only) and expert stacking, checked on the float values
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    q_hf = raw["model.layers.0.self_attn.q_proj.weight"][0].astype(np.float32)
    k_hf = raw["model.layers.0.self_attn.k_proj.weight"][0].astype(np.float32)
    q_g, k_g = plan.tensors["blk.0.attn_q.weight"].data, plan.tensors["blk.0.attn_k.weight"].data
    if arch == "llama":
        assert np.array_equal(q_g, gf.llama_permute(q_hf, n_head, n_head))
        assert np.array_equal(k_g, gf.llama_permute(k_hf, n_head, n_kv))
    else:
        assert np.array_equal(q_g, q_hf) and np.array_equal(k_g, k_hf)
    if kind == "olmoe":  # full-width q_norm stays in HF order too
        assert np.array_equal(plan.tensors["blk.0.attn_q_norm.weight"].data,
                              raw["model.layers.0.self_attn.q_norm.weight"][0])
    if "blk.0.ffn_gate_exps.weight" in plan.tensors:
        g = plan.tensors["blk.0.ffn_gate_exps.weight"].data
        d = plan.tensors["blk.0.ffn_down_exps.weight"].data
        n_exp, n_ff, n_embd = g.shape
        assert n_embd == cfg["hidden_size"] and d.shape == (n_exp, n_embd, n_ff)
        key = ("model.layers.0.block_sparse_moe.experts.1.w1.weight" if kind == "mixtral"
               else "model.layers.0.mlp.experts.1.gate_proj.weight")
        if key in raw:
            assert np.array_equal(g[1], raw[key][0])
    return plan


@pytest.mark.parametrize("kind", list(KIND_ARCH))
def test_hf_fixture_converts(kind, tmp_path):
    hf_dir = HF_FIXTURES / kind
    if not (hf_dir / "config.json").is_file():
        pytest.skip(f"{hf_dir} not generated")
    check_written(hf_dir, tmp_path / f"{kind}.gguf", kind)


@pytest.mark.parametrize("kind", list(KIND_ARCH))
def test_random_hf_converts(kind, tmp_path):
    hf = gf.make_random_hf(tmp_path / "hf", kind, dtype="bf16" if kind == "mistral" else "f32",
                           n_shards=3 if kind == "mixtral" else 1, tie_embeddings=kind == "qwen2",
                           rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
                           if kind == "llama" else None)
    check_written(hf, tmp_path / "out.gguf", kind)


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe"])
def test_fused_experts_equal_per_expert(kind, tmp_path):
    a = gf.convert_hf(gf.make_random_hf(tmp_path / "a", kind, seed=9), qtypes=Q.F32)
    b = gf.convert_hf(gf.make_random_hf(tmp_path / "b", kind, seed=9, fused_experts=True), qtypes=Q.F32)
    assert set(a.tensors) == set(b.tensors)
    for n in a.tensors:
        assert np.array_equal(a.tensors[n].data, b.tensors[n].data), n


def test_bf16_and_f16_checkpoints_load(tmp_path):
    ref = gf.load_hf_tensors(gf.make_random_hf(tmp_path / "f32", "llama", seed=3))
    for dt, tol in (("bf16", 2**-8), ("f16", 2**-11)):
        got = gf.load_hf_tensors(gf.make_random_hf(tmp_path / dt, "llama", seed=3, dtype=dt))
        for n, (arr, st) in got.items():
            assert st == dt.upper() and arr.dtype == (np.float32 if dt == "bf16" else np.float16)
            assert np.allclose(arr.astype(np.float32), ref[n][0], rtol=tol, atol=1e-7), n


def test_row_fallback(tmp_path):
    hf = gf.make_random_hf(tmp_path / "hf", "qwen2_moe")  # rows of 64, 32 and 48
    plan = gf.convert_hf(hf, qtypes=Q.Q4_K)
    assert {s.qtype for s in plan.tensors.values() if s.data.ndim > 1 and s.requested == Q.Q4_K} == {Q.F16}
    plan = gf.convert_hf(hf, qtypes=Q.Q4_0)
    assert plan.tensors["blk.0.ffn_down_shexp.weight"].qtype == Q.F16  # 48 % 32 != 0, like the converter
    assert plan.tensors["blk.0.ffn_up_shexp.weight"].qtype == Q.Q4_0
    plan = gf.convert_hf(hf, qtypes=Q.Q6_K, fallback="llama-quantize")
    assert plan.tensors["blk.0.attn_q.weight"].qtype == Q.Q8_0


def test_wide_gguf_every_kquant(tmp_path):
    out = gf.make_wide_gguf(tmp_path / "wide.gguf")
    s = gf.read_gguf(out)
    assert {qt for shape, qt in s.tensors.values() if len(shape) > 1} == {Q.Q4_K}
    hf = tmp_path / "wide_hf"
    mix = {"token_embd.weight": Q.Q6_K, "output.weight": Q.Q6_K, "blk.*.attn_*": Q.Q5_K,
           "blk.*.ffn_down.weight": Q.Q6_K, "blk.*.ffn_*": Q.Q4_K}
    plan = gf.convert_hf(hf, qtypes=mix)
    plan.write(tmp_path / "mix.gguf")
    s = gf.read_gguf(tmp_path / "mix.gguf")
    raw = gf.load_hf_tensors(hf)
    n_head, n_kv = 4, 2
    for name, (shape, qt) in s.tensors.items():
        if len(shape) == 1:
            assert qt == Q.F32
            continue
        want = (Q.Q6_K if name in ("token_embd.weight", "output.weight") or name.endswith("ffn_down.weight")
                else Q.Q5_K if ".attn_" in name else Q.Q4_K)
        assert qt == want, name
        assert shape[-1] % 256 == 0
        src = plan.tensors[name].source[0]
        ref = raw[src][0]
        if name.endswith("attn_q.weight"):
            ref = gf.llama_permute(ref, n_head, n_head)
        elif name.endswith("attn_k.weight"):
            ref = gf.llama_permute(ref, n_head, n_kv)
        assert rel_rms(s.tensor(name), ref) < BUDGET[want], name
    assert s.metadata["general.file_type"] == int(gguf.LlamaFileType.MOSTLY_Q4_K_M)  # Q4_K dominates


def test_write_raw_gguf_malformed(tmp_path):
    x = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)
    pre = kq.quantize(x, Q.Q6_K)
    out = gf.write_raw_gguf(tmp_path / "odd.gguf", "notanarch", {
        "token_embd.weight": (x, Q.Q4_K),
        "blk.0.mystery.weight": (pre, Q.Q6_K),
        "output_norm.weight": np.ones(256, np.float32),
    }, {"notanarch.block_count": 1, "custom.flag": True, "custom.list": [1, 2, 3],
        "custom.f": (2.5, gguf.GGUFValueType.FLOAT64)})
    s = gf.read_gguf(out)
    assert s.arch == "notanarch"
    assert s.tensors == {"token_embd.weight": ((8, 256), Q.Q4_K), "blk.0.mystery.weight": ((8, 256), Q.Q6_K),
                         "output_norm.weight": ((256,), Q.F32)}
    assert s.metadata["notanarch.block_count"] == 1 and s.metadata["custom.flag"] is True
    assert s.metadata["custom.list"] == [1, 2, 3] and s.metadata["custom.f"] == 2.5
    assert np.array_equal(s.tensor("blk.0.mystery.weight"), gguf.quants.dequantize(pre, Q.Q6_K))
    out = gf.write_raw_gguf(tmp_path / "noarch.gguf", None, {"a.weight": np.zeros((2, 32), np.float32)})
    assert "general.architecture" not in gf.read_gguf(out).metadata


def test_plan_can_be_edited(tmp_path):
    plan = gf.convert_hf(gf.make_random_hf(tmp_path / "hf", "qwen3"))
    del plan.tensors["blk.1.attn_k_norm.weight"]
    extra = gf.TensorSpec("blk.0.extra.weight", np.ones((4, 32), np.float32), Q.Q8_0)
    plan.tensors[extra.name] = extra
    plan.set_key("qwen3.block_count", 3)
    s = gf.read_gguf(plan.write(tmp_path / "bad.gguf"))
    assert "blk.1.attn_k_norm.weight" not in s.tensors
    assert s.tensors["blk.0.extra.weight"] == ((4, 32), Q.Q8_0)
    assert s.metadata["qwen3.block_count"] == 3


@pytest.mark.parametrize("kind", list(KIND_ARCH))
def test_hf_fixture_gguf_reproduces_transformers_logits(kind, tmp_path):
    """An F32 GGUF read with llama.cpp's semantics (NORM rope on permuted llama q/k, rope_freqs,
    hard-coded top-k renormalisation, ...) gives transformers' logits."""
    hf_dir = HF_FIXTURES / kind
    if not (hf_dir / "reference.npz").is_file():
        pytest.skip(f"{hf_dir} not generated")
    ref = np.load(hf_dir / "reference.npz")
    out = gf.write_gguf(hf_dir, tmp_path / "f32.gguf", qtypes=Q.F32)
    logits = gf.reference_forward(out, ref["input_ids"])
    assert np.abs(logits - ref["logits"]).max() < 1e-3
    if kind == "llama":
        # upstream reads original_max_position_embeddings at the top level (-> 8192) and misses
        # rope_scaling's 32: that file would not reproduce transformers
        bad = gf.write_gguf(hf_dir, tmp_path / "top.gguf", qtypes=Q.F32, llama3_orig_ctx="top_level")
        assert np.abs(gf.reference_forward(bad, ref["input_ids"]) - ref["logits"]).max() > 0.1
