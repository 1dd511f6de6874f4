"""Hugging Face checkpoints of every supported architecture, converted and read back."""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import HF_ARCHS, HF_FIXTURES
from hf_util import read_folder, read_safetensors, write_safetensors

from engine import quant
from engine.convert.convert import convert
from engine.errors import ConfigError
from engine.model_dir import open_model_dir


def converted_tensors(path) -> dict[str, np.ndarray]:
    model = open_model_dir(path, verify=True)
    out = {}
    for rel in model.files():
        with model.tensor_file(rel) as f:
            out.update({n: f.dequantize(n).copy() for n in f.names()})
    return out


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    """Each fixture converted once with --quantize keep."""
    root = tmp_path_factory.mktemp("kept")
    return {a: convert(HF_FIXTURES / a, root / a, "keep").path for a in HF_ARCHS}


@pytest.mark.parametrize("arch", HF_ARCHS)
def test_keep_is_exact_and_complete(kept, arch):
    """Every source tensor appears exactly once, bit for bit; nothing is invented."""
    src = read_folder(HF_FIXTURES / arch)
    ours = converted_tensors(kept[arch])
    ours.pop("rope_freqs.weight", None)  # computed from the llama3 rope_scaling, checked below
    def key(a):
        return a.shape[-1], a.size, a.astype(np.float32).tobytes()

    want = sorted(key(v) for v in src.values())
    got = sorted(key(v) for v in ours.values())
    assert len(got) == len(want)
    assert got == want


SPOT_CHECKS = {  # internal name -> Hugging Face name, restated here independently of the names table
    "llama": {"blk.1.attn_q.weight": "model.layers.1.self_attn.q_proj.weight",
              "blk.0.ffn_down.0.weight": "model.layers.0.mlp.down_proj.weight",
              "blk.1.ffn_norm.weight": "model.layers.1.post_attention_layernorm.weight"},
    "qwen2": {"blk.0.attn_k.bias": "model.layers.0.self_attn.k_proj.bias",
              "token_embd.weight": "model.embed_tokens.weight"},
    "mixtral": {"blk.1.ffn_gate.3.weight": "model.layers.1.block_sparse_moe.experts.3.w1.weight",
                "blk.1.ffn_up.3.weight": "model.layers.1.block_sparse_moe.experts.3.w3.weight",
                "blk.0.ffn_down.7.weight": "model.layers.0.block_sparse_moe.experts.7.w2.weight",
                "blk.0.ffn_gate_inp.weight": "model.layers.0.block_sparse_moe.gate.weight"},
    "qwen2_moe": {"blk.1.ffn_up_shexp.weight": "model.layers.1.mlp.shared_expert.up_proj.weight",
                  "blk.0.ffn_gate.2.weight": "model.layers.0.mlp.experts.2.gate_proj.weight"},
    "qwen3_moe": {"blk.1.attn_q_norm.weight": "model.layers.1.self_attn.q_norm.weight"},
    "olmoe": {"blk.0.attn_k_norm.weight": "model.layers.0.self_attn.k_norm.weight",
              "blk.1.ffn_down.1.weight": "model.layers.1.mlp.experts.1.down_proj.weight"},
}


@pytest.mark.parametrize("arch", SPOT_CHECKS)
def test_names_land_where_expected(kept, arch):
    src, ours = read_folder(HF_FIXTURES / arch), converted_tensors(kept[arch])
    for internal, hf_name in SPOT_CHECKS[arch].items():
        assert np.array_equal(ours[internal], src[hf_name]), internal
    if arch == "qwen2_moe":  # the (1, D) shared-expert gate is stored as a vector
        gate = src["model.layers.0.mlp.shared_expert_gate.weight"]
        assert np.array_equal(ours["blk.0.ffn_gate_inp_shexp.weight"], gate.reshape(-1))


@pytest.mark.parametrize("arch", HF_ARCHS)
def test_config_matches_source(kept, arch):
    hf = json.loads((HF_FIXTURES / arch / "config.json").read_text())
    cfg = open_model_dir(kept[arch]).config
    assert cfg.hidden_size == hf["hidden_size"] and cfg.num_layers == hf["num_hidden_layers"]
    assert cfg.num_heads == hf["num_attention_heads"] and cfg.num_kv_heads == hf["num_key_value_heads"]
    assert cfg.vocab_size == hf["vocab_size"]
    experts = hf.get("num_experts") or hf.get("num_local_experts") or 1
    assert cfg.num_experts == experts and cfg.top_k == hf.get("num_experts_per_tok", 1)
    assert cfg.tie_word_embeddings == hf.get("tie_word_embeddings", False)
    theta = hf.get("rope_theta") or hf["rope_parameters"]["rope_theta"]
    assert cfg.rope_theta == theta
    assert cfg.norm_topk_prob == {"mixtral": True}.get(arch, hf.get("norm_topk_prob", False))
    assert cfg.qk_norm == {"qwen3": "head", "qwen3_moe": "head", "olmoe": "full"}.get(arch, "none")


