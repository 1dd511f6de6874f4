"""The kernel table (engine/kernels/table.py) is the one list of what computes what: it must agree
with the formats the engine reads and with the integer and repacked formats cpu.py dispatches, and
every name in it must resolve. tests/test_kernels.py iterates it (each kernel against its twin at
its tolerance, stored and repacked, on every instruction path)."""
from __future__ import annotations

import numpy as np
import pytest
from test_kernels import stored_matrix

from engine import quant
from engine.kernels import cpu, table


def test_every_stored_format_has_its_kernels():
    names = {t.name for t in quant._TYPES if t.base is None}  # (x8 types: their format's kernels, repacked)
    assert set(table.ALL) == names
    for op in ("matmul", "matmul_exact", "dequantize_row", "gather_rows"):
        assert {f for k in table.TABLE if k.op == op for f in k.formats} == names, op


def test_table_and_cpu_dispatch_agree():
    """The formats the table says are dotted in integers (and in 8-row groups) are exactly those
    cpu.INT_CODES (and cpu.PACKABLE) send to the integer kernels."""
    ids = lambda names: {quant.get(n).type_id for n in names}  # noqa: E731
    assert ids(table.int_formats()) == {c for c in cpu.INT_CODES if c < cpu.PACKED}
    assert ids(table.packed_formats()) == set(cpu.PACKABLE) == ids(quant.X8_REGIONS)  # (x8 layouts on disk)
    assert {c - cpu.PACKED for c in cpu.INT_CODES if c > cpu.PACKED} == set(cpu.PACKABLE)
    for code in cpu.INT_CODES:
        assert cpu.is_int_code(code), code
    for name in set(table.ALL) - set(table.int_formats()):
        assert not cpu.is_int_code(quant.get(name).type_id), name


def test_every_entry_resolves_and_is_well_formed():
    for k in table.TABLE:
        assert callable(table.resolve(k.driver)), k.op
        assert callable(table.resolve(k.twin)) if k.twin else k.note.startswith("no "), k.op  # none: the note says
        __import__(k.inner)
        assert set(k.layouts) <= set(table.LAYOUTS) and k.rtol >= 0 and k.atol >= 0
        assert set(k.paths) <= set(table.PATHS) or k.paths == ("any",)
    seen = [(k.op, f) for k in table.TABLE for f in k.formats or ("",)]
    assert len(seen) == len(set(seen))  # one entry per operation and format


def test_lookup_and_describe():
    assert table.lookup("matmul", "iq4_xs").inner == "engine.kernels.blocks32"
    assert table.lookup("rmsnorm").twin == "engine.kernels.reference:rmsnorm"
    assert table.describe("q4_k").startswith("kquants (") and table.describe("f16") == "formats (float)"
    with pytest.raises(KeyError, match="iq2_xxs"):
        table.lookup("matmul", "iq2_xxs")


def test_every_compiled_kernel_states_its_fastmath():
    """numba gives a function without its own fastmath flag the flags of whichever caller compiled
    it first (a parallel fastmath kernel, or none from Python), and its cache then serves that
    variant to every process (formats.quantize_activations, meant to round as its numpy twin, took
    the fused decode's fastmath whenever that compiled it first). So every kernel that is not
    inlined says which it is, and the first caller no longer decides."""
    import importlib
    import pkgutil

    import engine.kernels
    import engine.ops
    from numba.core.registry import CPUDispatcher
    loose = []
    for pkg in (engine.kernels, engine.ops):
        for info in pkgutil.iter_modules(pkg.__path__):
            if info.name == "cuda":
                continue
            mod = importlib.import_module(f"{pkg.__name__}.{info.name}")
            for name, f in vars(mod).items():
                if isinstance(f, CPUDispatcher) and f.__module__ == mod.__name__ and \
                        f.targetoptions.get("inline") != "always" and "fastmath" not in f.targetoptions:
                    loose.append(f"{mod.__name__}.{name}")
    assert not loose, loose


