"""The activation quantizers: one token's float32 values into the int8 blocks every integer kernel reads,
as llama.cpp quantizes the activations it dots each weight format with (formats.quantize_block and
quantize_k_block call them; their scalar statements and numpy twins are there and in reference.py).

  quantize32  — per 32 values, llama.cpp's Q8_1: d = max|x| / 127 (kept as a half), q = rint(x · 127 / max|x|);
  quantize256 — per 256 values, llama.cpp's Q8_K: d = max / -127 with max the first value of largest magnitude.

Layout: x (n,) float32 of one token; xq (n,) int8; per 32 values xd (scale), xs (scale · Σq) float32 and
xi (Σq) int32. Each is written in 32-lane LLVM vectors whose every step is exact or rounds each value
alone, so the vector code equals the scalar statement bit for bit on every instruction path.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

import engine.kernels.ready  # noqa: F401  (engine.kernels.setup() first: fails otherwise)
from engine.kernels.simd import F32, I8, I32, _data_ptr, _ieee_divide, _lane0, _load, _splat, _vec, _widest


def _quantizer_pointers(context, builder, sig, args, size: int):
    """A quantizer's (x, xq, xd, xs, xi) data pointers, its block index as int64, and its first value (index · size)."""
    ptrs = tuple(_data_ptr(context, builder, t, a, e) for t, a, e in zip(sig.args[:5], args[:5], (F32, I8, F32, F32, I32)))
    index = _widest(builder, args[5], ir.IntType(64))
    return ptrs, index, builder.mul(index, ir.Constant(index.type, size))


def _halve(builder, v, combine):
    """A 32-lane vector reduced to its lane 0 by combining halves (exact for a maximum, a minimum, an integer sum)."""
    for width in (16, 8, 4, 2, 1):
        lo = builder.shuffle_vector(v, v, ir.Constant(_vec(I32, width), list(range(width))))
        hi = builder.shuffle_vector(v, v, ir.Constant(_vec(I32, width), list(range(width, 2 * width))))
        v = combine(lo, hi)
    return v


def _quantizer_types(x, xq, xd, xs, xi, index) -> bool:
    """The arguments quantize32 and quantize256 compile for: C rows of float32 x, int8 xq, float32 xd and
    xs, int32 xi, and an integer block index."""
    arrays = (x, xq, xd, xs, xi)
    return all(isinstance(t, types.Array) and t.ndim == 1 and t.layout == "C" for t in arrays) and \
        (x.dtype, xq.dtype, xd.dtype, xs.dtype, xi.dtype) == (types.float32, types.int8, types.float32, types.float32,
                                                             types.int32) and isinstance(index, types.Integer)


@intrinsic
def quantize32(typingctx, x, xq, xd, xs, xi, b):
    """Block b (values 32b..32b+31) of one token's float32 x (n,) into int8 xq, and its half
    scale xd[b] = max|x| / 127, half scaled sum xs[b] = xd·Σq and integer sum xi[b] = Σq
    (cpu.quantize_block; llama.cpp's Q8_1). In 32-lane vectors: every step is exact or rounds
    each value alone (the maximum, the integer sum), so this is the scalar loop's result bit
    for bit, about ten times faster (the decode kernel quantizes every expert's 32-row block as
    soon as it is done)."""
    if not _quantizer_types(x, xq, xd, xs, xi, b):
        return None

    def codegen(context, builder, sig, args):
        (px, pq, pd, ps, pi), b, start = _quantizer_pointers(context, builder, sig, args, 32)
        v32 = _vec(F32, 32)
        v = _load(builder, builder.gep(px, [start]), v32)
        mod = builder.module
        fabs = cgutils.get_or_insert_function(mod, ir.FunctionType(v32, [v32]), "llvm.fabs.v32f32")
        a = builder.call(fabs, [v])
        a = _halve(builder, a, lambda lo, hi: builder.select(builder.fcmp_ordered(">", hi, lo), hi, lo))
        amax = _lane0(builder, a)
        d = _ieee_divide(builder, amax, ir.Constant(F32, 127.0))
        positive = builder.fcmp_ordered(">", amax, ir.Constant(F32, 0.0))
        inv = builder.select(positive, _ieee_divide(builder, ir.Constant(F32, 127.0), amax), ir.Constant(F32, 0.0))
        splat = builder.shuffle_vector(builder.insert_element(ir.Constant(v32, None), inv, ir.Constant(I32, 0)),
                                       ir.Constant(v32, None), ir.Constant(_vec(I32, 32), [0] * 32))
        product = builder.fmul(v, splat)
        product.flags.append("nsz")  # (flagged, so the fastmath pass leaves it as it is)
        rint = cgutils.get_or_insert_function(mod, ir.FunctionType(v32, [v32]), "llvm.rint.v32f32")
        q = builder.fptosi(builder.call(rint, [product]), _vec(I32, 32))
        builder.store(builder.trunc(q, _vec(I8, 32)), builder.bitcast(builder.gep(pq, [start]), _vec(I8, 32).as_pointer()),
                      align=1)
        q = _halve(builder, q, lambda lo, hi: builder.add(lo, hi))
        total = _lane0(builder, q)
        half = lambda f: builder.fpext(builder.fptrunc(f, ir.HalfType()), F32)  # noqa: E731
        scaled_sum = builder.fmul(d, builder.sitofp(total, F32))
        scaled_sum.flags.append("nsz")
        builder.store(half(d), builder.gep(pd, [b]))
        builder.store(half(scaled_sum), builder.gep(ps, [b]))
        builder.store(total, builder.gep(pi, [b]))
        return context.get_dummy_value()
    return types.none(x, xq, xd, xs, xi, b), codegen