def test_llama3_rope_scaling_becomes_frequency_divisors(kept):
    """rope_freqs holds the per-frequency divisors of transformers' llama3 rule."""
    hf = json.loads((HF_FIXTURES / "llama" / "config.json").read_text())
    s, theta, hd = hf["rope_scaling"], hf["rope_theta"], hf["hidden_size"] // hf["num_attention_heads"]
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    wavelen = 2 * np.pi / inv
    lo_wl, hi_wl = s["original_max_position_embeddings"] / s["low_freq_factor"], \
        s["original_max_position_embeddings"] / s["high_freq_factor"]
    scaled = np.where(wavelen > lo_wl, inv / s["factor"], inv)  # transformers' rule, restated
    smooth = (s["original_max_position_embeddings"] / wavelen - s["low_freq_factor"]) / \
        (s["high_freq_factor"] - s["low_freq_factor"])
    medium = (wavelen <= lo_wl) & (wavelen >= hi_wl)
    scaled = np.where(medium, (1 - smooth) * inv / s["factor"] + smooth * inv, scaled)
    divisors = converted_tensors(kept["llama"])["rope_freqs.weight"]
    np.testing.assert_allclose(inv / divisors, scaled, rtol=1e-6)
    assert open_model_dir(kept["llama"]).config.rope_freq_factors


def test_bf16_kept_bit_exact(kept):
    src = read_safetensors(HF_FIXTURES / "mistral" / "model.safetensors")
    assert src["model.layers.0.self_attn.q_proj.weight"][0] == "BF16"
    f = open_model_dir(kept["mistral"]).tensor_file("attention/layer_0.bin")
    assert f.infos["blk.0.attn_q.weight"].qtype.name == "bf16"
    assert np.array_equal(f.dequantize("blk.0.attn_q.weight"), src["model.layers.0.self_attn.q_proj.weight"][1])


@pytest.mark.parametrize("target,budget_of", [("f16", "f16"), ("int8", "q8_0"), ("int4", "q4_1")])
@pytest.mark.parametrize("arch", ["mistral", "qwen2_moe"])
def test_quantized_within_budget(tmp_path, arch, target, budget_of):
    out = convert(HF_FIXTURES / arch, tmp_path / "m", target).path
    model = open_model_dir(out, verify=True)
    src = read_folder(HF_FIXTURES / arch)
    ours = converted_tensors(out)
    types = {}
    for rel in model.files():
        with model.tensor_file(rel) as f:
            types.update({n: i.qtype.plain.name for n, i in f.infos.items()})  # (experts: repacked)
    budget = quant.get(budget_of).rms_budget * 1.5  # fixture weights are near-normal, not exactly
    checked = 0
    for name, hf_name in {"blk.0.attn_q.weight": "model.layers.0.self_attn.q_proj.weight",
                          "blk.1.attn_output.weight": "model.layers.1.self_attn.o_proj.weight"}.items():
        x, y = src[hf_name], ours[name]
        assert np.sqrt(np.mean((x - y) ** 2) / np.mean(x ** 2)) <= budget
        checked += 1
    assert checked
    for name, t in types.items():
        if ours[name].ndim == 1 or name.endswith("ffn_gate_inp.weight"):
            assert t == "f32"  # norms, biases and routers stay exact
        elif name in ("token_embd.weight", "output.weight") and target == "int4":
            assert t == "q8_0"
        elif ours[name].shape[-1] % 32:
            assert t == "f16"  # rows that do not fill whole blocks fall back (with a warning)
        else:
            assert t == quant.TARGETS[target], name
    assert open_model_dir(out).meta["quantization"]["requested"] == target


