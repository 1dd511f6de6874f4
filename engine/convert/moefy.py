"""MoEfication: a dense model's MLPs cut into experts by co-activation, with a router per layer.

    colibri-convert --model_path DENSE --output_path OUT --moefy 8 --top_k 2

Each layer's FFN neurons (the rows of gate and up, the columns of down) are clustered into N
equal experts so that neurons which fire together on real text share an expert; a router per
layer then picks the K experts whose output matters most for each token. With K = N the MoE
computes the dense MLP; with K < N it reads K/N of the FFN bytes per token, at a perplexity cost
the converter prints and stores in config.json. The result is a Mixtral-style model directory:
the router's logits are scaled down until the K weights are 1/K each (LOGIT_SCALE), and every
expert's down is multiplied by K, so the selected experts add up as the dense MLP's neurons did.

Calibration (never the held-out perplexity texts): per layer the normed FFN input h (T, D) gives
the neuron activations a = silu(h @ gate.T) * (h @ up.T) (T, F) and each cluster's output norm
||a_e @ down_e.T||, the quantity routing should rank. Neurons are clustered by balanced k-means on
their |a| patterns (cosine). Two routers, a least-squares fit from h to the clusters' output norms
and the mean of each cluster's gate rows, are fitted on the first 3/4 of the tokens and compared on
the last 1/4; `router="auto"` keeps the better for each layer.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from engine import quant, tensorfile
from engine.errors import ConfigError
from engine.model_dir import (CONFIG_FILE, MANIFEST_FILE, Manifest, ModelDir, config_document, expert_file,
                              open_model_dir)

log = logging.getLogger("colibri.moefy")
CALIBRATION_TEXT = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "texts" / "calibration_en_code.txt"
ROUTERS = ("auto", "lsq", "gate")
LOGIT_SCALE = 1e-3  # largest |router logit| on the calibration text: top-k weights 1/K to 0.2%
CHUNK = 512  # calibration tokens per forward pass


@dataclass(frozen=True)
class LayerReport:
    """How well one layer routes on the held-out quarter of the calibration tokens."""
    router: str  # the one kept: "lsq" or "gate"
    error_lsq: float  # ||dense - MoE|| / ||dense|| of the FFN output, mean over tokens
    error_gate: float
    error_oracle: float  # picking the K experts with the largest output norms (the best any router can)
    recall_lsq: float  # share of the oracle's K picks the router also picks
    recall_gate: float


@dataclass(frozen=True)
class MoefyResult:
    path: Path
    num_experts: int
    top_k: int
    tokens: int  # calibration tokens used
    layers: tuple[LayerReport, ...]


# --- calibration: the normed FFN inputs of every layer -----------------------------------------

def ffn_inputs(dump: dict, layer: int, norm: np.ndarray, eps: float) -> np.ndarray:
    """Layer's normed FFN input (T, D) from a forward pass's dump: the residual after attention
    (blk.L.out - blk.L.ffn_out), RMS-normed with ffn_norm as the model does."""
    x = dump[f"blk.{layer}.out"] - dump[f"blk.{layer}.ffn_out"]
    return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * norm).astype(np.float32)


def calibration_inputs(model: ModelDir, text: str, tokens: int) -> list[np.ndarray]:
    """Per layer, the normed FFN inputs (tokens, D) over the first `tokens` tokens of `text`."""
    from engine.api import Engine
    eng = Engine(model.path, context_length=CHUNK, prefetch_window=0, log_level="WARN")
    try:
        ids = eng.codec.tok.encode(text, add_special_tokens=False).ids[:tokens]
        if len(ids) < 64:
            raise ConfigError(f"--moefy: the calibration text has {len(ids)} tokens; at least 64 are needed")
        norms = [eng.model.tensor_file(f"attention/layer_{L}.bin").dequantize(f"blk.{L}.ffn_norm.weight")
                 for L in range(model.config.num_layers)]
        out: list[list[np.ndarray]] = [[] for _ in range(model.config.num_layers)]
        chunk = min(CHUNK, eng.context_limit)  # (a model with a shorter context)
        for a in range(0, len(ids), chunk):
            dump: dict = {}
            eng.logits(ids[a:a + chunk], dump=dump)
            for L in range(model.config.num_layers):
                out[L].append(ffn_inputs(dump, L, norms[L], model.config.rms_norm_eps))
        return [np.concatenate(h) for h in out]
    finally:
        eng.close()


def swiglu(h: np.ndarray, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """h (T, D), gate and up (F, D) -> the neuron activations silu(h gate.T) * (h up.T) (T, F)."""
    g = h @ gate.T
    return (g / (1.0 + np.exp(-g)) * (h @ up.T)).astype(np.float32)


# --- clustering and routing (numpy) ------------------------------------------------------------

def balanced_clusters(features: np.ndarray, n: int, iters: int = 25, seed: int = 0) -> np.ndarray:
    """Rows of `features` (F, T) into n clusters of F/n rows each (balanced cosine k-means); (F,)."""
    F = features.shape[0]
    if F % n:
        raise ConfigError(f"--moefy {n}: the FFN's {F} neurons do not split into {n} equal experts")
    x = features / np.maximum(np.linalg.norm(features, axis=1, keepdims=True), 1e-12)
    rng = np.random.default_rng(seed)
    cent = x[rng.choice(F, n, replace=False)]
    labels = np.full(F, -1)
    for _ in range(iters):
        sims = x @ cent.T  # (F, n)
        got, room, left = [-1] * F, [F // n] * n, F
        for flat in np.argsort(-sims, axis=None).tolist():
            i, j = divmod(flat, n)
            if got[i] < 0 and room[j]:
                got[i], room[j], left = j, room[j] - 1, left - 1
                if not left:
                    break
        new = np.array(got)
        if np.array_equal(new, labels):
            break
        labels = new
        cent = np.stack([x[labels == j].mean(axis=0) for j in range(n)])
        cent /= np.maximum(np.linalg.norm(cent, axis=1, keepdims=True), 1e-12)
    return labels


def expert_outputs(act: np.ndarray, down: np.ndarray, labels: np.ndarray, n: int) -> np.ndarray:
    """Each cluster's share of the FFN output: (n, T, D) = act[:, e] @ down[:, e].T."""
    return np.stack([act[:, labels == e] @ down[:, labels == e].T for e in range(n)])


