"""Float vector intrinsics over rows as a KV cache stores them (float32, f16 bits as uint16, int8
widened to float32 as they are read): fixed-order dot products and weighted sums for attention
and RMSNorm (engine.kernels.rows).

Why intrinsics: numba lends a parallel fastmath kernel's fastmath to every function it calls,
and LLVM then vectorises a plain sum differently in each caller. These emit the vector IR
themselves, 16 lanes at a time with `contract` flags only (multiply-adds may fuse, nothing is
reordered), so the layered kernels (cpu.py) and the fused decode kernel (decode.py) round
every sum the same way.

Layout: a row is a contiguous 1-D array; a KV cache (S, kv_heads, hd), C order.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

import engine.kernels.ready  # noqa: F401  (engine.kernels.setup() first: fails otherwise)
from engine.kernels.simd import F32, I8, I16, I32, WIDE, _data_ptr, _lane0, _load, _vec, _widest

_CONTRACT = ("contract",)  # multiply-adds may fuse, nothing is reordered: the same sum wherever it runs
_ELEMENTS = {types.float32: F32, types.uint16: I16, types.int8: I8}


def _widen_vector(builder, v, dtype):
    """A vector of stored elements (float32, f16 bits as uint16, int8) as float32 lanes."""
    n = v.type.count
    if dtype == types.uint16:
        return builder.fpext(builder.bitcast(v, _vec(ir.HalfType(), n)), _vec(F32, n))
    if dtype == types.int8:
        return builder.sitofp(v, _vec(F32, n))
    return v


def _widened(builder, ptr, i, dtype, lanes: int):
    """`lanes` stored elements from ptr[i] (float32, f16 bits as uint16, int8) as float32 lanes."""
    return _widen_vector(builder, _load(builder, builder.gep(ptr, [i]), _vec(_ELEMENTS[dtype], lanes)), dtype)


def _float_and_stored_rows(a, b) -> bool:
    """Typing check of dot: a float32 row a and a row b as a cache stores it."""
    ok = all(isinstance(t, types.Array) and t.ndim == 1 and t.layout == "C" for t in (a, b))
    return ok and a.dtype == types.float32 and b.dtype in _ELEMENTS


def _float_row_and_cache(a, cache, ints) -> bool:
    """Typing check of dot_rows/add_weighted_rows: a float32 row, a KV cache (S, kv_heads, hd) as
    stored, and integer arguments."""
    ok = isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C" and a.dtype == types.float32
    ok = ok and isinstance(cache, types.Array) and cache.ndim == 3 and cache.layout == "C"
    return ok and cache.dtype in _ELEMENTS and all(isinstance(t, types.Integer) for t in ints)


def _row_pointers(context, builder, sig, args, fa: int, fb: int):
    """(n, float32* of argument fa, element* of argument fb, fb's dtype) for dot."""
    arr = context.make_array(sig.args[fa])(context, builder, args[fa])
    n = cgutils.unpack_tuple(builder, arr.shape, 1)[0]
    dtype = sig.args[fb].dtype
    return (n, builder.bitcast(arr.data, F32.as_pointer()),
            _data_ptr(context, builder, sig.args[fb], args[fb], _ELEMENTS[dtype]), dtype)


def _float_row(context, builder, sig, args, i: int):
    """(length, float32 pointer) of the 1-D float32 array argument i."""
    arr = context.make_array(sig.args[i])(context, builder, args[i])
    return cgutils.unpack_tuple(builder, arr.shape, 1)[0], builder.bitcast(arr.data, F32.as_pointer())


def _cache_row(context, builder, sig, args, fc: int, kh):
    """(element* of KV head kh of position 0 in the cache argument fc, elements from one position
    to the next)."""
    cache = context.make_array(sig.args[fc])(context, builder, args[fc])
    _, heads, hd = cgutils.unpack_tuple(builder, cache.shape, 3)
    base = _data_ptr(context, builder, sig.args[fc], args[fc], _ELEMENTS[sig.args[fc].dtype])
    return builder.gep(base, [builder.mul(_widest(builder, kh, hd.type), hd)]), builder.mul(heads, hd)


def _dot_code(builder, n, pa, pb, dtype, acc, total):
    """The fixed-order dot product (see `dot`) of n floats at pa with n stored elements at pb;
    acc (<16 x float>) and total (float) are the caller's slots."""
    v16 = _vec(F32, 16)
    builder.store(ir.Constant(v16, [0.0] * 16), acc)
    sixteen = ir.Constant(n.type, 16)
    with cgutils.for_range(builder, builder.sdiv(n, sixteen)) as loop:
        off = builder.mul(loop.index, sixteen)
        va, vb = _load(builder, builder.gep(pa, [off]), v16), _widened(builder, pb, off, dtype, 16)
        builder.store(builder.fadd(builder.load(acc), builder.fmul(va, vb, flags=_CONTRACT), flags=_CONTRACT), acc)
    v = builder.load(acc)
    for width in (8, 4, 2, 1):  # halves added pairwise: a fixed tree
        lo = builder.shuffle_vector(v, v, ir.Constant(_vec(I32, width), list(range(width))))
        hi = builder.shuffle_vector(v, v, ir.Constant(_vec(I32, width), list(range(width, 2 * width))))
        v = builder.fadd(lo, hi, flags=_CONTRACT)
    builder.store(_lane0(builder, v), total)
    tail = builder.mul(builder.sdiv(n, sixteen), sixteen)
    with cgutils.for_range_slice(builder, tail, n, ir.Constant(n.type, 1)) as (i, _):
        x, y = builder.load(builder.gep(pa, [i])), _lane0(builder, _widened(builder, pb, i, dtype, 1))
        builder.store(builder.fadd(builder.load(total), builder.fmul(x, y, flags=_CONTRACT), flags=_CONTRACT), total)
    return builder.load(total)


@intrinsic
def dot(typingctx, a, b):
    """Σ a[i]·widen(b[i]) over float32 a (n,) and a row b (n,) as stored (float32, f16 bits as
    uint16, int8; contiguous): 16 lanes at a time, then summed across in a fixed order. A plain
    loop would be vectorised however each calling kernel's fastmath context allows — a different
    float in cpu.attention than in the fused decode kernel; this is the same in both, and 3-4×
    faster than eight scalar partial sums."""
    if not _float_and_stored_rows(a, b):
        return None

    def codegen(context, builder, sig, args):
        n, pa, pb, dtype = _row_pointers(context, builder, sig, args, 0, 1)
        acc, total = cgutils.alloca_once(builder, _vec(F32, 16)), cgutils.alloca_once(builder, F32)
        return _dot_code(builder, n, pa, pb, dtype, acc, total)
    return types.float32(a, b), codegen


ROWS_AT_ONCE = 8 if WIDE else 4  # key rows dot_rows sums side by side (16-lane accumulators each)
HEAD_ROWS_AT_ONCE = 4 if WIDE else 1  # ... and dot_rows_heads (HEADS x 4 accumulators)


def _across(builder, vectors: list, width: int):
    """`dot`'s tree (halves added pairwise: lanes i and i + 8, then i + 4, i + 2, i + 1) for
    several rows at once: vectors[j] holds row j's 16 lane sums; each level packs two rows'
    halves into one vector, so a level costs two shuffles and one add for every two rows
    instead of for each. Returns one vector of the rows' sums, in order."""
    per = 1  # rows in each vector
    while width > 1:
        half = width // 2
        lo_hi = [[r * width + i + h for r in range(per) for i in range(half)] for h in (0, half)]
        if len(vectors) > 1:  # two vectors -> one holding both rows' halves
            lanes = per * width
            nxt = []
            for a, b in zip(vectors[0::2], vectors[1::2]):
                lo, hi = ([*m, *(lanes + i for i in m)] for m in lo_hi)
                nxt.append(builder.fadd(builder.shuffle_vector(a, b, ir.Constant(_vec(I32, len(lo)), lo)),
                                        builder.shuffle_vector(a, b, ir.Constant(_vec(I32, len(hi)), hi)),
                                        flags=_CONTRACT))
            vectors, per = nxt, 2 * per
        else:
            v = vectors[0]
            vectors = [builder.fadd(*(builder.shuffle_vector(v, v, ir.Constant(_vec(I32, len(m)), m)) for m in lo_hi),
                                    flags=_CONTRACT)]
        width = half
    return vectors[0]


def _position_blocks(builder, n, pqs, pos, head0, stride, dtype, first, last, P: int):
    """Positions first.. in blocks of P for the query heads at pqs (outputs at pos): each key row widened
    once for all the heads, each head's P lane sums reduced together (`_across`), then each position's
    leftover elements in order: `dot`'s float for every (head, position). Returns the first position
    left for a one-at-a-time loop (dot_rows, dot_rows_heads)."""
    v16, sixteen, one = _vec(F32, 16), ir.Constant(n.type, 16), ir.Constant(n.type, 1)
    chunks, tail = builder.sdiv(n, sixteen), builder.mul(builder.sdiv(n, sixteen), sixteen)
    accs = [[cgutils.alloca_once(builder, v16) for _ in range(P)] for _ in pqs]
    total = cgutils.alloca_once(builder, F32)
    blocks = builder.sdiv(builder.sub(builder.add(last, one), first), ir.Constant(n.type, P))
    with cgutils.for_range(builder, blocks) as outer:
        s0 = builder.add(first, builder.mul(outer.index, ir.Constant(n.type, P)))
        rows = [builder.gep(head0, [builder.mul(builder.add(s0, ir.Constant(n.type, j)), stride)]) for j in range(P)]
        for head in accs:
            for a in head:
                builder.store(ir.Constant(v16, [0.0] * 16), a)
        with cgutils.for_range(builder, chunks) as loop:
            off = builder.mul(loop.index, sixteen)
            keys = [_widened(builder, row, off, dtype, 16) for row in rows]
            for pq, head in zip(pqs, accs):
                va = _load(builder, builder.gep(pq, [off]), v16)
                for a, vb in zip(head, keys):
                    builder.store(builder.fadd(builder.load(a), builder.fmul(va, vb, flags=_CONTRACT),
                                               flags=_CONTRACT), a)
        for pq, po, head in zip(pqs, pos, accs):
            sums = _across(builder, [builder.load(a) for a in head], 16)
            for j, row in enumerate(rows):  # then the leftover elements, in order, as `dot` adds them
                builder.store(builder.extract_element(sums, ir.Constant(I32, j)), total)
                with cgutils.for_range_slice(builder, tail, n, one) as (i, _):
                    x, y = builder.load(builder.gep(pq, [i])), _lane0(builder, _widened(builder, row, i, dtype, 1))
                    builder.store(builder.fadd(builder.load(total), builder.fmul(x, y, flags=_CONTRACT),
                                               flags=_CONTRACT), total)
                builder.store(builder.load(total), builder.gep(po, [builder.add(s0, ir.Constant(n.type, j))]))
    return builder.add(first, builder.mul(blocks, ir.Constant(n.type, P)))


@intrinsic
def dot_rows(typingctx, q, k, kh, first, last, out):
    """out[s] = dot(q, k[s, kh]) for s in first..last: one query head q (hd,) against a KV cache's
    keys k (S, kv_heads, hd) as stored, each product exactly as `dot` sums it, in one compiled
    loop (no row views built per position). ROWS_AT_ONCE rows at a time share the sums across
    lanes (`_across`): the same additions, a quarter of the shuffles."""
    if not _float_row_and_cache(q, k, (kh, first, last)) or not _float_and_stored_rows(out, out):
        return None

    def codegen(context, builder, sig, args):
        n, pq = _float_row(context, builder, sig, args, 0)
        head0, stride = _cache_row(context, builder, sig, args, 1, args[2])
        po = _data_ptr(context, builder, sig.args[5], args[5], F32)
        dtype = sig.args[1].dtype
        acc, total = cgutils.alloca_once(builder, _vec(F32, 16)), cgutils.alloca_once(builder, F32)
        first, last = (_widest(builder, a, n.type) for a in args[3:5])
        end = builder.add(last, ir.Constant(n.type, 1))
        rest = _position_blocks(builder, n, [pq], [po], head0, stride, dtype, first, last, ROWS_AT_ONCE)
        with cgutils.for_range_slice(builder, rest, end, ir.Constant(n.type, 1)) as (s, _):
            row = builder.gep(head0, [builder.mul(s, stride)])
            builder.store(_dot_code(builder, n, pq, row, dtype, acc, total), builder.gep(po, [s]))
        return context.get_dummy_value()
    return types.none(q, k, kh, first, last, out), codegen


@intrinsic
def sum_in_order(typingctx, row, first, last):
    """row[first] + row[first + 1] + ... + row[last], added left to right whatever the caller's
    fastmath: each add carries `nsz` alone, so numba's fastmath pass (which flags only float
    instructions without flags) leaves it strict and LLVM cannot split it into vector lanes.
    Softmax's denominator: every kernel that attends sums it alike."""
    if not _float_and_stored_rows(row, row) or row.dtype != types.float32 or \
            not all(isinstance(t, types.Integer) for t in (first, last)):
        return None

    def codegen(context, builder, sig, args):
        n, pr = _float_row(context, builder, sig, args, 0)
        first, last = (_widest(builder, a, n.type) for a in args[1:3])
        total = cgutils.alloca_once_value(builder, ir.Constant(F32, 0.0))
        with cgutils.for_range_slice(builder, first, builder.add(last, ir.Constant(n.type, 1)),
                                     ir.Constant(n.type, 1)) as (i, _):
            builder.store(builder.fadd(builder.load(total), builder.load(builder.gep(pr, [i])), flags=("nsz",)), total)
        return builder.load(total)
    return types.float32(row, first, last), codegen


@intrinsic
def add_weighted_rows(typingctx, out, p, v, kh, first, last):
    """out[i] += Σ_s p[s]·widen(v[s, kh, i]) for s = first..last in order: attention's weighted
    sum of value rows, v (S, kv_heads, hd) as a KV cache stores it, out (hd,). Each element's
    sum runs in a register (64 of them at a time) rather than through memory once per position,
    one multiply-add per step as a plain `out += p · v` would round it."""
    if not _float_row_and_cache(out, v, (kh, first, last)) or not _float_and_stored_rows(p, p):
        return None

    def codegen(context, builder, sig, args):
        n, po = _float_row(context, builder, sig, args, 0)
        pp = _data_ptr(context, builder, sig.args[1], args[1], F32)
        head0, stride = _cache_row(context, builder, sig, args, 2, args[3])
        dtype = sig.args[2].dtype
        first, last = (_widest(builder, a, n.type) for a in args[4:6])
        end, one = builder.add(last, ir.Constant(n.type, 1)), ir.Constant(n.type, 1)

        def columns(start, lanes: int, count: int):
            """Elements start..start + lanes·count of out, summed over the positions."""
            ty = _vec(F32, lanes) if lanes > 1 else F32
            slots = [cgutils.alloca_once(builder, ty) for _ in range(count)]
            for c, slot in enumerate(slots):
                at = builder.gep(po, [builder.add(start, ir.Constant(n.type, lanes * c))])
                builder.store(builder.load(builder.bitcast(at, ty.as_pointer()), align=4), slot)
            with cgutils.for_range_slice(builder, first, end, one) as (s, _):
                weight = builder.load(builder.gep(pp, [s]))
                if lanes > 1:
                    weight = builder.shuffle_vector(builder.insert_element(ir.Constant(ty, None), weight,
                                                                           ir.Constant(I32, 0)),
                                                    ir.Constant(ty, None), ir.Constant(_vec(I32, lanes), [0] * lanes))
                row = builder.gep(head0, [builder.add(builder.mul(s, stride), start)])
                for c, slot in enumerate(slots):
                    x = _widened(builder, row, ir.Constant(n.type, lanes * c), dtype, lanes)
                    if lanes == 1:
                        x = _lane0(builder, x)
                    product = builder.fmul(weight, x, flags=_CONTRACT)
                    builder.store(builder.fadd(builder.load(slot), product, flags=_CONTRACT), slot)
            for c, slot in enumerate(slots):
                at = builder.gep(po, [builder.add(start, ir.Constant(n.type, lanes * c))])
                builder.store(builder.load(slot), builder.bitcast(at, ty.as_pointer()), align=4)

        sixty_four, sixteen = ir.Constant(n.type, 64), ir.Constant(n.type, 16)
        wide = builder.mul(builder.sdiv(n, sixty_four), sixty_four)
        with cgutils.for_range_slice(builder, ir.Constant(n.type, 0), wide, sixty_four) as (c, _):
            columns(c, 16, 4)
        narrow = builder.mul(builder.sdiv(n, sixteen), sixteen)
        with cgutils.for_range_slice(builder, wide, narrow, sixteen) as (c, _):
            columns(c, 16, 1)
        with cgutils.for_range_slice(builder, narrow, n, one) as (c, _):
            columns(c, 1, 1)
        return context.get_dummy_value()
    return types.none(out, p, v, kh, first, last), codegen


HEADS = 4  # query heads per call of the *_heads intrinsics (the query heads of one KV head, 4 at a time)


def _heads_and_cache(a, cache, ints) -> bool:
    """Typing check of the *_heads intrinsics: a float32 (HEADS, m) array, a KV cache as stored,
    integer arguments."""
    ok = isinstance(a, types.Array) and a.ndim == 2 and a.layout in "CA" and a.dtype == types.float32
    ok = ok and isinstance(cache, types.Array) and cache.ndim == 3 and cache.layout == "C"
    return ok and cache.dtype in _ELEMENTS and all(isinstance(t, types.Integer) for t in ints)


def _head_rows(context, builder, sig, args, i: int):
    """(row length, [float32 pointer of each of the HEADS rows]) of the 2-D float32 argument i
    (rows at its first stride: a slice of heads or score rows; each row contiguous)."""
    arr = context.make_array(sig.args[i])(context, builder, args[i])
    m = cgutils.unpack_tuple(builder, arr.shape, 2)[1]
    step = cgutils.unpack_tuple(builder, arr.strides, 2)[0]
    base = builder.bitcast(arr.data, I8.as_pointer())
    return m, [builder.bitcast(builder.gep(base, [builder.mul(step, ir.Constant(step.type, h))]), F32.as_pointer())
               for h in range(HEADS)]


@intrinsic
def dot_rows_heads(typingctx, q, k, kh, first, last, out):
    """dot_rows for HEADS query heads q (HEADS, hd) that read the same KV head: out[h, s] =
    dot(q[h], k[s, kh]) for s in first..last, each key widened once for all of them and each
    head's sum in its own registers by exactly `dot`'s steps (the same float as dot_rows; the
    heads' multiply-add chains interleave)."""
    if not _heads_and_cache(q, k, (kh, first, last)) or not _heads_and_cache(out, k, ()):
        return None

    def codegen(context, builder, sig, args):
        n, pqs = _head_rows(context, builder, sig, args, 0)
        _, pos = _head_rows(context, builder, sig, args, 5)
        head0, stride = _cache_row(context, builder, sig, args, 1, args[2])
        dtype = sig.args[1].dtype
        v16 = _vec(F32, 16)
        accs = [cgutils.alloca_once(builder, v16) for _ in range(HEADS)]
        totals = [cgutils.alloca_once(builder, F32) for _ in range(HEADS)]
        first, last = (_widest(builder, a, n.type) for a in args[3:5])
        sixteen, one = ir.Constant(n.type, 16), ir.Constant(n.type, 1)
        if HEAD_ROWS_AT_ONCE > 1:
            first = _position_blocks(builder, n, pqs, pos, head0, stride, dtype, first, last, HEAD_ROWS_AT_ONCE)
        with cgutils.for_range_slice(builder, first, builder.add(last, one), one) as (s, _):
            row = builder.gep(head0, [builder.mul(s, stride)])
            for acc in accs:
                builder.store(ir.Constant(v16, [0.0] * 16), acc)
            with cgutils.for_range(builder, builder.sdiv(n, sixteen)) as loop:
                off = builder.mul(loop.index, sixteen)
                vb = _widened(builder, row, off, dtype, 16)
                for pq, acc in zip(pqs, accs):
                    va = _load(builder, builder.gep(pq, [off]), v16)
                    builder.store(builder.fadd(builder.load(acc), builder.fmul(va, vb, flags=_CONTRACT),
                                               flags=_CONTRACT), acc)
            for acc, total in zip(accs, totals):
                v = builder.load(acc)
                for width in (8, 4, 2, 1):  # `dot`'s tree
                    lo = builder.shuffle_vector(v, v, ir.Constant(_vec(I32, width), list(range(width))))
                    hi = builder.shuffle_vector(v, v, ir.Constant(_vec(I32, width), list(range(width, 2 * width))))
                    v = builder.fadd(lo, hi, flags=_CONTRACT)
                builder.store(_lane0(builder, v), total)
            tail = builder.mul(builder.sdiv(n, sixteen), sixteen)
            with cgutils.for_range_slice(builder, tail, n, one) as (i, _):
                y = _lane0(builder, _widened(builder, row, i, dtype, 1))
                for pq, total in zip(pqs, totals):
                    x = builder.load(builder.gep(pq, [i]))
                    builder.store(builder.fadd(builder.load(total), builder.fmul(x, y, flags=_CONTRACT),
                                               flags=_CONTRACT), total)
            for po, total in zip(pos, totals):
                builder.store(builder.load(total), builder.gep(po, [s]))
        return context.get_dummy_value()
    return types.none(q, k, kh, first, last, out), codegen


@intrinsic
def sums_in_order_heads(typingctx, rows, first, last, totals):
    """totals[h] = sum_in_order(rows[h], first, last) for the HEADS rows of rows (HEADS, S): the same
    left-to-right adds, the heads' chains interleaved (one add's latency covers four positions)."""
    ok = all(isinstance(a, types.Array) and a.dtype == types.float32 and a.ndim == d for a, d in ((rows, 2), (totals, 1)))
    if not ok or rows.layout not in "CA" or not all(isinstance(t, types.Integer) for t in (first, last)):
        return None

    def codegen(context, builder, sig, args):
        n, prs = _head_rows(context, builder, sig, args, 0)
        first, last = (_widest(builder, a, n.type) for a in args[1:3])
        slots = [cgutils.alloca_once_value(builder, ir.Constant(F32, 0.0)) for _ in range(HEADS)]
        with cgutils.for_range_slice(builder, first, builder.add(last, ir.Constant(n.type, 1)),
                                     ir.Constant(n.type, 1)) as (i, _):
            for pr, slot in zip(prs, slots):
                builder.store(builder.fadd(builder.load(slot), builder.load(builder.gep(pr, [i])), flags=("nsz",)), slot)
        pt = _data_ptr(context, builder, sig.args[3], args[3], F32)
        for h, slot in enumerate(slots):
            builder.store(builder.load(slot), builder.gep(pt, [ir.Constant(I32, h)]))
        return context.get_dummy_value()
    return types.none(rows, first, last, totals), codegen


WEIGHTED_VECTORS = 4 if WIDE else 1  # 16-lane column blocks add_weighted_rows_heads sums at once per head


@intrinsic
def add_weighted_rows_heads(typingctx, out, p, v, kh, first, last):
    """add_weighted_rows for HEADS heads that read the same KV head: out[h, i] += Σ_s p[h, s] ·
    widen(v[s, kh, i]) for s = first..last in order, out (HEADS, hd), p (HEADS, S): each value
    row widened once for all of them, each element summed as add_weighted_rows sums it."""
    if not _heads_and_cache(out, v, (kh, first, last)) or not _heads_and_cache(p, v, ()):
        return None

    def codegen(context, builder, sig, args):
        n, pos = _head_rows(context, builder, sig, args, 0)
        _, pps = _head_rows(context, builder, sig, args, 1)
        head0, stride = _cache_row(context, builder, sig, args, 2, args[3])
        dtype = sig.args[2].dtype
        first, last = (_widest(builder, a, n.type) for a in args[4:6])
        end, one = builder.add(last, ir.Constant(n.type, 1)), ir.Constant(n.type, 1)

        def columns(start, lanes: int, vectors: int = 1):
            """Elements start..start + lanes·vectors of every head's out row, summed over the positions
            (each position's weight broadcast once for its `vectors` vectors)."""
            ty = _vec(F32, lanes) if lanes > 1 else F32
            slots = [[cgutils.alloca_once(builder, ty) for _ in range(vectors)] for _ in range(HEADS)]
            starts = [builder.add(start, ir.Constant(n.type, lanes * u)) for u in range(vectors)]
            for po, head in zip(pos, slots):
                for at, slot in zip(starts, head):
                    builder.store(builder.load(builder.bitcast(builder.gep(po, [at]), ty.as_pointer()), align=4), slot)
            with cgutils.for_range_slice(builder, first, end, one) as (s, _):
                row = builder.gep(head0, [builder.add(builder.mul(s, stride), start)])
                xs = [_widened(builder, row, ir.Constant(n.type, lanes * u), dtype, lanes) for u in range(vectors)]
                if lanes == 1:
                    xs = [_lane0(builder, x) for x in xs]
                for pp, head in zip(pps, slots):
                    weight = builder.load(builder.gep(pp, [s]))
                    if lanes > 1:
                        weight = builder.shuffle_vector(builder.insert_element(ir.Constant(ty, None), weight,
                                                                               ir.Constant(I32, 0)),
                                                        ir.Constant(ty, None), ir.Constant(_vec(I32, lanes), [0] * lanes))
                    for x, slot in zip(xs, head):
                        product = builder.fmul(weight, x, flags=_CONTRACT)
                        builder.store(builder.fadd(builder.load(slot), product, flags=_CONTRACT), slot)
            for po, head in zip(pos, slots):
                for at, slot in zip(starts, head):
                    builder.store(builder.load(slot), builder.bitcast(builder.gep(po, [at]), ty.as_pointer()), align=4)

        sixteen, wide = ir.Constant(n.type, 16), ir.Constant(n.type, 16 * WEIGHTED_VECTORS)
        broad = builder.mul(builder.sdiv(n, wide), wide)
        narrow = builder.mul(builder.sdiv(n, sixteen), sixteen)
        if WEIGHTED_VECTORS > 1:
            with cgutils.for_range_slice(builder, ir.Constant(n.type, 0), broad, wide) as (c, _):
                columns(c, 16, WEIGHTED_VECTORS)
        else:
            broad = ir.Constant(n.type, 0)
        with cgutils.for_range_slice(builder, broad, narrow, sixteen) as (c, _):
            columns(c, 16)
        with cgutils.for_range_slice(builder, narrow, n, one) as (c, _):
            columns(c, 1)
        return context.get_dummy_value()
    return types.none(out, p, v, kh, first, last), codegen