def test_fused_expert_checkpoint_matches_per_expert(tmp_path, kept):
    """transformers 5 can save experts fused (gate_up_proj [E, 2F, D], down_proj [E, D, F])."""
    src = read_safetensors(HF_FIXTURES / "qwen3_moe" / "model.safetensors")
    cfg = json.loads((HF_FIXTURES / "qwen3_moe" / "config.json").read_text())
    E = cfg.get("num_experts") or cfg["num_local_experts"]
    fused = {k: v for k, v in src.items() if ".experts." not in k}
    for L in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{L}.mlp.experts."
        gate_up = [np.concatenate([src[f"{p}{e}.gate_proj.weight"][1], src[f"{p}{e}.up_proj.weight"][1]]) for e in range(E)]
        fused[p + "gate_up_proj"] = ("F32", np.stack(gate_up))
        fused[p + "down_proj"] = ("F32", np.stack([src[f"{p}{e}.down_proj.weight"][1] for e in range(E)]))
    folder = tmp_path / "fused"
    folder.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (folder / f).write_bytes((HF_FIXTURES / "qwen3_moe" / f).read_bytes())
    write_safetensors(folder / "model.safetensors", fused)
    a = converted_tensors(convert(folder, tmp_path / "out", "keep").path)
    b = converted_tensors(kept["qwen3_moe"])
    assert a.keys() == b.keys()
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_unsplit_layout_holds_the_same_tensors(tmp_path, kept):
    out = convert(HF_FIXTURES / "qwen2_moe", tmp_path / "packed", "keep", split_experts=False).path
    assert sorted(p.name for p in (out / "experts").iterdir()) == ["layer_0.bin", "layer_1.bin"]
    a, b = converted_tensors(out), converted_tensors(kept["qwen2_moe"])
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_split_layout_is_one_file_per_expert(kept):
    names = sorted(p.name for p in (kept["mixtral"] / "experts").iterdir())
    assert names == sorted(f"layer_{L}_expert_{e}.bin" for L in range(2) for e in range(8))
    assert sorted(p.name for p in (kept["mixtral"] / "router").iterdir()) == ["layer_0.bin", "layer_1.bin"]
    assert not (kept["llama"] / "router").exists()  # dense: one expert, nothing to route


def test_tokenizer_and_template_travel(kept):
    from tokenizers import Tokenizer
    for arch in HF_ARCHS:
        out = kept[arch]
        assert (out / "tokenizer.json").read_bytes() == (HF_FIXTURES / arch / "tokenizer.json").read_bytes()
        tcfg = json.loads((HF_FIXTURES / arch / "tokenizer_config.json").read_text())
        assert (out / "chat_template.jinja").read_text() == tcfg["chat_template"]
        meta = open_model_dir(out).meta["tokenizer"]
        tok = Tokenizer.from_file(str(out / "tokenizer.json"))
        assert meta["eos_token"] == "<|im_end|>" and tok.token_to_id("<|im_end|>") in meta["eos_token_ids"]


def test_experts_and_top_k_options(tmp_path):
    with pytest.raises(ConfigError, match="--num_experts 4: the source model has 8 experts"):
        convert(HF_FIXTURES / "mixtral", tmp_path / "a", num_experts=4)
    with pytest.raises(ConfigError, match="--top_k 9"):
        convert(HF_FIXTURES / "mixtral", tmp_path / "b", top_k=9)
    out = convert(HF_FIXTURES / "mixtral", tmp_path / "c", num_experts=8, top_k=1).path
    assert open_model_dir(out).config.top_k == 1
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_the_one_safetensors_reader_agrees_with_the_safetensors_package(tmp_path):
    """engine.convert.safetensors_file against the `safetensors` package's numpy writer; BF16
    (which that package's numpy API cannot hold) against hand-made bits: 0x3F80 = 1.0, 0xC040 = -3.0."""
    from safetensors.numpy import save_file

    from engine.convert.safetensors_file import read_tensors
    rng = np.random.default_rng(0)
    want = {"a": rng.standard_normal((3, 5)).astype(np.float32), "b": rng.standard_normal(7).astype(np.float16),
            "c": np.arange(6, dtype=np.int32).reshape(2, 3)}
    save_file(want, str(tmp_path / "x.safetensors"))
    got = read_tensors(tmp_path / "x.safetensors")
    assert [got[k][0] for k in want] == ["F32", "F16", "I32"]
    for k, v in want.items():
        assert got[k][1].dtype == v.dtype and np.array_equal(got[k][1], v)
    write_safetensors(tmp_path / "bf16.safetensors", {"w": ("BF16", np.array([0x3F80, 0xC040], np.uint16))})
    assert read_tensors(tmp_path / "bf16.safetensors")["w"][1].tolist() == [1.0, -3.0]