def test_a_callee_with_its_own_fastmath_is_not_lent_its_callers():
    """The mechanism the test above guards against, shown on numba itself: a callee compiled first
    under a fastmath caller takes its flags unless it states its own."""
    from numba import njit

    def make(own):
        kw = {"fastmath": False} if own else {}
        callee = njit(**kw)(lambda a, b: a * b + 1.0)
        caller = njit(fastmath=True)(lambda a, b: callee(a, b))
        caller(1.0, 2.0)
        return next(iter(callee.overloads.values())).library.get_llvm_str()
    lent, own = make(own=False), make(own=True)
    assert "fmul fast" in lent
    assert "fmul fast" not in own and "fadd fast" not in own


def test_dispatch_module_is_generated_from_the_format_rows():
    """engine/kernels/dispatch.py (the per-format if-chains every kernel inlines) is what the table's FORMATS
    rows generate: a format is added there, then `python -m engine.kernels.table` rewrites the module."""
    from pathlib import Path

    from engine.kernels import dispatch
    assert Path(dispatch.__file__).read_text() == table.dispatch_source(), "run: python -m engine.kernels.table"


def test_format_rows_are_the_integer_formats_and_their_functions_exist():
    from engine.kernels import blocks32, kquants, simd, tile_formats
    assert {f.name for f in table.FORMATS} == set(table.int_formats())
    modules = {"simd": simd, "blocks32": blocks32, "kquants": kquants}
    for f in table.FORMATS:
        for op in table.OPS:
            fn = getattr(f, op).partition("(")[0]
            if fn:
                assert callable(getattr(tile_formats if op.startswith("tile") else modules[f.module], fn)), (f.name, op)
        assert bool(f.group) == (f.name in table.packed_formats()), f.name
        assert bool(f.tile_unpack) == (quant.get(f.name).type_id in cpu.TILE_CODES), f.name


# ---- every row of the table against its twin at its tolerance ----------------------------------------------
# tests/test_kernels.py and tests/test_kernels_tiles.py iterate these operations (every format, layout and
# instruction path); the cases below take the rest.
ELSEWHERE = {"matmul", "matmul_exact", "dequantize_row", "gather_rows", "quantize_activations",
             "quantize_activations_k", "rmsnorm", "rope", "swiglu", "attention", "store_f16", "softmax_top_k",
             "swiglu_int"}


def _int_case(k, fmt: str, layout: str):
    """A stored (or repacked) matrix of fmt and decode-sized x: the driver's output, the twin's."""
    n, rows, T = 512, 48, 2
    code = quant.get(fmt).type_id
    ws = [stored_matrix(fmt, rows, n, seed=s) for s in (1, 2)]
    x = np.random.default_rng(3).standard_normal((T, n)).astype(np.float32)
    want = table.resolve(k.twin)(ws[0], fmt, x) if k.op == "matmul_int" else table.resolve(k.twin)(ws, fmt, x)
    if layout == "x8":
        ws = [w.copy() for w in ws]
        for w in ws:
            cpu.repack_x8(w, code)
        code += cpu.PACKED
    out = np.full((T, rows), np.nan, np.float32)
    if k.op == "matmul_int":
        table.resolve(k.driver)((ws[0],), (code,), x, (out,))
    else:
        table.resolve(k.driver)(ws[0], code, ws[1], code, x, out)
    return out, want


def _attention(kernel, twin):
    from engine.ops import attention as att
    rng = np.random.default_rng(1)
    T, S, H, KVH, hd = 4, 9, 6, 2, 20
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    k, v = (rng.standard_normal((S, KVH, hd)).astype(np.float32) for _ in range(2))
    kpos = rng.permutation(np.r_[np.arange(S - 1), -1]).astype(np.int64)  # ring order, one empty slot
    qpos = np.arange(S - 1 - T, S - 1, dtype=np.int64) + 1
    sinks = rng.standard_normal(H).astype(np.float32)
    assert kernel is att.attention  # (reached through attend, which lays out its arguments)
    return att.attend(q, k, v, qpos, kpos, 0.3, 4, sinks, 5.0), twin(q, k, v, qpos, kpos, 0.3, 4, sinks, 5.0)