def routed_error(parts: np.ndarray, picks: np.ndarray) -> float:
    """Mean over tokens of ||dense - sum of the picked experts|| / ||dense||; parts (n, T, D),
    picks (T, K)."""
    dense = parts.sum(axis=0)
    keep = np.zeros(parts.shape[:2], bool)
    np.put_along_axis(keep.T, picks, True, axis=1)
    moe = (parts * keep[:, :, None]).sum(axis=0)
    return float(np.mean(np.linalg.norm(dense - moe, axis=1) / np.maximum(np.linalg.norm(dense, axis=1), 1e-12)))


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """(T, n) -> the k largest per row (T, k), largest first."""
    return np.argsort(-scores, axis=1)[:, :k]


def fit_lsq_router(h: np.ndarray, target: np.ndarray, ridge: float = 1e-3) -> np.ndarray:
    """Least squares h (T, D) @ W -> target (T, n), ridge-regularised; the router (n, D)."""
    gram = h.T.astype(np.float64) @ h
    gram += ridge * np.trace(gram) / len(gram) * np.eye(len(gram))
    return np.linalg.solve(gram, h.T.astype(np.float64) @ target).T.astype(np.float32)


def gate_router(gate: np.ndarray, labels: np.ndarray, n: int) -> np.ndarray:
    """Each cluster's mean gate row (n, D): a token that opens its neurons' gates picks it."""
    return np.stack([gate[labels == e].mean(axis=0) for e in range(n)]).astype(np.float32)


