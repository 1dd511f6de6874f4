"""One numba call per batched decode step of a dense model: N sequences' next tokens through
every layer, each row on its own KV cache at its own position (engine.batch's continuous
batching).

Why: layer by layer, a step of 8 rows cost ~40 kernel calls per layer (8 attention calls, 8
cache writes, the norms, the ropes) and the Python between them, and as many OpenMP regions:
3.6× one row's fused decode at 8 rows. Here the layer loop runs compiled with five parallel
loops per layer, as engine.kernels.decode.decode_layers, each over all N rows: a task reads
its 8, 16 or 32 weight rows once and dots them with every row's activations while they sit in
L1. With 512-bit vectors (simd.WIDE) a q4_0/q4_1/q8_0 task takes two 8-row groups side by side,
one vpdpbusd per chunk for 16 rows (simd._pair_tokens): 8-row step of SmolLM2 Q4_1, 1 thread,
medians of 40 on a loaded Zen 5: 25.2 -> 24.1 ms (minima 18.7 -> 17.3).

Exactness: each row goes through decode_layers' own helpers (_rows, _swiglu_rows,
_store_kv, attend, quantize_block, rmsnorm_row, rope_head) on its own activations, in the
same order, so every row's logits are what that sequence decodes alone, bit for bit
(tests/test_batch.py). The numpy twin is the layered path (engine.models.base with cpu.py's
kernels, run by Transformer.forward on rows when this kernel does not apply), equal to it.

Layout: weight tables as decode_layers' (int64 rows (address, rows, row_bytes, code)): attn
(layers, 4, 4) q, k, v, o; mlp (layers, 3, 4) gate, up, down. kv (N, 5) int64 per row: the
addresses of its cache's k, v, k_scale, v_scale and its capacity; the caches are KVCache's
(layers, capacity, kv_heads, head_dim) of one element type (like_kv's: float32, f16 bits as
uint16, int8), their scales (layers, capacity, kv_heads) float32 when `scaled`, else
(layers, 1, 1) (never read). The caller keeps every cache and matrix alive for the call.
"""
from __future__ import annotations

import numpy as np
from numba import carray, njit, prange, types
from numba.extending import intrinsic

import engine.kernels.ready  # noqa: F401  (engine.kernels.setup() first: fails otherwise)
from engine.kernels.decode import CODE, SPAN, _matrix, _rows, _store_kv, _swiglu_rows
from engine.kernels.formats import PACKED, per_256, quantize_block, quantize_row_for, quantized_pair, quantized_sets
from engine.kernels.matmul import _group_dot, _group_tokens, _pair, _pair8, _pairable
from engine.kernels.rows import attend, rmsnorm_row, rope_head, silu
from engine.kernels.simd import PAIR_TOKENS, TOKENS, WIDE

# rows per parallel task of the q/k/v/o and down matrices: two 8-row groups where 512-bit vectors
# take both at once (simd.WIDE: _pair), else one
TASK_ROWS = 16 if WIDE else SPAN

K_ADDR, V_ADDR, KS_ADDR, VS_ADDR, CAPACITY = range(5)  # columns of a row of kv


@intrinsic
def _at(typingctx, address, like):
    """An int64 address as a pointer to elements of like's type (an array), for numba.carray."""
    if not isinstance(like, types.Array):
        return None
    ptr = types.CPointer(like.dtype)

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(ptr))
    return ptr(types.int64, like), codegen


@njit(inline="always", cache=True)
def _cache(kv, n, col, like, layers, cap, a, b):
    """Row n's cache array at column col of kv, shaped (layers, cap, a, b) of like's type."""
    return carray(_at(kv[n, col], like), (layers, cap, a, b))


@njit(inline="always", cache=True)
def _scales(kv, n, col, like, scaled, layers, kv_heads):
    """Row n's k or v scales (layers, capacity, kv_heads), or like itself when unscaled."""
    if scaled:
        return carray(_at(kv[n, col], like), (layers, kv[n, CAPACITY], kv_heads))
    return like


