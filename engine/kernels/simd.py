"""Integer dot products of a weight row with int8 activations, written as LLVM vector code
(numba intrinsics).

Numba widens every small-integer product to int64, so plain loops over int8 never reach the
CPU's byte dot-product instructions. These intrinsics emit the vector IR directly, in the way
llama.cpp's hand-written kernels do: per block, 32 weights (nibbles split into bytes, or int8)
times 32 int8 activations summed in int32 lanes, then scaled into a float vector accumulator.

Which instructions, chosen once per process from the CPU numba compiles for (the `simd` setting
and NUMBA_CPU_FEATURES count):
  vnni    — vpdpbusd (AVX512-VNNI with AVX512-VL, or AVX-VNNI): unsigned × signed bytes, 4 per lane
  avx2    — vpmaddubsw then vpmaddwd (AVX2; several vpmaddubsw added in int16 first where the weights'
            bits allow: dots_accumulate)
  generic — widen to int16, multiply, add pairs: any LLVM target (NEON on ARM, SSE elsewhere)

Layout: `w` is a uint8 matrix (rows, row_bytes) of blocks (engine.quant), row r at
r * w.strides[0]; `xq` holds a token's int8 activations, `xd` their per-block scales, `xs` the
scale times the block's sum and `xi` the integer block sum (cpu.quantize_activations).
"""
from __future__ import annotations

import os

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

import engine.kernels.ready  # noqa: F401  (engine.kernels.setup() first: fails otherwise)

I8, I16, I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
_ZERO = ir.Constant(ir.IntType(64), 0)


def _vec(t: ir.Type, n: int) -> ir.VectorType:
    return ir.VectorType(t, n)


def _features() -> dict[str, bool]:
    """The features numba compiles for: the host's, with NUMBA_CPU_FEATURES (if set) in their place."""
    if os.environ.get("NUMBA_CPU_FEATURES"):
        return {f[1:]: f[0] == "+" for f in os.environ["NUMBA_CPU_FEATURES"].split(",") if f[:1] in "+-"}
    return dict(llvm.get_host_cpu_features())


def _mode(feats: dict[str, bool]) -> str:
    if os.environ.get("COLIBRI_DOT", "") in ("vnni", "avx2", "generic"):  # for tests and benchmarks
        return os.environ["COLIBRI_DOT"]
    if (feats.get("avx512vnni") and feats.get("avx512vl")) or feats.get("avxvnni"):
        return "vnni"
    return "avx2" if feats.get("avx2") else "generic"


DOT = _mode(_features())  # the instruction path of this process
# vnni with AVX-512 (512-bit vectors, 16 int32 lanes): kernels with a wide form use it (tiles.py: 16-row tiles)
WIDE = DOT == "vnni" and all(_features().get(f) for f in ("avx512f", "avx512bw", "avx512vnni")) and \
    _features().get("evex512", True)


def _byte_ptr(context, builder, aryty, ary, row, off):
    """Address of byte `off` of row `row` (row 0 for 1-D arrays)."""
    a = context.make_array(aryty)(context, builder, ary)
    data = builder.bitcast(a.data, I8.as_pointer())
    strides = cgutils.unpack_tuple(builder, a.strides, aryty.ndim)
    start = builder.add(builder.mul(row, strides[0]), off) if aryty.ndim > 1 else off
    return builder.gep(data, [start])


def _load(builder, ptr, ty):
    return builder.load(builder.bitcast(ptr, ty.as_pointer()), align=1)


def _dot_u8s8(builder, u, s):
    """<32 x i8> unsigned u · <32 x i8> signed s -> <8 x i32> sums of 4 neighbouring products."""
    mod = builder.module
    if DOT == "vnni":
        fn = cgutils.get_or_insert_function(mod, ir.FunctionType(_vec(I32, 8), [_vec(I32, 8)] * 3),
                                            "llvm.x86.avx512.vpdpbusd.256")
        return builder.call(fn, [ir.Constant(_vec(I32, 8), None), builder.bitcast(u, _vec(I32, 8)),
                                 builder.bitcast(s, _vec(I32, 8))])
    if DOT == "avx2":  # pair sums saturate at int16: callers' bytes keep them within 2 · 128 · 127
        f1 = cgutils.get_or_insert_function(mod, ir.FunctionType(_vec(I16, 16), [_vec(I8, 32)] * 2),
                                            "llvm.x86.avx2.pmadd.ub.sw")
        f2 = cgutils.get_or_insert_function(mod, ir.FunctionType(_vec(I32, 8), [_vec(I16, 16)] * 2),
                                            "llvm.x86.avx2.pmadd.wd")
        return builder.call(f2, [builder.call(f1, [u, s]), ir.Constant(_vec(I16, 16), [1] * 16)])
    m = builder.mul(builder.zext(u, _vec(I16, 32)), builder.sext(s, _vec(I16, 32)))
    for n in (16, 8):
        even = builder.shuffle_vector(m, m, ir.Constant(_vec(I32, n), list(range(0, 2 * n, 2))))
        odd = builder.shuffle_vector(m, m, ir.Constant(_vec(I32, n), list(range(1, 2 * n, 2))))
        if n == 16:
            even, odd = builder.sext(even, _vec(I32, 16)), builder.sext(odd, _vec(I32, 16))
        m = builder.add(even, odd)
    return m


