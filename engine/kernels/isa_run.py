"""The kernel side of engine.kernels.isa: a path measured in its child process, and what this
process runs (stats()). Apart from isa, which decides the path before any kernel is imported
(engine.kernels.setup), so that deciding imports no kernel."""
from __future__ import annotations

import json
import time

from engine.kernels import isa


def _random_blocks(name: str, rows: int, n: int, rng) -> "np.ndarray":  # noqa: F821
    """Random blocks with sane f16 scales (the offsets of each format's scale fields)."""
    import numpy as np

    from engine import quant
    offsets = {"q8_0": [0], "q4_0": [0], "q4_1": [0, 2], "q5_0": [0], "q5_1": [0, 2], "q2_k": [80, 82],
               "q3_k": [108], "q4_k": [0, 2], "q5_k": [0, 2], "q6_k": [208], "iq4_nl": [0], "iq4_xs": [0],
               "mxfp4": []}
    t = quant.get(name)
    nb = n // t.block_size
    raw = rng.integers(0, 256, size=(rows, nb, t.type_size), dtype=np.uint8)
    for off in offsets[name]:
        raw[:, :, off:off + 2] = rng.normal(0, 0.05, size=(rows, nb)).astype(np.float16).view(np.uint8) \
            .reshape(rows, nb, 2)
    if name == "mxfp4":
        raw[:, :, 0] = rng.integers(121, 128, size=(rows, nb), dtype=np.uint8)
    return raw.reshape(rows, -1)


def _child(path: str) -> dict[str, float | None]:
    """In the child: per format, x (1, 2048) @ W.T for W (128, 2048) as stored (decode), and
    x (64, 2048) @ W.T on W repacked into 8-row groups (prefill: "FORMAT@64"), each checked against
    the twin at the table's tolerance (None if wrong), then the best of 20 (decode) or 5 timed calls
    on one thread (the instructions are measured, not the thread pool's wake-up)."""
    import numba
    import numpy as np

    from engine import quant
    from engine.kernels import cpu, simd, table
    assert simd.DOT == path, (simd.DOT, path)
    numba.set_num_threads(1)
    rng = np.random.default_rng(0)
    out: dict[str, float | None] = {}
    for name in isa.FORMATS:
        w = _random_blocks(name, 128, 2048, rng)
        code = quant.get(name).type_id
        k = table.lookup("matmul", name)
        cases = [(name, w, code, 1, 20)]
        if code in cpu.PACKABLE:
            packed = w.copy()
            cpu.repack_x8(packed, code)
            cases.append((f"{name}@64", packed, code + cpu.PACKED, 64, 5))
        for case, m, c, T, repeats in cases:
            x = rng.standard_normal((T, 2048)).astype(np.float32)
            y = np.empty((T, 128), np.float32)
            cpu.matmul(m, c, x, y, False)
            want = table.resolve(k.twin)(w, name, x)
            if not np.allclose(y, want, rtol=k.rtol, atol=k.atol * np.abs(want).max()):
                out[case] = None
                continue
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                cpu.matmul(m, c, x, y, False)
                best = min(best, time.perf_counter() - t0)
            out[case] = best
    return out


def child_main(path: str) -> None:
    from engine import kernels
    kernels.setup()  # (COLIBRI_DOT and COLIBRI_SIMD, from run_child, decide)
    print(json.dumps(_child(path)))


def in_effect() -> str:
    """This process's path, how it was decided and the vector width, e.g. "vnni (measured, 512-bit)"."""
    from engine.kernels import simd
    return f"{simd.DOT} ({isa.SOURCE}, {512 if simd.WIDE else 256}-bit)"


def model_kernels(weights) -> dict[str, str]:
    """{format: what runs for x @ W.T on it (table.describe)} for the formats of a model's mapped
    and resident matrices (engine.weights.ModelWeights; MoE experts read on demand not included)."""
    from dataclasses import fields, is_dataclass

    from engine import quant
    from engine.kernels import cpu, table
    codes = set()

    def visit(obj) -> None:
        if hasattr(obj, "code") and hasattr(obj, "data"):  # a Matrix
            codes.add(obj.code - cpu.PACKED if obj.code >= cpu.PACKED else obj.code)
        elif is_dataclass(obj):
            for f in fields(obj):
                visit(getattr(obj, f.name))

    for m in (weights.token_embd, weights.output, *weights.layers):
        visit(m)
    out = {}
    for code in sorted(codes):
        name = quant.get(int(code)).name
        try:
            out[name] = table.describe(name)
        except KeyError:
            out[name] = "?"
    return out
