"""Where each matmul runs: CPU or NVIDIA GPU (numba-cuda), decided by `gpu_layers` and a cost model.

`gpu_layers` = N > 0 puts the attention projections of layers 0..N-1 on the GPU; every other matmul
goes where the cost model (`decide`) says, so a tiny expert stays on the CPU (launch latency alone
costs more than computing it) and a large one goes to the GPU once its weights are there or the
batch pays for the upload. Weights that never change (attention, routers, output) count as resident.

The figures come from a `DeviceProfile` measured once per machine and cached as JSON. No GPU, no
driver, no numba-cuda or gpu_layers = 0: everything runs on the CPU and `Scheduler.reason` says why
(numba.cuda is not even imported with gpu_layers = 0). Out of GPU memory: that layer falls back to
the CPU with a logged `FallbackEvent`, never a crash.
"""
from __future__ import annotations

import json
import logging
import os
import platform
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine import quant

log = logging.getLogger("colibri.scheduler")

PROFILE_VERSION = 1
MEMORY_RESERVE = 256 << 20  # device bytes kept free for activations, scratch and the CUDA context
MEMORY_SHARE = 0.9  # of the free device memory the weights may take
GPU_CODES = (1, 2, 3, 8)  # f16, q4_0, q4_1, q8_0: formats with a CUDA kernel (engine.kernels.cuda.CODES)
PACKED = 1000  # codes above: repacked for the CPU kernels (engine.quant.PACKED); unpacked for an upload
_FORMAT = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 8: "q8_0", 12: "q4_K", 13: "q5_K", 14: "q6_K", 30: "bf16"}


def _stored_code(code: int) -> int:
    """The GGML id of a matrix's format, repacked (x8, for the CPU kernels) or not."""
    return code - PACKED if code > PACKED else code


def _format_name(code: int) -> str:
    if code > PACKED:  # loaded with gpu_layers 0: the CUDA kernels read the stored layout
        return f"{_FORMAT.get(code - PACKED, str(code - PACKED))} repacked for the CPU at load"
    return _FORMAT.get(code, str(code))


@dataclass(frozen=True)
class DeviceProfile:
    """Measured speeds of this machine (bytes/s, flop/s, seconds). GPU fields are 0 without a GPU."""
    cpu_bandwidth: float  # stored weight bytes/s the CPU matmul streams at decode (T = 1)
    cpu_flops: float  # flop/s of the CPU matmul on a batch (prefill)
    gpu_name: str = ""
    gpu_launch_s: float = 0.0  # one kernel launch + synchronize
    h2d_bandwidth: float = 0.0  # host → device bytes/s
    d2h_bandwidth: float = 0.0
    gpu_bandwidth: float = 0.0  # stored weight bytes/s of the GPU matmul at T = 1
    gpu_flops: float = 0.0
    gpu_memory_free: int = 0  # device bytes free when measured
    threads: int = 1
    version: int = PROFILE_VERSION


@dataclass(frozen=True)
class Decision:
    where: str  # "cpu" or "gpu"
    cpu_s: float
    gpu_s: float
    resident: bool

    @property
    def reason(self) -> str:
        rel = "<" if self.where == "cpu" else ">"
        up = "" if self.resident else " incl. weight upload"
        return f"est. cpu {self.cpu_s * 1e3:.3f} ms {rel} gpu {self.gpu_s * 1e3:.3f} ms{up}"


def decide(p: DeviceProfile, nbytes: int, rows: int, cols: int, T: int, resident: bool,
           queue: int = 0, gpu_op_s: float = 0.0, cpu_scale: float = 1.0) -> Decision:
    """The cost model for one matmul x (T, cols) @ W.T, W (rows, cols) stored in `nbytes`: bytes over
    bandwidth or flops over flop/s, whichever is longer, plus on the GPU the launches, the PCIe
    transfers (weights too unless resident) and the queue ahead."""
    flops = 2.0 * rows * cols * T
    cpu_s = max(nbytes / p.cpu_bandwidth, flops / p.cpu_flops) / max(cpu_scale, 1e-3)
    if p.gpu_bandwidth <= 0:
        return Decision("cpu", cpu_s, float("inf"), resident)
    transfer = 4.0 * T * cols / p.h2d_bandwidth + 4.0 * T * rows / p.d2h_bandwidth
    if not resident:
        transfer += nbytes / p.h2d_bandwidth
    compute = max(nbytes / p.gpu_bandwidth, flops / p.gpu_flops)
    gpu_s = p.gpu_launch_s * (1 + queue) + transfer + compute + queue * gpu_op_s
    return Decision("gpu" if gpu_s < cpu_s else "cpu", cpu_s, gpu_s, resident)


