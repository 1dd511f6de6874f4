"""Fused dot products for the 32-weight block formats llama.cpp writes beside the K-quants:
Q5_0 and Q5_1 (its fallbacks for rows that are not a multiple of 256), IQ4_NL and MXFP4 (gpt-oss
experts), and IQ4_XS (IQ4_NL blocks under six-bit scales per 256), read straight from the blocks
and dotted with int8 activations, as simd.py does for q4_0/q4_1/q8_0 (numba intrinsics emitting
LLVM vector code; simd.DOT picks the instructions): rows as stored, or 8-row groups repacked at
load (repack32; one 4-byte vector lane per row, as simd's q4_0 groups).

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
from engine.kernels import kquants, simd
from engine.kernels.simd import _EXACT, _FAST, _ZERO, F32, I8, I32, TOKENS, _block_dot, _byte_ptr, _load, _splat, _vec

Q5_0, Q5_1, IQ4_NL, MXFP4, IQ4_XS = 6, 7, 20, 39, 23  # GGML type ids
# format -> (block bytes, scale "f16"/"e8m0", qh offset or None, quants offset, minimum offset or None, grid).
# IQ4_XS: 256-weight super-blocks (f16 d | u16 scales_h | scales_l[4] | 8 × 16 quant bytes) whose
# sub-blocks of 32 are IQ4_NL's with a six-bit scale d·(ls - 32): each is dotted as a block of its own.
FORMATS = {"q5_0": (22, "f16", 2, 6, None, None), "q5_1": (24, "f16", 4, 8, 2, None),
           "iq4_nl": (18, "f16", None, 2, None, quant.IQ4_GRID), "mxfp4": (17, "e8m0", None, 1, None, quant.MXFP4_GRID),
           "iq4_xs": (136, "f16", None, 8, None, quant.IQ4_GRID)}


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


def _weights(builder, blk, fmt, quants=None):
    """A block's 32 weights as bytes for the dot product: (unsigned bytes, None) for q5_x, or
    (|w|, w < 0) for the table formats (signed; simd._block_dot moves the sign to x). `quants`:
    where the 16 quant bytes are, if not at the format's offset in blk (IQ4_XS)."""
    _, _, qh_at, q_at, _, grid = FORMATS[fmt]
    q = _nibbles(builder, quants if quants is not None else builder.gep(blk, [ir.Constant(ir.IntType(64), q_at)]))
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


def _xs_scale(builder, sup, j, d):
    """IQ4_XS sub-block j's scale d·(ls - 32) as float32, ls = 4 bits of scales_l[j/2] | 2 bits of
    scales_h << 4 (super-block at sup, d its half already widened; j an i64 value)."""
    j32 = builder.trunc(j, I32)
    sh = builder.zext(_load(builder, builder.gep(sup, [ir.Constant(ir.IntType(64), 2)]), ir.IntType(16)), I32)
    sl = builder.zext(_load(builder, builder.gep(sup, [builder.add(builder.sdiv(j, ir.Constant(j.type, 2)),
                                                                ir.Constant(j.type, 4))]), I8), I32)
    lo = builder.and_(builder.lshr(sl, builder.mul(builder.and_(j32, ir.Constant(I32, 1)), ir.Constant(I32, 4))),
                      ir.Constant(I32, 15))
    hi = builder.shl(builder.and_(builder.lshr(sh, builder.mul(j32, ir.Constant(I32, 2))), ir.Constant(I32, 3)),
                     ir.Constant(I32, 4))
    ls = builder.sub(builder.or_(lo, hi), ir.Constant(I32, 32))
    return builder.fmul(d, builder.sitofp(ls, F32), flags=_FAST)


