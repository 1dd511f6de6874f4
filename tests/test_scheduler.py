"""The scheduler's decisions on synthetic device profiles, its fallbacks, and gpu_layers on this
(GPU-less) machine. GPU work is played by a fake backend doing the CPU kernel, so these run anywhere."""
from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import pytest

from conftest import HF_FIXTURES
from engine.api import Engine
from engine.convert.convert import convert
from engine.kernels import cpu
from engine.scheduler import DeviceProfile, Scheduler, attach, classify, decide

# a desktop: 20 GB/s CPU, 10 µs launches, PCIe 4 (25 GB/s), a GPU ~40x the CPU
DESKTOP = DeviceProfile(cpu_bandwidth=20e9, cpu_flops=200e9, gpu_name="fake", gpu_launch_s=10e-6,
                        h2d_bandwidth=25e9, d2h_bandwidth=25e9, gpu_bandwidth=800e9, gpu_flops=20e12,
                        gpu_memory_free=8 << 30)


class FakeBackend:
    """Plays the GPU with the CPU kernel; `fail_upload` raises like a device out of memory."""
    def __init__(self, fail_upload: bool = False):
        self.fail_upload, self.uploads = fail_upload, 0

    def upload(self, data):
        if self.fail_upload:
            raise MemoryError("CUDA_ERROR_OUT_OF_MEMORY: out of memory")
        self.uploads += 1
        return np.array(data, copy=True)

    def matmul(self, dw, code, x):
        out = np.empty((x.shape[0], dw.shape[0]), np.float32)
        cpu.matmul(dw, code, np.ascontiguousarray(x, np.float32), out, False)
        return out


