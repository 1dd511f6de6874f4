"""CUDA kernels (numba-cuda) for the GPU path, and `CudaBackend`, the host side the scheduler drives.

Imported only when a GPU is asked for (gpu_layers > 0): a CPU user never loads numba.cuda.
Weights are the same stored blocks as on the CPU (uint8 (rows, row_bytes), GGML type ids), uploaded
once and dequantized on the fly inside the kernels: no float copy on the device either. Each kernel
has its numpy twin in engine/kernels/reference.py; tests/cuda_sim/ compares them under Numba's CUDA
simulator (NUMBA_ENABLE_CUDASIM=1).

Layout: activations are float32 (tokens, features), row-major. Halves are decoded through a 64K-entry
table (`_F16`, uploaded once): exact, and the same decoding the CPU kernels use.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda

F16, Q4_0, Q4_1, Q8_0 = 1, 2, 3, 8
CODES = (F16, Q4_0, Q4_1, Q8_0)  # formats with a GPU kernel; the rest stay on the CPU
LANES = 32  # threads per CUDA block: one warp shares a row (or a head), partial sums meet in shared memory
TT = 8  # tokens per matmul block: each weight block read once is dotted with up to TT tokens
_F16 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


@cuda.jit(device=True, inline=True)
def _h2f(f16, lo, hi):
    return f16[np.int32(lo) | (np.int32(hi) << 8)]


@cuda.jit(device=True, inline=True)
def _lane_sum(sh, i0, i1, lane):
    """Tree sums over sh[i, 0:LANES] into sh[i, 0] for rows i0..i1-1; every lane of the block calls it."""
    s = LANES // 2
    while s > 0:
        if lane < s:
            for i in range(i0, i1):
                sh[i, lane] += sh[i, lane + s]
        cuda.syncthreads()
        s //= 2


@cuda.jit
def matmul(w, code, x, f16, out):
    """out (T, rows) = x (T, n) @ W.T; W uint8 (rows, row_bytes) blocks of `code`.

    Grid (rows, ceil(T / TT)), LANES threads: lane l takes weight blocks l, l + LANES, ... of row r
    (neighbouring lanes read neighbouring blocks; f16 rows go weight by weight, any length) and
    dots each with up to TT tokens.
    """
    r, t0, lane = cuda.blockIdx.x, cuda.blockIdx.y * TT, cuda.threadIdx.x
    T, n = x.shape
    nt = min(TT, T - t0)
    acc = cuda.local.array(TT, np.float32)
    sh = cuda.shared.array((TT, LANES), np.float32)
    for i in range(TT):
        acc[i] = 0.0
    if code == F16:  # 2 bytes per weight, any n: lane l takes weights l, l + LANES, ...
        for j in range(lane, n, LANES):
            wv = _h2f(f16, w[r, 2 * j], w[r, 2 * j + 1])
            for i in range(nt):
                acc[i] += wv * x[t0 + i, j]
    for b in range(lane, n // 32 if code != F16 else 0, LANES):
        xo = 32 * b
        if code == Q8_0:  # f16 d | int8 q[32]
            o = 34 * b
            d = _h2f(f16, w[r, o], w[r, o + 1])
            for j in range(32):
                q = np.int32(w[r, o + 2 + j])
                wv = d * np.float32(q - 256 if q > 127 else q)
                for i in range(nt):
                    acc[i] += wv * x[t0 + i, xo + j]
        else:  # Q4_0: f16 d | 16 bytes of nibbles, w = d (q - 8); Q4_1: f16 d | f16 m | nibbles, w = d q + m
            size, qs = (20, 4) if code == Q4_1 else (18, 2)
            o = size * b
            d = _h2f(f16, w[r, o], w[r, o + 1])
            m = _h2f(f16, w[r, o + 2], w[r, o + 3]) if code == Q4_1 else np.float32(-8.0) * d
            for j in range(16):
                q = np.int32(w[r, o + qs + j])
                lo, hi = d * np.float32(q & 15) + m, d * np.float32(q >> 4) + m
                for i in range(nt):
                    acc[i] += lo * x[t0 + i, xo + j] + hi * x[t0 + i, xo + j + 16]
    for i in range(TT):
        sh[i, lane] = acc[i]
    cuda.syncthreads()
    _lane_sum(sh, 0, nt, lane)
    if lane == 0:
        for i in range(nt):
            out[t0 + i, r] = sh[i, 0]


@cuda.jit
def rmsnorm(x, weight, eps, out):
    """out (R, n) = x / sqrt(mean(x²) + eps) * weight; one block of LANES threads per row of x (R, n)."""
    r, lane = cuda.blockIdx.x, cuda.threadIdx.x
    n = x.shape[1]
    sh = cuda.shared.array((1, LANES), np.float32)
    ss = np.float32(0.0)
    for j in range(lane, n, LANES):
        ss += x[r, j] * x[r, j]
    sh[0, lane] = ss
    cuda.syncthreads()
    _lane_sum(sh, 0, 1, lane)
    inv = np.float32(1.0) / math.sqrt(sh[0, 0] / n + eps)
    for j in range(lane, n, LANES):
        out[r, j] = weight[j] * (x[r, j] * inv)


@cuda.jit
def attention(q, k, v, pos0, window, scale, scores, out):
    """Causal grouped-query attention, as cpu.attention: q (T, H, hd) at positions pos0..; k, v
    (S, KV, hd); scores (T*H, S) scratch; out (T, H, hd). One block of LANES threads per (t, h):
    lanes split the positions for scores and softmax, then the head dimension for the output."""
    th, lane = cuda.blockIdx.x, cuda.threadIdx.x
    T, H, hd = q.shape
    t, h = th // H, th % H
    kh = h // (H // k.shape[1])
    last = pos0 + t
    first = max(0, last - window + 1) if window > 0 else 0
    sh = cuda.shared.array((2, LANES), np.float32)
    top = np.float32(-np.inf)
    for s in range(first + lane, last + 1, LANES):
        acc = np.float32(0.0)
        for d in range(hd):
            acc += q[t, h, d] * k[s, kh, d]
        scores[th, s] = acc * scale
        top = max(top, acc * scale)
    sh[0, lane] = top
    cuda.syncthreads()
    s = LANES // 2
    while s > 0:  # max over lanes
        if lane < s:
            sh[0, lane] = max(sh[0, lane], sh[0, lane + s])
        cuda.syncthreads()
        s //= 2
    top = sh[0, 0]
    total = np.float32(0.0)
    for s in range(first + lane, last + 1, LANES):
        e = math.exp(scores[th, s] - top)
        scores[th, s] = e
        total += e
    sh[1, lane] = total
    cuda.syncthreads()
    _lane_sum(sh, 1, 2, lane)
    total = sh[1, 0]
    for d in range(lane, hd, LANES):
        acc = np.float32(0.0)
        for s in range(first, last + 1):
            acc += scores[th, s] * v[s, kh, d]
        out[t, h, d] = acc / total


@cuda.jit
def _noop(a):
    """An empty launch: the scheduler's measure of launch latency."""
    if cuda.grid(1) == 0:
        a[0] = 0.0