def _weights(builder, quants, nibbles: bool):
    """A block's 32 weights at `quants` as unsigned bytes for the dot product, and for int8
    weights (q8_0) their signs (None for nibbles, which are unsigned already)."""
    if nibbles:  # low nibbles are weights 0-15, high nibbles 16-31 (Q4_0/Q4_1 order)
        v = _load(builder, quants, _vec(I8, 16))
        lo = builder.and_(v, ir.Constant(_vec(I8, 16), [15] * 16))
        hi = builder.lshr(v, ir.Constant(_vec(I8, 16), [4] * 16))
        return builder.shuffle_vector(lo, hi, ir.Constant(_vec(I32, 32), list(range(32)))), None
    return _weights_of(builder, _load(builder, quants, _vec(I8, 32)))


def _weights_of(builder, wv):
    """Loaded int8 weights (<32 x i8>) as |w| (unsigned bytes for the dot product) and w < 0."""
    absf = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_vec(I8, 32), [_vec(I8, 32), ir.IntType(1)]),
                                          "llvm.abs.v32i8")
    return builder.call(absf, [wv, ir.Constant(ir.IntType(1), 0)]), builder.icmp_signed("<", wv, ir.Constant(_vec(I8, 32), None))


def _block_dot(builder, u, negative, s):
    """<8 x i32> partial sums of a block's weights (from _weights) · activations s <32 x i8>.
    Signed × signed goes through the unsigned × signed instructions as |w| · (s with w's sign),
    as llama.cpp does; s stays within ±127, so negating it never overflows."""
    if negative is not None:
        s = builder.select(negative, builder.sub(ir.Constant(_vec(I8, 32), None), s), s)
    return _dot_u8s8(builder, u, s)


# How far ahead of the weight bytes a group kernel is reading it asks for later ones (prefetcht0).
# Why: a decode step reads each matrix once, in stripes of 8 or 16 rows a task, and the hardware
# prefetcher loses every stripe's first lines and lags behind a stream read slowly (several tokens'
# products a block). Matrices not in cache were read a third faster or more with it, best from
# 16 to 32 KB ahead, one token or several alike. (An instruction of every x86 vector path: AVX2
# machines take it as well.)
PREFETCH_AHEAD = 16384


def prefetch(builder, ptr, nbytes: int, ahead=None):
    """Ask for the nbytes at ptr + ahead (an int64 value; PREFETCH_AHEAD when None) to be loaded
    into the caches: one prefetcht0 a cache line. A prefetch never faults, so an address past the
    matrix's end costs nothing but the instruction."""
    i64 = ir.IntType(64)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [I8.as_pointer(), I32, I32, I32]),
                                        "llvm.prefetch.p0")
    at = builder.gep(builder.bitcast(ptr, I8.as_pointer()), [ahead if ahead is not None else ir.Constant(i64, PREFETCH_AHEAD)])
    for off in range(0, nbytes, 64):  # (rw 0: read; locality 3: every cache level; 1: data)
        builder.call(fn, [builder.gep(at, [ir.Constant(i64, off)]), ir.Constant(I32, 0), ir.Constant(I32, 3),
                          ir.Constant(I32, 1)])


def _splat(builder, v, lanes: int = 8):
    """A scalar (float, or int32) in all `lanes` lanes of a vector."""
    vt = _vec(v.type, lanes)
    return builder.shuffle_vector(builder.insert_element(ir.Constant(vt, None), v, ir.Constant(I32, 0)),
                                  ir.Constant(vt, None), ir.Constant(_vec(I32, lanes), [0] * lanes))


def _activations(context, builder, sig, args, dims: int):
    """Pointers to a call's activations xq, xd, xs, xi (arguments 2-5) and the block count."""
    _, _, qty, dty, sty, ity = sig.args[:6]
    nb = cgutils.unpack_tuple(builder, context.make_array(dty)(context, builder, args[3]).shape, dims)[-1]
    return (nb, _data_ptr(context, builder, qty, args[2], I8), _data_ptr(context, builder, dty, args[3], F32),
            _data_ptr(context, builder, sty, args[4], F32), _data_ptr(context, builder, ity, args[5], I32))


