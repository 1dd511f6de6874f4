"""A GGUF run in place (engine.gguf_index): GGUFs that llama.cpp's own tools wrote (tests/make_llamacpp_presets.py)
indexed, not copied, decode the same greedy tokens as their converted copies, from a folder of a few KB;
their experts read as three runs of the GGUF, page-widened for O_DIRECT; a GGUF moved, cut short or
rewritten since is an error naming it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import gguf
import numpy as np
import pytest
from conftest import TESTS

from engine.api import Engine
from engine.convert.convert import convert
from engine.errors import ColibriError, ConversionError, MissingFileError, SizeMismatchError
from engine.expert_store import DIRECT_ALIGN, ExpertStore
from engine.gguf_index import INDEX_FILE
from engine.mempool import MemoryPool
from engine.model_dir import open_model_dir

PRESETS = TESTS / "fixtures" / "llamacpp_presets"
DENSE, MOE = "tiny-q4_k_m.gguf", "tiny-moe-mxfp4_moe.gguf"  # llama-quantize's Q4_K_M llama; MXFP4 Mixtral
PROMPTS = ("def fibonacci(n):", "The capital of France is")


def disk_bytes(folder) -> int:
    return sum(p.stat().st_blocks * 512 for p in folder.rglob("*") if p.is_file())


def greedy(path, prompt: str) -> list[int]:
    eng = Engine(path, threads=2, kv_cache_quantize="f32", context_length=128)
    try:
        return [s.token_id for s in eng.generate(prompt, max_tokens=16, temperature=0.0) if s.token_id is not None]
    finally:
        eng.close()


@pytest.mark.parametrize("name", [DENSE, MOE])
def test_in_place_decodes_as_the_copy_from_a_folder_of_a_few_kb(tmp_path, name):
    src = tmp_path / "gguf" / name
    src.parent.mkdir()
    shutil.copy2(PRESETS / name, src)
    placed = convert(src, tmp_path / "in-place", in_place=True).path
    copied = convert(src, tmp_path / "copy").path
    assert sorted(p.name for p in src.parent.iterdir()) == [name]  # nothing written beside the GGUF
    assert not list(placed.rglob("*.bin")) and (placed / INDEX_FILE).is_file()
    model = open_model_dir(placed, verify=True)
    assert model.gguf == src.resolve() and model.config == open_model_dir(copied).config
    assert disk_bytes(placed) < 64 << 10 < src.stat().st_size / 4 < disk_bytes(copied)
    for prompt in PROMPTS:
        ours = greedy(placed, prompt)
        assert len(ours) == 16 and ours == greedy(copied, prompt), prompt


@pytest.mark.parametrize("mode", ["direct", "dontneed", "cached"])
def test_an_expert_is_three_runs_of_the_gguf_read_whole(tmp_path, mode):
    """Each routed expert's gate, up and down are its slices of the stacked tensors, bit for bit, read
    O_DIRECT (each run widened to whole pages: GGUF offsets are 32-byte aligned) or buffered, or mapped."""
    placed = convert(PRESETS / MOE, tmp_path / "m", in_place=True).path
    model = open_model_dir(placed)
    reader = gguf.GGUFReader(PRESETS / MOE)
    stacked = {t.name: np.asarray(t.data) for t in reader.tensors if "_exps." in t.name}
    store, pool = ExpertStore(model, read_mode=mode), MemoryPool()
    try:
        sp = store.span(0, 1)
        assert len(sp.runs) == 3 and any(o % DIRECT_ALIGN for o, _ in sp.runs)
        assert sp.slot_bytes == sum(-(-(o % DIRECT_ALIGN + n) // DIRECT_ALIGN) * DIRECT_ALIGN for o, n in sp.runs)
        block = pool.alloc(max(store.span(0, e).slot_bytes for e in range(model.config.num_experts)))
        for e in range(model.config.num_experts):
            for ew in (store.read_into(0, e, block.array(np.uint8, (block.size,))), store.map(0, e)):
                for part, m in zip(("gate", "up", "down"), (ew.gate, ew.up, ew.down)):
                    want = stacked[f"blk.0.ffn_{part}_exps.weight"][e]
                    assert np.array_equal(m.data.ravel(), want.view(np.uint8).ravel()), (e, part)
        if mode == "direct" and store.direct:  # (a filesystem without O_DIRECT falls back to buffered)
            assert store.read_bytes["direct"] > 0
        block.free()
    finally:
        store.close()


def test_a_gguf_moved_cut_short_or_rewritten_is_a_clear_error(tmp_path):
    src = tmp_path / "m.gguf"
    shutil.copy2(PRESETS / MOE, src)
    placed = convert(src, tmp_path / "m", in_place=True).path
    moved = tmp_path / "elsewhere.gguf"
    os.rename(src, moved)
    with pytest.raises(MissingFileError, match=rf"{src}.*gone.*colibri-convert"):
        Engine(placed)
    os.rename(moved, src)
    open_model_dir(placed)  # back where it was: fine again
    size, stamp = src.stat().st_size, src.stat().st_mtime_ns
    with open(src, "r+b") as f:  # rewritten: same size, same mtime, another header
        f.seek(40)
        f.write(b"\xff")
    os.utime(src, ns=(stamp, stamp))
    with pytest.raises(SizeMismatchError, match=rf"{src}: .*modified after it was indexed"):
        open_model_dir(placed)
    shutil.copy2(PRESETS / MOE, src)
    os.utime(src, ns=(stamp, stamp))
    open_model_dir(placed)
    os.truncate(src, size - 1000)
    with pytest.raises(SizeMismatchError, match=rf"{src}: the GGUF file has {size - 1000} bytes, {size}"):
        open_model_dir(placed)


def test_a_gguf_cut_short_while_loaded_is_an_error_not_a_crash(tmp_path):
    src = tmp_path / "m.gguf"
    shutil.copy2(PRESETS / MOE, src)
    eng = Engine(convert(src, tmp_path / "m", in_place=True).path, threads=2, context_length=64)
    try:
        os.truncate(src, src.stat().st_size // 2)
        with pytest.raises(ColibriError, match=str(src)):
            list(eng.generate("Hello", max_tokens=4, temperature=0.0))
    finally:
        eng.close()


def test_in_place_refuses_what_would_write_new_tensors(tmp_path):
    with pytest.raises(ConversionError, match="--quantize int8 writes new tensors"):
        convert(PRESETS / DENSE, tmp_path / "m", "int8", in_place=True)
    assert not (tmp_path / "m").exists()


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli_convert", *args], capture_output=True, text=True)


def test_colibri_convert_indexes_a_gguf_by_default_and_copies_on_request(tmp_path):
    r = run_cli("--model_path", str(PRESETS / DENSE), "--output_path", str(tmp_path / "a"), "--quiet")
    assert r.returncode == 0, r.stderr
    assert "no tensor copied" in r.stdout and not list((tmp_path / "a").rglob("*.bin"))
    assert json.loads((tmp_path / "a" / "config.json").read_text())["layout"]["gguf"] == INDEX_FILE
    r = run_cli("--model_path", str(PRESETS / DENSE), "--output_path", str(tmp_path / "b"), "--quiet", "--copy")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "b" / "embeddings.bin").is_file() and open_model_dir(tmp_path / "b").gguf is None


def test_the_wizard_worker_indexes_a_gguf_unless_told_to_copy(qtbot, tmp_path):
    from app.convert_worker import ConvertWorker
    for copy in (False, True):
        worker, results = ConvertWorker(copy_gguf=copy), []
        worker.converted.connect(results.append)
        worker.failed.connect(lambda what, err: pytest.fail(f"{what}: {err}"))
        worker.convert(str(PRESETS / MOE), str(tmp_path / str(copy)), "keep", True, "")
        assert len(results) == 1 and (open_model_dir(results[0].path).gguf is None) == copy