@dataclass(frozen=True)
class FallbackEvent:
    time: float  # time.time()
    layer: int  # -1: not a layer's matrix (the output head)
    matrix: str
    reason: str


@dataclass(frozen=True)
class LayerPlacement:
    layer: int
    attention: str  # "cpu" or "gpu"
    attention_reason: str
    ffn: str  # experts, dense FFN and router by the matmuls run so far: "cpu", "gpu" or "mixed"
    ffn_reason: str  # the cost model's last estimate for this layer
    gpu_matmuls: int
    cpu_matmuls: int


@dataclass(frozen=True)
class ScheduleSnapshot:
    """Where work runs and why; everything plain so the dashboard and logs can show it."""
    gpu: bool  # a GPU is in use
    device: str  # its name, "" without one
    reason: str  # e.g. "no NVIDIA GPU: CUDA driver not found", "gpu_layers is 0"
    gpu_layers: int
    layers: tuple[LayerPlacement, ...]
    fallbacks: tuple[FallbackEvent, ...]
    gpu_resident_bytes: int
    profile: DeviceProfile | None


# --- detection and the measured profile --------------------------------------------------------

def _driver_reason(e: BaseException) -> str:
    text = " ".join(str(e).split())
    if "cannot be found" in text or "not found" in text:
        return "CUDA driver not found"
    if "no CUDA-capable device" in text or "NO_DEVICE" in text:
        return "the driver sees no CUDA device"
    return text or type(e).__name__


def detect_gpu(allow_simulator: bool = False) -> tuple[Any, str]:
    """(a CudaBackend, its name) or (None, why there is none). Imports numba.cuda; Numba's CUDA
    simulator is not a GPU unless `allow_simulator` (tests)."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0") and not allow_simulator:
        return None, "no NVIDIA GPU: Numba's CUDA simulator is enabled (NUMBA_ENABLE_CUDASIM)"
    try:
        from numba import cuda
    except ImportError as e:
        return None, f"numba-cuda is not installed (pip install 'colibri[gpu]'): {e}"
    try:
        if not cuda.is_available():
            try:
                _ = cuda.gpus.current  # raises with the driver's reason
                return None, "no NVIDIA GPU: the driver sees no CUDA device"
            except Exception as e:  # CudaSupportError (an ImportError), CudaDriverError, ...
                return None, f"no NVIDIA GPU: {_driver_reason(e)}"
        from engine.kernels.cuda import CudaBackend
        backend = CudaBackend()
    except Exception as e:
        return None, f"no usable NVIDIA GPU: {_driver_reason(e)}"
    return backend, "CUDA simulator" if allow_simulator and "NUMBA_ENABLE_CUDASIM" in os.environ else _gpu_name()


def _gpu_name() -> str:
    try:
        from numba import cuda
        name = cuda.get_current_device().name
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # a name is nice to have; NVML below may know it
        from engine.hardware import Nvml
        nv = Nvml()
        nv.handle()
        return nv.name or "NVIDIA GPU"


def profile_path() -> Path:
    home = os.environ.get("COLIBRI_HOME")
    if home:
        return Path(home) / "cache" / "device_profile.json"
    import platformdirs
    return Path(platformdirs.user_cache_dir("colibri", appauthor=False)) / "device_profile.json"


def machine_key(gpu_name: str, threads: int) -> str:
    return f"{platform.node()}|{platform.processor() or platform.machine()}|{os.cpu_count()}|{gpu_name}|{threads}"


def _best(fn, repeats: int = 5) -> float:
    fn()  # compile / warm
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return max(min(times), 1e-9)


def measure_profile(backend: Any, gpu_name: str, threads: int) -> DeviceProfile:
    """Time the real kernels on a 2048 x 2048 q4_1 matrix (2.6 MB): T = 1 for bandwidth, T = 64 for
    flops; the GPU's launch latency, PCIe both ways (32 MB) and its own matmul. About a second."""
    from engine import quant
    from engine.kernels import cpu
    rows = cols = 2048
    rng = np.random.default_rng(0)
    w = quant.get("q4_1").quantize(rng.standard_normal((rows, cols), dtype=np.float32)).view(np.uint8)
    w = w.reshape(rows, -1)
    x1, x64 = rng.standard_normal((1, cols), dtype=np.float32), rng.standard_normal((64, cols), dtype=np.float32)
    out = np.empty((64, rows), np.float32)
    cpu_bw = w.nbytes / _best(lambda: cpu.matmul(w, 3, x1, out[:1], False))
    cpu_flops = 2.0 * rows * cols * 64 / _best(lambda: cpu.matmul(w, 3, x64, out, False), 2)
    big = np.ones(32 << 20, np.uint8)
    h2d = big.nbytes / _best(lambda: backend.upload(big), 3)
    dbig = backend.upload(big)
    d2h = big.nbytes / _best(lambda: dbig.copy_to_host(), 3)
    dw = backend.upload(w)
    gpu_bw = w.nbytes / _best(lambda: backend.matmul(dw, 3, x1))
    gpu_flops = 2.0 * rows * cols * 64 / _best(lambda: backend.matmul(dw, 3, x64))
    free, _ = backend.memory()
    return DeviceProfile(cpu_bw, cpu_flops, gpu_name, backend.launch_latency(), h2d, d2h, gpu_bw, gpu_flops,
                         free, threads)