@intrinsic
def quantize256(typingctx, x, xq, xd, xs, xi, s):
    """Super-block s (values 256s..256s+255) of one token's float32 x (n,) as llama.cpp's Q8_K
    (formats.quantize_k_block, its scalar statement): d = max / -127 with max the first value of largest
    magnitude, q = min(rint(x · (-127 / max)), 127) into xq, and per 32: xd = d, xi = Σq, xs = d·Σq. In
    32-lane vectors, every step exact or rounding each value alone, so it equals the scalar loop bit for
    bit, several times faster (K-quant rows read activations quantized this way at every matmul)."""
    if not _quantizer_types(x, xq, xd, xs, xi, s):
        return None

    def codegen(context, builder, sig, args):
        (px, pq, pd, ps, pi), s, start = _quantizer_pointers(context, builder, sig, args, 256)
        v32, i32x32 = _vec(F32, 32), _vec(I32, 32)
        mod = builder.module
        fabs = cgutils.get_or_insert_function(mod, ir.FunctionType(v32, [v32]), "llvm.fabs.v32f32")
        vs = [_load(builder, builder.gep(px, [builder.add(start, ir.Constant(s.type, 32 * k))]), v32) for k in range(8)]
        a = builder.call(fabs, [vs[0]])
        for v in vs[1:]:  # the largest magnitude, lane by lane, then across lanes (exact in any order)
            m = builder.call(fabs, [v])
            a = builder.select(builder.fcmp_ordered(">", m, a), m, a)
        a = _halve(builder, a, lambda lo, hi: builder.select(builder.fcmp_ordered(">", hi, lo), hi, lo))
        amax = _lane0(builder, a)
        # the first value of that magnitude (its sign): per vector the lowest lane that has it, the first vector first
        lanes = ir.Constant(i32x32, list(range(32)))
        none = ir.Constant(I32, 256)
        first = none
        for k in reversed(range(8)):
            hit = builder.fcmp_ordered("==", builder.call(fabs, [vs[k]]), _splat(builder, amax, 32))
            idx = builder.select(hit, builder.add(lanes, ir.Constant(i32x32, [32 * k] * 32)), ir.Constant(i32x32, [256] * 32))
            idx = _halve(builder, idx, lambda lo, hi: builder.select(builder.icmp_signed("<", hi, lo), hi, lo))
            low = _lane0(builder, idx)
            first = builder.select(builder.icmp_signed("<", low, first), low, first)
        positive = builder.fcmp_ordered(">", amax, ir.Constant(F32, 0.0))
        safe = builder.select(positive, first, ir.Constant(I32, 0))
        top = builder.load(builder.gep(px, [builder.add(start, builder.sext(safe, s.type))]))
        iscale = builder.select(positive, _ieee_divide(builder, ir.Constant(F32, -127.0), top), ir.Constant(F32, 0.0))
        d = builder.select(positive, _ieee_divide(builder, ir.Constant(F32, 1.0), iscale), ir.Constant(F32, 0.0))
        splat = _splat(builder, iscale, 32)
        rint = cgutils.get_or_insert_function(mod, ir.FunctionType(v32, [v32]), "llvm.rint.v32f32")
        cap = ir.Constant(v32, [127.0] * 32)
        for k in range(8):
            product = builder.fmul(vs[k], splat)
            product.flags.append("nsz")  # (flagged, so the fastmath pass leaves it as it is)
            r = builder.call(rint, [product])
            r = builder.select(builder.fcmp_ordered("<", r, cap), r, cap)
            q = builder.fptosi(r, i32x32)
            at = builder.add(start, ir.Constant(s.type, 32 * k))
            builder.store(builder.trunc(q, _vec(I8, 32)), builder.bitcast(builder.gep(pq, [at]), _vec(I8, 32).as_pointer()),
                          align=1)
            q = _halve(builder, q, lambda lo, hi: builder.add(lo, hi))
            total = _lane0(builder, q)
            scaled_sum = builder.fmul(d, builder.sitofp(total, F32))
            scaled_sum.flags.append("nsz")
            b = builder.add(builder.mul(s, ir.Constant(s.type, 8)), ir.Constant(s.type, k))
            builder.store(d, builder.gep(pd, [b]))
            builder.store(scaled_sum, builder.gep(ps, [b]))
            builder.store(total, builder.gep(pi, [b]))
        return context.get_dummy_value()
    return types.none(x, xq, xd, xs, xi, s), codegen
