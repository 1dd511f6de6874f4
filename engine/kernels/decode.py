"""One numba call per decoded token: every decoder layer of a dense Llama-style or a softmax
top-k MoE model (with or without q/k/v biases, q/k norms, a q/k/v clip), on the integer path
(int8 activations).

Why: layer by layer, a decoded token costs ten kernel calls per layer and the Python between
them — about 100 µs per layer, 1.6 ms of a 12.5 ms token on the MoE benchmark model, the gap to
llama.cpp. Here the layer loop, the router's choice and the expert lookup all run compiled,
with six parallel loops per layer (q/k/v, attention heads, output projection, the router's rows,
the experts' gate/up rows, their down rows) instead of ten.

The arithmetic is the layered path's own (engine.models.base with cpu.py's kernels): the same
integer dot products over the same quantized activations, the same KV rounding, the same
routing, so the two agree to float rounding and the tests hold them to it.

Layout: weight matrices are reached through address tables, int64 rows (address, rows,
row_bytes, code) of uint8 (rows, row_bytes) matrices as cpu.py reads them; the caller keeps
every one alive and in place for the call (engine.models.fused: the expert cache then holds
every expert, and nothing is evicted). attn (layers, 4, 4): q, k, v, o; router (layers, 4), no
rows for a dense model; experts (layers, E, 3, 4): gate, up, down. norms (layers, 2, hidden):
attention and feed-forward RMSNorm weights. The KV cache (layers, capacity, kv_heads, head_dim)
as KVCache stores it: float32, f16 bits as uint16, or int8 with scales (layers, capacity,
kv_heads).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, njit, prange, types
from numba.extending import intrinsic

import engine.kernels.ready  # noqa: F401  (engine.kernels.setup() first: fails otherwise)
from engine.kernels.float_rows import HEADS
from engine.kernels.formats import (F32, PACKED, Q4_0, Q4_1, Q8_0, dequantize_row, per_256, quantize_block, quantize_row_for,
                                    quantized_sets)
from engine.kernels.matmul import _f32_dot4, _group_dot, _int_dot
from engine.kernels.smallops import softmax_top_k
from engine.kernels.rows import attend, attend_heads, divide, rmsnorm_row, rope_head, silu

ADDRESS, ROWS, ROW_BYTES, CODE = range(4)  # columns of a matrix table row
SPAN = 8  # rows per parallel task: one 8-row group of a repacked matrix


@intrinsic
def _bytes_at(typingctx, address):
    """An int64 address as a uint8 pointer (for numba.carray)."""
    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.uint8)))
    return types.CPointer(types.uint8)(types.int64), codegen


@intrinsic
def _narrow(typingctx, v, like):
    """float32 v as an element of an array like `like`'s: float32 as is, uint16 as the bits of
    the nearest IEEE half (round half to even, as numpy's astype), int8 truncated (v is already
    a rounded integer)."""
    if like == types.float32:
        return types.float32(v, like), lambda context, builder, sig, args: args[0]
    if like == types.uint16:
        def half(context, builder, sig, args):
            return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))
        return types.uint16(v, like), half
    if like == types.int8:
        return types.int8(v, like), lambda context, builder, sig, args: builder.fptosi(args[0], ir.IntType(8))
    return None


@njit(inline="always", cache=True)
def _matrix(row):
    """A table row (address, rows, row_bytes, code) as the uint8 matrix it describes."""
    return carray(_bytes_at(row[ADDRESS]), (row[ROWS], row[ROW_BYTES]))


@njit(fastmath=True, cache=True, nogil=True)  # one compiled copy for every call site
def _rows(m, code, r0, r1, xq, xd, xs, xi, scale, out, off):
    """out[off + r] += scale · (row r of m · the token's int8 activations) for r in r0..r1-1
    (r0 a multiple of 8; an 8-row group at a time when m is repacked)."""
    if code > PACKED:
        for g in range(r0 // 8, r1 // 8):
            a = _group_dot(m, g, code, xq, xd, xs, xi)
            for i in range(8):
                out[off + 8 * g + i] += scale * a[i]
    else:
        for r in range(r0, r1):
            out[off + r] += scale * _int_dot(m, r, code, xq, xd, xs, xi)


@njit(fastmath=True, cache=True, nogil=True)
def _swiglu_rows(gate, cg, up, cu, r0, gq, gd, gs, gi, uq, ud, us, ui, act):
    """act[r] = silu(gate row r · x) · (up row r · x) for the 32 rows r0..r0+31, x quantized as each
    matrix reads it (g*, u*: formats.per_256): with both matrices repacked, 8-row groups straight from
    the dot products (as cpu.moe_int), else through a small buffer."""
    if cg > PACKED and cu > PACKED:
        for g in range(r0 // 8, r0 // 8 + 4):
            g8 = _group_dot(gate, g, cg, gq, gd, gs, gi)
            u8 = _group_dot(up, g, cu, uq, ud, us, ui)
            for i in range(8):
                act[8 * g + i] = silu(g8[i]) * u8[i]
        return
    buf = np.zeros(64, np.float32)
    _rows(gate, cg, r0, r0 + 32, gq, gd, gs, gi, np.float32(1.0), buf, -r0)
    _rows(up, cu, r0, r0 + 32, uq, ud, us, ui, np.float32(1.0), buf, 32 - r0)
    for i in range(32):
        act[r0 + i] = silu(buf[i]) * buf[32 + i]


@njit(fastmath=True, cache=True, nogil=True)  # its callers' (decode_layers, decode_rows); rows.divide rounds
def _store_kv(src, dst, scales, pos, scaled):
    """One token's keys or values src (kv_heads, hd) into dst (kv_heads, hd) as stored; int8
    (`scaled`): q = clip(rint(x / s), ±127) with s = max|x| / 127 per head, into scales[pos].
    KVCache.write is the numpy twin."""
    heads, hd = dst.shape
    for h in range(heads):
        s = np.float32(1.0)
        if scaled:
            top = np.float32(0.0)
            for d in range(hd):
                top = max(top, abs(src[h, d]))
            s = divide(top, np.float32(127.0))
            scales[pos, h] = s
            if s == 0:
                s = np.float32(1.0)
        for d in range(hd):
            v = src[h, d]
            if scaled:  # numpy divides in float64 there (np.where made the divisor a double)
                v = np.float32(min(max(np.rint(divide(np.float64(v), np.float64(s))), -127.0), 127.0))
            dst[h, d] = _narrow(v, dst[h, d])


@intrinsic
def _floats_at(typingctx, address):
    """An int64 address as a float32 pointer (for numba.carray)."""
    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.float32)))
    return types.CPointer(types.float32)(types.int64), codegen


@njit(fastmath=True, cache=True, nogil=True)
def _router_rows(row, r0, x, xq, xd, xs, xi, out):
    """Router logits out[r0..r0+3] (fewer at the end) of one token as cpu.matmul computes them:
    integer dots for q4_0/q4_1/q8_0, else each group of 4 rows dotted in float, float32 rows
    read where they lie (the copy dequantize_row would make is the same bits), others
    dequantized first. One task of decode_layers' parallel loop over the router's rows: the
    router (float32 in llama.cpp's mixes) is read by every thread, not one."""
    code, k, n = row[CODE], min(4, row[ROWS] - r0), x.shape[0]
    if code == Q4_0 or code == Q4_1 or code == Q8_0:
        m = _matrix(row)
        for i in range(k):
            out[r0 + i] = _int_dot(m, r0 + i, code, xq, xd, xs, xi)
        return
    if code == F32 and k == 4:
        a = _f32_dot4(carray(_floats_at(row[ADDRESS] + r0 * row[ROW_BYTES]), (4, n)), x)
    else:
        m = _matrix(row)
        buf = np.zeros((4, n), np.float32)
        for i in range(k):
            dequantize_row(m[r0 + i], code, buf[i])
        a = _f32_dot4(buf, x)
    for i in range(k):
        out[r0 + i] = a[i]


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def decode_layers(x, norms, attn, bias, qk_norms, qk_norm, clip, router, experts, top_k, renormalise, eps, scale,
                  window, cos, sin, pos, k_cache, v_cache, k_scale, v_scale, scaled, heads, kv_heads, head_dim,
                  picks, mixes, start, resume):
    """Run one token x (1, hidden), in place, through the layers from `start` at position `pos`,
    writing its keys and values into the cache; picks (layers, top_k) and mixes (layers, top_k)
    receive each layer's experts and their weights, but a row that comes in with experts (>= 0) is
    taken as given with its mixes, its router's own choice dropped (colibri-bench's trace replay,
    or the routing of a call that stopped at that layer).

    Returns the number of layers when done, or the first layer L whose picks include an expert
    the table does not hold (address 0): x then holds L's attention output, picks[L] and mixes[L]
    its routing, and a call with start=L, resume=True (the table now holding those experts) goes
    on from L's feed-forward part. So an expert cache that holds some of the experts streams the
    rest between calls (engine.models.fused). cos, sin (head_dim/2,): the position's rotary angles.
    bias (layers, 3, heads·head_dim): q, k, v biases (k, v in the first kv_heads·head_dim), or
    (layers, 3, 0) for none; qk_norms (layers, 2, n): q and k RMSNorm weights, n = head_dim per
    head (qk_norm 1, Qwen3) or heads·head_dim over all heads (qk_norm 2, OLMoE; k's in the first
    kv_heads·head_dim), unused for qk_norm 0; clip > 0: q, k, v clipped to ±clip."""
    n_layers, hidden = norms.shape[0], x.shape[1]
    hd, kvd = head_dim, kv_heads * head_dim
    qd = heads * hd
    group = heads // kv_heads
    first = max(0, pos - window + 1) if window > 0 else 0
    for L in range(start, n_layers):
        if not (resume and L == start):  # (resumed: this layer's attention is done)
            # --- attention: q, k, v in one parallel loop over all three matrices' rows ---
            h = np.empty((1, hidden), np.float32)
            rmsnorm_row(x[0], norms[L, 0], eps, h[0])
            k256 = (per_256(attn[L, 0, CODE]), per_256(attn[L, 1, CODE]), per_256(attn[L, 2, CODE]))
            q256, q32 = quantized_sets(h, k256[0] or k256[1] or k256[2], not (k256[0] and k256[1] and k256[2]))
            q, k, v = np.zeros((heads, hd), np.float32), np.zeros((kv_heads, hd), np.float32), \
                np.zeros((kv_heads, hd), np.float32)
            qf, kf, vf = q.reshape(qd), k.reshape(kvd), v.reshape(kvd)
            tq, tk = qd // SPAN, kvd // SPAN
            for task in prange(tq + 2 * tk):
                i = 0 if task < tq else (1 if task < tq + tk else 2)
                r0 = SPAN * (task - (0 if i == 0 else tq + (i - 1) * tk))
                out = qf if i == 0 else (kf if i == 1 else vf)
                xq, xd, xs, xi = q256 if k256[i] else q32
                _rows(_matrix(attn[L, i]), attn[L, i, CODE], r0, r0 + SPAN, xq[0], xd[0], xs[0], xi[0],
                      np.float32(1.0), out, 0)
            if bias.shape[2] > 0:  # as the layered path: the biases, then the q/k norms, then the clip
                for j in range(qd):
                    qf[j] += bias[L, 0, j]
                for j in range(kvd):
                    kf[j] += bias[L, 1, j]
                    vf[j] += bias[L, 2, j]
            if qk_norm == 2:
                rmsnorm_row(qf, qk_norms[L, 0, :qd], eps, qf)
                rmsnorm_row(kf, qk_norms[L, 1, :kvd], eps, kf)
            elif qk_norm == 1:
                for hh in range(heads):
                    rmsnorm_row(q[hh], qk_norms[L, 0, :hd], eps, q[hh])
                for hh in range(kv_heads):
                    rmsnorm_row(k[hh], qk_norms[L, 1, :hd], eps, k[hh])
            if clip > 0:
                for j in range(qd):
                    qf[j] = min(max(qf[j], -clip), clip)
                for j in range(kvd):
                    kf[j] = min(max(kf[j], -clip), clip)
                    vf[j] = min(max(vf[j], -clip), clip)
            for hh in range(heads):
                rope_head(q[hh], cos, sin)
            for hh in range(kv_heads):
                rope_head(k[hh], cos, sin)
            _store_kv(k, k_cache[L, pos], k_scale[L], pos, scaled)
            _store_kv(v, v_cache[L, pos], v_scale[L], pos, scaled)
            keys, values, ks, vs = k_cache[L], v_cache[L], k_scale[L], v_scale[L]
            att = np.empty((heads, hd), np.float32)  # rows of 2-D arrays, as cpu.attention's: the same code
            scores = np.empty((heads, pos + 1), np.float32)
            aq, ad = np.empty((1, qd), np.int8), np.empty((1, qd // 32), np.float32)
            as_, ai = np.empty((1, qd // 32), np.float32), np.empty((1, qd // 32), np.int32)
            flat = att.reshape(qd)
            # each head's output whole blocks of 32 (and read per 32): quantized as soon as it is done
            whole = hd % 32 == 0 and not per_256(attn[L, 3, CODE])
            # the HEADS query heads of one KV head in one task where they divide its group (as cpu.attention):
            # each key and value row is widened once for them, not once a head (at 1024 positions of the
            # bench MoE, 16 heads over 4 KV heads: +5.5 ms a token over 64 positions, +1.5 layer by layer)
            span = HEADS if group % HEADS == 0 else 1
            for task in prange(heads // span):
                h0 = task * span
                if span == HEADS:
                    attend_heads(q[h0:h0 + HEADS], keys, values, ks, vs, scaled, h0 // group, first, pos, scale,
                                 scores[h0:h0 + HEADS], att[h0:h0 + HEADS])
                else:
                    attend(q[h0], keys, values, ks, vs, scaled, h0 // group, first, pos, scale, scores[h0], att[h0])
                if whole:
                    for b in range(h0 * hd // 32, (h0 + span) * hd // 32):
                        quantize_block(flat, aq[0], ad[0], as_[0], ai[0], b)
            if not whole:
                quantize_row_for(attn[L, 3, CODE], flat, aq[0], ad[0], as_[0], ai[0])
            o = np.zeros(hidden, np.float32)
            for task in prange(hidden // SPAN):
                _rows(_matrix(attn[L, 3]), attn[L, 3, CODE], SPAN * task, SPAN * task + SPAN, aq[0], ad[0], as_[0],
                      ai[0], np.float32(1.0), o, 0)
            for j in range(hidden):
                x[0, j] += o[j]
        # --- feed-forward: route, then the chosen experts' gate/up rows, then their down rows ---
        h = np.empty((1, hidden), np.float32)
        rmsnorm_row(x[0], norms[L, 1], eps, h[0])
        mix = np.ones((1, top_k), np.float32)
        ids = np.zeros((1, top_k), np.int64)
        if picks[L, 0] >= 0:  # given
            for j in range(top_k):
                ids[0, j], mix[0, j] = picks[L, j], mixes[L, j]
        elif router[L, ROWS] > 0:
            r256 = per_256(router[L, CODE])
            xq, xd, xs, xi = quantized_sets(h, r256, not r256)[0]
            logits = np.empty((1, router[L, ROWS]), np.float32)
            for task in prange((router[L, ROWS] + 3) // 4):
                _router_rows(router[L], 4 * task, h[0], xq[0], xd[0], xs[0], xi[0], logits[0])
            softmax_top_k(logits, top_k, renormalise, mix, ids)
        for j in range(top_k):
            picks[L, j], mixes[L, j] = ids[0, j], mix[0, j]
            if experts[L, ids[0, j], 0, ADDRESS] == 0 or experts[L, ids[0, j], 1, ADDRESS] == 0 or \
                    experts[L, ids[0, j], 2, ADDRESS] == 0:
                for i in range(j + 1, top_k):
                    picks[L, i], mixes[L, i] = ids[0, i], mix[0, i]
                return L  # not held: the caller brings it in and resumes here
        some, every = False, True
        for j in range(top_k):
            for m in range(2):
                c = experts[L, ids[0, j], m, CODE]
                some, every = some or per_256(c), every and per_256(c)
        q256, q32 = quantized_sets(h, some, not every)
        ff = experts[L, ids[0, 0], 0, ROWS]  # a multiple of 32: the down matrices' blocks span it
        tasks = ff // 32
        act = np.empty((top_k, ff), np.float32)
        fq, fd = np.empty((top_k, ff), np.int8), np.empty((top_k, tasks), np.float32)
        fs, fi = np.empty((top_k, tasks), np.float32), np.empty((top_k, tasks), np.int32)
        for task in prange(top_k * tasks):  # 32 rows each: one activation block, quantized here (per 32)
            j, r0 = task // tasks, 32 * (task % tasks)
            e = ids[0, j]
            gate, up = experts[L, e, 0], experts[L, e, 1]
            gq, gd, gs, gi = q256 if per_256(gate[CODE]) else q32
            uq, ud, us, ui = q256 if per_256(up[CODE]) else q32
            _swiglu_rows(_matrix(gate), gate[CODE], _matrix(up), up[CODE], r0, gq[0], gd[0], gs[0], gi[0],
                         uq[0], ud[0], us[0], ui[0], act[j])
            if not per_256(experts[L, e, 2, CODE]):
                quantize_block(act[j], fq[j], fd[j], fs[j], fi[j], task % tasks)
        for j in range(top_k):  # or per 256, once the whole row is there
            if per_256(experts[L, ids[0, j], 2, CODE]):
                quantize_row_for(experts[L, ids[0, j], 2, CODE], act[j], fq[j], fd[j], fs[j], fi[j])
        out = np.zeros(hidden, np.float32)
        for task in prange(hidden // SPAN):
            r0 = SPAN * task
            for j in range(top_k):
                down = experts[L, ids[0, j], 2]
                _rows(_matrix(down), down[CODE], r0, r0 + SPAN, fq[j], fd[j], fs[j], fi[j], mix[0, j], out, 0)
        for j in range(hidden):
            x[0, j] += out[j]
    return n_layers
