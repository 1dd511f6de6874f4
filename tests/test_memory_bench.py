"""colibri-bench memory's report: medians per cell, the ratio to llama.cpp's mmap run, and the
docs/bench/memory.md block regenerated from the JSON; and what its Colibri child decodes (a real engine run)."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from app.bench.memory import _COLIBRI, _LLAMA, _TOKENS, run_child
from app.bench.memory_report import README_END, markdown, medians, write_readme
from tests.test_experts import VOCAB, routed_model  # noqa: F401 (a fixture)


def _results():
    runs = []
    for rep, (ours, peer) in enumerate(((6.0, 2.0), (9.0, 1.0), (7.0, 4.0))):
        base = {"preset": "q8_0", "ram_cap": 0.5, "repeat": rep}
        runs.append(base | {"engine": "colibri", "variant": "auto", "routing": "trace", "decode_tok_s": ours,
                            "peak_rss_mb": 300.0, "read_mb_per_token": 90.0, "hit_rate": 0.4})
        runs.append(base | {"engine": "llama.cpp", "variant": "mmap", "routing": "model", "decode_tok_s": peer,
                            "peak_rss_mb": 360.0})
        runs.append(base | {"engine": "llama.cpp", "variant": "none", "routing": "model",
                            "error": "killed (out of memory)", "oom_kills": 1})
    return {"model": {"params": 6.8e8, "shape": {"hidden": 1024, "layers": 8, "experts": 8, "ff": 2816, "top_k": 2},
                      "presets": {"q8_0": {"gguf_mb": 719.6}}, "disk_mb_s": 1500.0},
            "threads": 2, "repeats": 3, "trace": "/x/trace.npz", "runs": runs, "medians": medians(runs)}


def test_the_table_holds_medians_and_the_ratio_to_llama_cpp():
    table = markdown(_results())
    ours = next(line for line in table.splitlines() if "Colibri (auto, trace routing)" in line)
    assert "| 7.00 | 3.50 |" in ours  # median 7 of (6, 9, 7) over llama.cpp's median 2 of (2, 1, 4)
    killed = next(line for line in table.splitlines() if "--no-mmap" in line)
    assert "(3 failed), 3 OOM-killed" in killed
    res = _results()
    for r in res["runs"]:
        if r["engine"] == "colibri":
            r.pop("decode_tok_s")
            r["error"] = ["engine.sysmem.InsufficientMemoryError: not enough memory for this model: ..."]
    res["medians"] = medians(res["runs"])
    ours = next(line for line in markdown(res).splitlines() if "Colibri" in line)
    assert "refused: below dense weights + 200 MB" in ours and "failed" not in ours


def test_the_doc_block_is_regenerated_between_its_markers(tmp_path):
    readme = tmp_path / "memory.md"  # docs/bench/memory.md
    readme.write_text("before\n<!-- colibri-bench memory: begin (generated from old.json; do not edit) -->\nstale "
                      f"0.11x\n{README_END}\nafter\n")
    write_readme(_results(), readme, "app/bench/results/memory.json")
    text = readme.read_text()
    assert text.startswith("before\n<!-- colibri-bench memory: begin (generated from app/bench/results/memory.json")
    assert text.endswith(f"{README_END}\nafter\n") and "stale" not in text and "| 7.00 | 3.50 |" in text
    assert "0.68 B parameters" in text and "trace.npz" in text and "disk 1500 MB/s (O_DIRECT, 4 threads);" in text
    res = _results()
    for r, disk in zip(res["runs"], [1740.0, 1740.0, 1740.0, 760.0, 760.0, 760.0, 1210.0, 1210.0, 1210.0]):
        r["disk_mb_s"] = disk  # the disk's speed probed before each capped group
    readme.write_text(f"<!-- colibri-bench memory: begin -->\n{README_END}\n")
    write_readme(res, readme, "x.json")
    assert "disk 1500 MB/s (O_DIRECT, 4 threads), 760-1740 MB/s probed before each capped group" in readme.read_text()
    readme.write_text("no markers\n")
    with pytest.raises(SystemExit, match="no generated memory block"):
        write_readme(_results(), readme, "x.json")


def test_both_engines_are_fed_the_same_seeded_tokens_and_the_colibri_child_decodes_them(routed_model):  # noqa: F811
    """The capped comparison means something only if both engines decode the same tokens: llama.cpp's
    child once decoded greedily from the binding's `scores` (zero without logits_all), i.e. token 0 at
    every step, routed alike each time, beside Colibri's random routing. Both children now take one
    seeded stream; the Colibri child runs here for real and reports what it fed."""
    assert _TOKENS in _COLIBRI and _TOKENS in _LLAMA and "argmax" not in _LLAMA
    path, _ = routed_model
    out = run_child([sys.executable, "-c", _COLIBRI, str(path), "auto", "1", "8", "6", "", "inf"], None, 300)
    assert "error" not in out, out
    scope = {"np": np, "vocab": VOCAB, "prompt_n": 8, "decode_n": 6}
    exec(_TOKENS, scope)  # what the llama.cpp child computes for the same vocabulary
    assert out["fed"] == scope["stream"] and out["decode_tokens"] == 6
    assert len(set(out["fed"])) > 1  # not one token over and over


def test_the_scale_table_states_the_io_bound_share_and_the_entropy_beside_each_run(tmp_path):
    from app.bench.memory_scale import dd_bandwidth, markdown as scale_markdown
    runs = [{"engine": "colibri", "ram_cap": 0.75, "decode_tok_s": 2.0, "prompt_s": 12.5, "hit_rate": 0.62,
             "missed_mb_per_token": 100.0, "disk_mb_s": 1000.0, "io_bound_tok_s": 10.0, "share_of_io_bound": 0.2,
             "routing_entropy_bits": 6.93, "max_entropy_bits": 7.0, "cgroup_peak_mb": 3700.0, "oom_kills": 0},
            {"engine": "llama.cpp", "ram_cap": 0.75, "decode_tok_s": 0.25, "oom_kills": 0}]
    text = scale_markdown({"gguf": "m.gguf", "gguf_mb": 4960.0, "threads": 2, "prompt_tokens": 512, "runs": runs})
    colibri, llama = text.splitlines()[-2:]
    assert "| 10.0 | 20.0% | 6.93 bits (0.99) |" in colibri
    assert llama.startswith("| 0.75 | llama.cpp | 0.25 |") and "| – |" in llama
    f = tmp_path / "f.bin"
    f.write_bytes(np.random.default_rng(0).integers(0, 255, 8 << 20, np.uint8).tobytes())
    try:
        assert dd_bandwidth(f, 8 << 20) > 0
    except Exception as e:  # a filesystem without O_DIRECT (tmpfs)
        pytest.skip(f"dd iflag=direct refused here: {e}")
