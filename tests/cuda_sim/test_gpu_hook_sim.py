"""The GPU hook end to end under the simulator, on a converted Qwen2-MoE fixture (int4, with f16
shared-expert rows of 48): gpu_layers = 1 gives the CPU's logits with layer 0's attention computed
by the CUDA kernels, and an expert placed on the GPU by the cost model gives the CPU's output.
Kept to few matmuls: the simulator costs ~0.1 s per block of 32 threads (one block per output row)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from numba import config

from engine.api import Engine
from engine.convert.convert import convert
from engine.models import base
from engine.scheduler import DeviceProfile, Scheduler

assert config.ENABLE_CUDASIM
FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "hf" / "qwen2_moe"
# attention of gpu layers goes to the GPU regardless; with SLOW_GPU nothing else does
SLOW_GPU = DeviceProfile(cpu_bandwidth=1e12, cpu_flops=1e12, gpu_name="sim", gpu_launch_s=1e-3,
                         h2d_bandwidth=1e9, d2h_bandwidth=1e9, gpu_bandwidth=1e9, gpu_flops=1e9,
                         gpu_memory_free=8 << 30)
FAST_GPU = DeviceProfile(cpu_bandwidth=1e9, cpu_flops=1e9, gpu_name="sim", gpu_launch_s=1e-9, h2d_bandwidth=1e15,
                         d2h_bandwidth=1e15, gpu_bandwidth=1e15, gpu_flops=1e15, gpu_memory_free=8 << 30)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return convert(FIXTURE, tmp_path_factory.mktemp("sim") / "m", "int4").path


def test_attention_of_gpu_layers_matches_cpu(model):
    ids = [1, 5]
    # the GPU kernels multiply float activations: the CPU reference and CPU parts do too
    with Engine(model, threads=1, int8_activations=False) as eng:
        want = eng.logits(ids)
    with Engine(model, threads=1, gpu_layers=1, int8_activations=False) as eng:
        sched = Scheduler.create(eng.cfg, eng.weights, 1, profile=SLOW_GPU, allow_simulator=True)
        eng.net.gpu = sched.runner
        got = eng.logits(ids)
        snap = sched.snapshot()
        lw = eng.weights.layers[0]
        attention_bytes = sum(m.nbytes for m in (lw.q, lw.k, lw.v, lw.o))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert snap.gpu and snap.device == "CUDA simulator"
    assert [p.attention for p in snap.layers] == ["gpu", "cpu"]
    assert snap.layers[1].attention_reason == "beyond gpu_layers = 1"
    assert snap.layers[0].gpu_matmuls == 0 and snap.layers[0].cpu_matmuls > 0  # experts stayed on the CPU
    assert snap.gpu_resident_bytes == attention_bytes
    assert not snap.fallbacks


def test_expert_on_gpu_matches_cpu(model):
    """The shared expert: int4 gate/up and f16 down rows of 48, placed on the GPU by the cost model."""
    rng = np.random.default_rng(0)
    with Engine(model, threads=1, gpu_layers=1, int8_activations=False) as eng:
        sched = Scheduler.create(eng.cfg, eng.weights, 1, profile=FAST_GPU, allow_simulator=True)
        h = rng.standard_normal((2, eng.cfg.hidden_size)).astype(np.float32)
        ew = eng.weights.layers[0].shared
        # float activations, as the GPU kernels use
        want = base.expert_mlp(h, ew, base.Step(exact=True))
        got = base.expert_mlp(h, ew, base.Step(exact=True, gpu=sched.runner))
        snap = sched.snapshot()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert snap.layers[0].ffn == "gpu" and snap.layers[0].gpu_matmuls == 3, snap.layers[0]