def load_or_measure(backend: Any, gpu_name: str, threads: int, path: Path | None = None) -> DeviceProfile:
    """The cached profile of this machine, or a fresh (cached) measurement; free memory read now."""
    path = path or profile_path()
    key = machine_key(gpu_name, threads)
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = {}
    cached = table.get(key)
    if cached and cached.get("version") == PROFILE_VERSION:
        free, _ = backend.memory()
        return DeviceProfile(**{**cached, "gpu_memory_free": free})
    log.info("measuring CPU and GPU speeds for the scheduler (once per machine)")
    prof = measure_profile(backend, gpu_name, threads)
    table[key] = asdict(prof)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(table, indent=1))
    except OSError as e:
        log.warning("device profile not cached (%s): %s", path, e.strerror)
    return prof


# --- the scheduler -----------------------------------------------------------------------------

def classify(name: str) -> tuple[int, str]:
    """A matrix's layer and kind from its internal name: "attn", "router", "expert" or "output".
    blk.3.attn_q.weight, blk.3.ffn_gate_inp.weight, blk.3.ffn_up.5.weight, blk.3.ffn_down_shexp.weight"""
    parts = name.split(".")
    if parts[0] != "blk":
        return -1, "output"
    part = parts[2]
    kind = "attn" if part.startswith("attn") else "router" if part == "ffn_gate_inp" else "expert"
    return int(parts[1]), kind


@dataclass
class _Layer:
    attention: str = "cpu"
    attention_reason: str = ""
    gpu: int = 0
    cpu: int = 0
    last: Decision | None = None
    last_why: str = ""


@dataclass
class _Resident:
    handle: Any
    nbytes: int
    pinned: bool  # attention of a gpu layer: never evicted