class CudaBackend:
    """Host side: uploads stored matrices, runs the kernels, copies results back. Synchronous: each
    call returns host arrays, so the CPU code around it never sees a device array."""

    def __init__(self) -> None:
        self.f16 = cuda.to_device(_F16)

    def upload(self, data: np.ndarray):
        return cuda.to_device(np.ascontiguousarray(data))

    def matmul(self, dw, code: int, x: np.ndarray) -> np.ndarray:
        """x (T, cols) float32 @ W.T with W already on the device -> (T, rows) on the host."""
        T, rows = x.shape[0], dw.shape[0]
        dx = cuda.to_device(np.ascontiguousarray(x, dtype=np.float32))
        dout = cuda.device_array((T, rows), np.float32)
        matmul[(rows, (T + TT - 1) // TT), LANES](dw, code, dx, self.f16, dout)
        return dout.copy_to_host()

    def rmsnorm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        dx, dw = cuda.to_device(np.ascontiguousarray(x, np.float32)), cuda.to_device(weight)
        dout = cuda.device_array_like(dx)
        rmsnorm[x.shape[0], LANES](dx, dw, np.float32(eps), dout)
        return dout.copy_to_host()

    def attention(self, q, k, v, pos0: int, window: int, scale: float) -> np.ndarray:
        T, H, _ = q.shape
        dq, dk, dv = (cuda.to_device(np.ascontiguousarray(a, np.float32)) for a in (q, k, v))
        scores = cuda.device_array((T * H, k.shape[0]), np.float32)
        dout = cuda.device_array_like(dq)
        attention[T * H, LANES](dq, dk, dv, pos0, window, np.float32(scale), scores, dout)
        return dout.copy_to_host()

    def launch_latency(self, repeats: int = 50) -> float:
        """Seconds for one empty launch and synchronize (the median)."""
        import time
        a = cuda.device_array(1, np.float32)
        times = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            _noop[1, 1](a)
            cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return float(np.median(times[1:]))

    def memory(self) -> tuple[int, int]:
        """(free, total) device bytes."""
        free, total = cuda.current_context().get_memory_info()
        return int(free), int(total)