def _dot(fmt: str, tokens: int):
    """An intrinsic dotting row r of a `fmt` matrix with int8 activations: one token's
    (tokens=1: xq (n,) ...; even and odd blocks feed two accumulators so consecutive blocks do
    not wait on each other) or TOKENS tokens' from t0 on (xq (T, n) ...; each block unpacked
    once for all of them; per token the same accumulators and _EXACT float steps, so a token's
    product is the same bits either way). Returns float32, or a tuple of TOKENS float32."""
    size, _, _, _, m_at, grid = FORMATS[fmt]

    def codegen(context, builder, sig, args):
        wty = sig.args[0]
        nb, per_token = simd._token_pointers(context, builder, sig, args, tokens)
        row = _byte_ptr(context, builder, wty, args[0], args[1], _ZERO)
        vf = _vec(F32, 8)  # per token two accumulators: even and odd blocks
        accs = [cgutils.alloca_once_value(builder, ir.Constant(vf, None)) for _ in range(2 * tokens)]
        extras = [cgutils.alloca_once_value(builder, ir.Constant(F32, 0.0)) for _ in range(2 * tokens)]

        def block(b, which):
            if fmt == "iq4_xs":  # b: the 32-weight sub-block (and activation block) b % 8 of super-block b / 8
                eight = ir.Constant(b.type, 8)
                blk = builder.gep(row, [builder.mul(builder.sdiv(b, eight), ir.Constant(b.type, size))])
                j = builder.srem(b, eight)
                dw = _xs_scale(builder, blk, j, _scale(builder, blk, fmt))
                quants = builder.gep(blk, [builder.add(builder.mul(j, ir.Constant(b.type, 16)), ir.Constant(b.type, 8))])
                m, (u, negative) = None, _weights(builder, blk, fmt, quants)
            else:
                blk = builder.gep(row, [builder.mul(b, ir.Constant(b.type, size))])
                dw = _scale(builder, blk, fmt)
                m = builder.fpext(_load(builder, builder.gep(blk, [ir.Constant(b.type, m_at)]), ir.HalfType()), F32) \
                    if m_at is not None else None
                u, negative = _weights(builder, blk, fmt)  # once for every token
            for k in which:  # accumulator k: token k // 2, block parity k % 2
                qp, dp, sp, ip = per_token[k // 2]
                s = _load(builder, builder.gep(qp, [builder.mul(b, ir.Constant(b.type, 32))]), _vec(I8, 32))
                scale = builder.fmul(dw, builder.load(builder.gep(dp, [b])), flags=_EXACT)
                term = builder.fmul(builder.sitofp(_block_dot(builder, u, negative, s), vf), _splat(builder, scale),
                                    flags=_EXACT)
                builder.store(builder.fadd(builder.load(accs[k]), term, flags=_EXACT), accs[k])
                if m is not None:  # q5_1: + m_w · d_x Σq_x
                    e = builder.fmul(m, builder.load(builder.gep(sp, [b])), flags=_EXACT)
                elif grid is None:  # q5_0: - 16 · d_w d_x Σq_x
                    qsum = builder.sitofp(builder.load(builder.gep(ip, [b])), F32)
                    e = builder.fmul(builder.fmul(scale, qsum, flags=_EXACT), ir.Constant(F32, -16.0), flags=_EXACT)
                else:
                    continue
                builder.store(builder.fadd(builder.load(extras[k]), e, flags=_EXACT), extras[k])

        one, two = ir.Constant(nb.type, 1), ir.Constant(nb.type, 2)
        even, odd = range(0, 2 * tokens, 2), range(1, 2 * tokens, 2)
        with cgutils.for_range(builder, builder.sdiv(nb, two)) as loop:
            b = builder.mul(loop.index, two)
            block(b, even)
            block(builder.add(b, one), odd)
        with builder.if_then(builder.icmp_signed("!=", builder.srem(nb, two), ir.Constant(nb.type, 0))):
            block(builder.sub(nb, one), even)

        def total(vs, es):
            v = vs[0]
            for other in vs[1:]:
                v = builder.fadd(v, other, flags=_EXACT)
            t = es[0]
            for other in es[1:]:
                t = builder.fadd(t, other, flags=_EXACT)
            for i in range(8):
                t = builder.fadd(t, builder.extract_element(v, ir.Constant(I32, i)), flags=_EXACT)
            return t

        values = [total([builder.load(a) for a in accs[2 * k:2 * k + 2]], [builder.load(e) for e in extras[2 * k:2 * k + 2]])
                  for k in range(tokens)]
        if tokens == 1:
            return values[0]
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


row_dot_q5_0, row_dot_q5_1, row_dot_iq4_nl, row_dot_mxfp4, row_dot_iq4_xs = (_dot(f, 1) for f in FORMATS)
tokens_q5_0, tokens_q5_1, tokens_iq4_nl, tokens_mxfp4, tokens_iq4_xs = (_dot(f, TOKENS) for f in FORMATS)


def matmul_reference(w: np.ndarray, qtype: str, x: np.ndarray) -> np.ndarray:
    """The numpy twin: x (T, n) @ W.T computed as the kernels do, x quantized to int8 blocks
    (reference.quantize_activations; iq4_xs per 256, quantize_activations_k, as llama.cpp's Q8_K),
    then per block d_w·d_x·Σ q_w q_x with q_w the integer weights (q5 - 16, q5, or the grid value),
    + m_w·s_x for q5_1; float64 sums."""
    from engine.kernels.reference import quantize_activations, quantize_activations_k
    xq, xd, xs, _ = (quantize_activations_k if qtype == "iq4_xs" else quantize_activations)(x)
    T, nb = xd.shape
    size = FORMATS[qtype][0]
    def f16(a):
        return np.ascontiguousarray(a).view(np.float16)[..., 0].astype(np.float64)

    _, kind, qh_at, q_at, m_at, grid = FORMATS[qtype]
    if qtype == "iq4_xs":  # per sub-block of 32: d·(ls - 32) and IQ4_NL's grid values
        sup = w.reshape(w.shape[0], nb // 8, size)
        sh = np.ascontiguousarray(sup[..., 2:4]).view(np.uint16)[..., 0].astype(np.int64)
        j = np.arange(8)
        ls = (sup[..., 4 + j // 2].astype(np.int64) >> (4 * (j % 2))) & 15 | ((sh[..., None] >> (2 * j)) & 3) << 4
        d = (f16(sup[..., 0:2])[..., None] * (ls - 32)).reshape(w.shape[0], nb)
        nib = sup[..., 8:].reshape(w.shape[0], nb, 16)
        q = grid.astype(np.int64)[np.concatenate([nib & 15, nib >> 4], axis=-1)]
        isum = np.einsum("rbj,tbj->trb", q, xq.reshape(T, nb, 32).astype(np.int64))
        return (d[None] * xd.astype(np.float64)[:, None, :] * isum).sum(axis=-1).astype(np.float32)
    blocks = w.reshape(w.shape[0], nb, size)
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


# --- 8-row groups (repack8 at load): one 4-byte vector lane per row -------------------------------
# format -> regions (offset, bytes, unit) of a block that kquants.repack8 interleaves over 8 rows:
# the scale (and q5_1's minimum) halves, or mxfp4's exponent bytes; q5_x's 4 qh bytes; the 16 quant
# bytes in 4-byte units. A group's block: 8 rows' scales, (minimums), qh words, then 4 chunks of 32
# quant bytes, chunk c holding bytes 4c..4c+3 of row 0, row 1, ... (the layout of simd's q4_0 groups).
REGIONS = {"q5_0": [(0, 2, 2), (2, 4, 4), (6, 16, 4)], "q5_1": [(0, 4, 2), (4, 4, 4), (8, 16, 4)],
           "iq4_nl": [(0, 2, 2), (2, 16, 4)], "mxfp4": [(0, 1, 1), (1, 16, 4)],
           "iq4_xs": [(0, 2, 2), (2, 2, 2), (4, 4, 4), (8, 128, 4)]}  # d | scales_h | scales_l | qs: 1088 bytes
CODES = {"q5_0": Q5_0, "q5_1": Q5_1, "iq4_nl": IQ4_NL, "mxfp4": MXFP4, "iq4_xs": IQ4_XS}
_REGIONS = np.zeros((40, 4, 3), np.int64)  # GGML id -> its regions, padded with empty ones
_REGIONS[:] = (0, 0, 1)
_BLOCK = np.zeros(40, np.int64)
for _f, _r in REGIONS.items():
    _REGIONS[CODES[_f], :len(_r)] = _r
    _BLOCK[CODES[_f]] = FORMATS[_f][0]


@njit(fastmath=False, cache=True, nogil=True)
def repack32(w, code):
    """In place, a q5_0/q5_1/iq4_nl/mxfp4 matrix (rows, row_bytes), rows a multiple of 8 -> 8-row
    groups (REGIONS; the same bytes, moved)."""
    kquants.repack8(w, _BLOCK[code], _REGIONS[code])


@njit(fastmath=False, cache=True, nogil=True)
def unpack32_row(w, r, code, row):
    """Row r of a matrix repacked by repack32 (code: the GGML id) -> its stored bytes row (row_bytes,)."""
    kquants.unpack8_row(w, r, _BLOCK[code], _REGIONS[code], row)


def _scales8(builder, blk, fmt):
    """The 8 rows' weight scales of a group block as <8 x float>: halves, or e8m0 bytes."""
    vf, vi = _vec(F32, 8), _vec(I32, 8)
    if FORMATS[fmt][1] == "f16":
        return builder.fpext(_load(builder, blk, _vec(ir.HalfType(), 8)), vf)
    e = builder.zext(_load(builder, blk, _vec(I8, 8)), vi)
    small = builder.icmp_unsigned("<", e, ir.Constant(vi, [2] * 8))
    bits = builder.select(small, builder.shl(ir.Constant(vi, [0x00200000] * 8), e),
                          builder.shl(builder.sub(e, ir.Constant(vi, [1] * 8)), ir.Constant(vi, [23] * 8)))
    return builder.bitcast(bits, vf)


def _group_fifth_bits(builder, qh, c, high):
    """From a group block's qh words (<32 x i8>, row i's 4 bytes in lane i): 16 in byte k of lane i
    where row i's weight 4c + k (16 + 4c + k if `high`) has its fifth bit set, else 0."""
    src = [4 * i + 2 * high + c // 2 for i in range(8) for _ in range(4)]
    spread = builder.shuffle_vector(qh, qh, ir.Constant(_vec(I32, 32), src))
    mask = ir.Constant(_vec(I8, 32), [1 << (4 * (c % 2) + k) for _ in range(8) for k in range(4)])
    on = builder.icmp_unsigned("!=", builder.and_(spread, mask), ir.Constant(_vec(I8, 32), None))
    return builder.select(on, ir.Constant(_vec(I8, 32), [16] * 32), ir.Constant(_vec(I8, 32), None))


def _psign(builder, s, sign):
    """s with the sign of `sign` per byte (0 where it is 0): AVX2's vpsignb."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_vec(I8, 32), [_vec(I8, 32)] * 2),
                                        "llvm.x86.avx2.psign.b")
    return builder.call(fn, [s, sign])


def _group32(fmt: str, tokens: int):
    """An intrinsic dotting rows 8g..8g+7 of a `fmt` matrix repacked by repack32 with int8
    activations: one token's (tokens=1) or TOKENS tokens' from t0 on (prefill; each block's
    weights unpacked once for all of them). Per block and token: 8 vpdpbusd (4 byte lanes of
    4 broadcast activations each) sum each row in its own lane, then one multiply-add scales
    the 8 rows. Table formats: vnni/generic take grid + 128 as unsigned bytes (one vpshufb) and
    start the sum at -128 Σq_x; avx2 (whose pair sums saturate at int16) takes |grid| and moves
    the sign onto x (vpsignb). Returns a tuple of 8 float32 per token, token by token. Float steps
    _EXACT: IQ4_XS's prefill tiles (tiles.py) repeat them, bit for bit."""
    size, _, _, q_at, m_at, grid = FORMATS[fmt]
    qh_at = {"q5_0": 16, "q5_1": 32}.get(fmt)
    offset = grid is not None and simd.DOT != "avx2"
    limit = simd.i16_limit(31 if grid is None else max(abs(int(x)) for x in grid))  # (avx2: |grid|)

    def typer(w, g, xq, xd, xs, xi, *t0):
        def codegen(context, builder, sig, args):
            nb, per_token = simd._token_pointers(context, builder, sig, args, tokens)
            g = args[1]
            base = _byte_ptr(context, builder, sig.args[0], args[0], builder.mul(g, ir.Constant(g.type, 8)), _ZERO)
            vf, vi = _vec(F32, 8), _vec(I32, 8)
            accs = [cgutils.alloca_once_value(builder, ir.Constant(vf, None)) for _ in range(tokens)]
            low, four = ir.Constant(_vec(I8, 32), [15] * 32), ir.Constant(_vec(I8, 32), [4] * 32)
            step = size if fmt == "iq4_xs" else 8 * size  # group bytes a block (IQ4_XS: a super-block per 8)
            with cgutils.for_range(builder, nb) as loop:
                b = loop.index
                simd.prefetch(builder, builder.gep(base, [builder.mul(b, ir.Constant(b.type, step))]), step)
                if fmt == "iq4_xs":  # sub-block j = b % 8 of the 8 rows' super-block b / 8
                    eight = ir.Constant(b.type, 8)
                    sup = builder.gep(base, [builder.mul(builder.sdiv(b, eight), ir.Constant(b.type, 8 * size))])
                    j = builder.trunc(builder.srem(b, eight), I32)
                    sh = builder.zext(_load(builder, builder.gep(sup, [ir.Constant(b.type, 16)]), _vec(ir.IntType(16), 8)), vi)
                    sl = _load(builder, builder.gep(sup, [ir.Constant(b.type, 32)]), vi)
                    lo = builder.and_(builder.lshr(sl, _splat(builder, builder.mul(j, ir.Constant(I32, 4)))),
                                      ir.Constant(vi, [15] * 8))
                    hi = builder.shl(builder.and_(builder.lshr(sh, _splat(builder, builder.mul(j, ir.Constant(I32, 2)))),
                                                  ir.Constant(vi, [3] * 8)), ir.Constant(vi, [4] * 8))
                    ls = builder.sub(builder.or_(lo, hi), ir.Constant(vi, [32] * 8))
                    d8 = builder.fmul(_scales8(builder, sup, fmt), builder.sitofp(ls, vf), flags=_EXACT)
                    blk = builder.gep(sup, [builder.mul(builder.zext(j, b.type), ir.Constant(b.type, 128))])
                    q8 = 64  # the sub-block's 4 quant chunks follow at blk + 64
                else:
                    blk = builder.gep(base, [builder.mul(b, ir.Constant(b.type, 8 * size))])
                    d8 = _scales8(builder, blk, fmt)
                    q8 = 8 * q_at
                m8 = builder.fpext(_load(builder, builder.gep(blk, [ir.Constant(b.type, 16)]), _vec(ir.HalfType(), 8)),
                                   vf) if m_at is not None else None
                qh = _load(builder, builder.gep(blk, [ir.Constant(b.type, qh_at)]), _vec(I8, 32)) \
                    if qh_at is not None else None
                parts = []  # (unsigned weight bytes, activation word, signed weights for vpsignb or None)
                for c in range(4):
                    v = _load(builder, builder.gep(blk, [ir.Constant(b.type, q8 + 32 * c)]), _vec(I8, 32))
                    for high, idx in enumerate((builder.and_(v, low), builder.lshr(v, four))):
                        word = c + 4 * high
                        if grid is None:
                            parts.append((builder.or_(idx, _group_fifth_bits(builder, qh, c, high)), word, None))
                        elif offset:
                            parts.append((_lookup(builder, idx, [int(x) + 128 - 256 * (int(x) >= 0) for x in grid]), word, None))
                        else:
                            parts.append((_lookup(builder, idx, [abs(int(x)) for x in grid]), word,
                                          _lookup(builder, idx, grid)))
                for acc, (qp, dp, sp, ip) in zip(accs, per_token):
                    x4 = builder.bitcast(builder.gep(qp, [builder.mul(b, ir.Constant(b.type, 32))]), I32.as_pointer())
                    dots = ir.Constant(vi, None)
                    if offset:
                        bias = builder.mul(builder.load(builder.gep(ip, [b])), ir.Constant(I32, -128))
                        dots = builder.shuffle_vector(builder.insert_element(ir.Constant(vi, None), bias,
                                                                             ir.Constant(I32, 0)),
                                                      ir.Constant(vi, None), ir.Constant(vi, [0] * 8))
                    pairs = []
                    for u, at, signed in parts:
                        word = builder.load(builder.gep(x4, [ir.Constant(b.type, at)]), align=1)
                        s = builder.shuffle_vector(builder.insert_element(ir.Constant(vi, None), word, ir.Constant(I32, 0)),
                                                   ir.Constant(vi, None), ir.Constant(vi, [0] * 8))
                        s = builder.bitcast(s, _vec(I8, 32))
                        pairs.append((u, s if signed is None else _psign(builder, s, signed)))
                    dots = simd.dots_accumulate(builder, dots, pairs, limit)
                    xscale = builder.load(builder.gep(dp, [b]))
                    term = builder.fmul(builder.sitofp(dots, vf), builder.fmul(d8, _splat(builder, xscale), flags=_EXACT),
                                        flags=_EXACT)
                    total = builder.fadd(builder.load(acc), term, flags=_EXACT)
                    if m8 is not None:  # q5_1: + m_w · d_x Σ q_x
                        total = builder.fadd(total, builder.fmul(m8, _splat(builder, builder.load(builder.gep(sp, [b]))),
                                                                 flags=_EXACT), flags=_EXACT)
                    elif grid is None:  # q5_0: - 16 · d_w d_x Σ q_x
                        off = builder.fmul(builder.fmul(xscale, builder.sitofp(builder.load(builder.gep(ip, [b])), F32),
                                                        flags=_EXACT), ir.Constant(F32, -16.0), flags=_EXACT)
                        total = builder.fadd(total, builder.fmul(d8, _splat(builder, off), flags=_EXACT), flags=_EXACT)
                    builder.store(total, acc)
            values = []
            for acc in accs:
                v = builder.load(acc)
                values += [builder.extract_element(v, ir.Constant(I32, i)) for i in range(8)]
            return context.make_tuple(builder, sig.return_type, values)
        return types.UniTuple(types.float32, 8 * tokens)(w, types.intp, xq, xd, xs, xi, *t0), codegen

    return simd.group_intrinsic(typer, tokens)


group_q5_0, group_q5_1, group_iq4_nl, group_mxfp4, group_iq4_xs = (_group32(f, 1) for f in FORMATS)
group_tokens_q5_0, group_tokens_q5_1, group_tokens_iq4_nl, group_tokens_mxfp4, group_tokens_iq4_xs = (
    _group32(f, TOKENS) for f in FORMATS)
