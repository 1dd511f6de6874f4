"""The layouts the released checkpoints use, written by hand from the transformers fixtures' own
tensors (tests/fixtures/arch): Qwen3.5/3.6-MoE and Gemma 4 ship as *ForConditionalGeneration
(the text model under model.language_model., its config under text_config, vision tensors and
Qwen3.5's mtp.* beside it). The converter reads the text model and skips the rest by name; the
result must be the fixture's model, held to transformers' logits as test_arch_engine holds it."""
from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest
from arch_reference import ARCH_FIXTURES
from hf_util import read_safetensors, write_safetensors

from engine.api import Engine
from engine.convert.convert import convert

# architecture -> the wrapper class and the extra tensors its released checkpoints carry
WRAPPED = {
    "qwen3_5_moe": ("Qwen3_5MoeForConditionalGeneration",
                    ["model.visual.blocks.0.attn.qkv.weight", "model.visual.merger.linear_fc1.weight",
                     "mtp.fc.weight", "mtp.layers.0.mlp.experts.0.down_proj.weight", "mtp.norm.weight"]),
    "gemma4": ("Gemma4ForConditionalGeneration",
               ["model.vision_tower.encoder.layers.0.self_attn.q_proj.weight",
                "model.embed_vision.embedding_projection.weight"]),
    "gemma4_e2b": ("Gemma4ForConditionalGeneration",  # the edge models also hear
                   ["model.vision_tower.encoder.layers.0.self_attn.q_proj.weight",
                    "model.embed_vision.embedding_projection.weight",
                    "model.audio_tower.layers.0.self_attn.q_proj.linear.weight",
                    "model.embed_audio.embedding_projection.weight"]),
}


def _wrap(arch: str, dst):
    """The fixture rewritten as the hub checkpoint: renamed text tensors (f32, the bf16 values
    exactly), extra vision/MTP tensors, config.json nested under text_config."""
    cls, extra = WRAPPED[arch]
    src = ARCH_FIXTURES / arch
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.npz", "*.safetensors", "llamacpp.json"))
    tensors = {}
    for name, (_, a) in read_safetensors(src / "model.safetensors").items():
        tensors[name.replace("model.", "model.language_model.", 1) if name.startswith("model.") else name] = ("F32", a)
    for i, name in enumerate(extra):
        tensors[name] = ("F32", np.full((4, 8), i + 1, np.float32))
    write_safetensors(dst / "model.safetensors", tensors)
    text = json.loads((src / "config.json").read_text())
    outer = {"architectures": [cls], "model_type": text["model_type"].removesuffix("_text"),
             "text_config": {k: v for k, v in text.items() if k != "architectures"}, "vision_config": {"depth": 1, "hidden_size": 8},
             "tie_word_embeddings": text.get("tie_word_embeddings", False)}
    (dst / "config.json").write_text(json.dumps(outer))
    return dst


@pytest.mark.parametrize("arch", sorted(WRAPPED))
def test_wrapped_hub_checkpoint_imports_the_text_model(tmp_path, arch, caplog):
    hf = _wrap(arch, tmp_path / "hf")
    with caplog.at_level(logging.INFO, logger="colibri.convert"):
        convert(hf, tmp_path / "model", "f32")
    skipped = [r.getMessage() for r in caplog.records if "text model only" in r.getMessage()]
    assert skipped and "skipped" in skipped[0], caplog.text
    if arch == "qwen3_5_moe":
        assert "3 multi-token-prediction head (unused) tensor(s)" in skipped[0] and "2 vision tower" in skipped[0]
    ref = np.load(ARCH_FIXTURES / arch / "reference.npz")
    e = Engine(tmp_path / "model", threads=2, kv_cache_quantize="f32")
    try:
        logits = e.logits(ref["input_ids"].tolist())
    finally:
        e.close()
    assert np.abs(logits - ref["logits"]).max() <= 1e-4 * np.abs(ref["logits"]).max()


def test_an_unknown_tensor_beside_the_text_model_is_still_refused(tmp_path):
    """Only the named vision/audio/MTP prefixes are skipped: anything else left over is an error."""
    hf = _wrap("gemma4", tmp_path / "hf")
    tensors = read_safetensors(hf / "model.safetensors")
    tensors["model.language_model.layers.0.mystery.weight"] = ("F32", np.zeros((2, 2), np.float32))
    write_safetensors(hf / "model.safetensors", tensors)
    with pytest.raises(Exception, match="mystery"):
        convert(hf, tmp_path / "model", "f32")


# ---- gpt-oss: experts as MXFP4 -------------------------------------------------------------------

FP4 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)  # e2m1 codes


