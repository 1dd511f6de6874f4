"""Prefill (many tokens) for the 8-row groups of Q4_K, Q5_K, Q6_K and IQ4_XS: each group's
weights are unpacked once into a small tile of bytes (codes) and floats (per-32 or per-16 scales
and minimums), which then serves every token with plain byte dot products and no bit unpacking.

The group kernels (kquants.py, blocks32.py) unpack the 4/5/6-bit codes and six-bit scales of a
super-block for every TOKENS tokens; over a 512-token prompt that is 128 times per weight. Here
it happens once per group and prompt, so the inner loop is q8_0's: per 32-block and token, 8
vpdpbusd of 4 broadcast activation bytes into the 8 rows' lanes, then one multiply-add.

Tile layout (one 8-row group of a (rows, n) matrix, nb = n / 32 activation blocks):
  tq  uint8 (nb · 256,): block b at 256b, chunk c (weights 4c..4c+3) at +32c, row i at +4i:
      unsigned codes (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63), or IQ4_XS's grid values as
      grid + 128 (vnni, generic: summed from -128·Σq_x) or as signed bytes (avx2: vpsignb);
  ta  float32: per block 8 scales (row i at 8b + i): d·sc_j (Q4_K, Q5_K), d·(ls - 32) (IQ4_XS);
      Q6_K: 16 per block, d·sc of the first sub-block of 16 (16b + i), then of the second (16b + 8 + i);
  tb  float32 (nb · 8,): dmin·m_j (Q4_K, Q5_K; zeros otherwise).
Results equal the group kernels' to float rounding (the same integer sums, scaled in another order).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

import engine.kernels  # noqa: F401  (numba settings first)
from engine.kernels import blocks32, simd
from engine.kernels.kquants import (Q4_K, Q5_K, Q6_K, _at, _broadcast_word, _k_scales8, _q6k_parts, _q45k_parts,
                                    _splat_i32)
from engine.kernels.simd import _FAST, _ZERO, F32, I8, I32, TOKENS, _byte_ptr, _data_ptr, _dot_accumulate, _load, _splat, _vec

IQ4_XS = blocks32.IQ4_XS
TILE_CODES = (Q4_K, Q5_K, Q6_K, IQ4_XS)
_SIGNED = simd.DOT == "avx2"  # IQ4_XS's tile: signed grid values (vpsignb) instead of grid + 128


def _store(builder, ptr, v):
    builder.store(v, builder.bitcast(ptr, v.type.as_pointer()), align=1)


def _unpack(code: int):
    """An intrinsic unpack(w, g, tq, ta, tb): rows 8g..8g+7 of a repacked matrix (kquants.repack_k8,
    blocks32.repack32 for IQ4_XS) -> the tile (module docstring), super-block by super-block."""
    @intrinsic
    def unpack(typingctx, w, g, tq, ta, tb):
        def codegen(context, builder, sig, args):
            wty, _, qty, aty, bty = sig.args
            g = args[1]
            base = _byte_ptr(context, builder, wty, args[0], builder.mul(g, ir.Constant(g.type, 8)), _ZERO)
            qp = _data_ptr(context, builder, qty, args[2], I8)
            ap = _data_ptr(context, builder, aty, args[3], F32)
            bp = _data_ptr(context, builder, bty, args[4], F32)
            n = cgutils.unpack_tuple(builder, context.make_array(qty)(context, builder, args[2]).shape, 1)[0]
            vf, vi = _vec(F32, 8), _vec(I32, 8)
            gsize = 8 * {Q4_K: 144, Q5_K: 176, Q6_K: 210, IQ4_XS: 136}[code]
            with cgutils.for_range(builder, builder.sdiv(n, ir.Constant(n.type, 2048))) as loop:
                sb = loop.index
                blk = builder.gep(base, [builder.mul(sb, ir.Constant(sb.type, gsize))])
                q0 = builder.gep(qp, [builder.mul(sb, ir.Constant(sb.type, 2048))])
                a0 = builder.gep(ap, [builder.mul(sb, ir.Constant(sb.type, 128 if code == Q6_K else 64))])
                b0 = builder.gep(bp, [builder.mul(sb, ir.Constant(sb.type, 64))])
                if code == Q6_K:
                    d8 = builder.fpext(_load(builder, _at(builder, blk, 1664), _vec(ir.HalfType(), 8)), vf)
                    for h in range(2):
                        for s in range(4):
                            j = 4 * h + s
                            for part in range(2):
                                for c, (v, _) in enumerate(_q6k_parts(builder, blk, h, s, part)):
                                    _store(builder, _at(builder, q0, 256 * j + 32 * (4 * part + c)), v)
                                sc = builder.sitofp(builder.sext(_load(builder, _at(builder, blk, 1536 + 8 * (2 * j + part)),
                                                                       _vec(I8, 8)), vi), vf)
                                _store(builder, _at(builder, a0, 16 * j + 8 * part), builder.fmul(d8, sc, flags=_FAST))
                elif code == IQ4_XS:
                    d8 = blocks32._scales8(builder, blk, "iq4_xs")
                    sh = builder.zext(_load(builder, _at(builder, blk, 16), _vec(ir.IntType(16), 8)), vi)
                    sl = _load(builder, _at(builder, blk, 32), vi)
                    grid = [int(x) for x in blocks32.FORMATS["iq4_xs"][5]]
                    table = grid if _SIGNED else [x + 128 - 256 * (x >= 0) for x in grid]
                    low, four = ir.Constant(_vec(I8, 32), [15] * 32), ir.Constant(_vec(I8, 32), [4] * 32)
                    for j in range(8):
                        lo = builder.and_(builder.lshr(sl, ir.Constant(vi, [4 * j] * 8)), ir.Constant(vi, [15] * 8))
                        hi = builder.shl(builder.and_(builder.lshr(sh, ir.Constant(vi, [2 * j] * 8)), ir.Constant(vi, [3] * 8)),
                                         ir.Constant(vi, [4] * 8))
                        ls = builder.sub(builder.or_(lo, hi), ir.Constant(vi, [32] * 8))
                        _store(builder, _at(builder, a0, 8 * j), builder.fmul(d8, builder.sitofp(ls, vf), flags=_FAST))
                        _store(builder, _at(builder, b0, 8 * j), ir.Constant(vf, None))
                        for c in range(4):  # sub-block j's quant chunk c: bytes 4c..4c+3 of each row's 16
                            v = _load(builder, _at(builder, blk, 64 + 128 * j + 32 * c), _vec(I8, 32))
                            for high, idx in enumerate((builder.and_(v, low), builder.lshr(v, four))):
                                _store(builder, _at(builder, q0, 256 * j + 32 * (c + 4 * high)),
                                       blocks32._lookup(builder, idx, table))
                else:
                    d8 = builder.fpext(_load(builder, blk, _vec(ir.HalfType(), 8)), vf)
                    dmin8 = builder.fpext(_load(builder, _at(builder, blk, 16), _vec(ir.HalfType(), 8)), vf)
                    scales, ms = _k_scales8(builder, blk, 32)
                    qh_at, qs_at = (128, 384) if code == Q5_K else (None, 128)
                    for q in range(4):
                        for j, parts in zip((2 * q, 2 * q + 1), _q45k_parts(builder, blk, qs_at, qh_at, q)):
                            for c, (v, _) in enumerate(parts):
                                _store(builder, _at(builder, q0, 256 * j + 32 * c), v)
                            _store(builder, _at(builder, a0, 8 * j), builder.fmul(d8, scales[j], flags=_FAST))
                            _store(builder, _at(builder, b0, 8 * j), builder.fmul(dmin8, ms[j], flags=_FAST))
            return context.get_dummy_value()
        return types.none(w, types.intp, tq, ta, tb), codegen
    return unpack


_unpack_q4_k, _unpack_q5_k, _unpack_q6_k, _unpack_iq4_xs = (_unpack(c) for c in TILE_CODES)


def _tile_tokens(kind: str):
    """An intrinsic dotting a tile (8 rows) with tokens t0..t0+TOKENS-1 of (T, n) int8 activations:
    a tuple of 8 float32 per token, token by token. kind: "k" (unsigned codes, a scale and a
    minimum per 32: Q4_K, Q5_K; xs holds min_sums), "q6" (unsigned codes - 32, two scales per 32;
    xs is q6_offsets (T, n/16) int32), "grid" (IQ4_XS). Each block's 8 weight vectors are loaded once for the
    TOKENS tokens."""
    def typer(tq, ta, tb, xq, xd, xs, xi, t0):
        def codegen(context, builder, sig, args):
            tq, ta, tb = args[:3]
            qp = _data_ptr(context, builder, sig.args[0], tq, I8)
            ap = _data_ptr(context, builder, sig.args[1], ta, F32)
            bp = _data_ptr(context, builder, sig.args[2], tb, F32)
            rest = (sig.return_type, types.intp, *sig.args[3:])  # (w, g) stand-ins for _token_pointers
            nb, per_token = simd._token_pointers(context, builder, types.none(*rest), (None, None, *args[3:]), TOKENS)
            vf, vi = _vec(F32, 8), _vec(I32, 8)
            accs = [cgutils.alloca_once_value(builder, ir.Constant(vf, None)) for _ in range(TOKENS)]
            mins = [cgutils.alloca_once_value(builder, ir.Constant(vf, None)) for _ in range(TOKENS)]
            with cgutils.for_range(builder, nb) as loop:
                b = loop.index
                wp = builder.gep(qp, [builder.mul(b, ir.Constant(b.type, 256))])
                vs = [_load(builder, _at(builder, wp, 32 * c), _vec(I8, 32)) for c in range(8)]
                signs, m8 = None, None
                if kind == "grid" and _SIGNED:
                    signs, vs = vs, [simd._weights_of(builder, v)[0] for v in vs]
                if kind == "q6":
                    a_lo = _load(builder, builder.gep(ap, [builder.mul(b, ir.Constant(b.type, 16))]), vf)
                    a_hi = _load(builder, builder.gep(ap, [builder.add(builder.mul(b, ir.Constant(b.type, 16)),
                                                                      ir.Constant(b.type, 8))]), vf)
                else:
                    a8 = _load(builder, builder.gep(ap, [builder.mul(b, ir.Constant(b.type, 8))]), vf)
                    m8 = _load(builder, builder.gep(bp, [builder.mul(b, ir.Constant(b.type, 8))]), vf) if kind == "k" else None
                for k, (xqp, dp, sp, ip) in enumerate(per_token):
                    x32 = builder.gep(xqp, [builder.mul(b, ir.Constant(b.type, 32))])
                    dx = _splat(builder, builder.load(builder.gep(dp, [b])))
                    xsum = builder.load(builder.gep(ip, [b]))
                    words = []
                    for c in range(8):
                        s = _broadcast_word(builder, x32, 4 * c)
                        if signs is not None:
                            s = blocks32._psign(builder, s, signs[c])
                        words.append(s)
                    if kind == "q6":  # Σ (q - 32) x per sub-block of 16: the sums start at -32 Σx (xs: q6_offsets)
                        op = builder.bitcast(sp, I32.as_pointer())
                        halves = []
                        for part in range(2):
                            at = builder.add(builder.mul(b, ir.Constant(b.type, 2)), ir.Constant(b.type, part))
                            dots = _splat_i32(builder, builder.load(builder.gep(op, [at])))
                            for c in range(4 * part, 4 * part + 4):
                                dots = _dot_accumulate(builder, dots, vs[c], words[c])
                            halves.append(builder.sitofp(dots, vf))
                        term = builder.fadd(builder.fmul(halves[0], a_lo, flags=_FAST),
                                            builder.fmul(halves[1], a_hi, flags=_FAST), flags=_FAST)
                        term = builder.fmul(term, dx, flags=_FAST)
                    else:  # two chains of 4 vpdpbusd (their latency, not their count, limited one chain of 8)
                        chains = [ir.Constant(vi, None), ir.Constant(vi, None)]
                        if kind == "grid" and not _SIGNED:  # grid + 128: - 128 Σx
                            chains[0] = _splat_i32(builder, builder.mul(xsum, ir.Constant(I32, -128)))
                        for c in range(8):
                            chains[c % 2] = _dot_accumulate(builder, chains[c % 2], vs[c], words[c])
                        dots = builder.add(chains[0], chains[1])
                        term = builder.fmul(builder.sitofp(dots, vf), builder.fmul(a8, dx, flags=_FAST), flags=_FAST)
                    builder.store(builder.fadd(builder.load(accs[k]), term, flags=_FAST), accs[k])
                    if m8 is not None:  # the minimums: dmin·m_j · d_x Σx (xs: d_x Σx, from min_sums)
                        e = builder.fmul(m8, _splat(builder, builder.load(builder.gep(sp, [b]))), flags=_FAST)
                        builder.store(builder.fadd(builder.load(mins[k]), e, flags=_FAST), mins[k])
            values = []
            for acc, mn in zip(accs, mins):
                v = builder.fsub(builder.load(acc), builder.load(mn), flags=_FAST)
                values += [builder.extract_element(v, ir.Constant(I32, i)) for i in range(8)]
            return context.make_tuple(builder, sig.return_type, values)
        return types.UniTuple(types.float32, 8 * TOKENS)(tq, ta, tb, xq, xd, xs, xi, types.intp), codegen

    @intrinsic
    def tile_tokens(typingctx, tq, ta, tb, xq, xd, xs, xi, t0):
        return typer(tq, ta, tb, xq, xd, xs, xi, t0)
    return tile_tokens


_tile_k, _tile_q6, _tile_grid = (_tile_tokens(k) for k in ("k", "q6", "grid"))


@njit(cache=True, nogil=True)
def unpack(w, g, code, tq, ta, tb):
    """Rows 8g..8g+7 of a repacked Q4_K/Q5_K/Q6_K/IQ4_XS matrix (code: the GGML id) -> its tile."""
    if code == Q4_K:
        _unpack_q4_k(w, g, tq, ta, tb)
    elif code == Q5_K:
        _unpack_q5_k(w, g, tq, ta, tb)
    elif code == Q6_K:
        _unpack_q6_k(w, g, tq, ta, tb)
    else:
        _unpack_iq4_xs(w, g, tq, ta, tb)


@njit(cache=True, nogil=True)
def tile_tokens(code, tq, ta, tb, xq, xd, xs, xi, t0):
    """A Q4_K/Q5_K/IQ4_XS tile · tokens t0..t0+TOKENS-1: 8 rows of token t0, then of t0+1, ..."""
    if code == IQ4_XS:
        return _tile_grid(tq, ta, tb, xq, xd, xs, xi, t0)
    return _tile_k(tq, ta, tb, xq, xd, xs, xi, t0)


@njit(cache=True, nogil=True)
def min_sums(xd, xs, xi):
    """xs (T, n/32) = d_x · Σq_x of each block as float32 (the product the decode kernels form,
    not the half-rounded sum quantize_activations stores): the Q4_K/Q5_K tiles' minimum terms."""
    T, nb = xs.shape
    for t in range(T):
        for b in range(nb):
            xs[t, b] = xd[t, b] * np.float32(xi[t, b])


