"""Fused integer dot products for the K-quants (Q4_K, Q5_K, Q6_K): weight rows straight from
their 256-weight super-blocks times int8 activations, in LLVM vector code (the instruction
paths of simd.py: vnni, avx2, generic).

The activations are int8 per 256 with one float scale (formats.quantize_k_block, llama.cpp's Q8_K,
which llama.cpp dots these formats with), stored in the per-32 arrays every integer kernel reads (the
scale repeated for each 32), so q/k/v, gate/up and the experts of a mixed Q4_K_M model (Q4_K and
Q6_K matrices) share one quantization; per-32 activations (Q8_1), finer, moved the argmax away from
llama.cpp's more often than its own two paths disagree. Per 32 weights (a Q4_K /
Q5_K sub-block, or two Q6_K sub-blocks of 16) the byte dot product is summed in int32 lanes and multiplied by the
six-bit (Q4_K, Q5_K) or int8 (Q6_K) sub-block scale in integers; the super-block's sum then takes
d·d_x once per 256 weights (llama.cpp's order); Q4_K/Q5_K's minimum is dmin·d_x·Σ_j m_j Σq_x,
Q6_K's offset of 32 is taken off the integer sums.

Two layouts:
- rows as stored (row_dot_*: one row and one token; rows that are not repacked, such as
  experts streamed through a small cache);
- 8-row groups (repack_k8 at load, group_dot_* / group_tokens_*; long prompts: tiles.py): each super-block of 8 rows
  is stored region by region (halves, scale bytes, quants), each region interleaved so that one
  4-byte vector lane is one row: the 8 rows' sums build up in 8 lanes with no sums across lanes
  (llama.cpp interleaves its repacked rows for the same reason), and the sub-block scales of the
  8 rows are one <8 x i8> load. The same bytes as the stored matrix, so it is repacked in place.
  Where simd.WIDE, a 512-bit vector holds two neighbouring chunks (LANES 16): one vpdpbusd for 8
  weights of the 8 rows, about half the instructions of a 256-bit vector for the same bytes.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

import engine.kernels.ready  # noqa: F401  (engine.kernels.setup() first: fails otherwise)
from engine.kernels.simd import (_EXACT, _FAST, _ZERO, F32, I8, I32, TOKENS, WIDE, _activations, _byte_ptr, _dot_accumulate, _load,
                                 _splat, _token_pointers, _vec, copy4, dots_accumulate, group_intrinsic, i16_limit,
                                 prefetch)

Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = 10, 11, 12, 13, 14
# GGML id -> block bytes, and per row of a block the regions (offset, bytes, unit) that
# repack_k8 interleaves over 8 rows: unit k of row i goes to 8·offset + 8·unit·k + unit·i
BLOCK = {Q4_K: 144, Q5_K: 176, Q6_K: 210}
_REGIONS = np.zeros((15, 4, 3), np.int64)
_REGIONS[:] = (0, 0, 1)  # (no region)
_REGIONS[Q4_K, :3] = [(0, 4, 2), (4, 12, 1), (16, 128, 4)]  # d, dmin | scales[12] | qs[128]
_REGIONS[Q5_K] = [(0, 4, 2), (4, 12, 1), (16, 32, 4), (48, 128, 4)]  # ... | qh[32] | qs[128]
_REGIONS[Q6_K] = [(0, 128, 4), (128, 64, 4), (192, 16, 1), (208, 2, 2)]  # ql | qh | int8 scales[16] | d
_BLOCK = np.zeros(15, np.int64)
for _c, _b in BLOCK.items():
    _BLOCK[_c] = _b


@njit(fastmath=False, cache=True, nogil=True)
def repack_k8(w, code):
    """In place, a Q4_K/Q5_K/Q6_K matrix (rows, row_bytes), rows a multiple of 8 -> groups of
    8 rows stored super-block by super-block, each region of the block (_REGIONS) interleaved
    over the 8 rows in units of 2 (halves), 1 (scale bytes) or 4 (quant bytes) bytes."""
    repack8(w, _BLOCK[code], _REGIONS[code])


@njit(fastmath=False, cache=True, nogil=True)
def repack8(w, size, regions):
    """In place, a matrix (rows, row_bytes) of `size`-byte blocks, rows a multiple of 8 -> groups
    of 8 rows stored block by block, each region (offset, bytes, unit) of regions (4, 3)
    interleaved over the 8 rows: unit c of row i goes to 8·offset + 8·unit·c + unit·i (the
    K-quants' repack_k8, and cpu.repack_x8's q4_0/q4_1/q8_0)."""
    rows, rb = w.shape
    flat = w.reshape(-1)
    tmp = np.empty(8 * rb, np.uint8)
    for g in range(rows // 8):
        for i in range(8):
            src0 = (8 * g + i) * rb
            for b in range(rb // size):
                src, dst = src0 + size * b, 8 * size * b
                for k in range(4):
                    off, length, unit = regions[k, 0], regions[k, 1], regions[k, 2]
                    for c in range(length // unit):
                        at = dst + 8 * off + 8 * unit * c + unit * i
                        if unit == 4:
                            copy4(tmp, at, flat, src + off + 4 * c)
                        else:
                            for u in range(unit):
                                tmp[at + u] = flat[src + off + unit * c + u]
        flat[8 * g * rb:8 * (g + 1) * rb] = tmp


@njit(fastmath=False, cache=True, nogil=True)
def unpack_k8_row(w, r, code, row):
    """Row r of a matrix repacked by repack_k8 (code: the GGML id) -> its stored bytes row (row_bytes,)."""
    unpack8_row(w, r, _BLOCK[code], _REGIONS[code], row)


@njit(fastmath=False, cache=True, nogil=True)
def unpack8_row(w, r, size, regions, row):
    """Row r of a matrix repacked by repack8(w, size, regions) -> its stored bytes row (row_bytes,)."""
    rb = w.shape[1]
    flat = w.reshape(-1)
    i = r % 8
    base = (r - i) * rb
    for b in range(rb // size):
        src = base + 8 * size * b
        for k in range(4):
            off, length, unit = regions[k, 0], regions[k, 1], regions[k, 2]
            for c in range(length // unit):
                for u in range(unit):
                    row[size * b + off + unit * c + u] = flat[src + 8 * off + 8 * unit * c + unit * i + u]


# --- IR helpers ----------------------------------------------------------------------------

def _c8(v, n=32):
    return ir.Constant(_vec(I8, n), [v] * n)


def _at(builder, p, off):
    return builder.gep(p, [ir.Constant(ir.IntType(64), off)]) if isinstance(off, int) else builder.gep(p, [off])


def _broadcast_word(builder, qp, off, lanes: int = 8):
    """4 activation bytes at qp + off in every 4-byte lane of a <32 x i8>; lanes 16: those in
    lanes 0-7 and the next 4 bytes in lanes 8-15 (a vector of two neighbouring chunks)."""
    per = lanes // 8
    words = builder.load(builder.bitcast(_at(builder, qp, off), _vec(I32, per).as_pointer()), align=1)
    s = builder.shuffle_vector(words, words, ir.Constant(_vec(I32, lanes), [i // 8 for i in range(lanes)]))
    return builder.bitcast(s, _vec(I8, 4 * lanes))


def _first_sums(builder, x0, lanes: int):
    """Σ of the first 16 int8 activations of each of the 8 blocks of 32 at x0 (a super-block's),
    as 8 i32 (Q6_K's offset of 32): byte dots with ones (4-sums in lanes), then two rounds of
    neighbour adds; one or two blocks per vector."""
    vi, per = _vec(I32, lanes), lanes // 8
    out = []
    for k in range(8 // per):
        x = _load(builder, _at(builder, x0, 32 * per * k), _vec(I8, 4 * lanes))
        v = _dot_accumulate(builder, ir.Constant(vi, None), _c8(1, 4 * lanes), x)
        for step in (1, 2):
            v = builder.add(v, builder.shuffle_vector(v, v, ir.Constant(vi, [i ^ step for i in range(lanes)])))
        out += [builder.extract_element(v, ir.Constant(I32, 8 * b)) for b in range(per)]
    return out


def _k_scales8(builder, blk, at):
    """The 8 rows' six-bit scales and minimums of sub-blocks 0..7 as <8 x i8> each (0..63), from the
    12 interleaved scale bytes at blk + at (byte k of row i at at + 8k + i; formats._k_scale_min)."""
    s = [_load(builder, _at(builder, blk, at + 8 * k), _vec(I8, 8)) for k in range(12)]
    c = lambda v: ir.Constant(_vec(I8, 8), [v] * 8)  # noqa: E731
    scales, mins = [], []
    for j in range(8):
        if j < 4:
            sc, mn = builder.and_(s[j], c(63)), builder.and_(s[j + 4], c(63))
        else:
            top = lambda v: builder.shl(builder.lshr(v, c(6)), c(4))  # noqa: E731
            sc = builder.or_(builder.and_(s[j + 4], c(15)), top(s[j - 4]))
            mn = builder.or_(builder.lshr(s[j + 4], c(4)), top(s[j]))
        scales.append(sc)
        mins.append(mn)
    return scales, mins


def super_block_total(builder, d8, dmin8, dx, isum, msum):
    """A super-block's rows: d·d_x·S - dmin·d_x·M (Q6_K: d·d_x·S) from its exact integer sums S =
    Σ_j sc_j Σ q_w q_x and M = Σ_j m_j Σq_x (int32 vectors, a row a lane) and the activations' one
    scale d_x (llama.cpp's Q8_K: one per 256), as llama.cpp's K-quant dot products take them. The
    group kernels and tiles.py both end a super-block here: the same float steps, the same bits."""
    vf = d8.type
    fx = _splat(builder, dx, vf.count)
    total = builder.fmul(builder.fmul(d8, fx, flags=_EXACT), builder.sitofp(isum, vf), flags=_EXACT)
    if dmin8 is not None:
        low = builder.fmul(builder.fmul(dmin8, fx, flags=_EXACT), builder.sitofp(msum, vf), flags=_EXACT)
        total = builder.fsub(total, low, flags=_EXACT)
    return total


def _fifth_bit(builder, h, j):
    """Bit j of Q5_K's qh bytes h, moved to bit 4 (the weights of sub-block j)."""
    n = h.type.count
    return builder.shl(builder.and_(builder.lshr(h, _c8(j, n)), _c8(1, n)), _c8(4, n))


def _q45k_parts(builder, blk, qs_at, qh_at, q, per: int = 1):
    """Weights of sub-blocks 2q and 2q+1 of an 8-row group as unsigned bytes (0..15, or 0..31
    with Q5_K's fifth bits from the qh chunks at qh_at): [(vector, activation offset in the
    super-block)] each. qs chunk 8q+c holds bytes 4c..4c+3 of each row's 32-byte run q: low
    nibbles are sub-block 2q's weights 4c..4c+3, high nibbles sub-block 2q+1's. per 2: a vector
    holds chunks c and c+1 (512 bits), the offset is chunk c's."""
    low, high = [], []
    n = 32 * per
    for c in range(0, 8, per):
        v = _load(builder, _at(builder, blk, qs_at + 32 * (8 * q + c)), _vec(I8, n))
        lo, hi = builder.and_(v, _c8(15, n)), builder.lshr(v, _c8(4, n))
        if qh_at is not None:
            h = _load(builder, _at(builder, blk, qh_at + 32 * c), _vec(I8, n))
            lo, hi = builder.or_(lo, _fifth_bit(builder, h, 2 * q)), builder.or_(hi, _fifth_bit(builder, h, 2 * q + 1))
        low.append((lo, 32 * (2 * q) + 4 * c))
        high.append((hi, 32 * (2 * q + 1) + 4 * c))
    return low, high


def _q6k_weights(builder, a, b, hb):
    """Q6_K's four weight vectors (s = 0..3, unsigned 0..63) of ql bytes a (s 0, 2), b (s 1, 3)
    and their qh bytes hb (bits 2s, 2s+1): the high bits are moved to bits 4-5 and masked
    (x86 shifts bytes as 16-bit words: one shift and one mask each)."""
    n = a.type.count  # 32 bytes, or 64 (two chunks: _group_k on 512 bits)
    top = _c8(0x30, n)
    hi = (builder.and_(builder.shl(hb, _c8(4, n)), top), builder.and_(builder.shl(hb, _c8(2, n)), top),
          builder.and_(hb, top), builder.and_(builder.lshr(hb, _c8(2, n)), top))
    lo = (builder.and_(a, _c8(15, n)), builder.and_(b, _c8(15, n)), builder.lshr(a, _c8(4, n)), builder.lshr(b, _c8(4, n)))
    return [builder.or_(x, y) for x, y in zip(lo, hi)]


def _q6k_parts(builder, blk, h, s, part, per: int = 1):
    """Weights 128h + 32s + 16·part .. +15 of an 8-row Q6_K group (sub-block 8h + 2s + part) as
    unsigned bytes (0..63): [(vector, activation offset)] for its 4 chunks. ql chunk 16h+c
    (s 0, 2: low, high nibbles) or 16h+8+c (s 1, 3) and qh chunk 8h+c hold bytes 4c..4c+3 of each
    row's ql[64h..], ql[64h+32..] and qh[32h..]; bits 2s, 2s+1 of qh are the weight's bits 4, 5.
    Built a sub-block at a time: a half's vectors spill out of the 16 AVX2 registers. per 2: a
    vector holds chunks c and c+1 (512 bits), the offset is chunk c's."""
    out = []
    for c in range(4 * part, 4 * part + 4, per):
        q = _load(builder, _at(builder, blk, 32 * (16 * h + 8 * (s % 2) + c)), _vec(I8, 32 * per))
        hb = _load(builder, _at(builder, blk, 1024 + 32 * (8 * h + c)), _vec(I8, 32 * per))
        out.append((_q6k_weights(builder, q, q, hb)[s], 128 * h + 32 * s + 4 * c))
    return out


I16_LIMIT = {Q4_K: i16_limit(15), Q5_K: i16_limit(31), Q6_K: i16_limit(63)}  # (simd.dots_accumulate)
GROUP_FORMATS = {"q4_k": (Q4_K, 8 * 144), "q5_k": (Q5_K, 8 * 176), "q6_k": (Q6_K, 8 * 210)}


def _fold(builder, v):
    """A <16 x i32> of two chunks' sums (the 8 rows twice) -> <8 x i32>, each row's two added."""
    if v.type.count == 8:
        return v
    half = lambda at: builder.shuffle_vector(v, v, ir.Constant(_vec(I32, 8), list(range(at, at + 8))))  # noqa: E731
    return builder.add(half(0), half(8))


def _group_k(fmt: str, tokens: int, lanes: int = 8):
    """An intrinsic dotting rows 8g..8g+7 of a K-quant matrix repacked by repack_k8 with int8
    activations: one token's (tokens=1: xq (n,) ...) or TOKENS tokens' from t0 on (xq (T, n) ...),
    each super-block's weights unpacked once for all of them. Returns a tuple of 8 float32 per
    token, token by token. Per super-block and token: the 8 rows' integer sums in 8 lanes, each
    sub-block's times its scale in integers (on avx2 in the vpmaddwd that widens them), the
    minimums' m_j Σq_x (Q6_K: its offsets of 32) likewise; then one float step per super-block
    (super_block_total). Why: float work per sub-block was about 90 of the Q4_K loop's 527
    instructions a super-block (avx2), and from DRAM a kernel runs slower the more it computes per
    byte (the same bytes with twice the arithmetic read markedly slower).
    lanes 16 (simd.WIDE): each 512-bit vector holds two neighbouring chunks (the 8 rows, then the
    8 rows 4 weights further on), one vpdpbusd for 8 weights of 8 rows, the halves added in
    integers per super-block. The integer sums are exact and the float steps _EXACT: tiles.py's
    prefill repeats them, so a token gets the same bits alone, among many, or on either width."""
    code, gsize = GROUP_FORMATS[fmt]
    per = lanes // 8  # chunks per vector
    vi, vi8, vf = _vec(I32, lanes), _vec(I32, 8), _vec(F32, 8)
    twice = ir.Constant(vi, [i % 8 for i in range(lanes)])  # the 8 rows' values in every 8 lanes

    def typer(w, g, xq, xd, xs, xi, *t0):
        def codegen(context, builder, sig, args):
            nb, per_token = _token_pointers(context, builder, sig, args, tokens)
            g = args[1]
            base = _byte_ptr(context, builder, sig.args[0], args[0], builder.mul(g, ir.Constant(g.type, 8)), _ZERO)
            accs = [cgutils.alloca_once_value(builder, ir.Constant(vf, None)) for _ in range(tokens)]
            with cgutils.for_range(builder, builder.sdiv(nb, ir.Constant(nb.type, 8))) as loop:
                sb = loop.index
                blk = builder.gep(base, [builder.mul(sb, ir.Constant(sb.type, gsize))])
                prefetch(builder, blk, gsize)  # (simd.PREFETCH_AHEAD)
                b0 = builder.mul(sb, ir.Constant(sb.type, 8))  # first activation block of the super-block
                x0 = builder.mul(sb, ir.Constant(sb.type, 256))
                xps = [(builder.gep(qp, [x0]), builder.gep(dp, [b0]), builder.gep(ip, [b0])) for qp, dp, _, ip in per_token]
                sps = [builder.gep(sp, [b0]) for _, _, sp, _ in per_token]
                isums = [ir.Constant(vi, None)] * tokens  # Σ_j sc_j · (integer sums of sub-block j), per row
                msums = [ir.Constant(vi8, None)] * tokens  # Σ_j m_j · Σq_x (Q4_K, Q5_K); Q6_K: its offsets of 32

                def dot(parts, qp, acc, scale):
                    pairs = [(u, _broadcast_word(builder, qp, at, lanes)) for u, at in parts]
                    return dots_accumulate(builder, acc, pairs, I16_LIMIT[code],
                                           builder.shuffle_vector(scale, scale, twice))

                if code == Q6_K:  # per activation block j: the 8 rows' Σ (q - 32) x of its two
                    if tokens == 1:  # sub-blocks times their int8 scales, summed in integers
                        firsts = [_first_sums(builder, xps[0][0], lanes)]
                    else:  # a few tokens: first_sums put them in xs's place, once per token
                        firsts = [[builder.fptosi(builder.load(_at(builder, p, j)), I32) for j in range(8)] for p in sps]
                    for h in range(2):
                        for s in range(4):
                            j = 4 * h + s
                            scs, block = [], [ir.Constant(vi, None)] * tokens
                            for part in range(2):
                                parts = _q6k_parts(builder, blk, h, s, part, per)
                                sc8 = _load(builder, _at(builder, blk, 1536 + 8 * (2 * j + part)), _vec(I8, 8))
                                scs.append(builder.sext(sc8, vi8))
                                for k, (qp, _, _) in enumerate(xps):
                                    block[k] = dot(parts, qp, block[k], sc8)
                            for k, (_, _, ip) in enumerate(xps):
                                isums[k] = builder.add(isums[k], block[k])
                                first = firsts[k][j]  # the offset of 32: - 32 Σx of each sub-block · its scale
                                second = builder.sub(builder.load(_at(builder, ip, j)), first)
                                for sc, sx in zip(scs, (first, second)):
                                    offset = builder.mul(sc, _splat(builder, builder.mul(sx, ir.Constant(I32, -32))))
                                    msums[k] = builder.add(msums[k], offset)
                    d8 = builder.fpext(_load(builder, _at(builder, blk, 1664), _vec(ir.HalfType(), 8)), vf)
                    dmin8 = None
                else:
                    scales, ms = _k_scales8(builder, blk, 32)
                    qh_at, qs_at = (128, 384) if code == Q5_K else (None, 128)
                    for q in range(4):
                        for j, parts in zip((2 * q, 2 * q + 1), _q45k_parts(builder, blk, qs_at, qh_at, q, per)):
                            m = builder.zext(ms[j], vi8)
                            for k, (qp, _, ip) in enumerate(xps):
                                isums[k] = dot(parts, qp, isums[k], scales[j])
                                msums[k] = builder.add(msums[k], builder.mul(m, _splat(builder, builder.load(_at(builder, ip, j)))))
                    d8 = builder.fpext(_load(builder, blk, _vec(ir.HalfType(), 8)), vf)
                    dmin8 = builder.fpext(_load(builder, _at(builder, blk, 16), _vec(ir.HalfType(), 8)), vf)
                for k, (_, dp, _) in enumerate(xps):  # the super-block's one d_x (xd repeats it per 32)
                    isum = _fold(builder, isums[k])
                    if dmin8 is None:  # Q6_K: its offsets are integers of the same sum
                        isum = builder.add(isum, msums[k])
                    total = super_block_total(builder, d8, dmin8, builder.load(dp), isum, msums[k])
                    builder.store(builder.fadd(builder.load(accs[k]), total, flags=_EXACT), accs[k])
            values = []
            for acc in accs:
                v = builder.load(acc)
                values += [builder.extract_element(v, ir.Constant(I32, i)) for i in range(8)]
            return context.make_tuple(builder, sig.return_type, values)
        return types.UniTuple(types.float32, 8 * tokens)(w, types.intp, xq, xd, xs, xi, *t0), codegen

    return group_intrinsic(typer, tokens)


LANES = 16 if WIDE else 8  # the K-quant group kernels' vector width (32-bit lanes)
_group_q4_k, _group_q5_k, _group_q6_k = (_group_k(f, 1, LANES) for f in ("q4_k", "q5_k", "q6_k"))
# a few tokens at a time (a batch of rows; a long prompt takes tiles.py: each group unpacked once)
_tokens_q4_k, _tokens_q5_k, _tokens_q6_k = (_group_k(f, TOKENS, LANES) for f in ("q4_k", "q5_k", "q6_k"))


def _row_k(code: int):
    """An intrinsic dotting one stored row of a K-quant matrix (rows as in the file) with one
    token's int8 activations: per 32 weights a <32 x i8> of unsigned weights times the 32
    activations (8 lanes of 4 products), scaled into a float vector; one horizontal sum a row."""
    size = BLOCK[code]

    @intrinsic
    def row_dot(typingctx, w, r, xq, xd, xs, xi):
        def codegen(context, builder, sig, args):
            nb, qp, dp, _, ip = _activations(context, builder, sig, args, 1)
            row = _byte_ptr(context, builder, sig.args[0], args[0], args[1], _ZERO)
            vf = _vec(F32, 8)
            acc = cgutils.alloca_once_value(builder, ir.Constant(vf, None))
            extra = cgutils.alloca_once_value(builder, ir.Constant(F32, 0.0))
            with cgutils.for_range(builder, builder.sdiv(nb, ir.Constant(nb.type, 8))) as loop:
                sb = loop.index
                blk = builder.gep(row, [builder.mul(sb, ir.Constant(sb.type, size))])
                b0 = builder.mul(sb, ir.Constant(sb.type, 8))
                xq0 = builder.gep(qp, [builder.mul(sb, ir.Constant(sb.type, 256))])
                dx = [builder.load(builder.gep(dp, [builder.add(b0, ir.Constant(b0.type, j))])) for j in range(8)]
                v = builder.load(acc)
                if code == Q6_K:
                    d = builder.fpext(_load(builder, _at(builder, blk, 208), ir.HalfType()), F32)
                    for h in range(2):
                        a = _load(builder, _at(builder, blk, 64 * h), _vec(I8, 32))
                        b = _load(builder, _at(builder, blk, 64 * h + 32), _vec(I8, 32))
                        hb = _load(builder, _at(builder, blk, 128 + 32 * h), _vec(I8, 32))
                        ws = _q6k_weights(builder, a, b, hb)
                        for s in range(4):
                            j = 4 * h + s  # activation block; sub-blocks 2j, 2j+1 in lanes 0-3, 4-7
                            x = _load(builder, _at(builder, xq0, 32 * j), _vec(I8, 32))
                            dots = _dot_accumulate(builder, ir.Constant(_vec(I32, 8), None), ws[s], x)
                            dots = builder.sub(dots, _dot_accumulate(builder, ir.Constant(_vec(I32, 8), None),
                                                                     _c8(32), x))
                            sc = [builder.sitofp(_load(builder, _at(builder, blk, 192 + 2 * j + p), I8), F32)
                                  for p in range(2)]
                            f = builder.fmul(d, dx[j], flags=_FAST)
                            lanes = ir.Constant(vf, None)
                            for i in range(8):
                                lanes = builder.insert_element(lanes, builder.fmul(f, sc[i // 4], flags=_FAST),
                                                               ir.Constant(I32, i))
                            v = builder.fadd(v, builder.fmul(builder.sitofp(dots, vf), lanes, flags=_FAST), flags=_FAST)
                else:
                    d = builder.fpext(_load(builder, blk, ir.HalfType()), F32)
                    dmin = builder.fpext(_load(builder, _at(builder, blk, 2), ir.HalfType()), F32)
                    s = [builder.zext(_load(builder, _at(builder, blk, 4 + k), I8), I32) for k in range(12)]
                    c = lambda n: ir.Constant(I32, n)  # noqa: E731
                    qs_at = 48 if code == Q5_K else 16
                    hb = _load(builder, _at(builder, blk, 16), _vec(I8, 32)) if code == Q5_K else None
                    e = builder.load(extra)
                    for j in range(8):
                        if j < 4:
                            sc, mn = builder.and_(s[j], c(63)), builder.and_(s[j + 4], c(63))
                        else:
                            top = lambda t: builder.shl(builder.lshr(t, c(6)), c(4))  # noqa: E731
                            sc = builder.or_(builder.and_(s[j + 4], c(15)), top(s[j - 4]))
                            mn = builder.or_(builder.lshr(s[j + 4], c(4)), top(s[j]))
                        qv = _load(builder, _at(builder, blk, qs_at + 32 * (j // 2)), _vec(I8, 32))
                        u = builder.and_(qv, _c8(15)) if j % 2 == 0 else builder.lshr(qv, _c8(4))
                        if hb is not None:
                            u = builder.or_(u, _fifth_bit(builder, hb, j))
                        x = _load(builder, _at(builder, xq0, 32 * j), _vec(I8, 32))
                        dots = _dot_accumulate(builder, ir.Constant(_vec(I32, 8), None), u, x)
                        f = builder.fmul(builder.fmul(d, builder.sitofp(sc, F32), flags=_FAST), dx[j], flags=_FAST)
                        v = builder.fadd(v, builder.fmul(builder.sitofp(dots, vf), _splat(builder, f), flags=_FAST),
                                         flags=_FAST)
                        qsum = builder.sitofp(builder.load(builder.gep(ip, [builder.add(b0, ir.Constant(b0.type, j))])),
                                              F32)
                        m = builder.fmul(builder.fmul(dmin, builder.sitofp(mn, F32), flags=_FAST),
                                         builder.fmul(dx[j], qsum, flags=_FAST), flags=_FAST)
                        e = builder.fadd(e, m, flags=_FAST)
                    builder.store(e, extra)
                builder.store(v, acc)
            v = builder.load(acc)
            total = builder.fsub(ir.Constant(F32, 0.0), builder.load(extra), flags=_FAST)
            for i in range(8):
                total = builder.fadd(total, builder.extract_element(v, ir.Constant(I32, i)), flags=_FAST)
            return total
        return types.float32(w, types.intp, xq, xd, xs, xi), codegen
    return row_dot


_row_q4_k, _row_q5_k, _row_q6_k = (_row_k(c) for c in (Q4_K, Q5_K, Q6_K))


def _row_low_k(code: int):
    """An intrinsic dotting one stored row of a Q2_K or Q3_K matrix with one token's int8
    activations. Per activation block j (32 weights: sub-blocks 2j, 2j+1 of 16, in lanes 0-3 and
    4-7 of the <8 x i32> byte dot product) the weights are 2-bit (Q2_K: q; Q3_K: q + 4h - 4 with
    the high bit h from hmask, taken as q | h << 2 and - 4·Σx) and each half's integer sum is
    multiplied by its sub-block scale in integers; Q2_K's minimum is dmin·m·d_x·Σx per half (the
    4-sums of x from a dot with ones). Layouts (engine.quant): Q2_K scales[16] (scale | min << 4) |
    qs[64] | d | dmin, 84 bytes; Q3_K hmask[32] | qs[64] | scales[12] (six bits, - 32) | d, 110
    bytes; weight 32j + i is bits 2(j % 4) of qs[32(j / 4) + i]."""
    size, qs_at = (84, 16) if code == Q2_K else (110, 32)
    vi = _vec(I32, 8)
    halves = ir.Constant(_vec(ir.IntType(1), 8), [1] * 4 + [0] * 4)

    @intrinsic
    def row_dot(typingctx, w, r, xq, xd, xs, xi):
        def codegen(context, builder, sig, args):
            nb, qp, dp, _, _ = _activations(context, builder, sig, args, 1)
            row = _byte_ptr(context, builder, sig.args[0], args[0], args[1], _ZERO)
            vf = _vec(F32, 8)
            acc = cgutils.alloca_once_value(builder, ir.Constant(vf, None))
            c = lambda n: ir.Constant(I32, n)  # noqa: E731
            byte = lambda blk, k: builder.zext(_load(builder, _at(builder, blk, k), I8), I32)  # noqa: E731
            pair = lambda a, b: builder.select(halves, _splat(builder, a), _splat(builder, b))  # noqa: E731
            with cgutils.for_range(builder, builder.sdiv(nb, ir.Constant(nb.type, 8))) as loop:
                sb = loop.index
                blk = builder.gep(row, [builder.mul(sb, ir.Constant(sb.type, size))])
                b0 = builder.mul(sb, ir.Constant(sb.type, 8))
                xq0 = builder.gep(qp, [builder.mul(sb, ir.Constant(sb.type, 256))])
                hm = _load(builder, blk, _vec(I8, 32)) if code == Q3_K else None
                sums = ir.Constant(vf, None)  # Σ_j d_x · (scaled integer sums): the d terms
                mins = ir.Constant(vf, None)  # Q2_K: Σ_j d_x · m · Σx: the dmin terms
                for j in range(8):
                    v = _load(builder, _at(builder, blk, qs_at + 32 * (j // 4)), _vec(I8, 32))
                    u = builder.and_(builder.lshr(v, _c8(2 * (j % 4))), _c8(3)) if j % 4 else builder.and_(v, _c8(3))
                    x = _load(builder, _at(builder, xq0, 32 * j), _vec(I8, 32))
                    ones = _dot_accumulate(builder, ir.Constant(vi, None), _c8(1), x)  # 4-sums of x
                    dx = _splat(builder, builder.load(builder.gep(dp, [builder.add(b0, ir.Constant(b0.type, j))])))
                    if code == Q3_K:
                        u = builder.or_(u, builder.shl(builder.and_(builder.lshr(hm, _c8(j)), _c8(1)), _c8(2)))
                    dots = _dot_accumulate(builder, ir.Constant(vi, None), u, x)
                    if code == Q2_K:
                        s0, s1 = byte(blk, 2 * j), byte(blk, 2 * j + 1)
                        sc = pair(builder.and_(s0, c(15)), builder.and_(s1, c(15)))
                        mn = pair(builder.lshr(s0, c(4)), builder.lshr(s1, c(4)))
                        mins = builder.fadd(mins, builder.fmul(builder.sitofp(builder.mul(ones, mn), vf), dx, flags=_FAST),
                                            flags=_FAST)
                    else:
                        scs = []
                        for k in (2 * j, 2 * j + 1):
                            lo = builder.and_(builder.lshr(byte(blk, 96 + k % 8), c(4 * (k // 8))), c(15))
                            hi = builder.and_(builder.lshr(byte(blk, 104 + k % 4), c(2 * (k // 4))), c(3))
                            scs.append(builder.sub(builder.or_(lo, builder.shl(hi, c(4))), c(32)))
                        sc = pair(*scs)
                        dots = builder.sub(dots, builder.shl(ones, _splat(builder, c(2))))  # - 4 Σx
                    sums = builder.fadd(sums, builder.fmul(builder.sitofp(builder.mul(dots, sc), vf), dx, flags=_FAST),
                                        flags=_FAST)
                d_at = 80 if code == Q2_K else 108
                d = _splat(builder, builder.fpext(_load(builder, _at(builder, blk, d_at), ir.HalfType()), F32))
                total = builder.fmul(d, sums, flags=_FAST)
                if code == Q2_K:
                    dmin = _splat(builder, builder.fpext(_load(builder, _at(builder, blk, 82), ir.HalfType()), F32))
                    total = builder.fsub(total, builder.fmul(dmin, mins, flags=_FAST), flags=_FAST)
                builder.store(builder.fadd(builder.load(acc), total, flags=_FAST), acc)
            v = builder.load(acc)
            out = builder.extract_element(v, ir.Constant(I32, 0))
            for i in range(1, 8):
                out = builder.fadd(out, builder.extract_element(v, ir.Constant(I32, i)), flags=_FAST)
            return out
        return types.float32(w, types.intp, xq, xd, xs, xi), codegen
    return row_dot


_row_q2_k, _row_q3_k = _row_low_k(Q2_K), _row_low_k(Q3_K)


# --- what matmul.py calls: one compiled copy each, however many kernels call it --------------------

@njit(fastmath=True, cache=True, nogil=True)
def first_sums(xq, xs):
    """xs (T, n/32) = Σ of the first 16 int8 activations of each 32-block of xq (T, n), as float32
    (exact: at most 2032 in size). The Q6_K few-token kernel reads them in place of the scaled sums
    (which Q6_K never uses) for the offset of 32 of its first sub-block; the second's is the block
    sum minus it. Once per token instead of once per 8-row group and token (llama.cpp's Q8_K
    keeps per-16 sums, bsums, for the same reason)."""
    T, nb = xs.shape
    for t in range(T):
        for b in range(nb):
            total = 0
            for i in range(16):
                total += xq[t, 32 * b + i]
            xs[t, b] = np.float32(total)