def test_tiny_expert_stays_on_cpu():
    d = decide(DESKTOP, nbytes=64 * 32 * 20 // 32, rows=32, cols=64, T=1, resident=False)
    assert d.where == "cpu" and d.gpu_s > d.cpu_s and "est. cpu" in d.reason
    assert decide(DESKTOP, 64 * 32 * 20 // 32, 32, 64, 1, resident=True).where == "cpu"  # launch alone loses


def test_large_matmuls_go_to_gpu():
    big = 4096 * 4096 * 20 // 32  # a 4096 x 4096 int4 attention projection, resident (uploaded once)
    assert decide(DESKTOP, big, 4096, 4096, T=1, resident=True).where == "gpu"
    expert = 14336 * 4096 * 20 // 32  # a Mixtral-sized expert not on the device: worth it for a prompt
    assert decide(DESKTOP, expert, 14336, 4096, T=128, resident=False).where == "gpu"
    busy = decide(DESKTOP, big, 4096, 4096, T=1, resident=True, queue=50, gpu_op_s=1e-3)
    assert busy.where == "cpu"  # a long GPU queue sends work back to the CPU


def test_no_gpu_profile_is_all_cpu():
    cpu_only = DeviceProfile(cpu_bandwidth=20e9, cpu_flops=200e9)
    assert decide(cpu_only, 1 << 30, 4096, 4096, T=512, resident=True).where == "cpu"


def test_classify_names():
    assert classify("blk.3.attn_q.weight") == (3, "attn")
    assert classify("blk.3.ffn_gate_inp.weight") == (3, "router")
    assert classify("blk.12.ffn_up.5.weight") == (12, "expert")
    assert classify("blk.0.ffn_down_shexp.weight") == (0, "expert")
    assert classify("output.weight") == (-1, "output")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return convert(HF_FIXTURES / "qwen2_moe", tmp_path_factory.mktemp("sched") / "m", "int4").path


def test_gpu_layers_place_attention_and_match_cpu(model):
    ids = [1, 5, 9]
    with Engine(model, threads=1) as eng:
        want = eng.logits(ids)
    with Engine(model, threads=1, gpu_layers=1) as eng:
        sched = Scheduler.create(eng.cfg, eng.weights, 1, profile=DESKTOP, backend=FakeBackend(), device="fake")
        eng.net.gpu = sched.runner
        got = eng.logits(ids)
        snap = sched.snapshot()
    # the CPU-only engine repacks its resident q4/q8_0 matrices (the output head among them) into
    # the kernels' 8-row groups; one that may offload keeps the stored layout a GPU reads: the
    # same integer products, summed in another order
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert [(p.attention, p.attention_reason) for p in snap.layers] == [
        ("gpu", "gpu_layers = 1"), ("cpu", "beyond gpu_layers = 1")]
    assert snap.layers[0].ffn == "cpu" and "est. cpu" in snap.layers[0].ffn_reason  # tiny experts
    assert snap.gpu and snap.device == "fake" and not snap.fallbacks


def test_out_of_memory_budget_falls_back_with_event(model, caplog):
    small = DeviceProfile(**{**DESKTOP.__dict__, "gpu_memory_free": 0})
    with Engine(model, threads=1, gpu_layers=2) as eng, caplog.at_level(logging.WARNING, "colibri.scheduler"):
        sched = Scheduler.create(eng.cfg, eng.weights, 2, profile=small, backend=FakeBackend(), device="fake")
        eng.logits([1, 2])
        snap = sched.snapshot()
    assert [p.attention for p in snap.layers] == ["cpu", "cpu"]
    assert [e.layer for e in snap.fallbacks] == [0, 1] and "out of GPU memory" in snap.fallbacks[0].reason
    assert "fallback to CPU" in caplog.text


def test_out_of_memory_on_upload_falls_back_without_crash(model, caplog):
    ids = [3, 4]
    with Engine(model, threads=1) as eng:
        want = eng.logits(ids)
    with Engine(model, threads=1, gpu_layers=2) as eng, caplog.at_level(logging.WARNING, "colibri.scheduler"):
        sched = Scheduler.create(eng.cfg, eng.weights, 2, profile=DESKTOP, backend=FakeBackend(fail_upload=True),
                                 device="fake")
        eng.net.gpu = sched.runner
        got = eng.logits(ids)
        snap = sched.snapshot()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())  # (layouts: as above)
    assert snap.fallbacks and all("out of GPU memory" in e.reason for e in snap.fallbacks)
    assert [p.attention for p in snap.layers] == ["cpu", "cpu"]
    assert snap.layers[0].attention_reason.startswith("fallback: out of GPU memory")
    assert "fallback to CPU" in caplog.text


def test_gpu_layers_without_gpu_runs_on_cpu(model, monkeypatch):
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    with Engine(model, threads=1, gpu_layers=4) as eng:
        sched = getattr(eng, "scheduler", None) or attach(eng)
        snap = sched.snapshot()
        assert eng.net.gpu is None
        eng.logits([1, 2])
    assert not snap.gpu and snap.gpu_layers == 4
    assert snap.reason.startswith(("no NVIDIA GPU", "numba-cuda is not installed", "no usable NVIDIA GPU")), snap.reason
    assert all(p.attention == "cpu" and p.attention_reason == snap.reason for p in snap.layers)


def test_gpu_layers_zero_does_not_import_numba_cuda(model):
    code = ("import sys; from engine import kernels; kernels.setup(); from engine.api import Engine; from engine.scheduler import attach\n"
            f"e = Engine({str(model)!r}, threads=1); s = attach(e); e.logits([1, 2])\n"
            "assert s.snapshot().reason.startswith('gpu_layers is 0'), s.reason\n"
            "assert 'numba.cuda' not in sys.modules, 'numba.cuda imported on the CPU path'\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]


def test_cli_accepts_gpu_layers_without_gpu(model):
    r = subprocess.run([sys.executable, "-m", "app.cli_chat", "--model", str(model), "--gpu_layers", "2",
                        "--prompt", "hi", "--max_tokens", "3", "--temperature", "0", "--threads", "1"],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]



def test_repacked_matrices_stay_on_the_cpu(model):
    """A GPU runner attached to an engine loaded for the CPU alone (gpu_layers 0: q4 matrices
    repacked into the CPU kernels' layout) hands those back instead of uploading them: the CUDA
    kernels read the stored layout."""
    from engine.kernels import cpu as kernels
    from engine.scheduler import PACKED
    assert PACKED == kernels.PACKED
    with Engine(model, threads=1) as eng:
        want = eng.logits([1, 5])
        assert eng.weights.layers[0].q.code > PACKED
        backend = FakeBackend()
        sched = Scheduler.create(eng.cfg, eng.weights, 2, profile=DESKTOP, backend=backend, device="fake")
        eng.net.gpu = sched.runner
        got = eng.logits([1, 5])
        snap = sched.snapshot()
    np.testing.assert_array_equal(got, want)
    assert backend.uploads == 0
    assert [p.attention for p in snap.layers] == ["cpu", "cpu"]
    assert "q4_1 repacked for the CPU at load has no GPU kernel" in snap.layers[0].attention_reason

def test_an_expert_repacked_on_disk_goes_to_the_gpu_unpacked(model):
    """Experts are written in the CPU kernels' 8-row groups (engine.quant x8 types); the CUDA
    kernels read the stored layout, so the scheduler uploads an unpacked copy and multiplies in the
    format's own code: the same output as the CPU's repacked kernel."""
    from engine import quant
    from engine.models import base
    fast = DeviceProfile(cpu_bandwidth=1e9, cpu_flops=1e9, gpu_name="fake", gpu_launch_s=1e-9, h2d_bandwidth=1e15,
                         d2h_bandwidth=1e15, gpu_bandwidth=1e15, gpu_flops=1e15, gpu_memory_free=8 << 30)
    x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    with Engine(model, threads=1, gpu_layers=1) as eng:
        backend, uploaded = FakeBackend(), []
        backend.upload = lambda data: uploaded.append(np.array(data)) or np.array(data)
        sched = Scheduler.create(eng.cfg, eng.weights, 1, profile=fast, backend=backend, device="fake")
        with eng.weights.experts.use(0, 1) as ew:
            assert ew.gate.code == cpu.PACKED + quant.get("q4_1").type_id  # as read: no work on the miss
            want = base.expert_mlp(x, ew, base.Step())  # (the fake GPU is the CPU kernel: int8 activations)
            got = base.expert_mlp(x, ew, base.Step(gpu=sched.runner))
            stored = quant.unpack_x8(ew.gate.data, "q4_1")
        snap = sched.snapshot()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert snap.layers[0].gpu_matmuls == 3 and not snap.fallbacks
    assert any(u.shape == stored.shape and np.array_equal(u, stored) for u in uploaded)
