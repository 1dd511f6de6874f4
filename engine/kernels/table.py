"""The kernel table: one place that lists each operation the forward pass calls -> its kernel per
weight format, layout and instruction path -> its numpy twin -> the tolerance its test holds it to;
and each integer format -> its inner function per operation, from which engine/kernels/dispatch.py
(the per-format `if code == ...` chains every kernel inlines) is generated.

Why: the per-format kernels are spread over simd.py (q4_0/q4_1/q8_0), blocks32.py (q5_x, iq4_nl,
mxfp4, iq4_xs), kquants.py (q2_k..q6_k), tiles.py (q4_k..q6_k and iq4_xs prefill from TILE_MIN_T tokens on),
formats.py (dequantize, repacking), matmul.py (the parallel drivers), smallops.py and engine/ops (norm,
rope, attention, DeltaNet, convolutions, feed-forwards); this table says which code computes what, the
tests iterate it (each kernel against its twin at its tolerance: tests/test_kernels.py,
tests/test_kernel_table.py), and tools (the profiler's per-op timing hook, stats) read its operation
names instead of replacing engine functions at run time. A new format is one FORMATS row plus its kernel.

Names are dotted paths ("module:function"), resolved on demand (`resolve`), so importing the table
compiles nothing. Tolerances: out ≈ twin within rtol, and atol times max|twin| (0, 0: bit for bit).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

PATHS = ("vnni", "avx2", "generic")  # simd.DOT: the byte dot-product instructions
LAYOUTS = ("stored", "x8")  # rows as in the file; repacked in 8-row groups at load (formats.repack_x8)


@dataclass(frozen=True)
class Kernel:
    """One operation on a set of weight formats: which driver runs it, where the per-format inner
    code lives, its numpy twin, the tolerance, the layouts and instruction paths it is tested on."""
    op: str
    formats: tuple[str, ...]  # engine.quant names; () for an operation that reads no weights
    driver: str  # the numba kernel the engine calls
    inner: str  # the module with the per-format code (the vector intrinsics)
    twin: str  # the numpy twin ("": none; the note says what the kernel is held to instead)
    rtol: float
    atol: float  # times max|twin|
    layouts: tuple[str, ...] = ("stored",)
    paths: tuple[str, ...] = ("any",)  # PATHS it has code for, or "any" (plain numba loops)
    note: str = ""


# --- The per-format dispatch of the integer kernels, generated into engine/kernels/dispatch.py.
# numba compiles an `if code == ...` chain per dispatcher; writing those chains by hand in every
# module repeated each format a dozen times. Here each format is one row naming its inner function
# per operation ("" where it has none); dispatch_source() writes the chains from these rows, in row
# order, and tests/test_kernel_table.py fails when the committed dispatch.py differs from it
# (`python -m engine.kernels.table` rewrites it). numba cannot cache functions made by exec at import,
# hence a committed file. A new format: its row here, its kernel in its module, then regenerate.

@dataclass(frozen=True)
class Format:
    """One format dotted with int8 activations: the module holding its code, whether its rows read
    activations per 256 (llama.cpp's Q8_K) rather than per 32, and its inner function per operation."""
    name: str  # engine.quant name
    module: str  # simd | blocks32 | kquants: where row..pair8 live (the tile functions: tile_formats.py)
    per_256: bool = False
    row: str = ""  # a stored row · one token
    tokens: str = ""  # a stored row · TOKENS tokens ("": a token at a time through row)
    group: str = ""  # an 8-row group (repacked at load) · one token; "": not repackable
    group_tokens: str = ""  # an 8-row group · TOKENS tokens
    pair: str = ""  # two 8-row groups · TOKENS tokens (512-bit vectors)
    pair8: str = ""  # two 8-row groups · PAIR_TOKENS tokens
    tile_unpack: str = ""  # prefill from TILE_MIN_T tokens on: 8-row groups into a tile (tile_formats.py)
    tile_dot: str = ""  # a tile · TOKENS tokens ("name(args)" where its arguments differ)


def _blocks32(name: str, per_256: bool = False, **tiles: str) -> Format:
    return Format(name, "blocks32", per_256, f"row_dot_{name}", f"tokens_{name}", f"group_{name}",
                  f"group_tokens_{name}", **tiles)


def _kquant(name: str, **tiles: str) -> Format:
    return Format(name, "kquants", True, f"_row_{name}", "", f"_group_{name}", f"_tokens_{name}", **tiles)


def _simd(name: str) -> Format:
    return Format(name, "simd", False, f"row_dot_{name}", f"tokens_{name}", f"group_dot_{name}x8",
                  f"group_tokens_{name}x8", f"pair_tokens_{name}x8", f"pair8_tokens_{name}x8")


FORMATS: tuple[Format, ...] = (  # the chains test in this order; each chain's last format is its fallback
    _blocks32("q5_0"), _blocks32("q5_1"), _blocks32("iq4_nl"),
    _blocks32("iq4_xs", True, tile_unpack="_unpack_iq4_xs", tile_dot="_tile_grid"),
    _blocks32("mxfp4"),
    _kquant("q4_k", tile_unpack="_unpack_q4_k", tile_dot="_tile_k"),
    Format("q2_k", "kquants", True, "_row_q2_k"), Format("q3_k", "kquants", True, "_row_q3_k"),
    _kquant("q5_k", tile_unpack="_unpack_q5_k", tile_dot="_tile_k"),
    _kquant("q6_k", tile_unpack="_unpack_q6_k", tile_dot="_tile_q6(tq, ta, tb, td, xq, xd, offsets, xi, t0, res)"),
    _simd("q4_1"), _simd("q4_0"), _simd("q8_0"),
)

INT_SIMD = tuple(f.name for f in FORMATS if f.module == "simd")
INT_BLOCKS32 = tuple(f.name for f in FORMATS if f.module == "blocks32")
INT_KQUANTS = tuple(f.name for f in FORMATS if f.module == "kquants" and f.group)
INT_LOW_K = tuple(f.name for f in FORMATS if f.module == "kquants" and not f.group)  # stored rows only
FLOATS = ("f32", "f16", "bf16")
INT = INT_SIMD + INT_BLOCKS32 + INT_LOW_K + INT_KQUANTS
ALL = FLOATS + INT

TABLE: tuple[Kernel, ...] = (
    # --- x @ W.T with int8 activations (decode, prefill; matmul_int, swiglu_int, moe_int, tiles.swiglu_tiles and
    # the one-call decode reach the same inner code through dispatch.py: int_dot / group_dot / tokens_dot / group_tokens)
    Kernel("matmul", INT_SIMD, "engine.kernels.matmul:matmul", "engine.kernels.simd", "engine.kernels.reference:matmul_int",
           1e-5, 1e-5, LAYOUTS, PATHS, "per block d_w·d_x·Σ q_w q_x (+ m_w·s_x, - 8·d·Σq_x)"),
    Kernel("matmul", INT_BLOCKS32, "engine.kernels.matmul:matmul", "engine.kernels.blocks32",
           "engine.kernels.blocks32:matmul_reference", 1e-5, 1e-5, LAYOUTS, PATHS,
           "16-entry grids through vpshufb; q5_x's fifth bits; iq4_xs sub-blocks as iq4_nl blocks (x8 prefill: tiles.py)"),
    Kernel("matmul", INT_KQUANTS, "engine.kernels.matmul:matmul", "engine.kernels.kquants",
           "engine.kernels.reference:matmul_int_k", 1e-5, 1e-5, LAYOUTS, PATHS, "sub-block scales per 32 (Q6_K: 16); x8 prefill: tiles.py"),
    Kernel("matmul", INT_LOW_K, "engine.kernels.matmul:matmul", "engine.kernels.kquants",
           "engine.kernels.reference:matmul_int_low_k", 1e-5, 1e-5, ("stored",), PATHS,
           "2-bit weights, scales applied in integers per 16"),
    Kernel("matmul", FLOATS, "engine.kernels.matmul:matmul", "engine.kernels.formats", "engine.kernels.reference:matmul",
           1e-5, 1e-5, ("stored",), ("any",), "rows dequantized 4 at a time, float dots"),
    Kernel("swiglu_int", INT_KQUANTS + ("iq4_xs",), "engine.kernels.tiles:swiglu_tiles", "engine.kernels.tiles",
           "engine.kernels.reference:swiglu_int", 1e-4, 1e-5, ("x8",), PATHS,
           "prefill (TILE_MIN_T tokens on): gate and up tiles dotted in one pass, each product matmul's bit for bit"),
    # --- the same product with float activations (the `exact` switch, and every format's fallback)
    Kernel("matmul_exact", ALL, "engine.kernels.matmul:matmul", "engine.kernels.formats", "engine.kernels.reference:matmul",
           1e-5, 1e-5, ("stored",), ("any",), "dequantize_row, then float dots"),
    Kernel("dequantize_row", ALL, "engine.kernels.formats:dequantize_row", "engine.kernels.formats", "engine.quant:dequantize",
           0.0, 0.0, ("stored",), ("any",), "bit for bit (gguf.quants equals the twin: tests/test_quant.py)"),
    Kernel("gather_rows", ALL, "engine.kernels.formats:gather_rows", "engine.kernels.formats", "engine.quant:dequantize",
           0.0, 0.0, LAYOUTS, ("any",), "the embedding lookup; repacked tables read back exactly"),
    Kernel("quantize_activations", (), "engine.kernels.formats:quantize_activations", "engine.kernels.simd",
           "engine.kernels.reference:quantize_activations", 0.0, 0.0, note="llama.cpp's Q8_1, bit for bit"),
    Kernel("quantize_activations_k", (), "engine.kernels.formats:quantized_for", "engine.kernels.formats",
           "engine.kernels.reference:quantize_activations_k", 0.0, 0.0,
           note="llama.cpp's Q8_K (per 256), read by the K-quants and IQ4_XS (formats.per_256); bit for bit"),
    # --- small float operations
    Kernel("rmsnorm", (), "engine.kernels.smallops:rmsnorm", "engine.kernels.rows", "engine.kernels.reference:rmsnorm",
           1e-5, 1e-6),
    Kernel("rope", (), "engine.kernels.smallops:rope", "engine.kernels.rows", "engine.kernels.reference:rope", 1e-5, 1e-6),
    Kernel("swiglu", (), "engine.kernels.smallops:swiglu", "engine.kernels.rows", "engine.kernels.reference:swiglu",
           1e-5, 1e-6),
    Kernel("attention", (), "engine.kernels.smallops:attention", "engine.kernels.float_rows",
           "engine.kernels.reference:attention", 1e-5, 1e-5, note="f32, f16 and int8 KV caches"),
    Kernel("store_f16", (), "engine.kernels.smallops:store_f16", "engine.kernels.simd", "engine.kernels.reference:store_f16",
           0.0, 0.0, note="the f16 KV cache's write, bit for bit"),
    Kernel("softmax_top_k", (), "engine.kernels.smallops:softmax_top_k", "engine.kernels.smallops",
           "engine.kernels.reference:softmax_top_k", 1e-6, 0.0, note="ids exactly (ties: the lower id)"),
    # --- the decode-sized integer kernels (T <= INT_MAX_T): x quantized once for several products
    Kernel("matmul_int", INT, "engine.kernels.matmul:matmul_int", "engine.kernels.dispatch",
           "engine.kernels.reference:int_product", 1e-5, 1e-5, LAYOUTS, PATHS,
           "q, k and v in one parallel loop; x8: the repackable formats"),
    Kernel("swiglu_int_decode", INT, "engine.kernels.matmul:swiglu_int", "engine.kernels.dispatch",
           "engine.kernels.reference:swiglu_int", 1e-4, 1e-5, LAYOUTS, PATHS, "gate and up in one pass, x quantized once"),
    Kernel("moe_int", INT, "engine.kernels.matmul:moe_int", "engine.kernels.dispatch", "", 1e-3, 2e-3, LAYOUTS, PATHS,
           "no numpy twin of its own: tests/test_kernels.py::test_moe_experts_in_one_call_match_numpy composes "
           "reference.matmul_int and swiglu expert by expert (q4_0, q4_1, q8_0)"),
    # --- one call per decoded token (engine.models.fused, engine.batch)
    Kernel("decode_layers", (), "engine.kernels.decode:decode_layers", "engine.kernels.decode", "", 0.0, 0.0,
           note="no numpy twin: bit for bit with the layered forward on every architecture "
                "(tests/test_fused_decode.py), whose kernels have theirs"),
    Kernel("decode_rows", (), "engine.kernels.batched:decode_rows", "engine.kernels.batched", "", 0.0, 0.0,
           note="no numpy twin: each row bit for bit with decode_layers alone (tests/test_batch.py)"),
    # --- engine/ops: the blocks of the 2025-26 architectures (attention sinks and softcap, partial rotary, DeltaNet,
    # short convolutions, gpt-oss and Gemma 4 feed-forwards, a prompt's tokens per expert)
    Kernel("ops.attention", (), "engine.ops.attention:attention", "engine.ops.attention",
           "engine.ops.attention:attention_ref", 0.0, 1e-6, note="window, sinks, softcap; caches in ring order"),
    Kernel("ops.rope", (), "engine.ops.rope:rope", "engine.ops.rope", "engine.ops.rope:rope_ref", 0.0, 1e-6,
           note="partial rotary: the other dims pass through"),
    Kernel("causal_conv", (), "engine.ops.conv:causal_conv", "engine.ops.conv", "engine.ops.conv:causal_conv_ref",
           0.0, 1e-6, note="its state carried from chunk to chunk"),
    Kernel("delta_rule", (), "engine.ops.deltanet:delta_rule", "engine.ops.deltanet",
           "engine.ops.deltanet:delta_rule_ref", 0.0, 1e-5, note="gated DeltaNet, value heads grouped or tiled"),
    Kernel("biased_clamped_swiglu", (), "engine.ops.ffn:biased_clamped_swiglu", "engine.ops.ffn",
           "engine.ops.ffn:clamped_swiglu_ref", 1e-6, 1e-6, note="the twin reads (gate + bias, up + bias) interleaved"),
    Kernel("gelu_mul", (), "engine.ops.ffn:gelu_mul", "engine.ops.ffn", "engine.ops.ffn:gelu_tanh", 1e-6, 1e-9,
           note="twin: gelu_tanh(gate) · up"),
    Kernel("take_rows", (), "engine.ops.ffn:take_rows", "engine.ops.ffn", "", 0.0, 0.0,
           note="no twin function: numpy's h[rows], bit for bit (tests/test_kernels.py::"
                "test_expert_gather_and_scatter_are_numpys)"),
    Kernel("add_weighted_rows", (), "engine.ops.ffn:add_weighted_rows", "engine.ops.ffn", "", 0.0, 0.0,
           note="no twin function: numpy's out[rows] += w · y, bit for bit (the same test)"),
)


def int_formats() -> tuple[str, ...]:
    """Formats dotted with int8 activations (the "matmul" entries that are not float)."""
    return tuple(f for k in TABLE if k.op == "matmul" and k.twin != "engine.kernels.reference:matmul"
                 for f in k.formats)


def packed_formats() -> tuple[str, ...]:
    """Formats with 8-row group kernels (repacked at load)."""
    return tuple(f for k in TABLE if k.op == "matmul" and "x8" in k.layouts for f in k.formats)


def lookup(op: str, fmt: str = "") -> Kernel:
    """The entry computing `op` on weights in format `fmt` (engine.quant name; "" for weightless ops)."""
    for k in TABLE:
        if k.op == op and (fmt in k.formats or (not fmt and not k.formats)):
            return k
    raise KeyError(f"kernel table: no entry for operation {op!r}" + (f" on {fmt} weights" if fmt else ""))


def resolve(name: str) -> Any:
    """"module:function" -> the function (importing its module, which may compile kernels)."""
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)