def _token_pointers(context, builder, sig, args, tokens: int):
    """The block count and per token its pointers (xq, xd, xs, xi): one token's (n,) activations
    (tokens=1), or rows t0..t0+tokens-1 (t0: argument 6) of (T, n) ones."""
    nb, *ptrs = _activations(context, builder, sig, args, 1 if tokens == 1 else 2)
    if tokens == 1:
        return nb, [tuple(ptrs)]
    per_token = []
    for k in range(tokens):
        t = builder.add(args[6], ir.Constant(args[6].type, k))
        per_token.append(tuple(builder.bitcast(_byte_ptr(context, builder, ty, a, t, _ZERO), elem.as_pointer())
                               for ty, a, elem in zip(sig.args[2:6], args[2:6], (I8, F32, F32, I32))))
    return nb, per_token


@intrinsic
def round_f16(typingctx, v):
    """v rounded to the nearest IEEE half (as llama.cpp stores a block's scale), back as float32."""
    def codegen(context, builder, sig, args):
        return builder.fpext(builder.fptrunc(args[0], ir.HalfType()), ir.FloatType())
    return types.float32(types.float32), codegen


@intrinsic
def half_bits(typingctx, v):
    """v rounded to the nearest IEEE half (numpy's astype(float16)), as its 16 bits: in a loop LLVM
    makes it vcvtps2ph where the CPU has F16C (numpy converts one value at a time)."""
    def codegen(context, builder, sig, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))
    return types.uint16(types.float32), codegen


F32 = ir.FloatType()
_FAST = ("fast",)
# Float steps two kernels must round alike (a token's 8-row group alone, or among many: tiles.py):
# flagged, so numba's fastmath pass leaves them; LLVM may fuse a multiply into the add, not reorder.
_EXACT = ("contract",)


def _lane0(builder, v):
    return builder.extract_element(v, ir.Constant(I32, 0))


def _widest(builder, v, ty):
    """An integer argument as `ty` (a pointer-sized index)."""
    if v.type.width < ty.width:
        return builder.sext(v, ty)
    return builder.trunc(v, ty) if v.type.width > ty.width else v


# format -> (block bytes, offset of the quants, has a minimum (q4_1), nibbles (q4) or bytes (q8))
_ROW_FORMATS = {"q4_0": (18, 2, False, True), "q4_1": (20, 4, True, True), "q8_0": (34, 2, False, False)}


def _data_ptr(context, builder, aryty, ary, elem: ir.Type):
    return builder.bitcast(context.make_array(aryty)(context, builder, ary).data, elem.as_pointer())


def _row_dot(fmt: str):
    """An intrinsic dotting one row of a `fmt` matrix with quantized activations, in vectors:
    per block, the byte dot product (<8 x i32>) is converted and accumulated into <8 x float>
    scaled by d_w·d_x; the horizontal sum happens once per row, not once per block. Even and
    odd blocks feed two accumulators, so consecutive blocks do not wait on each other's
    multiply-add (its latency, not the arithmetic, limited a single chain)."""
    size, qoff, has_min, nibbles = _ROW_FORMATS[fmt]

    @intrinsic
    def row_dot(typingctx, w, r, xq, xd, xs, xi):
        def codegen(context, builder, sig, args):
            nb, qp, dp, sp, ip = _activations(context, builder, sig, args, 1)
            row = _byte_ptr(context, builder, sig.args[0], args[0], args[1], _ZERO)
            vf = _vec(F32, 8)
            accs = [cgutils.alloca_once_value(builder, ir.Constant(vf, None)) for _ in range(2)]
            extras = [cgutils.alloca_once_value(builder, ir.Constant(F32, 0.0)) for _ in range(2)]

            def block(b, acc, extra):
                blk = builder.gep(row, [builder.mul(b, ir.Constant(b.type, size))])
                scale = builder.fmul(builder.fpext(_load(builder, blk, ir.HalfType()), F32),
                                     builder.load(builder.gep(dp, [b])), flags=_EXACT)
                s = _load(builder, builder.gep(qp, [builder.mul(b, ir.Constant(b.type, 32))]), _vec(I8, 32))
                u, negative = _weights(builder, builder.gep(blk, [ir.Constant(b.type, qoff)]), nibbles)
                dot = _block_dot(builder, u, negative, s)
                term = builder.fmul(builder.sitofp(dot, vf), _splat(builder, scale), flags=_EXACT)
                builder.store(builder.fadd(builder.load(acc), term, flags=_EXACT), acc)
                if has_min:  # + m_w · d_x Σ q_x
                    m = builder.fpext(_load(builder, builder.gep(blk, [ir.Constant(b.type, 2)]), ir.HalfType()), F32)
                    e = builder.fmul(m, builder.load(builder.gep(sp, [b])), flags=_EXACT)
                    builder.store(builder.fadd(builder.load(extra), e, flags=_EXACT), extra)
                elif nibbles:  # q4_0's offset: - 8 · d_w d_x Σ q_x
                    qsum = builder.sitofp(builder.load(builder.gep(ip, [b])), F32)
                    e = builder.fmul(builder.fmul(scale, qsum, flags=_EXACT), ir.Constant(F32, -8.0), flags=_EXACT)
                    builder.store(builder.fadd(builder.load(extra), e, flags=_EXACT), extra)

            one, two = ir.Constant(nb.type, 1), ir.Constant(nb.type, 2)
            with cgutils.for_range(builder, builder.sdiv(nb, two)) as loop:
                b = builder.mul(loop.index, two)
                block(b, accs[0], extras[0])
                block(builder.add(b, one), accs[1], extras[1])
            with builder.if_then(builder.icmp_signed("!=", builder.srem(nb, two), ir.Constant(nb.type, 0))):
                block(builder.sub(nb, one), accs[0], extras[0])
            v = builder.fadd(builder.load(accs[0]), builder.load(accs[1]), flags=_EXACT)
            total = builder.fadd(builder.load(extras[0]), builder.load(extras[1]), flags=_EXACT)
            for i in range(8):
                total = builder.fadd(total, builder.extract_element(v, ir.Constant(I32, i)), flags=_EXACT)
            return total
        return types.float32(w, types.intp, xq, xd, xs, xi), codegen
    return row_dot


