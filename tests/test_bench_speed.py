"""colibri-bench speed: a quick smoke run on a tiny model (figures are printed, never asserted)."""
from __future__ import annotations

import json

import numpy as np

from conftest import HF_FIXTURES

from app.bench import speed as bench_speed
from app.bench.cli import main


def test_speed_command_writes_every_figure(tmp_path, capsys):
    out = tmp_path / "speed.json"
    # an HF folder: llama.cpp (GGUF only) is skipped with its reason; transformers is left out for time
    code = main(["speed", "--model", str(HF_FIXTURES / "llama"), "--engines", "colibri,colibri-chat,llama.cpp",
                 "--threads", "1", "--runs", "1", "--prompt_tokens", "8", "--gen_tokens", "4",
                 "--workdir", str(tmp_path / "w"), "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["bandwidth_gb_s"] > 0 and report["weight_bytes_per_token"] > 0
    assert report["models"][0]["kv_bytes_per_token"] > 0
    assert "llama.cpp" in report["skipped"] and "GGUF" in report["skipped"]["llama.cpp"]
    rows = {r["engine"]: r for r in report["results"]}
    assert set(rows) == {"colibri", "colibri-chat"}  # greedy forward() and the chat path (generate, sampling)
    for row in rows.values():
        assert row["threads"] == 1
        for key in ("decode_tok_s", "prefill_tok_s", "ttft_s", "load_s", "peak_rss_mb", "bandwidth_fraction"):
            assert row[key] > 0, key
    assert report["machine"]["cpu"] and isinstance(report["machine"]["flags"], list)
    text = capsys.readouterr().out
    assert "| colibri | 1 |" in text and "| colibri-chat | 1 |" in text and "Machine: " in text


def test_missing_interpreter_is_reported_not_fatal(tmp_path):
    py, why = bench_speed.find_python("llama.cpp", str(tmp_path / "no-python"))
    assert py is None and "llama_cpp" in why
    binary, why = bench_speed.find_python("llama-bench", str(tmp_path / "no-llama-bench"))
    assert binary is None and "cmake" in why  # says how to build it


def test_cpu_flags_name_what_the_kernels_depend_on(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse4_2 avx fma avx2 f16c bmi2\n\n"
                    "processor\t: 1\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse4_2 avx fma avx2 f16c bmi2\n")
    name, flags = bench_speed.cpu_info(str(info))
    assert name == "AMD EPYC 7B13" and flags == ["sse4_2", "avx", "f16c", "fma", "avx2"]


def test_the_doc_block_is_regenerated_from_the_json(tmp_path):
    report = {"machine": {"cpu": "Test CPU", "flags": ["avx2", "fma"], "physical_cores": 2, "memory_gb": 24.0},
              "prompt_tokens": 512, "decode_tokens": 128, "bandwidth_gb_s": 40.0,
              "bandwidth_by_threads_gb_s": {"1": 30.0, "2": 40.0}, "bandwidth_probes_gb_s": [40.0, 38.0],
              "models": [{"name": "m", "weight_bytes_per_token": 1e8, "kv_bytes_per_token": 1e6,
                          "decode_scaling_vs_1_thread": {}, "reference": "llama-bench"}],
              "results": [{"engine": e, "model": "m", "threads": 2, "runs": 3, "decode_tok_s": d, "prefill_tok_s": 900.0,
                           "ttft_s": 0.5, "load_s": None, "first_token_s": None, "peak_rss_mb": 100.0,
                           "bandwidth_fraction": 0.25, **({"vs_llama_cpp": {"decode": d / 80, "prefill": 1.0}})}
                          for e, d in (("colibri", 100.0), ("llama-bench", 80.0))],
              "skipped": {}}
    (tmp_path / "r.json").write_text(json.dumps(report))
    readme = tmp_path / "speed.md"  # docs/bench/speed.md
    readme.write_text("# X\n\nbefore\n\n" + bench_speed.BEGIN.format(json="old") + "\nstale figures\n"
                      + bench_speed.END + "\n\nafter\n")
    assert main(["readme", "--json", str(tmp_path / "r.json"), "--doc", str(readme)]) == 0
    text = readme.read_text()
    assert "stale figures" not in text and text.startswith("# X\n\nbefore") and text.endswith("after\n")
    assert "Test CPU" in text and "avx2 fma" in text and "| colibri | 2 | 100.0 |" in text and "1.25×" in text
    assert "decode vs llama-bench" in text


def test_several_models_in_one_run(tmp_path, capsys):
    out = tmp_path / "speed.json"
    models = f"{HF_FIXTURES / 'llama'},{HF_FIXTURES / 'mixtral'}"
    code = main(["speed", "--model", models, "--engines", "colibri", "--threads", "1,2", "--runs", "1",
                 "--prompt_tokens", "8", "--gen_tokens", "4", "--workdir", str(tmp_path / "w"), "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert [m["name"] for m in report["models"]] == ["llama", "mixtral"]
    assert {(r["model"], r["threads"]) for r in report["results"]} == {(m, t) for m in ("llama", "mixtral") for t in (1, 2)}
    assert set(report["bandwidth_by_threads_gb_s"]) >= {"1"} and report["bandwidth_gb_s"] > 0
    probes = report["bandwidth_probes_gb_s"]  # before the first model and after each: the best is the limit
    assert len(probes) == 3 and report["bandwidth_gb_s"] == max(probes)
    for r in report["results"]:
        m = next(m for m in report["models"] if m["name"] == r["model"])
        read = m["weight_bytes_per_token"] + m["kv_bytes_per_token"]
        assert abs(r["bandwidth_fraction"] - r["decode_tok_s"] * read / max(probes) / 1e9) < 1e-9
    assert all("colibri" in m["decode_scaling_vs_1_thread"] for m in report["models"])
    text = capsys.readouterr().out
    assert text.count("| colibri | 2 |") == 2 and "decode scaling 1 → 2 threads" in text


def test_unknown_model_name_is_refused(tmp_path):
    import pytest
    with pytest.raises(SystemExit, match="moe-q8_0"):
        main(["speed", "--model", "no-such-model", "--workdir", str(tmp_path)])


def test_profile_splits_a_token_by_tensor(tmp_path, capsys):
    """colibri-bench profile on a tiny MoE: each tensor group and kernel has a row, and the rows
    add up to the timed token."""
    out = tmp_path / "profile.json"
    code = main(["profile", "--model", str(HF_FIXTURES / "mixtral"), "--threads", "1", "--prompt_tokens", "4",
                 "--tokens", "3", "--workdir", str(tmp_path / "w"), "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    rows = report["rows"]
    experts = "experts (gate, up, down: one call per layer)"
    for part in ("attn_qkv", "attn_output", experts, "ffn_gate_inp (router)", "output", "attention",
                 "python and the rest"):
        assert part in rows, part
    assert rows[experts]["calls_per_token"] == 2  # 2 layers, their top-2 experts in one call each
    total = sum(r["ms_per_token"] for r in rows.values())
    assert abs(total - report["timed_ms_per_token"]) < 1e-6 and report["untimed_ms_per_token"] > 0
    # every expert resident: decoded tokens took the one-call kernel, which is timed apart (its
    # time is not compared with the untimed token's: two timings, which a loaded machine swaps)
    assert report["fused_kernel_ms_per_token"] > 0
    assert report["layered_ms_per_token"] > 0
    assert "| attn_output |" in capsys.readouterr().out


def test_preset_specs_name_llama_cpp_quantizations(tmp_path):
    assert bench_speed.split_preset("default:Q4_K_M") == ("default", "Q4_K_M")
    assert bench_speed.split_preset("moe:IQ4_XS") == ("moe", "IQ4_XS")
    assert bench_speed.split_preset("/models/smollm2:Q5_K_M") == ("/models/smollm2", "Q5_K_M")
    assert bench_speed.split_preset("default") is None and bench_speed.split_preset("/a/b.gguf") is None
    tools, why = bench_speed.find_llama_cpp(str(tmp_path))  # not a llama.cpp tree: the reason says what is needed
    assert tools is None and "llama-quantize" in why


def test_fidelity_counts_only_positions_where_llama_cpp_is_confident():
    """app.bench.fidelity.agreement: argmax agreement over the positions whose reference top-1 leads
    its top-2 by at least the margin; a near-tie that the engines break differently is not counted."""
    from app.bench.fidelity import agreement
    theirs = np.array([[0.0, 2.0, 1.0],      # confident: top 1
                       [1.0, 1.02, 0.0],     # a near-tie (margin 0.02): not counted
                       [3.0, 0.0, 0.0],      # confident: top 0
                       [0.0, 0.0, 5.0]], np.float32)
    ours = np.array([[0.0, 2.1, 1.0], [1.1, 1.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 4.0]], np.float32)
    r = agreement(ours, theirs)
    assert (r["compared"], r["agreed"], r["positions"]) == (3, 2, 4)
    assert abs(r["rate"] - 2 / 3) < 1e-9 and r["agreed_all"] == 0.5
    report = {"machine": {"cpu": "C", "flags": [], "physical_cores": 2, "memory_gb": 1.0}, "prompt_tokens": 8,
              "decode_tokens": 4, "bandwidth_gb_s": 1.0, "bandwidth_by_threads_gb_s": {"1": 1.0},
              "bandwidth_probes_gb_s": [1.0], "results": [], "skipped": {},
              "models": [{"name": "m", "weight_bytes_per_token": 1.0, "decode_scaling_vs_1_thread": {},
                          "fidelity": r | {"text": "t.txt"}}]}
    assert "at 2 of the 3 positions" in bench_speed.markdown(report)
    report["models"][0]["fidelity"] |= {"llama_cpp_self": {"compared": 3, "agreed": 3, "rate": 1.0},
                                        "vs_llama_cpp_one_by_one": 0.5}
    assert "batched run at 3 of 3 (100.0%), Colibri with that one-token run at 50.0%" in bench_speed.markdown(report)