def describe(fmt: str) -> str:
    """What runs for x @ W.T on `fmt` weights in this process: e.g. "blocks32 (vnni)"."""
    from engine.kernels import simd
    k = lookup("matmul", fmt)
    path = simd.DOT if k.paths != ("any",) else "float"
    return f"{k.inner.rsplit('.', 1)[-1]} ({path})"


# operation -> (dispatcher, its arguments, whether its code is a repacked one (PACKED + the GGML id), the inner
# functions' arguments, what it computes)
_ROW, _TOK = "w, r, code, xq, xd, xs, xi", "w, g, code, xq, xd, xs, xi, t0"
OPS = {"row": ("int_dot", _ROW, False, "", "row r of a stored matrix · one token's int8 activations"),
       "tokens": ("tokens_dot", _ROW + ", t0", False, "", "row r · tokens t0..t0+TOKENS-1"),
       "group": ("group_dot", _TOK[:-4], True, "", "rows 8g..8g+7 of a repacked matrix · one token"),
       "group_tokens": ("group_tokens", _TOK, True, "", "rows 8g..8g+7 · tokens t0..t0+TOKENS-1: 8 rows a token"),
       "pair": ("pair", "m" + _TOK[1:], True, "", "rows 8g..8g+15 · tokens t0..t0+TOKENS-1: 16 rows a token"),
       "pair8": ("pair8", "m" + _TOK[1:], True, "", "pair for PAIR_TOKENS tokens t0.. in one pass"),
       "tile_unpack": ("tile_unpack", "w, g, h, code, tq, ta, tb, td", False, "",
                       "8-row group g into half h of a tile (tq, ta, tb, td)"),
       "tile_dot": ("tile_dot", "code, tq, ta, tb, td, xq, xd, xs, offsets, xi, t0, res", False,
                    "tq, ta, tb, td, xq, xd, xs, xi, t0, res", "res = a tile · tokens t0..t0+TOKENS-1")}