def hub_dequant(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The hub's MXFP4 as transformers reads it (integrations/mxfp4.py convert_moe_packed_tensors):
    element 2i in the low nibble, 2i + 1 in the high one, times 2^(scale - 127)."""
    vals = np.stack([FP4[blocks & 0x0F], FP4[blocks >> 4]], axis=-1).reshape(*blocks.shape[:-1], 32)
    vals = vals * np.exp2(scales.astype(np.float32) - 127)[..., None]
    return vals.reshape(*blocks.shape[:-2], -1)


def hub_quant(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A float [..., C] as the hub stores MXFP4: a power-of-two scale per 32 values, nearest code."""
    g = w.reshape(*w.shape[:-1], -1, 32)
    amax = np.abs(g).max(axis=-1)
    e = np.clip(np.floor(np.log2(np.maximum(amax, 1e-30))) - 2, -127, 127)  # the largest code is 6 = 1.5 * 4
    codes = np.abs((g / np.exp2(e)[..., None])[..., None] - FP4).argmin(axis=-1).astype(np.uint8)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)), (e + 127).astype(np.uint8)


def test_mxfp4_blocks_and_scales_import_bit_for_bit(tmp_path):
    """Each *_blocks/*_scales pair reads as our mxfp4 with the hub's values exactly; gate_up's
    interleaved rows split into gate (even) and up (odd)."""
    from engine import quant
    from engine.convert.hf import HFCheckpoint
    rng = np.random.default_rng(3)
    gu_b, gu_s = rng.integers(0, 256, (2, 6, 2, 16), dtype=np.uint8), rng.integers(118, 136, (2, 6, 2), dtype=np.uint8)
    d_b, d_s = rng.integers(0, 256, (2, 4, 1, 16), dtype=np.uint8), rng.integers(118, 136, (2, 4, 1), dtype=np.uint8)
    p = "model.layers.0.mlp.experts."
    write_safetensors(tmp_path / "model.safetensors", {
        p + "gate_up_proj_blocks": ("U8", gu_b), p + "gate_up_proj_scales": ("U8", gu_s),
        p + "down_proj_blocks": ("U8", d_b), p + "down_proj_scales": ("U8", d_s)})
    ck = HFCheckpoint(tmp_path)
    try:
        gate, up, down = (ck.tensors[p + n + ".mxfp4"] for n in ("gate_proj", "up_proj", "down_proj"))
        assert gate.qtype.name == "mxfp4" and gate.shape == (2, 3, 64) and down.shape == (2, 4, 32)
        want = hub_dequant(gu_b, gu_s)
        for e in range(2):
            assert np.array_equal(quant.dequantize(gate.expert(e).read(), gate.qtype), want[e, 0::2])
            assert np.array_equal(quant.dequantize(up.expert(e).read(), up.qtype), want[e, 1::2])
            assert np.array_equal(quant.dequantize(down.expert(e).read(), down.qtype), hub_dequant(d_b, d_s)[e])
    finally:
        ck.close()
    write_safetensors(tmp_path / "model.safetensors", {p + "down_proj_scales": ("U8", d_s)})
    with pytest.raises(Exception, match="MXFP4 scales without blocks"):
        HFCheckpoint(tmp_path)


def test_gpt_oss_hub_checkpoint_keeps_its_mxfp4_experts(tmp_path):
    """The gpt-oss fixture with its down projections stored as the hub stores them (MXFP4; its
    hidden size 72 is no multiple of 32, so gate_up stays float here) converts with the experts
    kept as mxfp4 and runs as the same model with those values in float."""
    from engine.model_dir import open_model_dir
    src = ARCH_FIXTURES / "gpt_oss"
    tensors = read_safetensors(src / "model.safetensors")
    mx, flat = dict(tensors), dict(tensors)
    for name in [n for n in tensors if n.endswith("mlp.experts.down_proj")]:
        w = tensors[name][1]  # [E, I, H] (in, out): the hub keeps (out, in)
        b, s = hub_quant(np.swapaxes(w, 1, 2))
        del mx[name]
        mx[name + "_blocks"], mx[name + "_scales"] = ("U8", b), ("U8", s)
        flat[name] = ("F32", np.swapaxes(hub_dequant(b, s), 1, 2).copy())
    outs = {}
    for kind, t, target in (("mxfp4", mx, "keep"), ("float", flat, "f32")):
        hf = tmp_path / kind
        shutil.copytree(src, hf, ignore=shutil.ignore_patterns("*.npz", "*.safetensors", "llamacpp.json"))
        write_safetensors(hf / "model.safetensors", {n: ("F32" if d != "U8" else d, a) for n, (d, a) in t.items()})
        convert(hf, tmp_path / f"{kind}-model", target)
        e = Engine(tmp_path / f"{kind}-model", threads=2, kv_cache_quantize="f32", int8_activations=False)
        try:
            outs[kind] = e.logits(np.load(src / "reference.npz")["input_ids"].tolist())
        finally:
            e.close()
    md = open_model_dir(tmp_path / "mxfp4-model")
    f = md.tensor_file(next(r for r in md.files() if r.startswith("experts/")))
    kinds = {n.split(".")[2]: f.infos[n].qtype.plain.name for n in f.names() if n.endswith(".weight")}
    assert kinds["ffn_down"] == "mxfp4" and kinds["ffn_gate"] == "f32", kinds  # kept as the source stores them
    assert np.abs(outs["mxfp4"] - outs["float"]).max() <= 1e-5 * np.abs(outs["float"]).max()
