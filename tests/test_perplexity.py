"""colibri-bench perplexity: llama.cpp's conventions, checked against independent scalar versions
of tools/perplexity/perplexity.cpp's arithmetic (written here loop by loop, as the C++ does)."""
from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from app.bench import perplexity as P


def _llama_log_softmax(logits: np.ndarray, tok: int) -> float:
    """perplexity.cpp's log_softmax: max, then a double sum of expf(logit - max)."""
    mx = float(logits.max())
    s = 0.0
    for v in logits:
        s += math.exp(float(v) - mx)
    return float(logits[tok]) - mx - math.log(s)


def _llama_ppl(chunk_logits: list[np.ndarray], chunks: list[np.ndarray]) -> tuple[float, float, int]:
    """The loop of perplexity(): positions first = n_ctx/2 .. n_ctx-2 of each chunk predict the next token."""
    nll = nll2 = 0.0
    count = 0
    for logits, toks in zip(chunk_logits, chunks):
        n_ctx = len(toks)
        first = n_ctx // 2
        for i in range(n_ctx - 1 - first):
            v = -_llama_log_softmax(logits[first + i], int(toks[first + i + 1]))
            nll += v
            nll2 += v * v
        count += n_ctx - first - 1
    nll /= count
    nll2 = nll2 / count - nll * nll
    ppl = math.exp(nll)
    return ppl, math.sqrt(nll2 / (count - 1)) * ppl, count


def test_chunks_are_whole_windows_with_bos_in_front():
    toks = list(range(100, 100 + 50))
    chunks = list(P.chunk_tokens(toks, 16, bos=1))
    assert len(chunks) == 3  # 50 // 16: the 2-token tail is dropped, as llama.cpp does
    assert [c[0] for c in chunks] == [1, 1, 1]
    assert list(chunks[1][1:]) == toks[17:32]
    assert [list(c) for c in P.chunk_tokens(toks, 16)] == [toks[0:16], toks[16:32], toks[32:48]]
    assert len(list(P.chunk_tokens(toks, 16, n_chunks=2))) == 2
    with pytest.raises(ValueError, match="only 50 tokens.*at least 64"):
        list(P.chunk_tokens(toks, 32))