def moefy_layer(h: np.ndarray, gate: np.ndarray, up: np.ndarray, down: np.ndarray, n: int, k: int,
                router: str = "auto") -> tuple[np.ndarray, np.ndarray, LayerReport]:
    """One layer: (labels (F,), router (n, D), report) from its calibration inputs h (T, D)."""
    act = swiglu(h, gate, up)
    labels = balanced_clusters(np.abs(act).T, n)
    parts = expert_outputs(act, down, labels, n)  # (n, T, D)
    norms = np.linalg.norm(parts, axis=2).T  # (T, n): what a router should rank
    fit = max(1, 3 * len(h) // 4)
    held = slice(fit, None) if fit < len(h) else slice(None)
    routers = {"lsq": fit_lsq_router(h[:fit], norms[:fit]), "gate": gate_router(gate, labels, n)}
    errs = {m: routed_error(parts[:, held], top_k(h[held] @ r.T, k)) for m, r in routers.items()}
    oracle = top_k(norms[held], k)
    recall = {m: float(np.mean([len(set(a) & set(b)) / k for a, b in zip(top_k(h[held] @ r.T, k), oracle)]))
              for m, r in routers.items()}
    kept = min(errs, key=errs.get) if router == "auto" else router
    r = routers[kept]
    r = r * (LOGIT_SCALE / max(float(np.abs(h @ r.T).max()), 1e-30))
    rep = LayerReport(kept, errs["lsq"], errs["gate"], routed_error(parts[:, held], oracle), recall["lsq"],
                      recall["gate"])
    return labels, r.astype(np.float32), rep


# --- writing the MoE model directory -----------------------------------------------------------

def _down_type(src: quant.QuantType) -> quant.QuantType:
    """Down is re-quantized (its columns are regrouped): in its own format where Colibri writes it, else q8_0."""
    src = src.plain  # (a matrix repacked on disk: its format)
    return src if src.quantize is not None else quant.get("q8_0")


def moefy(src_path: str | Path, dst_path: str | Path, num_experts: int, top_k_: int, *,
          text: str | None = None, tokens: int = 4096, router: str = "auto", force: bool = False) -> MoefyResult:
    """Write `dst_path`: the dense model at `src_path` as a Mixtral-style MoE of `num_experts`
    experts per layer, `top_k_` per token (see the module docstring)."""
    src = open_model_dir(src_path)
    cfg, dst = src.config, Path(dst_path)
    if cfg.is_moe:
        raise ConfigError(f"--moefy: {src.path} is already an MoE ({cfg.num_experts} experts per layer)")
    if not 2 <= num_experts <= cfg.intermediate_size or not 1 <= top_k_ <= num_experts:
        raise ConfigError(f"--moefy {num_experts} --top_k {top_k_}: needs 2 <= experts <= "
                          f"{cfg.intermediate_size} and 1 <= top_k <= experts")
    if router not in ROUTERS:
        raise ConfigError(f"router {router!r} is not one of {', '.join(ROUTERS)}")
    if dst.exists() and not force:
        raise ConfigError(f"{dst} exists (use --force to replace it)")
    if cfg.intermediate_size % num_experts:
        raise ConfigError(f"--moefy {num_experts}: the FFN's {cfg.intermediate_size} neurons do not split "
                          f"into {num_experts} equal experts")
    if text is None and not CALIBRATION_TEXT.is_file():
        raise ConfigError(f"--moefy: the calibration text {CALIBRATION_TEXT} is not part of this installation "
                          f"(it ships with the source tree)")
    text = CALIBRATION_TEXT.read_text(encoding="utf-8") if text is None else text
    hs = calibration_inputs(src, text, tokens)
    n, k, F = num_experts, top_k_, cfg.intermediate_size // num_experts
    tmp = dst.with_name(dst.name + ".moefy-partial")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "experts").mkdir(parents=True)
    (tmp / "router").mkdir()
    manifest, reports = Manifest(), []
    for rel, entry in src.manifest["files"].items():  # everything but the MLPs is unchanged
        if rel.startswith("experts/") or rel in (CONFIG_FILE, MANIFEST_FILE):
            continue
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src.path / rel, tmp / rel)
        manifest.add(rel, entry["size"], entry["sha256"])
    types: dict[str, int] = {}
    for L in range(cfg.num_layers):
        b = f"blk.{L}."
        tf = src.tensor_file(expert_file(L, 0, src.split_experts))
        names = {p: f"{b}ffn_{p}.0.weight" for p in ("gate", "up", "down")}
        gate, up, down = (tf.dequantize(names[p]) for p in ("gate", "up", "down"))
        labels, r, rep = moefy_layer(hs[L], gate, up, down, n, k, router)
        reports.append(rep)
        log.info("layer %d: router %s, FFN output error %.3f (oracle %.3f)", L, rep.router,
                 min(rep.error_lsq, rep.error_gate) if router == "auto" else getattr(rep, f"error_{rep.router}"),
                 rep.error_oracle)
        rel = f"router/layer_{L}.bin"
        manifest.add(rel, *tensorfile.write_tensor_file(tmp / rel, {f"{b}ffn_gate_inp.weight": (r, "f32")}))
        dtype = _down_type(tf.infos[names["down"]].qtype)
        plain = {p: tf.stored(names[p]) for p in ("gate", "up")}  # the stored layout (unpacked if repacked)
        plain_type = {p: tf.infos[names[p]].qtype.plain for p in ("gate", "up")}
        for e in range(n):
            rows = np.flatnonzero(labels == e)
            stored = {p: plain[p][rows] for p in ("gate", "up")}  # whole rows: bytes unchanged
            stored["down"] = quant.quantize(np.ascontiguousarray(down[:, rows] * k), dtype)
            qt = {"gate": plain_type["gate"], "up": plain_type["up"], "down": dtype}
            shapes = {"gate": (F, cfg.hidden_size), "up": (F, cfg.hidden_size), "down": (cfg.hidden_size, F)}
            rel = expert_file(L, e, True)
            plans = [tensorfile.TensorPlan(f"{b}ffn_{p}.{e}.weight", quant.repacked(qt[p], shapes[p]), shapes[p])
                     for p in ("gate", "up", "down")]  # in the CPU kernels' layout where it has one, as convert writes
            w = tensorfile.TensorFileWriter(tmp / rel, plans)
            for p, plan in zip(("gate", "up", "down"), plans):
                w.write(plan.name, stored[p] if plan.qtype is qt[p] else quant.pack_x8(stored[p], qt[p].name))
                types[qt[p].name] = types.get(qt[p].name, 0) + 1
            manifest.add(rel, *w.close())
        tf.close()
    moe = replace(cfg, architecture="mixtral", num_experts=n, top_k=k, intermediate_size=F, norm_topk_prob=True)
    meta = {key: v for key, v in src.meta.items() if key not in ("layout", "quantization")}
    meta["layout"] = {"split_experts": True}
    meta["quantization"] = {**src.meta.get("quantization", {}), "moefied_down": sorted({_down_type(
        tensorfile.read_header(src.path / expert_file(L, 0, src.split_experts))[0][f"blk.{L}.ffn_down.0.weight"].qtype
    ).name for L in range(cfg.num_layers)})}
    meta["moefy"] = {"source": str(src.path), "num_experts": n, "top_k": k, "router": router,
                     "calibration_tokens": len(hs[0]), "layers": [asdict(r) for r in reports]}
    (tmp / CONFIG_FILE).write_text(json.dumps(config_document(moe, meta), indent=1) + "\n", encoding="utf-8")
    manifest.add_file(tmp, CONFIG_FILE)
    manifest.write(tmp)
    if dst.exists():
        shutil.rmtree(dst)
    os.replace(tmp, dst)
    open_model_dir(dst)  # what was written opens
    return MoefyResult(dst, n, k, len(hs[0]), tuple(reports))