def _rope(kernel, twin):
    from engine.ops import rope
    x = np.random.default_rng(0).standard_normal((5, 3, 24)).astype(np.float32)
    cos, sin = rope.tables(rope.default_inv_freq(1e4, 24, 0.25), np.arange(7, 12))
    y = x.copy()
    kernel(y, cos, sin)
    return y, twin(x, cos, sin)


def _conv(kernel, twin):
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((11, 7)).astype(np.float32), rng.standard_normal((7, 4)).astype(np.float32)
    state, out = np.zeros((3, 7), np.float32), np.empty((11, 7), np.float32)
    kernel(x, w, state, True, out)
    want, want_state = twin(x, w, np.zeros((3, 7), np.float32), True)
    return np.concatenate([out, state]), np.concatenate([want, want_state])


def _delta(kernel, twin):
    from engine.ops import deltanet
    rng = np.random.default_rng(3)
    T, Hk, Hv, dk, dv = 13, 2, 4, 20, 12
    q, k = (rng.standard_normal((T, Hk, dk)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((T, Hv, dv)).astype(np.float32)
    g, beta = -rng.uniform(0.05, 2, (T, Hv)).astype(np.float32), rng.uniform(0, 1, (T, Hv)).astype(np.float32)
    s0 = rng.standard_normal((Hv, dk, dv)).astype(np.float32) * 0.1
    s, out = s0.copy(), np.empty((T, Hv, dv), np.float32)
    kernel(q, k, v, g, beta, s, False, deltanet.work_for(Hv, dk, dv), out)
    want, want_s = twin(q, k, v, g, beta, s0)
    return np.concatenate([out.ravel(), s.ravel()]), np.concatenate([want.ravel(), want_s.ravel()])


def _biased_swiglu(kernel, twin):
    rng = np.random.default_rng(3)
    g, u = (rng.normal(0, 6, (3, 21)).astype(np.float32) for _ in range(2))
    gb, ub = (rng.normal(0, 2, 21).astype(np.float32) for _ in range(2))
    out = np.empty_like(g)
    kernel(g, u, gb, ub, np.float32(1.702), np.float32(7.0), out)
    gu = np.empty((3, 42), np.float32)
    gu[:, 0::2], gu[:, 1::2] = g + gb, u + ub
    return out, twin(gu, 1.702, 7.0)


def _gelu_mul(kernel, twin):
    rng = np.random.default_rng(7)
    g = np.concatenate([np.linspace(-12, 12, 111), rng.normal(0, 3, 111)]).astype(np.float32).reshape(6, 37)
    u = rng.normal(0, 2, g.shape).astype(np.float32)
    out = np.empty_like(g)
    kernel(g, u, out)
    return out, twin(g) * u


CASES = {"ops.attention": _attention, "ops.rope": _rope, "causal_conv": _conv, "delta_rule": _delta,
         "biased_clamped_swiglu": _biased_swiglu, "gelu_mul": _gelu_mul}
INT_CASES = {"matmul_int", "swiglu_int_decode"}
ROWS = [(k, f, lay) for k in table.TABLE if k.op in INT_CASES for f in k.formats for lay in k.layouts
        if lay == "stored" or f in table.packed_formats()]


def test_every_row_with_a_twin_is_held_to_it():
    for k in table.TABLE:
        assert not k.twin or k.op in ELSEWHERE or k.op in CASES or k.op in INT_CASES, k.op


@pytest.mark.parametrize("op", sorted(CASES))
def test_weightless_kernel_matches_its_twin(op):
    k = table.lookup(op)
    got, want = CASES[op](table.resolve(k.driver), table.resolve(k.twin))
    np.testing.assert_allclose(got, want, rtol=k.rtol, atol=k.atol * np.abs(want).max())


@pytest.mark.parametrize("k,fmt,layout", ROWS, ids=[f"{k.op}-{f}-{lay}" for k, f, lay in ROWS])
def test_integer_kernel_matches_its_twin(k, fmt, layout):
    got, want = _int_case(k, fmt, layout)
    np.testing.assert_allclose(got, want, rtol=k.rtol, atol=k.atol * np.abs(want).max())