@pytest.mark.parametrize("ctx", [8, 9, 200])
def test_ppl_and_error_match_the_scalar_loop(ctx):
    rng = np.random.default_rng(ctx)
    V = 37
    chunks = [rng.integers(0, V, ctx) for _ in range(3)]
    logits = [rng.standard_normal((ctx, V)).astype(np.float32) * 3 for _ in chunks]
    acc = P.Accumulator()
    for lg, c in zip(logits, chunks):
        acc.add_chunk(lg, c)
    got = P.summarize(acc)
    ppl, err, count = _llama_ppl(logits, chunks)
    assert got["positions"] == count == 3 * (ctx - ctx // 2 - 1)
    assert got["ppl"] == pytest.approx(ppl, rel=1e-12)
    assert got["ppl_err"] == pytest.approx(err, rel=1e-9)


def test_only_the_second_half_is_scored():
    ctx, V = 10, 5
    c = np.arange(ctx) % V
    lg = np.zeros((ctx, V), np.float32)
    lg[: ctx // 2] = np.nan  # the first half must never be read
    lg[ctx - 1] = np.nan  # nor the last position (no next token)
    acc = P.Accumulator()
    acc.add_chunk(lg, c)
    assert P.summarize(acc)["ppl"] == pytest.approx(V)  # uniform over V tokens


def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    p_logits, q_logits = p_logits.astype(np.float64), q_logits.astype(np.float64)
    p = np.exp(p_logits - p_logits.max())
    p /= p.sum()
    q = np.exp(q_logits - q_logits.max())
    q /= q.sum()
    return float(sum(pi * (math.log(pi) - math.log(qi)) for pi, qi in zip(p, q)))


def test_kl_top1_and_ratio_against_a_reference():
    rng = np.random.default_rng(0)
    ctx, V = 64, 11
    c = rng.integers(0, V, ctx)
    ref = rng.standard_normal((ctx, V)).astype(np.float32) * 2
    noisy = ref + rng.standard_normal((ctx, V)).astype(np.float32) * 0.5
    acc = P.Accumulator()
    acc.add_chunk(noisy, c, ref)
    got = P.summarize(acc)
    rows = range(ctx // 2, ctx - 1)
    kl = np.array([_kl(ref[i], noisy[i]) for i in rows])  # KL(reference || model), as llama.cpp
    assert got["kld_mean"] == pytest.approx(kl.mean(), rel=1e-9)
    # llama.cpp's percentile: linear interpolation between the sorted neighbours
    s, f = np.sort(kl), 0.99 * (len(kl) - 1)
    assert got["kld_p99"] == pytest.approx(s[int(f)] * (1 - f % 1) + s[int(f) + 1] * (f % 1), rel=1e-9)
    same = np.mean([np.argmax(noisy[i]) == np.argmax(ref[i]) for i in rows])
    assert got["same_top_pct"] == pytest.approx(100 * same)
    assert 0 < same < 1  # the noise flips some top tokens: the figure is not trivially 100%
    ppl_ref, _, _ = _llama_ppl([ref], [c])
    assert got["ppl_ref"] == pytest.approx(ppl_ref, rel=1e-12)
    assert got["delta_ppl_pct"] == pytest.approx(100 * (got["ppl"] / ppl_ref - 1), rel=1e-9)

    same_model = P.Accumulator()
    same_model.add_chunk(ref, c, ref)
    s = P.summarize(same_model)
    assert s["kld_mean"] == pytest.approx(0, abs=1e-12) and s["same_top_pct"] == 100
    assert s["ln_ppl_ratio"] == 0 and s["ln_ppl_ratio_err"] == pytest.approx(0, abs=1e-7)


_LLAMA_LOG = """perplexity: calculating perplexity over 4 chunks, n_ctx=512, batch_size=2048, n_seq=4
[1]16.1920,[2]15.2722,[3]13.7362,[4]14.0691,
0.24.402.683 I Final estimate: PPL = 14.0691 +/- 1.19402
"""
_LLAMA_KLD_LOG = """kl_divergence: computing over 4 chunks, n_ctx=512, batch_size=2048, n_seq=4
====== Perplexity statistics ======
Mean PPL(Q)                   :  14.142061 ±   1.201270
Mean PPL(base)                :  14.034831 ±   1.191218
Mean ln(PPL(Q)/PPL(base))     :   0.007611 ±   0.002711
====== KL divergence statistics ======
Mean    KLD:   0.012345 ±   0.000678
99.0%   KLD:   0.123456
Same top p: 96.667 ± 0.562 %
"""


def _fake_tool(tmp_path, log: str, rc: int = 0):
    exe = tmp_path / "llama-perplexity"
    (tmp_path / "log.txt").write_text(log)
    exe.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/args\ncat {tmp_path}/log.txt >&2\nexit {rc}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe)


def test_reads_llama_perplexity_figures(tmp_path):
    exe = _fake_tool(tmp_path, _LLAMA_LOG)
    r = P.run_llama_perplexity(exe, tmp_path / "m.gguf", tmp_path / "t.txt", 512, 2, n_chunks=4)
    assert (r["ppl"], r["ppl_err"], r["chunks"]) == (14.0691, 1.19402, 4)
    assert (tmp_path / "args").read_text().split() == ["-m", str(tmp_path / "m.gguf"), "-f", str(tmp_path / "t.txt"),
                                                        "-c", "512", "-t", "2", "--chunks", "4"]
    exe = _fake_tool(tmp_path, _LLAMA_KLD_LOG)
    r = P.run_llama_perplexity(exe, tmp_path / "m.gguf", tmp_path / "t.txt", 512, 2)
    assert (r["ppl"], r["ppl_ref"], r["kld_mean"], r["kld_p99"], r["same_top_pct"]) == \
        (14.142061, 14.034831, 0.012345, 0.123456, 96.667)
    assert (r["ln_ppl_ratio"], r["kld_err"], r["same_top_err"]) == (0.007611, 0.000678, 0.562)


def test_llama_perplexity_failures_are_named(tmp_path, monkeypatch):
    with pytest.raises(RuntimeError, match="failed \\(3\\)"):
        P.run_llama_perplexity(_fake_tool(tmp_path, "boom", rc=3), tmp_path / "m", tmp_path / "t", 512, 2)
    with pytest.raises(RuntimeError, match="no final figure"):
        P.run_llama_perplexity(_fake_tool(tmp_path, "you need at least 1024 tokens"), tmp_path / "m",
                               tmp_path / "t", 512, 2)
    monkeypatch.delenv(P.LLAMA_ENV, raising=False)
    assert P.find_llama_perplexity(None)[0] is None
    assert "not an executable" in P.find_llama_perplexity(str(tmp_path / "nope"))[1]
    monkeypatch.setenv(P.LLAMA_ENV, _fake_tool(tmp_path, _LLAMA_LOG))
    assert P.find_llama_perplexity(None)[0] == os.environ[P.LLAMA_ENV]


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match="NAME=VALUE"):
        P.parse_params(["no_such_param=1"])
    assert P.parse_params(["int8_activations=false"]) == {"int8_activations": False}
    with pytest.raises(FileNotFoundError, match="no such model"):
        P.prepare_model(tmp_path / "missing.gguf")
    with pytest.raises(ValueError, match="--quantize applies to GGUF"):
        P.prepare_model(tmp_path, "int8")


def test_llama_kl_change_is_taken_against_the_plain_reference_run(tmp_path):
    exe = tmp_path / "llama-perplexity"
    (tmp_path / "plain.txt").write_text(_LLAMA_LOG.replace("14.0691", "14.0348"))
    (tmp_path / "kl.txt").write_text(_LLAMA_KLD_LOG)
    exe.write_text(f"#!/bin/sh\ncase \"$*\" in *--kl-divergence\\ *|*--kl-divergence) cat {tmp_path}/kl.txt >&2;;\n"
                   f"*) cat {tmp_path}/plain.txt >&2;; esac\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    ref = tmp_path / "ref.gguf"
    ref.write_bytes(b"")
    r = P.llama_side(str(exe), tmp_path / "m.gguf", tmp_path / "t.txt", 512, 2, 4, ref)
    assert (r["ppl"], r["ppl_ref"], r["ppl_ref_kl_table"]) == (14.142061, 14.0348, 14.034831)
    assert r["delta_ppl_pct"] == pytest.approx(100 * (14.142061 / 14.0348 - 1))
    assert P.llama_side(str(exe), tmp_path / "m.gguf", tmp_path / "t.txt", 512, 2, 4, None)["ppl"] == 14.0348


def test_the_command_on_the_default_model(tmp_path, default_gguf, monkeypatch, capsys):
    from app.bench.cli import main
    monkeypatch.delenv(P.LLAMA_ENV, raising=False)
    text = Path(__file__).parent / "fixtures" / "texts" / "code_cpython.txt"
    out = tmp_path / "ppl.json"
    assert main(["perplexity", "--model", str(default_gguf), "--text", str(text), "--ctx", "64", "--chunks", "2",
                 "--reference", str(default_gguf), "--reference_quantize", "f16", "--workdir", str(tmp_path),
                 "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    ours = r["colibri"]
    assert (ours["chunks"], ours["positions"], ours["ctx"]) == (2, 62, 64)
    assert 1 < ours["ppl_ref"] < 100 and ours["same_top_pct"] > 80  # Q4_1 against its own f16
    assert "no llama-perplexity given" in r["llama.cpp"]["skipped"]
    assert "skipped" in capsys.readouterr().out
    assert len(list(tmp_path.glob("SmolLM2-*"))) == 2  # the GGUF converted once per target, kept
