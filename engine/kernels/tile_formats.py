"""The per-format code of the prefill tiles (tiles.py): intrinsics that unpack an 8-row group of
Q4_K, Q5_K, Q6_K or IQ4_XS into a tile, and that dot a tile with TOKENS tokens. The generated
dispatch (dispatch.tile_unpack, dispatch.tile_dot) picks among them; tiles.py drives them.

The group kernels (kquants.py, blocks32.py) unpack the 4/5/6-bit codes and six-bit scales of a
super-block for every TOKENS tokens; over a 512-token prompt that is 128 times per weight. Here
it happens once per group and prompt, so the inner loop is q8_0's: per 32-block and token, 8
vpdpbusd of 4 broadcast activation bytes into the rows' lanes, then one multiply-add. From
TILE_MIN_T tokens on (matmul.py); below that the unpacking costs more than it saves.

A tile holds R = ROWS rows: 16 (two 8-row groups side by side, one 512-bit vector per chunk)
where simd.WIDE, else 8 (one group, 256-bit vectors). Layout (nb = n / 32 activation blocks):
  tq  uint8 (nb · 32R,): block b at 32Rb, chunk c (weights 4c..4c+3) at +4Rc, row i at +4i:
      unsigned codes (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63), or IQ4_XS's grid values as
      grid + 128 (vnni, generic: summed from -128·Σq_x) or as signed bytes (avx2: vpsignb);
  ta  float32 (nb · 2R,): per block the R rows' sub-block scales sc_j (Q4_K, Q5_K, as int32 bits),
      d·(ls - 32) (IQ4_XS), or Q6_K's int8 scales of its two sub-blocks of 16 as int32 bits
      (R of the first, then R of the second);
  tb  float32 (nb · R,): the minimums m_j (Q4_K, Q5_K, as int32 bits);
  td  float32 (nb / 8 · 2R,): per super-block the R rows' d, then dmin.
Group 2p + h of a 16-row tile fills rows 8h..8h+7 (an odd last group: the other half is zero).
The K-quants' integer sums are the group kernels' (kquants._group_k) and each super-block ends in
the same float steps (kquants.super_block_total); IQ4_XS's float steps are blocks32._group32's in the
same order, lane by lane; all _EXACT there and here, so a token's products are the decode kernels'
bit for bit.

"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

import engine.kernels.ready  # noqa: F401  (engine.kernels.setup() first: fails otherwise)
from engine.kernels import blocks32, simd
from engine.kernels.kquants import Q4_K, Q5_K, Q6_K, _at, _k_scales8, _q6k_parts, _q45k_parts, super_block_total
from engine.kernels.simd import _EXACT, _ZERO, F32, I8, I32, TOKENS, _byte_ptr, _data_ptr, _dot_accumulate, _load, _vec

IQ4_XS = blocks32.IQ4_XS
TILE_CODES = (Q4_K, Q5_K, Q6_K, IQ4_XS)
_SIGNED = simd.DOT == "avx2"  # IQ4_XS's tile: signed grid values (vpsignb) instead of grid + 128
ROWS = 16 if simd.WIDE else 8  # rows of a tile (module docstring)


def _splat(builder, v, lanes: int):
    """A scalar in every lane of a <lanes x type(v)>."""
    vt = _vec(v.type, lanes)
    return builder.shuffle_vector(builder.insert_element(ir.Constant(vt, None), v, ir.Constant(I32, 0)),
                                  ir.Constant(vt, None), ir.Constant(_vec(I32, lanes), [0] * lanes))


def _broadcast_word(builder, qp, off, lanes: int):
    """4 activation bytes at qp + off in every 4-byte lane of a <4·lanes x i8>."""
    word = builder.load(builder.bitcast(_at(builder, qp, off), I32.as_pointer()), align=1)
    return builder.bitcast(_splat(builder, word, lanes), _vec(I8, 4 * lanes))


def _store(builder, ptr, v):
    builder.store(v, builder.bitcast(ptr, v.type.as_pointer()), align=1)


def _unpack(code: int):
    """An intrinsic unpack(w, g, h, tq, ta, tb, td): rows 8g..8g+7 of a repacked matrix (kquants.repack_k8,
    blocks32.repack32 for IQ4_XS) -> rows 8h..8h+7 of the tile (module docstring), super-block by super-block."""
    R = ROWS

    @intrinsic
    def unpack(typingctx, w, g, h, tq, ta, tb, td):
        def codegen(context, builder, sig, args):
            wty, _, _, qty, aty, bty, dty = sig.args
            g = args[1]
            base = _byte_ptr(context, builder, wty, args[0], builder.mul(g, ir.Constant(g.type, 8)), _ZERO)
            h8 = builder.mul(args[2], ir.Constant(args[2].type, 8))  # the group's first row in the tile
            qp = builder.gep(_data_ptr(context, builder, qty, args[3], I8), [builder.mul(h8, ir.Constant(h8.type, 4))])
            ap, bp, dp = (builder.gep(_data_ptr(context, builder, ty, a, F32), [h8])
                          for ty, a in zip((aty, bty, dty), args[4:]))
            n = cgutils.unpack_tuple(builder, context.make_array(qty)(context, builder, args[3]).shape, 1)[0]
            vf, vi = _vec(F32, 8), _vec(I32, 8)
            gsize = 8 * {Q4_K: 144, Q5_K: 176, Q6_K: 210, IQ4_XS: 136}[code]
            with cgutils.for_range(builder, builder.sdiv(n, ir.Constant(n.type, 256 * R))) as loop:
                sb = loop.index
                blk = builder.gep(base, [builder.mul(sb, ir.Constant(sb.type, gsize))])
                q0 = builder.gep(qp, [builder.mul(sb, ir.Constant(sb.type, 256 * R))])
                a0 = builder.gep(ap, [builder.mul(sb, ir.Constant(sb.type, 16 * R))])
                b0 = builder.gep(bp, [builder.mul(sb, ir.Constant(sb.type, 8 * R))])
                d0 = builder.gep(dp, [builder.mul(sb, ir.Constant(sb.type, 2 * R))])
                if code == Q6_K:
                    _store(builder, d0, builder.fpext(_load(builder, _at(builder, blk, 1664), _vec(ir.HalfType(), 8)), vf))
                    for half in range(2):
                        for s in range(4):
                            j = 4 * half + s
                            for part in range(2):
                                for c, (v, _) in enumerate(_q6k_parts(builder, blk, half, s, part)):
                                    _store(builder, _at(builder, q0, 32 * R * j + 4 * R * (4 * part + c)), v)
                                sc = builder.sext(_load(builder, _at(builder, blk, 1536 + 8 * (2 * j + part)), _vec(I8, 8)), vi)
                                _store(builder, _at(builder, a0, 2 * R * j + R * part), sc)
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
                        _store(builder, _at(builder, a0, 2 * R * j), builder.fmul(d8, builder.sitofp(ls, vf), flags=_EXACT))
                        _store(builder, _at(builder, b0, R * j), ir.Constant(vf, None))
                        for c in range(4):  # sub-block j's quant chunk c: bytes 4c..4c+3 of each row's 16
                            v = _load(builder, _at(builder, blk, 64 + 128 * j + 32 * c), _vec(I8, 32))
                            for high, idx in enumerate((builder.and_(v, low), builder.lshr(v, four))):
                                _store(builder, _at(builder, q0, 32 * R * j + 4 * R * (c + 4 * high)),
                                       blocks32._lookup(builder, idx, table))
                else:
                    _store(builder, d0, builder.fpext(_load(builder, blk, _vec(ir.HalfType(), 8)), vf))
                    _store(builder, _at(builder, d0, R), builder.fpext(_load(builder, _at(builder, blk, 16), _vec(ir.HalfType(), 8)), vf))
                    scales, ms = _k_scales8(builder, blk, 32)
                    qh_at, qs_at = (128, 384) if code == Q5_K else (None, 128)
                    for q in range(4):
                        for j, parts in zip((2 * q, 2 * q + 1), _q45k_parts(builder, blk, qs_at, qh_at, q)):
                            for c, (v, _) in enumerate(parts):
                                _store(builder, _at(builder, q0, 32 * R * j + 4 * R * c), v)
                            _store(builder, _at(builder, a0, 2 * R * j), builder.zext(scales[j], vi))
                            _store(builder, _at(builder, b0, R * j), builder.zext(ms[j], vi))
            return context.get_dummy_value()
        return types.none(w, types.intp, types.intp, tq, ta, tb, td), codegen
    return unpack


_unpack_q4_k, _unpack_q5_k, _unpack_q6_k, _unpack_iq4_xs = (_unpack(c) for c in TILE_CODES)


def _tile_tokens(kind: str):
    """An intrinsic dotting a tile (R = ROWS rows) with tokens t0..t0+TOKENS-1 of (T, n) int8 activations:
    R float32 per token into res (TOKENS · R,), token by token. kind: "k" (Q4_K, Q5_K; reads xi),
    "q6" (Q6_K; xs is the offsets (T, n/16) int32), "grid" (IQ4_XS). Each block's 8 weight vectors
    are loaded once for the TOKENS tokens; per token the float steps of the group kernel."""
    R = ROWS
    def typer(tq, ta, tb, td, xq, xd, xs, xi, t0, res):
        def codegen(context, builder, sig, args):
            qp = _data_ptr(context, builder, sig.args[0], args[0], I8)
            ap = _data_ptr(context, builder, sig.args[1], args[1], F32)
            bp = _data_ptr(context, builder, sig.args[2], args[2], F32)
            tdp = _data_ptr(context, builder, sig.args[3], args[3], F32)
            rest = (sig.return_type, types.intp, *sig.args[4:])  # (w, g) stand-ins for _token_pointers
            nb, per_token = simd._token_pointers(context, builder, types.none(*rest), (None, None, *args[4:]), TOKENS)
            vf, vi = _vec(F32, R), _vec(I32, R)
            accs = [cgutils.alloca_once_value(builder, ir.Constant(vf, None)) for _ in range(TOKENS)]
            sub = 1 if kind == "grid" else 8  # blocks per step: IQ4_XS adds each block, the K-quants each super-block

            def block(b, sums, mins):
                """Block b's R rows · every token: into sums[k] (IQ4_XS: floats), or the super-block's
                integer sums[k] (Σ sc_j Σ q_w q_x; Q6_K with its offsets) and mins[k] (Σ m_j Σq_x)."""
                wp = builder.gep(qp, [builder.mul(b, ir.Constant(b.type, 32 * R))])
                vs = [_load(builder, _at(builder, wp, 4 * R * c), _vec(I8, 4 * R)) for c in range(8)]
                signs = None
                if kind == "grid" and _SIGNED:
                    signs, vs = vs, [simd._weights_of(builder, v)[0] for v in vs]
                a16 = builder.gep(ap, [builder.mul(b, ir.Constant(b.type, 2 * R))])
                if kind == "q6":
                    sc = [_load(builder, builder.bitcast(_at(builder, a16, R * p), I32.as_pointer()), vi) for p in range(2)]
                elif kind == "k":
                    sc8 = _load(builder, builder.bitcast(a16, I32.as_pointer()), vi)
                    m8 = _load(builder, builder.bitcast(builder.gep(bp, [builder.mul(b, ir.Constant(b.type, R))]),
                                                        I32.as_pointer()), vi)
                else:
                    a8 = _load(builder, a16, vf)
                for k, (xqp, dp, sp, ip) in enumerate(per_token):
                    x32 = builder.gep(xqp, [builder.mul(b, ir.Constant(b.type, 32))])
                    words = []
                    for c in range(8):
                        s = _broadcast_word(builder, x32, 4 * c, R)
                        words.append(blocks32._psign(builder, s, signs[c]) if signs is not None else s)
                    if kind == "q6":  # Σ (q - 32) x per sub-block of 16 (from -32 Σx), times its scale, in integers
                        op = builder.bitcast(sp, I32.as_pointer())
                        for part in range(2):
                            at = builder.add(builder.mul(b, ir.Constant(b.type, 2)), ir.Constant(b.type, part))
                            dots = _splat(builder, builder.load(builder.gep(op, [at])), R)
                            for c in range(4 * part, 4 * part + 4):
                                dots = _dot_accumulate(builder, dots, vs[c], words[c])
                            sums[k] = builder.add(sums[k], builder.mul(dots, sc[part]))
                        continue
                    chains = [ir.Constant(vi, None), ir.Constant(vi, None)]  # two chains: vpdpbusd's latency
                    if kind == "grid" and not _SIGNED:  # grid + 128: - 128 Σx
                        chains[0] = _splat(builder, builder.mul(builder.load(builder.gep(ip, [b])), ir.Constant(I32, -128)), R)
                    for c in range(8):
                        chains[c % 2] = _dot_accumulate(builder, chains[c % 2], vs[c], words[c])
                    dots = builder.add(chains[0], chains[1])
                    if kind == "k":
                        sums[k] = builder.add(sums[k], builder.mul(dots, sc8))
                        mins[k] = builder.add(mins[k], builder.mul(m8, _splat(builder, builder.load(builder.gep(ip, [b])), R)))
                    else:
                        f = builder.fmul(a8, _splat(builder, builder.load(builder.gep(dp, [b])), R), flags=_EXACT)
                        sums[k] = builder.fadd(sums[k], builder.fmul(builder.sitofp(dots, vf), f, flags=_EXACT),
                                               flags=_EXACT)  # (IQ4_XS: d·(ls - 32) · d_x)

            with cgutils.for_range(builder, builder.sdiv(nb, ir.Constant(nb.type, sub))) as loop:
                if kind == "grid":
                    sums = [builder.load(acc) for acc in accs]
                    block(loop.index, sums, None)
                    for acc, v in zip(accs, sums):
                        builder.store(v, acc)
                else:
                    sb = loop.index
                    sums = [ir.Constant(vi, None)] * TOKENS
                    mins = [ir.Constant(vi, None)] * TOKENS
                    b0 = builder.mul(sb, ir.Constant(sb.type, 8))
                    for j in range(8):
                        block(builder.add(b0, ir.Constant(sb.type, j)), sums, mins)
                    d16 = builder.gep(tdp, [builder.mul(sb, ir.Constant(sb.type, 2 * R))])
                    d8 = _load(builder, d16, vf)
                    dmin8 = _load(builder, _at(builder, d16, R), vf) if kind == "k" else None
                    for k, (_, dp, _, _) in enumerate(per_token):
                        total = super_block_total(builder, d8, dmin8, builder.load(builder.gep(dp, [b0])), sums[k], mins[k])
                        builder.store(builder.fadd(builder.load(accs[k]), total, flags=_EXACT), accs[k])
            rp = _data_ptr(context, builder, sig.args[9], args[9], F32)
            for k, acc in enumerate(accs):
                _store(builder, _at(builder, rp, R * k), builder.load(acc))
            return context.get_dummy_value()
        return types.none(tq, ta, tb, td, xq, xd, xs, xi, types.intp, res), codegen

    @intrinsic
    def tile_tokens(typingctx, tq, ta, tb, td, xq, xd, xs, xi, t0, res):
        return typer(tq, ta, tb, td, xq, xd, xs, xi, t0, res)
    return tile_tokens


_tile_k, _tile_q6, _tile_grid = (_tile_tokens(k) for k in ("k", "q6", "grid"))