@njit(fastmath=True, cache=True, nogil=True)
def _rows_n(m, code, r0, r1, xq, xd, xs, xi, out):
    """out[n, r] += row r of m · row n's int8 activations for r in r0..r1-1 (r0 a multiple of 8),
    every row n of xq (N, cols): on a repacked matrix each block is unpacked once for TOKENS
    rows (the prefill's group kernel, whose integer block sums and per-token float steps are the
    one-token kernel's: the same products bit for bit; with simd.WIDE two groups at once), else
    decode._rows row by row."""
    N = xq.shape[0]
    if code > PACKED:
        g, g_end = r0 // 8, r1 // 8
        while g < g_end:
            if WIDE:
                if g + 1 < g_end and _pairable(code, N):
                    t = 0
                    while t + PAIR_TOKENS <= N:
                        a8 = _pair8(m, g, code, xq, xd, xs, xi, t)
                        for j in range(PAIR_TOKENS):
                            for i in range(16):
                                out[t + j, 8 * g + i] += a8[16 * j + i]
                        t += PAIR_TOKENS
                    while t + TOKENS <= N:
                        a = _pair(m, g, code, xq, xd, xs, xi, t)
                        for j in range(TOKENS):
                            for i in range(16):
                                out[t + j, 8 * g + i] += a[16 * j + i]
                        t += TOKENS
                    for u in range(t, N):
                        for gg in range(g, g + 2):
                            b = _group_dot(m, gg, code, xq[u], xd[u], xs[u], xi[u])
                            for i in range(8):
                                out[u, 8 * gg + i] += b[i]
                    g += 2
                    continue
            t = 0
            while t + TOKENS <= N:
                a = _group_tokens(m, g, code, xq, xd, xs, xi, t)
                for j in range(TOKENS):
                    for i in range(8):
                        out[t + j, 8 * g + i] += a[8 * j + i]
                t += TOKENS
            for u in range(t, N):
                b = _group_dot(m, g, code, xq[u], xd[u], xs[u], xi[u])
                for i in range(8):
                    out[u, 8 * g + i] += b[i]
            g += 1
    else:
        for n in range(N):
            _rows(m, code, r0, r1, xq[n], xd[n], xs[n], xi[n], np.float32(1.0), out[n], 0)