_TILE_OPS = ("tile_unpack", "tile_dot")  # compiled functions of their own, returning nothing (tile_formats.py)
# (module, operation) -> a chain of that module's own, reached from the dispatcher as an inlined function or
# as a call (a compiled function of its own: keeps the big kernels that inline the dispatchers smaller);
# other modules' formats branch in the dispatcher itself
_CHAINS = {("blocks32", "row"): "inline", ("blocks32", "tokens"): "inline", ("blocks32", "group"): "call",
           ("blocks32", "group_tokens"): "call", ("kquants", "row"): "call"}
_DECORATOR = {"inline": '@njit(inline="always", cache=True)', "call": "@njit(fastmath=True, cache=True, nogil=True)"}
DISPATCH_PATH = "engine/kernels/dispatch.py"


def _const(f: Format, packed: bool = False) -> str:
    return f.name.upper() + ("X8" if packed else "")


def _either(var: str, consts: list[str], indent: int) -> str:
    """`var == A or var == B ...`, wrapped under 110 columns."""
    terms, lines, line = [f"{var} == {c}" for c in consts], [], ""
    for t in terms:
        if line and indent + len(line) + len(t) + 4 > 100:
            lines.append(line)
            line = "or " + t
        else:
            line = f"{line} or {t}" if line else t
    lines.append(line)
    return ("(" + ("\n" + " " * (indent + 1)).join(lines) + ")") if len(lines) > 1 else lines[0]