row_dot_q4_0, row_dot_q4_1, row_dot_q8_0 = (_row_dot(f) for f in ("q4_0", "q4_1", "q8_0"))


# format -> (block bytes, halves at its head (d; d and m for q4_1), quant bytes, nibbles)
GROUP_FORMATS = {"q4_0": (18, 1, 16, True), "q4_1": (20, 2, 16, True), "q8_0": (34, 1, 32, False)}


def group_bytes(fmt: str) -> int:
    """Bytes of one block of an 8-row group: the 8 rows' head halves, then their quants."""
    _, halves, qbytes, _ = GROUP_FORMATS[fmt]
    return 16 * halves + 8 * qbytes


def _dot_accumulate(builder, acc, u, s):
    """acc (<8 x i32>) plus, per lane, the sum of 4 neighbouring products of unsigned bytes u and
    signed bytes s (<32 x i8>): one vpdpbusd where there is VNNI."""
    lanes = acc.type.count  # 8, or 16 (WIDE: <64 x i8> bytes, vpdpbusd on 512 bits)
    if DOT == "vnni":
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_vec(I32, lanes), [_vec(I32, lanes)] * 3),
                                            f"llvm.x86.avx512.vpdpbusd.{32 * lanes}")
        return builder.call(fn, [acc, builder.bitcast(u, _vec(I32, lanes)), builder.bitcast(s, _vec(I32, lanes))])
    return builder.add(acc, _dot_u8s8(builder, u, s))


