"""The kernel table (engine/kernels/table.py) is the one list of what computes what: it must agree
with the formats the engine reads and with the integer and repacked formats cpu.py dispatches, and
every name in it must resolve. tests/test_kernels.py iterates it (each kernel against its twin at
its tolerance, stored and repacked, on every instruction path)."""
from __future__ import annotations

import pytest

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
        assert callable(table.resolve(k.driver)) and callable(table.resolve(k.twin)), k.op
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
    from engine.kernels import blocks32, kquants, simd, tiles
    assert {f.name for f in table.FORMATS} == set(table.int_formats())
    modules = {"simd": simd, "blocks32": blocks32, "kquants": kquants}
    for f in table.FORMATS:
        for op in table.OPS:
            fn = getattr(f, op).partition("(")[0]
            if fn:
                assert callable(getattr(tiles if op.startswith("tile") else modules[f.module], fn)), (f.name, op)
        assert bool(f.group) == (f.name in table.packed_formats()), f.name
        assert bool(f.tile_unpack) == (quant.get(f.name).type_id in cpu.TILE_CODES), f.name

