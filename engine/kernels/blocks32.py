"""Fused dot products for the 32-weight block formats llama.cpp writes beside the K-quants:
Q5_0 and Q5_1 (its fallbacks for rows that are not a multiple of 256), IQ4_NL and MXFP4 (gpt-oss
experts), read straight from the blocks and dotted with int8 activations, as simd.py does for
q4_0/q4_1/q8_0 (numba intrinsics emitting LLVM vector code; simd.DOT picks the instructions).

Per block, the 32 weights become 32 bytes, their byte dot product with the block's 32 int8
activations lands in int32 lanes, and the block is scaled once:
  q5_0   w = d (q5 - 16), q5 = nibble | (bit j of qh) << 4: unsigned q5, then - 16 d_w d_x Σq_x
  q5_1   w = d q5 + m: unsigned q5, then + m_w · d_x Σq_x
  iq4_nl w = d grid[nibble]: signed bytes out of a 16-entry table (one vpshufb on x86)
  mxfp4  w = 2^(e - 128) grid[nibble] (e2m1 values doubled): as iq4_nl with an e8m0 scale
The integer sums are exact, so the result differs from the numpy twin (matmul_reference) only
by float rounding.

Layout: w is uint8 (rows, row_bytes), row r's blocks back to back (engine.quant); xq holds
int8 activations (n,) for one token or (T, n) for several, with per-block scale xd, scaled
sum xs and integer sum xi (cpu.quantize_activations).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine import quant
from engine.kernels import simd
from engine.kernels.simd import _FAST, _ZERO, F32, I8, I32, TOKENS, _block_dot, _byte_ptr, _load, _splat, _vec

Q5_0, Q5_1, IQ4_NL, MXFP4 = 6, 7, 20, 39  # GGML type ids
# format -> (block bytes, scale "f16"/"e8m0", qh offset or None, quants offset, minimum offset or None, grid)
FORMATS = {"q5_0": (22, "f16", 2, 6, None, None), "q5_1": (24, "f16", 4, 8, 2, None),
           "iq4_nl": (18, "f16", None, 2, None, quant.IQ4_GRID), "mxfp4": (17, "e8m0", None, 1, None, quant.MXFP4_GRID)}


@njit(inline="always", cache=True)
def fused(code):
    """Whether matmul dots this format here."""
    return code == Q5_0 or code == Q5_1 or code == IQ4_NL or code == MXFP4


def _nibbles(builder, ptr):
    """16 bytes at ptr -> <32 x i8>: low nibbles (weights 0-15), then high ones (16-31)."""
    v = _load(builder, ptr, _vec(I8, 16))
    lo = builder.and_(v, ir.Constant(_vec(I8, 16), [15] * 16))
    hi = builder.lshr(v, ir.Constant(_vec(I8, 16), [4] * 16))
    return builder.shuffle_vector(lo, hi, ir.Constant(_vec(I32, 32), list(range(32))))


def _fifth_bits(builder, ptr):
    """The 4 bytes of qh at ptr (little-endian uint32) -> <32 x i8>, 16 in lane j where bit j is
    set: byte j // 8 in lane j, masked with 1 << j % 8 (byte lanes only: no 32-bit shifts)."""
    qh = _load(builder, ptr, _vec(I8, 4))
    spread = builder.shuffle_vector(qh, qh, ir.Constant(_vec(I32, 32), [j // 8 for j in range(32)]))
    hit = builder.and_(spread, ir.Constant(_vec(I8, 32), [1 << (j % 8) for j in range(32)]))
    on = builder.icmp_unsigned("!=", hit, ir.Constant(_vec(I8, 32), None))
    return builder.select(on, ir.Constant(_vec(I8, 32), [16] * 32), ir.Constant(_vec(I8, 32), None))


def _lookup(builder, idx, grid):
    """Bytes idx (<32 x i8>, each 0..15) -> grid[idx]: vpshufb with the table in both 128-bit
    halves on x86, a compare-and-select per table entry elsewhere."""
    table = [int(v) for v in grid]
    if simd.DOT in ("vnni", "avx2"):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_vec(I8, 32), [_vec(I8, 32)] * 2),
                                            "llvm.x86.avx2.pshuf.b")
        return builder.call(fn, [ir.Constant(_vec(I8, 32), table * 2), idx])
    out = ir.Constant(_vec(I8, 32), None)
    for k, value in enumerate(table):
        hit = builder.icmp_unsigned("==", idx, ir.Constant(_vec(I8, 32), [k] * 32))
        out = builder.select(hit, ir.Constant(_vec(I8, 32), [value] * 32), out)
    return out


def _weights(builder, blk, fmt):
    """A block's 32 weights as bytes for the dot product: (unsigned bytes, None) for q5_x, or
    (|w|, w < 0) for the table formats (signed; simd._block_dot moves the sign to x)."""
    _, _, qh_at, q_at, _, grid = FORMATS[fmt]
    q = _nibbles(builder, builder.gep(blk, [ir.Constant(ir.IntType(64), q_at)]))
    if grid is None:
        return builder.or_(q, _fifth_bits(builder, builder.gep(blk, [ir.Constant(ir.IntType(64), qh_at)]))), None
    return simd._weights_of(builder, _lookup(builder, q, grid))


def _scale(builder, blk, fmt):
    """The block's weight scale as float32: an IEEE half, or e8m0 2^(e - 128) (e < 2: subnormal)."""
    if FORMATS[fmt][1] == "f16":
        return builder.fpext(_load(builder, blk, ir.HalfType()), F32)
    e = builder.zext(_load(builder, blk, I8), I32)
    small = builder.icmp_unsigned("<", e, ir.Constant(I32, 2))
    bits = builder.select(small, builder.shl(ir.Constant(I32, 0x00200000), e),
                          builder.shl(builder.sub(e, ir.Constant(I32, 1)), ir.Constant(I32, 23)))
    return builder.bitcast(bits, F32)


def _dot(fmt: str, tokens: int):
    """An intrinsic dotting row r of a `fmt` matrix with int8 activations: one token's
    (tokens=1: xq (n,) ...; even and odd blocks feed two accumulators so consecutive blocks do
    not wait on each other) or TOKENS tokens' from t0 on (xq (T, n) ...; each block unpacked
    once for all of them). Returns float32, or a tuple of TOKENS float32."""
    size, _, _, _, m_at, grid = FORMATS[fmt]

    def codegen(context, builder, sig, args):
        wty = sig.args[0]
        nb, per_token = simd._token_pointers(context, builder, sig, args, tokens)
        row = _byte_ptr(context, builder, wty, args[0], args[1], _ZERO)
        if tokens == 1:
            per_token *= 2  # (even, odd) blocks
        vf = _vec(F32, 8)
        accs = [cgutils.alloca_once_value(builder, ir.Constant(vf, None)) for _ in per_token]
        extras = [cgutils.alloca_once_value(builder, ir.Constant(F32, 0.0)) for _ in per_token]

        def block(b, which):
            blk = builder.gep(row, [builder.mul(b, ir.Constant(b.type, size))])
            dw = _scale(builder, blk, fmt)
            m = builder.fpext(_load(builder, builder.gep(blk, [ir.Constant(b.type, m_at)]), ir.HalfType()), F32) \
                if m_at is not None else None
            u, negative = _weights(builder, blk, fmt)  # once for every token
            for k in which:
                qp, dp, sp, ip = per_token[k]
                s = _load(builder, builder.gep(qp, [builder.mul(b, ir.Constant(b.type, 32))]), _vec(I8, 32))
                scale = builder.fmul(dw, builder.load(builder.gep(dp, [b])), flags=_FAST)
                term = builder.fmul(builder.sitofp(_block_dot(builder, u, negative, s), vf), _splat(builder, scale),
                                    flags=_FAST)
                builder.store(builder.fadd(builder.load(accs[k]), term, flags=_FAST), accs[k])
                if m is not None:  # q5_1: + m_w · d_x Σq_x
                    e = builder.fmul(m, builder.load(builder.gep(sp, [b])), flags=_FAST)
                elif grid is None:  # q5_0: - 16 · d_w d_x Σq_x
                    qsum = builder.sitofp(builder.load(builder.gep(ip, [b])), F32)
                    e = builder.fmul(builder.fmul(scale, qsum, flags=_FAST), ir.Constant(F32, -16.0), flags=_FAST)
                else:
                    continue
                builder.store(builder.fadd(builder.load(extras[k]), e, flags=_FAST), extras[k])

        if tokens == 1:
            one, two = ir.Constant(nb.type, 1), ir.Constant(nb.type, 2)
            with cgutils.for_range(builder, builder.sdiv(nb, two)) as loop:
                b = builder.mul(loop.index, two)
                block(b, [0])
                block(builder.add(b, one), [1])
            with builder.if_then(builder.icmp_signed("!=", builder.srem(nb, two), ir.Constant(nb.type, 0))):
                block(builder.sub(nb, one), [0])
        else:
            with cgutils.for_range(builder, nb) as loop:
                block(loop.index, range(tokens))

        def total(vs, es):
            v = vs[0]
            for other in vs[1:]:
                v = builder.fadd(v, other, flags=_FAST)
            t = es[0]
            for other in es[1:]:
                t = builder.fadd(t, other, flags=_FAST)
            for i in range(8):
                t = builder.fadd(t, builder.extract_element(v, ir.Constant(I32, i)), flags=_FAST)
            return t

        if tokens == 1:
            return total([builder.load(a) for a in accs], [builder.load(e) for e in extras])
        values = [total([builder.load(a)], [builder.load(e)]) for a, e in zip(accs, extras)]
        return context.make_tuple(builder, sig.return_type, values)

    if tokens == 1:
        @intrinsic
        def row_dot(typingctx, w, r, xq, xd, xs, xi):
            return types.float32(w, types.intp, xq, xd, xs, xi), codegen
        return row_dot

    @intrinsic
    def row_dot_tokens(typingctx, w, r, xq, xd, xs, xi, t0):
        return types.UniTuple(types.float32, TOKENS)(w, types.intp, xq, xd, xs, xi, types.intp), codegen
    return row_dot_tokens


row_dot_q5_0, row_dot_q5_1, row_dot_iq4_nl, row_dot_mxfp4 = (_dot(f, 1) for f in FORMATS)
tokens_q5_0, tokens_q5_1, tokens_iq4_nl, tokens_mxfp4 = (_dot(f, TOKENS) for f in FORMATS)


@njit(inline="always", cache=True)
def row_dot(w, r, code, xq, xd, xs, xi):
    """Row r of a q5_0/q5_1/iq4_nl/mxfp4 matrix · one token's int8 activations (decode)."""
    if code == Q5_0:
        return row_dot_q5_0(w, r, xq, xd, xs, xi)
    if code == Q5_1:
        return row_dot_q5_1(w, r, xq, xd, xs, xi)
    if code == IQ4_NL:
        return row_dot_iq4_nl(w, r, xq, xd, xs, xi)
    return row_dot_mxfp4(w, r, xq, xd, xs, xi)


@njit(inline="always", cache=True)
def tokens_dot(w, r, code, xq, xd, xs, xi, t0):
    """Row r · tokens t0..t0+TOKENS-1 (prefill): each block unpacked once for all of them."""
    if code == Q5_0:
        return tokens_q5_0(w, r, xq, xd, xs, xi, t0)
    if code == Q5_1:
        return tokens_q5_1(w, r, xq, xd, xs, xi, t0)
    if code == IQ4_NL:
        return tokens_iq4_nl(w, r, xq, xd, xs, xi, t0)
    return tokens_mxfp4(w, r, xq, xd, xs, xi, t0)


def matmul_reference(w: np.ndarray, qtype: str, x: np.ndarray) -> np.ndarray:
    """The numpy twin: x (T, n) @ W.T computed as the kernels do, x quantized to int8 blocks
    (reference.quantize_activations), then per block d_w·d_x·Σ q_w q_x with q_w the integer
    weights (q5 - 16, q5, or the grid value), + m_w·s_x for q5_1; float64 sums."""
    from engine.kernels.reference import quantize_activations
    xq, xd, xs, _ = quantize_activations(x)
    T, nb = xd.shape
    size = FORMATS[qtype][0]
    blocks = w.reshape(w.shape[0], nb, size)
    def f16(a):
        return np.ascontiguousarray(a).view(np.float16)[..., 0].astype(np.float64)

    _, kind, qh_at, q_at, m_at, grid = FORMATS[qtype]
    nib = blocks[..., q_at:q_at + 16]
    q = np.concatenate([nib & 15, nib >> 4], axis=-1).astype(np.int64)
    if grid is None:
        qh = np.ascontiguousarray(blocks[..., qh_at:qh_at + 4]).view(np.uint32)[..., 0]
        q |= ((qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int64) << 4
        if qtype == "q5_0":
            q -= 16
    else:
        q = grid.astype(np.int64)[q]
    d = f16(blocks[..., 0:2]) if kind == "f16" else quant.e8m0_half(blocks[..., 0]).astype(np.float64)
    isum = np.einsum("rbj,tbj->trb", q, xq.reshape(T, nb, 32).astype(np.int64))
    out = (d[None] * xd.astype(np.float64)[:, None, :] * isum).sum(axis=-1)
    if m_at is not None:
        out += (f16(blocks[..., m_at:m_at + 2])[None] * xs.astype(np.float64)[:, None, :]).sum(axis=-1)
    return out.astype(np.float32)
