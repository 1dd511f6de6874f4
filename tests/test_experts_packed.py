"""Experts written in the CPU kernels' layout at convert time (engine.quant's x8 types): the numpy
definition of the layout is the kernels' repack_x8 byte for byte; a converted model's logits are
the same bit for bit whether its experts were repacked on disk or at load, resident or streamed
through a small cache; model dirs in the stored layout still load; and the tools that read expert
files (GGUF export, moefy) see the stored layout."""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import HF_FIXTURES
from gguf_fixtures import make_random_hf

from engine import quant, tensorfile
from engine.api import Engine
from engine.convert.convert import convert
from engine.expert_store import ExpertStore
from engine.kernels import cpu
from engine.model_dir import open_model_dir

PROMPT, TOKENS = [1, 5, 9, 14, 3, 7], [11, 2, 30, 4, 17]


@pytest.mark.parametrize("name", sorted(quant.X8_REGIONS))
def test_the_numpy_layout_is_the_kernels_repack(name):
    t = quant.get(name)
    raw = np.random.default_rng(t.type_id).integers(0, 256, (24, t.row_bytes(2 * t.block_size * 8)), dtype=np.uint8)
    kernel = raw.copy()
    cpu.repack_x8(kernel, t.type_id)
    packed = quant.pack_x8(raw, name)
    np.testing.assert_array_equal(packed, kernel)
    np.testing.assert_array_equal(quant.unpack_x8(packed, name), raw)
    x8 = quant.repacked(t, (24, 8))
    assert x8.type_id == cpu.PACKED + t.type_id and x8.base is t and x8.nbytes((24, 512)) == t.nbytes((24, 512))
    with np.errstate(all="ignore"):  # (random halves: NaNs and infinities)
        a, b = quant.dequantize(packed, x8), quant.dequantize(raw, t)
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    assert quant.repacked(t, (20, 8)) is t and quant.repacked(t, (8,)) is t and quant.repacked(x8, (24, 8)) is x8


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(stored, repacked) model dirs of one source and quantization."""
    root = tmp_path_factory.mktemp("packed")
    cache: dict = {}

    def get(quantize: str, arch: str = "mixtral", **shape):
        key = (quantize, arch, tuple(sorted(shape.items())))
        if key not in cache:
            src = make_random_hf(root / f"hf-{len(cache)}", arch, **shape) if shape else HF_FIXTURES / arch
            n = len(cache)
            cache[key] = (convert(src, root / f"stored-{n}", quantize, repack_experts=False).path,
                          convert(src, root / f"packed-{n}", quantize).path)
        return cache[key]
    return get


def run(path, **params) -> tuple[np.ndarray, tuple[bool, bool]]:
    """Prompt logits, then logits of tokens decoded one by one; whether the cache held every
    expert, and whether it repacked them at load."""
    with Engine(path, threads=1, **params) as eng:
        out = [eng.logits(PROMPT)]
        eng.forward(PROMPT)
        out += [eng.net.forward(np.array([t]), eng.cache, eng.cache.length) for t in TOKENS]
        return np.concatenate(out), (eng.weights.experts.room_for_all, eng.weights.experts.repack)


CASES = [("int8", "mixtral", {}), ("int4", "mixtral", {}),
         ("q4_k_m", "mixtral", {"hidden": 256, "moe_intermediate": 256, "n_expert": 4, "intermediate": 256, "seed": 2}),
         ("int4", "qwen2_moe", {})]  # (a shared expert: resident, repacked on disk too)


@pytest.mark.parametrize("quantize,arch,shape", CASES)
def test_logits_bit_for_bit_repacked_on_disk_or_at_load(models, monkeypatch, quantize, arch, shape):
    """Resident: the old dir's experts repacked at load give the same logits as the new dir's.
    Streamed through a small cache (misses read into slots or mapped from the page cache): the new
    dir's as-read experts give what the old dir gives with every miss repacked, read or mapped —
    the same kernels on the same bytes. (Streamed and resident decode differ in the last bits:
    experts computed one by one as they arrive, or in one call.)"""
    stored, packed = models(quantize, arch, **shape)
    want, held = run(stored)  # every expert resident: repacked at load (the old fast path)
    assert held == (True, True)
    got, held = run(packed)
    assert held[0]
    np.testing.assert_array_equal(got, want)
    streamed, held = run(packed, expert_cache_size=1)
    assert not held[0]
    np.testing.assert_allclose(streamed, want, rtol=1e-4, atol=1e-4)
    old, held = run(stored, expert_cache_size=1)  # a stored-layout dir streams with the stored kernels
    assert held == (False, False)
    np.testing.assert_allclose(old, want, rtol=1e-4, atol=1e-4)
    real = ExpertStore._weights  # every miss repacked, in a copy (a mapped miss's pages are read-only)
    monkeypatch.setattr(ExpertStore, "_weights", staticmethod(lambda L, e, sp, buf, start, repack:
                                                              real(L, e, sp, buf.copy(), start, True)))
    repacked, _ = run(stored, expert_cache_size=1)
    np.testing.assert_array_equal(repacked, streamed)


def test_streamed_experts_come_repacked_with_no_work_on_the_miss(models, monkeypatch):
    """A miss on a repacked-on-disk model: the read's bytes are the kernels' (codes > PACKED), by a
    pool read or a page-cache mapping, and repack_x8 never runs; a stored-layout dir's streamed
    experts stay stored."""
    stored, packed = models("int8")
    calls, real = [], cpu.repack_x8
    for path, want in ((packed, True), (stored, False)):
        with Engine(path, threads=1, expert_cache_size=1) as eng:  # (dense weights are repacked at load)
            monkeypatch.setattr(cpu, "repack_x8", lambda w, code: calls.append(code) or real(w, code))
            cache, store = eng.weights.experts, eng.weights.store
            assert not cache.repack
            eng.forward(PROMPT + TOKENS)
            for e in range(eng.cfg.num_experts):
                w = store.read_into(0, e, np.empty(store.span(0, e).nbytes, np.uint8))
                assert all((m.code > cpu.PACKED) == want for m in (w.gate, w.up, w.down))
                assert all((m.code > cpu.PACKED) == want for m in (store.map(0, e).gate, store.map(1, e).down))
            assert cache.stats().misses > 0
            monkeypatch.undo()
    assert calls == []


def test_files_manifest_and_config(models):
    stored, packed = models("int8")
    a, b = open_model_dir(stored, verify=True), open_model_dir(packed, verify=True)  # sizes and sha256 right
    ca, cb = (json.loads((p / "config.json").read_text()) for p in (stored, packed))
    assert ca["quantization"] == cb["quantization"]  # tensor_types by format
    for rel, entry in a.manifest["files"].items():
        if not rel.endswith(".bin"):
            continue
        assert b.manifest["files"][rel]["size"] == entry["size"]
        same = b.manifest["files"][rel]["sha256"] == entry["sha256"]
        assert same == (not rel.startswith("experts/")), rel  # only expert files change
        with tensorfile.TensorFile(stored / rel) as ta, tensorfile.TensorFile(packed / rel) as tb:
            version = int.from_bytes((packed / rel).read_bytes()[4:8], "little")
            assert version == (2 if rel.startswith("experts/") else 1)
            for n in ta.names():
                qa, qb = ta.infos[n].qtype, tb.infos[n].qtype
                assert qb is quant.repacked(qa, ta.infos[n].shape) if rel.startswith("experts/") else qb is qa
                np.testing.assert_array_equal(tb.stored(n), ta.tensor(n))


def test_an_older_reader_refuses_a_repacked_file(models, monkeypatch):
    from engine.errors import NewerFormatError
    _, packed = models("int8")
    monkeypatch.setattr(tensorfile, "TENSORFILE_VERSION", 1)
    with pytest.raises(NewerFormatError, match="version 2 is newer"):
        tensorfile.read_header(packed / "experts/layer_0_expert_0.bin")


def test_gguf_export_writes_the_stored_layout(models, tmp_path):
    gguf = pytest.importorskip("gguf")
    from engine.convert.gguf_export import export_gguf
    stored, packed = models("int8")
    out = {}
    for name, path in (("stored", stored), ("packed", packed)):
        r = gguf.GGUFReader(export_gguf(path, tmp_path / f"{name}.gguf"))
        out[name] = {t.name: (int(t.tensor_type), np.array(t.data)) for t in r.tensors}
    assert out["stored"].keys() == out["packed"].keys()
    for n, (kind, data) in out["stored"].items():
        assert out["packed"][n][0] == kind, n
        np.testing.assert_array_equal(out["packed"][n][1], data)


def test_moefy_of_a_dense_model_repacked_on_disk(models, tmp_path):
    """A dense model's MLP is its expert 0, repacked on disk: moefy reads it in the stored layout
    and gives the same MoE either way."""
    from engine.convert.moefy import moefy
    stored, packed = models("int8", "llama")
    text = "the quick brown fox jumps over the lazy dog " * 8
    a = moefy(stored, tmp_path / "a", 3, 2, text=text, tokens=64)  # (96 rows: 3 experts of 32)
    b = moefy(packed, tmp_path / "b", 3, 2, text=text, tokens=64)
    wa, _ = run(a.path)
    wb, _ = run(b.path)
    np.testing.assert_array_equal(wa, wb)


def test_bench_compares_the_layouts(models):
    """colibri-bench loads on a model repacked on disk, --against its stored-layout twin."""
    from app.bench.loads import measure_layout_decode, measure_repack
    stored, packed = models("int8")
    r = measure_repack(packed, repeats=2)
    assert r["repacked_on_disk"] == 1.0 and {"on_disk_read_ms", "on_disk_token_ms", "stored_token_ms", "repack_ms"} <= set(r)
    assert measure_repack(stored, repeats=2)["repacked_on_disk"] == 0.0
    d = measure_layout_decode({"repacked": packed, "stored": stored}, threads=1, tokens=6, cache=1)
    assert set(d) == {"repacked_ms_per_token", "stored_ms_per_token", "repacked_read_wait_ms_per_token",
                      "stored_read_wait_ms_per_token", "repacked_minus_stored_ms_per_token"}
    assert all(v >= 0 for k, v in d.items() if "minus" not in k)