@njit(cache=True, nogil=True)
def q6_offsets(xq):
    """(T, n/16) int32: -32 · Σ of each 16 int8 activations of xq (T, n), once per token: where
    the Q6_K tile's sums of a sub-block of 16 start (its codes are q + 32)."""
    T, n = xq.shape
    out = np.empty((T, n // 16), np.int32)
    for t in range(T):
        for k in range(n // 16):
            total = 0
            for i in range(16):
                total += xq[t, 16 * k + i]
            out[t, k] = -32 * total
    return out


@njit(parallel=True, cache=True, nogil=True)
def matmul_tiles(w, code, xq, xd, xs, xi, out):
    """out (T, rows) = the quantized activations (T >= TOKENS; Q4_K/Q5_K: xs is overwritten with
    min_sums)
    times a repacked matrix in TILE_CODES (code: the GGML id), an 8-row group at a time: its tile
    (about 9 bytes per weight, L1/L2 resident) is unpacked once and dotted with every token."""
    rows, T, n = w.shape[0], xq.shape[0], xq.shape[1]
    per = 16 if code == Q6_K else 8
    if code == Q4_K or code == Q5_K:
        min_sums(xd, xs, xi)
    offsets = q6_offsets(xq) if code == Q6_K else np.zeros((T, 1), np.int32)
    for g in prange(rows // 8):
        tq = np.empty(8 * n, np.uint8)
        ta = np.empty(n // 32 * per, np.float32)
        tb = np.empty(n // 4, np.float32)
        unpack(w, g, code, tq, ta, tb)
        t = 0
        while t < T:
            t0 = min(t, T - TOKENS)  # a short tail re-does some tokens: same values
            if code == Q6_K:
                a = _tile_q6(tq, ta, tb, xq, xd, offsets, xi, t0)
            else:
                a = tile_tokens(code, tq, ta, tb, xq, xd, xs, xi, t0)
            for k in range(TOKENS):
                for i in range(8):
                    out[t0 + k, 8 * g + i] = a[8 * k + i]
            t = t0 + TOKENS