def dots_accumulate(builder, acc, pairs, limit: int, scale=None):
    """acc + (Σ over (u, s) pairs of their lane sums, as _dot_accumulate's) · scale, per lane: scale
    a <lanes x i8> (1 when None). On avx2, up to `limit` byte products (vpmaddubsw) are added in
    int16 before the one vpmaddwd that widens them to int32 and multiplies them by the scale: half
    the multiplies, and no int32 multiply. The caller bounds its weights so that
    limit · 2 · max(u) · 127 stays within int16 (i16_limit): the sums are exact, the same integers
    as one vpmaddwd a product: faster on matrices in cache (from DRAM within the noise, though a
    kernel's DRAM rate does fall with its compute per byte: kquants._group_k)."""
    lanes = acc.type.count
    if DOT != "avx2" or limit < 2 or lanes != 8:
        dots = acc if scale is None else ir.Constant(acc.type, None)
        for u, s in pairs:
            dots = _dot_accumulate(builder, dots, u, s)
        return dots if scale is None else builder.add(acc, builder.mul(dots, builder.sext(scale, acc.type)))
    mod, v16 = builder.module, _vec(I16, 16)
    f1 = cgutils.get_or_insert_function(mod, ir.FunctionType(v16, [_vec(I8, 32)] * 2), "llvm.x86.avx2.pmadd.ub.sw")
    f2 = cgutils.get_or_insert_function(mod, ir.FunctionType(_vec(I32, 8), [v16] * 2), "llvm.x86.avx2.pmadd.wd")
    by = ir.Constant(v16, [1] * 16) if scale is None else \
        builder.sext(builder.shuffle_vector(scale, scale, ir.Constant(_vec(I32, 16), [i // 2 for i in range(16)])), v16)
    for at in range(0, len(pairs), limit):  # (a lane's scale in both of its int16 halves)
        total = None
        for u, s in pairs[at:at + limit]:
            p = builder.call(f1, [u, s])
            total = p if total is None else builder.add(total, p)
        acc = builder.add(acc, builder.call(f2, [total, by]))
    return acc


def i16_limit(largest: int) -> int:
    """How many byte products of unsigned weights up to `largest` with activations within ±127
    avx2 may add in int16 (dots_accumulate): each vpmaddubsw lane is at most 2 · largest · 127."""
    return max(1, 32767 // (2 * 127 * largest))


TOKENS = 4  # tokens per call of the prefill row kernels


def _block_dots(builder, x4, b, parts, lanes: int, bias=None, limit: int = 1):
    """One token's integer sums over a block for every lane (a row): each part (unsigned weight
    bytes, which 4 activation bytes, their signs or None) multiplied with those 4 bytes broadcast;
    `bias` (i32) starts every lane (q8_0 on vnni: -128 Σx); `limit`: dots_accumulate's, for
    unsigned weights (i16_limit)."""
    vi = _vec(I32, lanes)
    dots = ir.Constant(vi, None) if bias is None else _splat(builder, bias, lanes)
    pairs = []
    for u, at, negative in parts:
        word = builder.load(builder.gep(x4, [ir.Constant(b.type, at)]), align=1)
        s = builder.bitcast(_splat(builder, word, lanes), _vec(I8, 4 * lanes))
        if negative is not None:
            s = builder.select(negative, builder.sub(ir.Constant(_vec(I8, 4 * lanes), None), s), s)
        pairs.append((u, s))
    return dots_accumulate(builder, dots, pairs, limit)


def _scale_block(builder, dots, d, m, b, token, acc, extra, halves: int, nibbles: bool):
    """acc += dots · d_w · d_x, and extra += m_w · s_x (q4_1) or -8 · d_w · d_x Σ q_x (q4_0): a
    block's float steps for every lane, in one order whatever the lane count (8 or 16), so a row
    rounds alike in every kernel that takes it."""
    _, dp, sp, ip = token
    lanes = d.type.count
    vf = _vec(F32, lanes)
    xscale = builder.load(builder.gep(dp, [b]))
    term = builder.fmul(builder.sitofp(dots, vf), builder.fmul(d, _splat(builder, xscale, lanes), flags=_FAST),
                        flags=_FAST)
    builder.store(builder.fadd(builder.load(acc), term, flags=_FAST), acc)
    if halves == 2:  # q4_1: + m_w · d_x Σ q_x
        e = builder.fmul(m, _splat(builder, builder.load(builder.gep(sp, [b])), lanes), flags=_FAST)
    elif nibbles:  # q4_0: - 8 · d_w d_x Σ q_x
        off = builder.fmul(builder.fmul(xscale, builder.sitofp(builder.load(builder.gep(ip, [b])), F32),
                                        flags=_FAST), ir.Constant(F32, -8.0), flags=_FAST)
        e = builder.fmul(d, _splat(builder, off, lanes), flags=_FAST)
    if nibbles:
        builder.store(builder.fadd(builder.load(extra), e, flags=_FAST), extra)


def _group_dot(fmt: str, tokens: int):
    """An intrinsic dotting rows 8g..8g+7 of a matrix repacked in groups of 8 (cpu.repack_x8)
    with int8 activations: one token's (tokens=1: xq (n,) ...), or TOKENS tokens' from t0 on
    (prefill: xq (T, n) ..., each block unpacked once for all of them). A block's quants are 4
    chunks of 32 bytes, 4 bytes of each row in turn, so one 4-byte lane of a vector is one row:
    its low nibbles times 4 activations broadcast to every lane, then its high nibbles times 4
    more, summed straight into that row's lane (8 vpdpbusd a block, no sums across lanes;
    llama.cpp interleaves its repacked rows for the same reason). Each block's scaling is then
    one vector multiply-add for all 8 rows (their 8 scales are consecutive halves). The integer
    block sums are exact, so this is the row-by-row result bit for bit, and a token's products
    are the same for either `tokens`. Returns a tuple of 8 float32 per token, token by token."""
    _, halves, qbytes, nibbles = GROUP_FORMATS[fmt]
    gsize = group_bytes(fmt)

    def typer(w, g, xq, xd, xs, xi, *t0):
        def codegen(context, builder, sig, args):
            nb, per_token = _token_pointers(context, builder, sig, args, tokens)
            g = args[1]
            base = _byte_ptr(context, builder, sig.args[0], args[0], builder.mul(g, ir.Constant(g.type, 8)), _ZERO)
            vf = _vec(F32, 8)
            accs = [cgutils.alloca_once_value(builder, ir.Constant(vf, None)) for _ in range(tokens)]
            extras = [cgutils.alloca_once_value(builder, ir.Constant(vf, None)) for _ in range(tokens)]
            low, four = ir.Constant(_vec(I8, 32), [15] * 32), ir.Constant(_vec(I8, 32), [4] * 32)
            with cgutils.for_range(builder, nb) as loop:
                b = loop.index
                blk = builder.gep(base, [builder.mul(b, ir.Constant(b.type, gsize))])
                prefetch(builder, blk, gsize)  # (the groups of a task follow each other in memory)
                d8 = builder.fpext(_load(builder, blk, _vec(ir.HalfType(), 8)), vf)
                m8 = builder.fpext(_load(builder, builder.gep(blk, [ir.Constant(b.type, 16)]),
                                         _vec(ir.HalfType(), 8)), vf) if halves == 2 else None
                parts = []  # (unsigned weight bytes, which 4 activations, signs or None): chunk c holds
                for c in range(qbytes // 4):  # weights 4c..4c+3 of each row (q4: low nibbles; high: 16+4c..)
                    v = _load(builder, builder.gep(blk, [ir.Constant(b.type, 16 * halves + 32 * c)]), _vec(I8, 32))
                    if nibbles:
                        parts += [(builder.and_(v, low), c, None), (builder.lshr(v, four), c + 4, None)]
                    elif DOT == "vnni":  # int8 as unsigned w + 128; the accumulator starts at -128 Σx
                        parts.append((builder.xor(v, ir.Constant(_vec(I8, 32), [-128] * 32)), c, None))
                    else:  # |w| times x with w's sign (the pair sums of avx2 stay within int16)
                        magnitude, negative = _weights_of(builder, v)
                        parts.append((magnitude, c, negative))
                for token, acc, extra in zip(per_token, accs, extras):
                    qp, ip = token[0], token[3]
                    x4 = builder.bitcast(builder.gep(qp, [builder.mul(b, ir.Constant(b.type, 32))]), I32.as_pointer())
                    bias = builder.mul(builder.load(builder.gep(ip, [b])), ir.Constant(I32, -128)) \
                        if not nibbles and DOT == "vnni" else None
                    dots = _block_dots(builder, x4, b, parts, 8, bias, i16_limit(15) if nibbles else 1)
                    _scale_block(builder, dots, d8, m8, b, token, acc, extra, halves, nibbles)
            values = []
            for acc, extra in zip(accs, extras):
                total = builder.fadd(builder.load(acc), builder.load(extra), flags=_FAST)
                values += [builder.extract_element(total, ir.Constant(I32, i)) for i in range(8)]
            return context.make_tuple(builder, sig.return_type, values)
        return types.UniTuple(types.float32, 8 * tokens)(w, types.intp, xq, xd, xs, xi, *t0), codegen

    return group_intrinsic(typer, tokens)


def group_intrinsic(typer, tokens: int):
    """The intrinsic over an 8-row group typer: (w, g, xq, xd, xs, xi) for one token (decode), with
    the first token t0 as well for TOKENS tokens (prefill)."""
    if tokens == 1:
        @intrinsic
        def group_dot(typingctx, w, g, xq, xd, xs, xi):
            return typer(w, g, xq, xd, xs, xi)
        return group_dot

    @intrinsic
    def group_dot_tokens(typingctx, w, g, xq, xd, xs, xi, t0):
        return typer(w, g, xq, xd, xs, xi, types.intp)
    return group_dot_tokens


def _pair_tokens(fmt: str, tokens: int = TOKENS):
    """As _group_dot(fmt, TOKENS), for the two groups g and g+1 side by side (WIDE only): each
    512-bit vector holds a chunk of both groups' blocks (rows 8g..8g+15, one row a 4-byte lane),
    so one vpdpbusd of the broadcast activations serves 16 rows, and each block's scaling is one
    16-lane multiply-add. Every lane takes the 8-row kernel's integer sums and float steps in the
    same order: each row's value is _group_dot's bit for bit. Returns 16 float32 per token
    (rows 8g..8g+15), token by token, for `tokens` tokens from t0 on (TOKENS, or PAIR_TOKENS for
    the batched decode steps of 8 rows and more)."""
    _, halves, qbytes, nibbles = GROUP_FORMATS[fmt]
    gsize = group_bytes(fmt)
    both = ir.Constant(_vec(I32, 16), list(range(16)))  # shuffle masks: two halves into one vector
    both64 = ir.Constant(_vec(I32, 64), list(range(64)))

    def typer(w, g, xq, xd, xs, xi, t0):
        def codegen(context, builder, sig, args):
            nb, per_token = _token_pointers(context, builder, sig, args, tokens)
            g = args[1]
            base = _byte_ptr(context, builder, sig.args[0], args[0], builder.mul(g, ir.Constant(g.type, 8)), _ZERO)
            stride = builder.mul(_widest(builder, nb, ir.IntType(64)), ir.Constant(ir.IntType(64), gsize))
            base2 = builder.gep(base, [stride])  # group g + 1: the next 8 rows
            vf = _vec(F32, 16)
            accs = [cgutils.alloca_once_value(builder, ir.Constant(vf, None)) for _ in range(tokens)]
            extras = [cgutils.alloca_once_value(builder, ir.Constant(vf, None)) for _ in range(tokens)]
            low, four = ir.Constant(_vec(I8, 64), [15] * 64), ir.Constant(_vec(I8, 64), [4] * 64)

            def pair(b, off, ty, mask):
                at = [builder.gep(p, [builder.add(builder.mul(b, ir.Constant(b.type, gsize)), ir.Constant(b.type, off))])
                      for p in (base, base2)]
                return builder.shuffle_vector(_load(builder, at[0], ty), _load(builder, at[1], ty), mask)
            # each stream is read 2 groups at a time: the blocks PREFETCH_AHEAD bytes later in time are
            # `ahead` blocks on in both groups, and past their end, the next pair's (groups g+2, g+3)
            ahead = max(1, PREFETCH_AHEAD // (2 * gsize))
            with cgutils.for_range(builder, nb) as loop:
                b = loop.index
                later = builder.add(_widest(builder, b, ir.IntType(64)), ir.Constant(ir.IntType(64), ahead))
                wrap = builder.icmp_signed(">=", later, _widest(builder, nb, ir.IntType(64)))
                step = builder.add(builder.mul(later, ir.Constant(ir.IntType(64), gsize)),
                                   builder.select(wrap, stride, ir.Constant(ir.IntType(64), 0)))
                prefetch(builder, base, gsize, step)
                prefetch(builder, base2, gsize, step)
                d16 = builder.fpext(pair(b, 0, _vec(ir.HalfType(), 8), both), vf)
                m16 = builder.fpext(pair(b, 16, _vec(ir.HalfType(), 8), both), vf) if halves == 2 else None
                parts = []
                for c in range(qbytes // 4):
                    v = pair(b, 16 * halves + 32 * c, _vec(I8, 32), both64)
                    if nibbles:
                        parts += [(builder.and_(v, low), c, None), (builder.lshr(v, four), c + 4, None)]
                    else:  # (vnni) int8 as unsigned w + 128; the accumulator starts at -128 Σx
                        parts.append((builder.xor(v, ir.Constant(_vec(I8, 64), [-128] * 64)), c, None))
                for token, acc, extra in zip(per_token, accs, extras):
                    qp, ip = token[0], token[3]
                    x4 = builder.bitcast(builder.gep(qp, [builder.mul(b, ir.Constant(b.type, 32))]), I32.as_pointer())
                    bias = None if nibbles else builder.mul(builder.load(builder.gep(ip, [b])), ir.Constant(I32, -128))
                    dots = _block_dots(builder, x4, b, parts, 16, bias)
                    _scale_block(builder, dots, d16, m16, b, token, acc, extra, halves, nibbles)
            values = []
            for acc, extra in zip(accs, extras):
                total = builder.fadd(builder.load(acc), builder.load(extra), flags=_FAST)
                values += [builder.extract_element(total, ir.Constant(I32, i)) for i in range(16)]
            return context.make_tuple(builder, sig.return_type, values)
        return types.UniTuple(types.float32, 16 * tokens)(w, types.intp, xq, xd, xs, xi, types.intp), codegen

    @intrinsic
    def pair_tokens(typingctx, w, g, xq, xd, xs, xi, t0):
        return typer(w, g, xq, xd, xs, xi, t0)
    return pair_tokens


group_dot_q4_0x8, group_dot_q4_1x8, group_dot_q8_0x8 = (_group_dot(f, 1) for f in ("q4_0", "q4_1", "q8_0"))
group_tokens_q4_0x8, group_tokens_q4_1x8, group_tokens_q8_0x8 = (_group_dot(f, TOKENS) for f in ("q4_0", "q4_1", "q8_0"))
# (WIDE only) two groups' rows, 16 per token: engine.kernels.batched's steps of TOKENS rows or more
pair_tokens_q4_0x8, pair_tokens_q4_1x8, pair_tokens_q8_0x8 = (_pair_tokens(f) for f in ("q4_0", "q4_1", "q8_0"))
# ... and PAIR_TOKENS tokens a pass: a T=8 matmul as two passes of TOKENS over each stripe took longer than
# two T=4 calls
PAIR_TOKENS = 2 * TOKENS
pair8_tokens_q4_0x8, pair8_tokens_q4_1x8, pair8_tokens_q8_0x8 = (_pair_tokens(f, PAIR_TOKENS) for f in ("q4_0", "q4_1",
                                                                                                        "q8_0"))



def _row_dot_tokens(fmt: str):
    """An intrinsic dotting one row with TOKENS tokens' int8 activations (prefill): each block's
    weights are loaded and unpacked once and dotted with every token, each token with its own
    pair of accumulators (even and odd blocks) and the float steps of _row_dot in its order, so
    a token's product is row_dot's bit for bit (rows as stored: repacked matrices take the group
    kernels). Returns a tuple of TOKENS float32."""
    size, qoff, has_min, nibbles = _ROW_FORMATS[fmt]

    @intrinsic
    def row_dot_tokens(typingctx, w, r, xq, xd, xs, xi, t0):
        def codegen(context, builder, sig, args):
            wty, _, qty, dty, sty, ity, _ = sig.args
            w, r, xq, xd, xs, xi, t0 = args
            nb = _activations(context, builder, sig, args, 2)[0]
            start = _byte_ptr(context, builder, wty, w, r, _ZERO)
            d_at, m_at, q_at = ir.Constant(r.type, 0), ir.Constant(r.type, 2), ir.Constant(r.type, qoff)
            toks = [builder.add(t0, ir.Constant(t0.type, k)) for k in range(TOKENS)]
            qps = [_byte_ptr(context, builder, qty, xq, t, _ZERO) for t in toks]
            fptr = lambda ty, a, t: builder.bitcast(_byte_ptr(context, builder, ty, a, t, _ZERO), F32.as_pointer())  # noqa: E731
            dps = [fptr(dty, xd, t) for t in toks]
            sps = [fptr(sty, xs, t) for t in toks]
            ips = [builder.bitcast(_byte_ptr(context, builder, ity, xi, t, _ZERO), I32.as_pointer()) for t in toks]
            vf = _vec(F32, 8)
            accs = [[cgutils.alloca_once_value(builder, ir.Constant(vf, None)) for _ in range(2)] for _ in range(TOKENS)]
            extras = [[cgutils.alloca_once_value(builder, ir.Constant(F32, 0.0)) for _ in range(2)] for _ in range(TOKENS)]

            def block(b, parity):
                blk = builder.gep(start, [builder.mul(b, ir.Constant(b.type, size))])
                dw = builder.fpext(_load(builder, builder.gep(blk, [d_at]), ir.HalfType()), F32)
                m = builder.fpext(_load(builder, builder.gep(blk, [m_at]), ir.HalfType()), F32) if has_min else None
                u, negative = _weights(builder, builder.gep(blk, [q_at]), nibbles)  # once for all tokens
                for k in range(TOKENS):
                    acc, extra = accs[k][parity], extras[k][parity]
                    scale = builder.fmul(dw, builder.load(builder.gep(dps[k], [b])), flags=_EXACT)
                    s = _load(builder, builder.gep(qps[k], [builder.mul(b, ir.Constant(b.type, 32))]), _vec(I8, 32))
                    dot = _block_dot(builder, u, negative, s)
                    term = builder.fmul(builder.sitofp(dot, vf), _splat(builder, scale), flags=_EXACT)
                    builder.store(builder.fadd(builder.load(acc), term, flags=_EXACT), acc)
                    if has_min:
                        e = builder.fmul(m, builder.load(builder.gep(sps[k], [b])), flags=_EXACT)
                    elif nibbles:
                        qsum = builder.sitofp(builder.load(builder.gep(ips[k], [b])), F32)
                        e = builder.fmul(builder.fmul(scale, qsum, flags=_EXACT), ir.Constant(F32, -8.0), flags=_EXACT)
                    if nibbles:
                        builder.store(builder.fadd(builder.load(extra), e, flags=_EXACT), extra)

            one, two = ir.Constant(nb.type, 1), ir.Constant(nb.type, 2)
            with cgutils.for_range(builder, builder.sdiv(nb, two)) as loop:
                b = builder.mul(loop.index, two)
                block(b, 0)
                block(builder.add(b, one), 1)
            with builder.if_then(builder.icmp_signed("!=", builder.srem(nb, two), ir.Constant(nb.type, 0))):
                block(builder.sub(nb, one), 0)
            totals = []
            for k in range(TOKENS):
                v = builder.fadd(builder.load(accs[k][0]), builder.load(accs[k][1]), flags=_EXACT)
                total = builder.fadd(builder.load(extras[k][0]), builder.load(extras[k][1]), flags=_EXACT)
                for i in range(8):
                    total = builder.fadd(total, builder.extract_element(v, ir.Constant(I32, i)), flags=_EXACT)
                totals.append(total)
            return context.make_tuple(builder, sig.return_type, totals)
        return types.UniTuple(types.float32, TOKENS)(w, types.intp, xq, xd, xs, xi, types.intp), codegen
    return row_dot_tokens


tokens_q4_0, tokens_q4_1, tokens_q8_0 = (_row_dot_tokens(f) for f in ("q4_0", "q4_1", "q8_0"))


def _copy(n: int):
    """An intrinsic dst[doff:doff+n] = src[soff:soff+n] for uint8 arrays: one unaligned move of
    n bytes (repack_x8 moves 4-byte runs; numba's byte loops do not vectorise)."""
    ty = _vec(I8, n)

    @intrinsic
    def copy(typingctx, dst, doff, src, soff):
        def codegen(context, builder, sig, args):
            v = _load(builder, _byte_ptr(context, builder, sig.args[2], args[2], _ZERO, args[3]), ty)
            p = _byte_ptr(context, builder, sig.args[0], args[0], _ZERO, args[1])
            builder.store(v, builder.bitcast(p, ty.as_pointer()), align=1)
            return context.get_dummy_value()
        return types.none(dst, types.intp, src, types.intp), codegen
    return copy


copy4 = _copy(4)


def _ieee_divide(builder, a, b):
    """a / b rounded as IEEE division even inside a fastmath kernel: numba's fastmath pass adds
    its flags only to float instructions without any, and `nsz` (the sign of a zero quotient)
    does not let LLVM turn the division into a multiply by the reciprocal."""
    quotient = builder.fdiv(a, b)
    quotient.flags.append("nsz")
    return quotient