class Scheduler:
    """Places matmuls; with a GPU in use it is also the runner base.linear() calls (`runner`)."""

    def __init__(self, layer_attention_bytes: list[int], gpu_layers: int, backend: Any = None,
                 profile: DeviceProfile | None = None, reason: str = "", device: str = "",
                 layer_codes: list[tuple[int, ...]] | None = None):
        self.backend, self.profile, self.device = backend, profile, device
        self.gpu_layers = gpu_layers
        self.cpu_scale = 1.0  # the engine may lower it while the CPU is throttled
        self.layers = [_Layer() for _ in layer_attention_bytes]
        self.fallbacks: list[FallbackEvent] = []
        self._resident: OrderedDict[str, _Resident] = OrderedDict()  # LRU order for the unpinned ones
        self._kinds: dict[str, tuple[int, str]] = {}
        self._lock = threading.Lock()
        self._inflight = 0
        self._gpu_op_s = 0.0  # moving average of one GPU matmul, for the queue term
        self.budget = self._reserved = 0
        if backend is None:
            self.reason = reason
            for lay in self.layers:
                lay.attention_reason = reason
            return
        self.budget = max(0, int(profile.gpu_memory_free * MEMORY_SHARE) - MEMORY_RESERVE)
        self._plan_attention(layer_attention_bytes, layer_codes or [(3,)] * len(self.layers))
        on = sum(lay.attention == "gpu" for lay in self.layers)
        self.reason = reason or f"{device}: attention of {on} of {len(self.layers)} layers on the GPU, other " \
                                f"matmuls by the cost model"

    @classmethod
    def create(cls, cfg, weights, gpu_layers: int, threads: int = 1, profile: DeviceProfile | None = None,
               allow_simulator: bool = False, backend: Any = None, device: str = "") -> Scheduler:
        """The scheduler for a loaded model: CPU-only (with its reason) unless gpu_layers > 0 and a GPU works."""
        att = [sum(m.nbytes for m in (lw.q, lw.k, lw.v, lw.o) if m is not None) for lw in weights.layers]
        codes = [tuple(m.code for m in (lw.q, lw.k, lw.v, lw.o) if m is not None) for lw in weights.layers]
        if gpu_layers <= 0:
            return cls(att, 0, reason="gpu_layers is 0: everything on the CPU")
        if backend is None:
            backend, found = detect_gpu(allow_simulator)
            if backend is None:
                log.info("gpu_layers %d: %s; everything on the CPU", gpu_layers, found)
                return cls(att, gpu_layers, reason=found)
            device = found
        try:
            profile = profile or load_or_measure(backend, device, threads)
        except Exception as e:  # a GPU that fails its own measurement is not one to use
            why = f"GPU {device} failed its measurement: {e}"
            log.warning("%s; fallback to CPU", why)
            return cls(att, gpu_layers, reason=why)
        s = cls(att, gpu_layers, backend, profile, device=device, layer_codes=codes)
        log.info("scheduler: %s", s.reason)
        return s

    @property
    def runner(self) -> Scheduler | None:
        """What Transformer.gpu is set to: self with a GPU in use, else None (the CPU path untouched)."""
        return self if self.backend is not None else None

    def _plan_attention(self, sizes: list[int], codes: list[tuple[int, ...]]) -> None:
        """Attention of layers 0..gpu_layers-1 on the GPU while it fits in the memory budget."""
        left = self.budget
        for L, (lay, size) in enumerate(zip(self.layers, sizes)):
            if L >= self.gpu_layers:
                lay.attention_reason = f"beyond gpu_layers = {self.gpu_layers}"
                continue
            bad = [_format_name(c) for c in codes[L] if c not in GPU_CODES]
            if bad:
                lay.attention_reason = f"{bad[0]} has no GPU kernel"
                continue
            if size > left:
                self._fallback(L, f"blk.{L}.attn", f"out of GPU memory: needs {size / 2**20:.1f} MiB, "
                                                    f"{left / 2**20:.1f} MiB left of the budget")
                continue
            left -= size
            lay.attention, lay.attention_reason = "gpu", f"gpu_layers = {self.gpu_layers}"
        self._reserved = self.budget - left

    def _fallback(self, layer: int, matrix: str, why: str) -> None:
        log.warning("layer %d (%s): fallback to CPU: %s", layer, matrix, why)
        self.fallbacks.append(FallbackEvent(time.time(), layer, matrix, why))
        if 0 <= layer < len(self.layers) and matrix.startswith(f"blk.{layer}.attn"):
            self.layers[layer].attention, self.layers[layer].attention_reason = "cpu", f"fallback: {why}"

    # --- the hot path: called by base.linear() for every matmul while a GPU is in use ---------
    def linear(self, x: np.ndarray, m) -> np.ndarray | None:
        """x (T, cols) @ m.T on the GPU, or None: the caller computes it on the CPU."""
        kind = self._kinds.get(m.name)
        if kind is None:
            kind = self._kinds[m.name] = classify(m.name)
        L, what = kind
        lay = self.layers[L] if L >= 0 else None
        if what == "attn":
            if lay.attention != "gpu":
                return None
        else:
            if _stored_code(m.code) not in GPU_CODES:
                return self._count(lay, None, False)
            res = self._resident.get(m.name)
            d = decide(self.profile, m.nbytes, m.rows, m.cols, x.shape[0], res is not None or what != "expert",
                       self._inflight, self._gpu_op_s, self.cpu_scale)
            if d.where == "cpu":
                return self._count(lay, d, False)
        dw = self._device(m, L, what == "attn")
        if dw is None:
            return self._count(lay, None, False) if what != "attn" else None
        try:
            with self._lock:
                self._inflight += 1
            t0 = time.perf_counter()
            y = self.backend.matmul(dw, _stored_code(m.code), x)
            self._gpu_op_s = 0.9 * self._gpu_op_s + 0.1 * (time.perf_counter() - t0)
        except Exception as e:  # a failing launch costs this matmul a CPU run, never the reply
            self._fallback(L, m.name, f"{type(e).__name__}: {e}")
            self._resident.pop(m.name, None)
            return None
        finally:
            with self._lock:
                self._inflight -= 1
        if what != "attn":
            self._count(lay, d, True)
        return y

    def _count(self, lay: _Layer | None, d: Decision | None, gpu: bool) -> None:
        if lay is not None:
            lay.gpu += gpu
            lay.cpu += not gpu
            lay.last = d or lay.last

    def _device(self, m, layer: int, pinned: bool):
        """m's weights on the device, uploaded on first use; None if they cannot be (logged)."""
        r = self._resident.get(m.name)
        if r is not None:
            if not r.pinned:
                self._resident.move_to_end(m.name)
            return r.handle
        if not pinned and not self._make_room(m.nbytes):
            self.layers[layer].last_why = "does not fit in GPU memory" if layer >= 0 else ""
            return None
        try:  # the CUDA kernels read the stored layout: a repacked expert goes up unpacked
            data = m.data if m.code < PACKED else quant.unpack_x8(m.data, quant.get(m.code).base.name)
            handle = self.backend.upload(data)
        except Exception as e:
            oom = "out of GPU memory" if _is_oom(e) else "upload failed"
            self._fallback(layer, m.name, f"{oom}: {type(e).__name__}: {e}")
            if _is_oom(e) and not pinned:
                self.budget = self._used()  # stop asking for more than the device gave
            return None
        self._resident[m.name] = _Resident(handle, m.nbytes, pinned)
        return handle

    def _used(self) -> int:
        return sum(r.nbytes for r in self._resident.values())

    def _make_room(self, nbytes: int) -> bool:
        """Evict least recently used unpinned weights until nbytes fit beside the pinned attention."""
        limit = self.budget - self._reserved
        loose = [k for k, r in self._resident.items() if not r.pinned]
        used = sum(self._resident[k].nbytes for k in loose)
        if nbytes > limit:
            return False
        for k in loose:
            if used + nbytes <= limit:
                break
            used -= self._resident.pop(k).nbytes
        return True

    # --- what the dashboard sees -------------------------------------------------------------
    def snapshot(self) -> ScheduleSnapshot:
        rows = []
        for L, lay in enumerate(self.layers):
            ffn = "gpu" if lay.gpu and not lay.cpu else "mixed" if lay.gpu else "cpu"
            why = lay.last.reason if lay.last is not None else (lay.last_why or (
                self.reason if self.backend is None else "no FFN matmul yet"))
            rows.append(LayerPlacement(L, lay.attention, lay.attention_reason, ffn, why, lay.gpu, lay.cpu))
        return ScheduleSnapshot(self.backend is not None, self.device, self.reason, self.gpu_layers, tuple(rows),
                                tuple(self.fallbacks), self._used(), self.profile)

    def close(self) -> None:
        self._resident.clear()  # device arrays are freed with their last reference


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, MemoryError) or getattr(e, "code", None) == 2 or "OUT_OF_MEMORY" in str(e).upper()


def attach(engine) -> Scheduler:
    """Build the scheduler for a loaded Engine and hook it into its Transformer (Engine.__init__)."""
    sched = Scheduler.create(engine.cfg, engine.weights, engine.params.get("gpu_layers", 0), engine.threads)
    engine.net.gpu = sched.runner
    return sched


__all__ = ["DeviceProfile", "Decision", "FallbackEvent", "LayerPlacement", "ScheduleSnapshot", "Scheduler",
           "attach", "decide", "detect_gpu", "load_or_measure", "measure_profile"]