@njit(fastmath=True, cache=True, nogil=True)
def _swiglu_n(gate, cg, up, cu, r0, gq, gd, gs, gi, uq, ud, us, ui, act):
    """act[n, r] = silu(gate row r · x_n) · (up row r · x_n) for the 32 rows r0..r0+31 and every
    row n, x quantized as each matrix reads it (g*, u*: formats.per_256): both matrices repacked,
    TOKENS rows per unpacked block (as _rows_n), else decode._swiglu_rows row by row."""
    N = gq.shape[0]
    if WIDE:
        if cg == cu and _pairable(cg, N):  # both matrices in one q4_0/q4_1/q8_0 kind: 16 rows at once
            for g in range(r0 // 8, r0 // 8 + 4, 2):
                t = 0
                while t + PAIR_TOKENS <= N:
                    ga8 = _pair8(gate, g, cg, gq, gd, gs, gi, t)
                    ua8 = _pair8(up, g, cu, uq, ud, us, ui, t)
                    for j in range(PAIR_TOKENS):
                        for i in range(16):
                            act[t + j, 8 * g + i] = silu(ga8[16 * j + i]) * ua8[16 * j + i]
                    t += PAIR_TOKENS
                while t + TOKENS <= N:
                    ga = _pair(gate, g, cg, gq, gd, gs, gi, t)
                    ua = _pair(up, g, cu, uq, ud, us, ui, t)
                    for j in range(TOKENS):
                        for i in range(16):
                            act[t + j, 8 * g + i] = silu(ga[16 * j + i]) * ua[16 * j + i]
                    t += TOKENS
                for u in range(t, N):
                    for gg in range(g, g + 2):
                        g8 = _group_dot(gate, gg, cg, gq[u], gd[u], gs[u], gi[u])
                        u8 = _group_dot(up, gg, cu, uq[u], ud[u], us[u], ui[u])
                        for i in range(8):
                            act[u, 8 * gg + i] = silu(g8[i]) * u8[i]
            return
    if cg > PACKED and cu > PACKED:
        for g in range(r0 // 8, r0 // 8 + 4):
            t = 0
            while t + TOKENS <= N:
                ga = _group_tokens(gate, g, cg, gq, gd, gs, gi, t)
                ua = _group_tokens(up, g, cu, uq, ud, us, ui, t)
                for j in range(TOKENS):
                    for i in range(8):
                        act[t + j, 8 * g + i] = silu(ga[8 * j + i]) * ua[8 * j + i]
                t += TOKENS
            for u in range(t, N):
                g8 = _group_dot(gate, g, cg, gq[u], gd[u], gs[u], gi[u])
                u8 = _group_dot(up, g, cu, uq[u], ud[u], us[u], ui[u])
                for i in range(8):
                    act[u, 8 * g + i] = silu(g8[i]) * u8[i]
        return
    for n in range(N):
        _swiglu_rows(gate, cg, up, cu, r0, gq[n], gd[n], gs[n], gi[n], uq[n], ud[n], us[n], ui[n], act[n])


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def decode_rows(x, norms, attn, bias, qk_norms, qk_norm, clip, mlp, eps, scale, window, cos, sin, pos, kv, like_kv,
                like_scale, scaled, heads, kv_heads, head_dim):
    """Run N tokens x (N, hidden), in place, through every dense layer: row n at position
    pos[n] of its own cache (kv[n]), cos[n], sin[n] (head_dim/2,) its rotary angles, writing
    its keys and values there. bias, qk_norms, qk_norm, clip as decode_layers'."""
    n_layers, (N, hidden) = norms.shape[0], x.shape
    hd, kvd = head_dim, kv_heads * head_dim
    qd = heads * hd
    group = heads // kv_heads
    top = 0
    for n in range(N):
        top = max(top, pos[n])
    for L in range(n_layers):
        # --- attention: q, k, v in one parallel loop over all three matrices' rows, all N rows each ---
        h = np.empty((N, hidden), np.float32)
        for n in range(N):
            rmsnorm_row(x[n], norms[L, 0], eps, h[n])
        k256 = (per_256(attn[L, 0, CODE]), per_256(attn[L, 1, CODE]), per_256(attn[L, 2, CODE]))
        q256, q32 = quantized_sets(h, k256[0] or k256[1] or k256[2], not (k256[0] and k256[1] and k256[2]))
        q, k, v = np.zeros((N, heads, hd), np.float32), np.zeros((N, kv_heads, hd), np.float32), \
            np.zeros((N, kv_heads, hd), np.float32)
        qf, kf, vf = q.reshape((N, qd)), k.reshape((N, kvd)), v.reshape((N, kvd))
        tq, tk = -(-qd // TASK_ROWS), -(-kvd // TASK_ROWS)  # (a last task of 8 rows where 16 do not divide)
        for task in prange(tq + 2 * tk):
            i = 0 if task < tq else (1 if task < tq + tk else 2)
            r0 = TASK_ROWS * (task - (0 if i == 0 else tq + (i - 1) * tk))
            out = qf if i == 0 else (kf if i == 1 else vf)
            xq, xd, xs, xi = q256 if k256[i] else q32
            _rows_n(_matrix(attn[L, i]), attn[L, i, CODE], r0, min(r0 + TASK_ROWS, qd if i == 0 else kvd), xq, xd, xs,
                    xi, out)
        for n in range(N):  # as decode_layers: the biases, the q/k norms, the clip, rope, the cache
            if bias.shape[2] > 0:
                for j in range(qd):
                    qf[n, j] += bias[L, 0, j]
                for j in range(kvd):
                    kf[n, j] += bias[L, 1, j]
                    vf[n, j] += bias[L, 2, j]
            if qk_norm == 2:
                rmsnorm_row(qf[n], qk_norms[L, 0, :qd], eps, qf[n])
                rmsnorm_row(kf[n], qk_norms[L, 1, :kvd], eps, kf[n])
            elif qk_norm == 1:
                for hh in range(heads):
                    rmsnorm_row(q[n, hh], qk_norms[L, 0, :hd], eps, q[n, hh])
                for hh in range(kv_heads):
                    rmsnorm_row(k[n, hh], qk_norms[L, 1, :hd], eps, k[n, hh])
            if clip > 0:
                for j in range(qd):
                    qf[n, j] = min(max(qf[n, j], -clip), clip)
                for j in range(kvd):
                    kf[n, j] = min(max(kf[n, j], -clip), clip)
                    vf[n, j] = min(max(vf[n, j], -clip), clip)
            for hh in range(heads):
                rope_head(q[n, hh], cos[n], sin[n])
            for hh in range(kv_heads):
                rope_head(k[n, hh], cos[n], sin[n])
            cap = kv[n, CAPACITY]
            kc = _cache(kv, n, K_ADDR, like_kv, n_layers, cap, kv_heads, hd)
            vc = _cache(kv, n, V_ADDR, like_kv, n_layers, cap, kv_heads, hd)
            ks = _scales(kv, n, KS_ADDR, like_scale, scaled, n_layers, kv_heads)
            vs = _scales(kv, n, VS_ADDR, like_scale, scaled, n_layers, kv_heads)
            _store_kv(k[n], kc[L, pos[n]], ks[L], pos[n], scaled)
            _store_kv(v[n], vc[L, pos[n]], vs[L], pos[n], scaled)
        att = np.empty((N, heads, hd), np.float32)
        scores = np.empty((N * heads, top + 1), np.float32)
        aq, ad = np.empty((N, qd), np.int8), np.empty((N, qd // 32), np.float32)
        as_, ai = np.empty((N, qd // 32), np.float32), np.empty((N, qd // 32), np.int32)
        flat = att.reshape((N, qd))
        # each head's output whole blocks of 32 (and read per 32): quantized as soon as it is done
        whole = hd % 32 == 0 and not per_256(attn[L, 3, CODE])
        for t in prange(N * heads):
            n, hh = t // heads, t % heads
            p, cap = pos[n], kv[n, CAPACITY]
            first = max(0, p - window + 1) if window > 0 else 0
            keys = _cache(kv, n, K_ADDR, like_kv, n_layers, cap, kv_heads, hd)[L]
            values = _cache(kv, n, V_ADDR, like_kv, n_layers, cap, kv_heads, hd)[L]
            ks = _scales(kv, n, KS_ADDR, like_scale, scaled, n_layers, kv_heads)[L]
            vs = _scales(kv, n, VS_ADDR, like_scale, scaled, n_layers, kv_heads)[L]
            attend(q[n, hh], keys, values, ks, vs, scaled, hh // group, first, p, scale, scores[t], att[n, hh])
            if whole:
                for b in range(hh * hd // 32, (hh + 1) * hd // 32):
                    quantize_block(flat[n], aq[n], ad[n], as_[n], ai[n], b)
        if not whole:
            for n in range(N):
                quantize_row_for(attn[L, 3, CODE], flat[n], aq[n], ad[n], as_[n], ai[n])
        o = np.zeros((N, hidden), np.float32)
        for task in prange(-(-hidden // TASK_ROWS)):
            r0 = TASK_ROWS * task
            _rows_n(_matrix(attn[L, 3]), attn[L, 3, CODE], r0, min(r0 + TASK_ROWS, hidden), aq, ad, as_, ai, o)
        for n in range(N):
            for j in range(hidden):
                x[n, j] += o[n, j]
        # --- feed-forward: the gate/up rows (32 a task, all N rows), then the down rows ---
        h = np.empty((N, hidden), np.float32)
        for n in range(N):
            rmsnorm_row(x[n], norms[L, 1], eps, h[n])
        cg, cu, cd = mlp[L, 0, CODE], mlp[L, 1, CODE], mlp[L, 2, CODE]
        (gq, gd, gs, gi), (uq, ud, us, ui) = quantized_pair(h, cg, cu)
        ff = mlp[L, 0, 1]  # rows: a multiple of 32, the down matrix's blocks span it
        tasks = ff // 32
        act = np.empty((N, ff), np.float32)
        fq, fd = np.empty((N, ff), np.int8), np.empty((N, tasks), np.float32)
        fs, fi = np.empty((N, tasks), np.float32), np.empty((N, tasks), np.int32)
        for task in prange(tasks):
            r0 = 32 * task
            _swiglu_n(_matrix(mlp[L, 0]), cg, _matrix(mlp[L, 1]), cu, r0, gq, gd, gs, gi, uq, ud, us, ui, act)
            if not per_256(cd):
                for n in range(N):
                    quantize_block(act[n], fq[n], fd[n], fs[n], fi[n], task)
        if per_256(cd):  # per 256: once the whole rows are there
            for n in range(N):
                quantize_row_for(cd, act[n], fq[n], fd[n], fs[n], fi[n])
        out = np.zeros((N, hidden), np.float32)
        for task in prange(-(-hidden // TASK_ROWS)):
            r0 = TASK_ROWS * task
            _rows_n(_matrix(mlp[L, 2]), mlp[L, 2, CODE], r0, min(r0 + TASK_ROWS, hidden), fq, fd, fs, fi, out)
        for n in range(N):
            for j in range(hidden):
                x[n, j] += out[n, j]