def _chain(branches: list[tuple[list[str], str]], void: bool) -> list[str]:
    """The body of a dispatcher: branches (codes, call) merged where the call is the same, tested in order,
    the last one the fallback."""
    merged: dict[str, list[str]] = {}
    for consts, call in branches:
        merged.setdefault(call, []).extend(consts)
    items, out = list(merged.items()), []
    for i, (call, consts) in enumerate(items):
        if i == len(items) - 1:
            out += ["    else:", f"        {call}"] if void and len(items) > 1 else [f"    {'' if void else 'return '}{call}"]
        elif void:
            out += [f"    {'if' if i == 0 else 'elif'} {_either('code', consts, 7)}:", f"        {call}"]
        else:
            out += [f"    if {_either('code', consts, 7)}:", f"        return {call}"]
    return out


def _call(module: str, fn: str, op: str) -> str:
    """module.fn(its arguments): the dispatcher's less code, unless the row names them."""
    _, args, _, inner, _ = OPS[op]
    inner = inner or ", ".join(a for a in args.split(", ") if a != "code")
    return f"{module}.{fn}" if "(" in fn else f"{module}.{fn}({inner})"


def dispatch_source() -> str:
    """The text of engine/kernels/dispatch.py, from FORMATS."""
    from engine import quant
    from engine.kernels.simd import TOKENS
    modules = list(dict.fromkeys(f.module for f in FORMATS))
    head = ['"""The per-format dispatch of the integer kernels: for each operation, which function dots a row, an',
            "8-row group or a tile of each format. GENERATED from engine/kernels/table.py's FORMATS by",
            "`python -m engine.kernels.table`: edit the table, not this file (tests/test_kernel_table.py checks",
            'that they agree)."""',
            "from __future__ import annotations", "", "from numba import njit", "",
            f"PACKED = {quant.PACKED}  # + a GGML id: that format repacked in groups of 8 rows"]
    for f in FORMATS:
        head.append(f"{_const(f)} = {quant.get(f.name).type_id}" +
                    (f"\n{_const(f, True)} = PACKED + {_const(f)}" if f.group else ""))
    preds = [("is_int_code", "Whether `code` (a GGML id, or PACKED + one) is dotted with int8 activations.",
              FORMATS),
             ("per_256", "Whether rows of `code` (a GGML id, or PACKED + one) read activations quantized per 256\n"
                         "    (llama.cpp's Q8_K) rather than per 32 (Q8_1).", [f for f in FORMATS if f.per_256])]
    preds += [(f"in_{m}", f"Whether `code` (a GGML id, or PACKED + one) has its dot products in {m}.py.",
               [f for f in FORMATS if f.module == m]) for m in modules]
    body = []
    for name, doc, fs in preds:
        body += ["", "", _DECORATOR["inline"], f"def {name}(code):", f'    """{doc}"""',
                 "    c = code - PACKED if code > PACKED else code",
                 f"    return {_either('c', [_const(f) for f in fs], 11)}"]
    body += ["", "", _DECORATOR["inline"], "def tiled(code):",
             '    """Whether prefill on this format (a GGML id, repacked) takes tiles.py from TILE_MIN_T tokens on."""',
             f"    return {_either('code', [_const(f) for f in FORMATS if f.tile_unpack], 11)}",
             "", "", _DECORATOR["inline"], "def pairable(code, N):",
             '    """Whether N rows on a matrix in `code` go through pair, two groups at once (simd.WIDE only)."""',
             f"    return N >= simd.TOKENS and ({_either('code', [_const(f, True) for f in FORMATS if f.pair], 32)})",
             "", "", "from engine.kernels import " + ", ".join(sorted(modules + ["tile_formats"])) +
             "  # noqa: E402  (below what formats.py reads)"]
    for (module, op), how in _CHAINS.items():  # each module's own chains
        name, args, _, _, what = OPS[op]
        fs = [f for f in FORMATS if f.module == module and getattr(f, op)]
        body += ["", "", _DECORATOR[how], f"def {module}_{op}({args}):",
                 f'    """{name} on {module}.py\'s formats (code: the GGML id)."""']
        body += _chain([([_const(f)], _call(module, getattr(f, op), op)) for f in fs], False)
    for op, (name, args, packed, _, what) in OPS.items():  # the dispatchers
        branches = []
        for f in FORMATS:
            fn, consts = getattr(f, op), [_const(f, packed)]
            if op == "tokens" and not fn and f.row:  # a token at a time
                ts = [f"t0 + {k}" if k else "t0" for k in range(TOKENS)]
                calls = [f"{f.module}_row(w, r, code, xq[{t}], xd[{t}], xs[{t}], xi[{t}])" for t in ts]
                branches.append((consts, "(" + ",\n                ".join(calls) + ")"))
            elif fn and op in _TILE_OPS:
                branches.append((consts, _call("tile_formats", fn, op)))
            elif fn and (f.module, op) in _CHAINS:
                branches.append((consts, f"{f.module}_{op}({args.replace('code', 'code - PACKED' if packed else 'code')})"))
            elif fn:
                branches.append((consts, _call(f.module, fn, op)))
        tile = op in _TILE_OPS
        body += ["", "", _DECORATOR["call" if tile else "inline"], f"def {name}({args}):",
                 f'    """{name}: {what} (code: {"PACKED + " if packed else ""}the GGML id)."""']
        body += _chain(branches, tile)
    return "\n".join(head + body) + "\n"


if __name__ == "__main__":  # rewrite dispatch.py from FORMATS
    from engine import kernels
    kernels.setup()
    text = dispatch_source()
    with open(DISPATCH_PATH, "w") as fh:
        fh.write(text)
