"""The Colibri model directory: what files it holds, what each must contain, and its checks.

    model/
      config.json                     format name and version, architecture, dims, quantization
      manifest.json                   every other file with its size and sha256
      tokenizer.json                  Hugging Face tokenizers format
      chat_template.jinja             the model's chat template (untrusted: render in a sandbox)
      embeddings.bin                  token_embd (+ output, output_norm, rope_freqs)
      attention/layer_N.bin           attention weights and both norms of layer N
      router/layer_N.bin              router of layer N (MoE only)
      experts/layer_N_expert_M.bin    gate/up/down of one expert (a dense MLP is expert 0)
      experts/layer_N_shared.bin      Qwen2-MoE's shared expert
    or, converted without --split_experts, experts/layer_N.bin holding all experts of layer N;
    or, for a GGUF run in place, no tensor file at all: gguf_index.json (engine.gguf_index) says where
    each of those files' tensors lies in the GGUF, and every tensor file is read from there.

Tensor names are GGUF's vocabulary (`blk.3.attn_q.weight`, `blk.3.ffn_gate.5.weight`) and are
the same string in files, manifest, logs and dashboard.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from engine import gguf_index, tensorfile
from engine.arch import spec
from engine.errors import (BadHeaderError, ChecksumMismatchError, MissingFileError,
                           ModelFormatError, NewerFormatError, SizeMismatchError)

FORMAT_NAME = "colibri"
FORMAT_VERSION = 1
CONFIG_FILE, MANIFEST_FILE = "config.json", "manifest.json"
TOKENIZER_FILE, TEMPLATE_FILE = "tokenizer.json", "chat_template.jinja"



@dataclass(frozen=True)
class ModelConfig:
    """Everything the engine needs to know about a model's shape and maths."""
    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # of one expert (the MLP, for a dense model)
    num_experts: int = 1
    top_k: int = 1
    norm_topk_prob: bool = False  # renormalise the top-k router weights to sum to 1
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE's always-on expert; 0 = none
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # {"type": "linear"|"yarn", ...}; llama3-style → rope_freqs
    rope_freq_factors: bool = False  # embeddings.bin holds rope_freqs.weight (head_dim/2 divisors)
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v biases (Qwen2)
    qk_norm: str = "none"  # "none", "head" (RMSNorm per head: Qwen3) or "full" (whole q/k: OLMoE)
    clip_qkv: float | None = None
    sliding_window: int | None = None  # attend to at most this many past tokens (Mistral); None = all
    # --- the 2026 architectures (engine.arch layer kinds, routers) ---
    layer_types: tuple[str, ...] | None = None  # engine.arch LayerKind per layer; None: spec.layer_types' default
    dense_layers: int = 0  # the first k layers have a dense MLP (stored as their "shared" expert), no router
    dense_intermediate_size: int = 0  # those MLPs' width
    conv_kernel: int = 0  # short_conv layers: the causal conv's taps (LFM2 conv_L_cache)
    routed_scaling_factor: float = 1.0  # router weights multiplied by this (sigmoid_bias)
    swiglu_alpha: float = 1.702  # clamped SwiGLU (spec.swiglu_clamp, gpt-oss): (up + 1) * g * sigmoid(alpha g)
    swiglu_limit: float = 7.0  # ... with g <= limit and -limit <= up <= limit
    partial_rotary_factor: float = 1.0  # rope turns the first head_dim * this dims only
    linear_key_heads: int = 0  # linear_attention (gated DeltaNet) layers: key heads, value heads, their dims
    linear_value_heads: int = 0
    linear_key_dim: int = 0
    linear_value_dim: int = 0
    delta_tiled: bool = False  # DeltaNet value heads in llama.cpp's tiled order (a GGUF's), else grouped
    full_head_dim: int = 0  # full-attention layers' own head_dim and KV heads where they differ (Gemma 4)
    full_kv_heads: int = 0
    rope_theta_full: float = 0.0  # full-attention layers' own rope theta (0: rope_theta)
    final_logit_softcap: float = 0.0  # logits c * tanh(x / c); 0: none
    per_layer_input_size: int = 0  # Gemma 4 E2B/E4B: each layer's own input of this width (0: none)
    per_layer_vocab_size: int = 0  # ... looked up by token id in a table of this many rows
    kv_shared_layers: int = 0  # the last k layers attend over an earlier layer's keys and values
    double_wide_mlp: bool = False  # ... and their MLPs are twice intermediate_size wide
    full_v: bool = False  # full layers have a v_proj where the family's are k_eq_v (Gemma 4 attention_k_eq_v false)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    def attention_shape(self, layer: int) -> tuple[int, int]:
        """(KV heads, head_dim) of an attention layer: full layers may have their own (Gemma 4)."""
        if self.full_head_dim and (self.layer_types or ())[layer:layer + 1] == ("attention",):
            return self.full_kv_heads, self.full_head_dim
        return self.num_kv_heads, self.head_dim

    def kv_source(self, layer: int) -> int:
        """The layer whose keys and values `layer` attends over: itself, or for one of the last
        kv_shared_layers the last earlier layer of its kind (as transformers' Gemma 4 shares them)."""
        first = self.num_layers - self.kv_shared_layers
        if layer < first:
            return layer
        kinds = self.layer_types or ("attention",) * self.num_layers
        source = max((i for i in range(first) if kinds[i] == kinds[layer]), default=None)
        if source is None:
            raise ModelFormatError(f"config.json: layer {layer} ({kinds[layer]}) shares keys and values "
                                   f"(kv_shared_layers {self.kv_shared_layers}) but no layer before {first} is of its kind")
        return source

    def mlp_width(self, layer: int) -> int:
        """A layer's MLP width (of one expert): twice intermediate_size in the KV-shared layers of a
        double_wide_mlp model."""
        shared = self.double_wide_mlp and layer >= self.num_layers - self.kv_shared_layers
        return self.intermediate_size * (2 if shared else 1)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ModelFormatError(f"config.json: unknown model keys {unknown}")
        _check_values(d)
        if isinstance(d.get("layer_types"), list):
            d = {**d, "layer_types": tuple(d["layer_types"])}
        try:
            return cls(**d)
        except TypeError as e:
            raise ModelFormatError(f"config.json: {e}") from None


# config.json is untrusted: every value is checked by its field's type before anything is sized from it
DIM_LIMIT = 1 << 24  # as the converters' limits (engine.convert.hf.HF_LIMITS): no real dimension is near it
_AT_LEAST_ONE = {"vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "num_experts",
                 "top_k", "max_position_embeddings"}
QK_NORMS = ("none", "head", "full")


def _check_values(d: dict) -> None:
    for f in fields(ModelConfig):
        if f.name not in d or d[f.name] is None and f.type.endswith("| None"):
            continue
        v, what = d[f.name], f"config.json: model {f.name!r} = {d[f.name]!r}"
        kind = f.type.split(" ")[0].split("[")[0]
        if kind == "int":
            if isinstance(v, bool) or not isinstance(v, int):
                raise ModelFormatError(f"{what} is not an integer")
            low = 1 if f.name in _AT_LEAST_ONE else 0
            if not low <= v <= DIM_LIMIT:
                raise ModelFormatError(f"{what} is out of range (expected {low} to {DIM_LIMIT})")
        elif kind == "float":
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ModelFormatError(f"{what} is not a number")
            if not math.isfinite(v):
                raise ModelFormatError(f"{what} is not a finite number")
        elif kind == "bool" and not isinstance(v, bool):
            raise ModelFormatError(f"{what} is not true or false")
        elif kind in ("str", "dict") and not isinstance(v, {"str": str, "dict": dict}[kind]):
            raise ModelFormatError(f"{what} is not a {'string' if kind == 'str' else 'JSON object'}")
    if d.get("qk_norm", "none") not in QK_NORMS:
        raise ModelFormatError(f"config.json: model 'qk_norm' = {d['qk_norm']!r} is not one of {QK_NORMS}")
    if d.get("top_k", 1) > d.get("num_experts", 1):
        raise ModelFormatError(f"config.json: model 'top_k' = {d['top_k']} is more than num_experts = "
                               f"{d.get('num_experts', 1)}")
    kinds = d.get("layer_types")
    if kinds is not None and (not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds)
                              or len(kinds) != d.get("num_layers")):
        n = len(kinds) if isinstance(kinds, list) else kinds
        raise ModelFormatError(f"config.json: model 'layer_types' has {n} entries for {d.get('num_layers')} layers")


# --- which tensor goes where -----------------------------------------------------------------

def expert_file(layer: int, expert: int | str, split: bool) -> str:
    if not split:
        return f"experts/layer_{layer}.bin"
    return f"experts/layer_{layer}_{'shared' if expert == 'shared' else f'expert_{expert}'}.bin"


def expected_tensors(cfg: ModelConfig, split_experts: bool = True) -> dict[str, dict[str, tuple[int, ...]]]:
    """file -> {tensor name -> shape}, in file order: the one definition of the layout."""
    D, hd = cfg.hidden_size, cfg.head_dim
    q, kv = cfg.num_heads * hd, cfg.num_kv_heads * hd
    files: dict[str, dict[str, tuple[int, ...]]] = {}
    emb = {"token_embd.weight": (cfg.vocab_size, D), "output_norm.weight": (D,)}
    if not cfg.tie_word_embeddings:
        emb["output.weight"] = (cfg.vocab_size, D)
    if cfg.rope_freq_factors:
        emb["rope_freqs.weight"] = (hd // 2,)
    if P := cfg.per_layer_input_size:  # Gemma 4 E2B/E4B: every layer's inputs, packed
        emb |= {"per_layer_token_embd.weight": (cfg.per_layer_vocab_size, cfg.num_layers * P),
                "per_layer_model_proj.weight": (cfg.num_layers * P, D), "per_layer_proj_norm.weight": (P,)}
    files["embeddings.bin"] = emb
    kinds = cfg.layer_types or ("attention",) * cfg.num_layers
    for L in range(cfg.num_layers):
        b = f"blk.{L}."
        if kinds[L] == "short_conv":  # LFM2: in_proj to B, C, x; a depthwise causal conv; out_proj
            files[f"attention/layer_{L}.bin"] = {
                b + "attn_norm.weight": (D,), b + "shortconv.in_proj.weight": (3 * D, D),
                b + "shortconv.conv.weight": (D, cfg.conv_kernel), b + "shortconv.out_proj.weight": (D, D),
                b + "ffn_norm.weight": (D,)}
            _ffn_files(files, cfg, L, split_experts)
            continue
        if kinds[L] == "linear_attention":  # gated DeltaNet (names as llama.cpp's)
            nk, nv, dk, dv = cfg.linear_key_heads, cfg.linear_value_heads, cfg.linear_key_dim, cfg.linear_value_dim
            C = 2 * nk * dk + nv * dv
            files[f"attention/layer_{L}.bin"] = {
                b + "attn_norm.weight": (D,), b + "attn_qkv.weight": (C, D), b + "attn_gate.weight": (nv * dv, D),
                b + "ssm_beta.weight": (nv, D), b + "ssm_alpha.weight": (nv, D), b + "ssm_a": (nv,),
                b + "ssm_dt.bias": (nv,), b + "ssm_conv1d.weight": (C, cfg.conv_kernel), b + "ssm_norm.weight": (dv,),
                b + "ssm_out.weight": (D, nv * dv), b + "ffn_norm.weight": (D,)}
            _ffn_files(files, cfg, L, split_experts)
            continue
        sp = spec(cfg.architecture)
        kvh, hd = cfg.attention_shape(L)
        q, kv = cfg.num_heads * hd, kvh * hd
        att = {b + "attn_norm.weight": (D,), b + "attn_q.weight": (2 * q if sp.attention_gate else q, D),
               b + "attn_k.weight": (kv, D),
               b + "attn_v.weight": (kv, D), b + "attn_output.weight": (D, q)}
        if sp.k_eq_v and kinds[L] == "attention" and not cfg.full_v:
            del att[b + "attn_v.weight"]
        if cfg.kv_source(L) != L:  # its keys and values are another layer's
            att = {n: s for n, s in att.items() if not n.startswith((b + "attn_k", b + "attn_v"))}
        if cfg.attention_bias:
            att |= {b + "attn_q.bias": (q,), b + "attn_k.bias": (kv,), b + "attn_v.bias": (kv,)}
        if sp.o_bias:
            att[b + "attn_output.bias"] = (D,)
        if sp.attention_sinks:
            att[b + "attn_sinks.weight"] = (cfg.num_heads,)
        if cfg.qk_norm != "none":
            head = cfg.qk_norm == "head"
            att |= {b + "attn_q_norm.weight": (hd if head else q,), b + "attn_k_norm.weight": (hd if head else kv,)}
            if cfg.kv_source(L) != L:
                del att[b + "attn_k_norm.weight"]
        att[b + "ffn_norm.weight"] = (D,)
        if sp.norm_place == "sandwich":  # Gemma 4: post-norms, the experts' own pre/post norms, a scalar
            moe = ("post_ffw_norm_1.weight", "pre_ffw_norm_2.weight", "post_ffw_norm_2.weight") if cfg.is_moe else ()
            att |= {b + n: (D,) for n in ("post_attention_norm.weight", *moe, "post_ffw_norm.weight")}
            att[b + "layer_output_scale.weight"] = (1,)
        if P := cfg.per_layer_input_size:  # its input's gate, projection and norm
            att |= {b + "inp_gate.weight": (P, D), b + "proj.weight": (D, P), b + "post_norm.weight": (D,)}
        files[f"attention/layer_{L}.bin"] = att
        _ffn_files(files, cfg, L, split_experts)
    return files


# what each router function (ArchSpec.router) reads beside its matrix, in the model's dims (E
# experts, D hidden, F an expert's width): a selection bias; gpt-oss's logit bias; Gemma 4's input
# scale and each expert's output scale
ROUTER_TENSORS = {"softmax_topk": (), "sigmoid_bias": (("exp_probs_b.bias", "E"),),
                  "topk_softmax": (("ffn_gate_inp.bias", "E"),),
                  "gemma4": (("ffn_gate_inp.scale", "D"), ("ffn_down_exps.scale", "E"))}
# the experts' biases (ArchSpec.expert_bias), resident beside the router (they are small)
EXPERT_BIASES = (("ffn_gate_exps.bias", "EF"), ("ffn_up_exps.bias", "EF"), ("ffn_down_exps.bias", "ED"))


def _ffn_files(files: dict, cfg: ModelConfig, L: int, split_experts: bool) -> None:
    """Layer L's router and experts; a leading dense layer's MLP is its "shared" expert."""
    D, b = cfg.hidden_size, f"blk.{L}."
    dense = L < cfg.dense_layers
    if cfg.is_moe and not dense:
        router = {b + "ffn_gate_inp.weight": (cfg.num_experts, D)}
        if cfg.shared_expert_intermediate_size:
            router[b + "ffn_gate_inp_shexp.weight"] = (D,)
        sp, dims = spec(cfg.architecture), {"E": cfg.num_experts, "D": D, "F": cfg.intermediate_size}
        for name, shape in ROUTER_TENSORS[sp.router] + (EXPERT_BIASES if sp.expert_bias else ()):
            router[b + name] = tuple(dims[d] for d in shape)
        files[f"router/layer_{L}.bin"] = router
    F = cfg.mlp_width(L)
    for e in range(0 if dense else cfg.num_experts):
        files.setdefault(expert_file(L, e, split_experts), {}).update({
            f"{b}ffn_gate.{e}.weight": (F, D), f"{b}ffn_up.{e}.weight": (F, D),
            f"{b}ffn_down.{e}.weight": (D, F)})
    S = cfg.dense_intermediate_size if dense or spec(cfg.architecture).parallel_dense else \
        cfg.shared_expert_intermediate_size
    if S:
        files.setdefault(expert_file(L, "shared", split_experts), {}).update({
            b + "ffn_gate_shexp.weight": (S, D), b + "ffn_up_shexp.weight": (S, D),
            b + "ffn_down_shexp.weight": (D, S)})


# --- manifest --------------------------------------------------------------------------------

def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@dataclass
class Manifest:
    files: dict[str, dict] = field(default_factory=dict)  # relpath -> {"size", "sha256"}

    def add(self, relpath: str, size: int, sha256: str) -> None:
        self.files[relpath] = {"size": size, "sha256": sha256}

    def add_file(self, root: Path, relpath: str) -> None:
        p = root / relpath
        self.add(relpath, p.stat().st_size, sha256_file(p))

    def write(self, root: Path) -> None:
        doc = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "files": self.files}
        (root / MANIFEST_FILE).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


# --- opening and validating ------------------------------------------------------------------

@dataclass(frozen=True)
class ModelDir:
    """A validated model directory. Tensor files are opened (mmapped) on demand."""
    path: Path
    config: ModelConfig
    meta: dict  # the rest of config.json: quantization, tokenizer, source, layout
    manifest: dict
    # each tensor file's header as validated on opening (relative path -> TensorInfo by name): the
    # expert store locates experts from these rather than reading every file's header again
    headers: dict = field(default_factory=dict, repr=False, compare=False)
    gguf: Path | None = None  # a GGUF run in place (engine.gguf_index): every tensor file is a part of it
    indexed: dict = field(default_factory=dict, repr=False, compare=False)  # its tensors: name -> IndexedTensor

    @property
    def split_experts(self) -> bool:
        return bool(self.meta.get("layout", {}).get("split_experts", True))

    def data_path(self, relpath: str) -> Path:
        """The file holding a tensor file's bytes: itself, or the GGUF it is a part of."""
        return self.gguf or self.path / relpath

    def tensor_file(self, relpath: str) -> tensorfile.TensorFile:
        if self.gguf is None:
            return tensorfile.TensorFile(self.path / relpath)
        infos = self.headers[relpath]
        made = {n: (t.stored, lambda v, t=t: gguf_index.made_in_memory(t, v)) for n in infos
                if (t := self.indexed[n]).stored is not t.info.qtype or t.unpermute}
        return tensorfile.TensorFile(self.gguf, infos, made)

    def tensor_bytes(self) -> dict[str, int]:
        """Bytes of each tensor file, relative path -> size (a GGUF run in place: its tensors' bytes)."""
        if self.gguf is None:
            return {rel: e["size"] for rel, e in self.manifest["files"].items() if rel.endswith(".bin")}
        return {rel: sum(i.nbytes for i in infos.values()) for rel, infos in self.headers.items()}

    def files(self) -> dict[str, dict[str, tuple[int, ...]]]:
        return expected_tensors(self.config, self.split_experts)

    @property
    def chat_template(self) -> str | None:
        """The template's text, read only as the manifest lists it (open_model_dir checked the
        file is a regular one inside the folder, of the listed size): its text goes into every prompt."""
        p = self.path / TEMPLATE_FILE
        if TEMPLATE_FILE not in self.manifest.get("files", {}):
            if p.exists() or p.is_symlink():
                raise ModelFormatError(f"{p}: not listed in manifest.json, so not read")
            return None
        return inside(self.path, TEMPLATE_FILE).read_text(encoding="utf-8")


def inside(root: Path, rel: str) -> Path:
    """root / rel, where rel is a relative path that stays in root, links followed (a manifest
    entry may not name /dev/zero, ../ or a link to a private file)."""
    p = Path(rel) if isinstance(rel, str) else None
    if p is None or p.is_absolute() or ".." in p.parts or not (root / p).resolve().is_relative_to(root.resolve()):
        raise BadHeaderError(f"{root / MANIFEST_FILE}: path {rel!r} is outside the model folder")
    return root / p


def _load_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise MissingFileError(f"{path}: missing {what}")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise BadHeaderError(f"{path}: {what} is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise BadHeaderError(f"{path}: {what} is not a JSON object")
    return doc


def _check_format(doc: dict, path: Path) -> None:
    if doc.get("format") != FORMAT_NAME:
        raise BadHeaderError(f"{path}: format is {doc.get('format')!r}, expected {FORMAT_NAME!r} "
                             f"(is this a Colibri model directory?)")
    version = doc.get("format_version")
    if not isinstance(version, int):
        raise BadHeaderError(f"{path}: format_version {version!r} is not an integer")
    if version > FORMAT_VERSION:
        raise NewerFormatError(f"{path}: model format version {version} is newer than this Colibri "
                               f"reads ({FORMAT_VERSION}); update Colibri to open it")


def open_model_dir(path: str | Path, verify: bool = False) -> ModelDir:
    """Check a model directory and say precisely what is wrong with it.

    Always checks: config and manifest parse, every expected file is listed and present with
    the listed size, every tensor file's header, and every expected tensor with its shape and
    a known quant type. With `verify`, also every file's sha256 (reads the whole model).
    """
    root = Path(path)
    if not root.is_dir():
        raise MissingFileError(f"{root}: model directory not found")
    cfg_doc = _load_json(root / CONFIG_FILE, "config.json")
    _check_format(cfg_doc, root / CONFIG_FILE)
    man_doc = _load_json(root / MANIFEST_FILE, "manifest.json")
    _check_format(man_doc, root / MANIFEST_FILE)
    if "model" not in cfg_doc or not isinstance(cfg_doc["model"], dict):
        raise BadHeaderError(f"{root / CONFIG_FILE}: no 'model' section")
    config = ModelConfig.from_dict(cfg_doc["model"])
    meta = {k: v for k, v in cfg_doc.items() if k != "model"}
    listed = man_doc.get("files", {})
    if not isinstance(listed, dict) or not all(isinstance(e, dict) for e in listed.values()):
        raise BadHeaderError(f"{root / MANIFEST_FILE}: 'files' is not an object of file entries")
    for rel, entry in listed.items():
        p = inside(root, rel)
        if not p.is_file():
            raise MissingFileError(f"{p}: missing (listed in manifest.json)")
        size = p.stat().st_size
        if size != entry.get("size"):
            raise SizeMismatchError(f"{p}: size {size} bytes, manifest.json says {entry.get('size')} "
                                    f"(truncated or overwritten?)")
        if verify and sha256_file(p) != entry.get("sha256"):
            raise ChecksumMismatchError(f"{p}: sha256 does not match manifest.json (file is corrupt)")
    index = meta.get("layout", {}).get("gguf")
    if index is not None:
        if index not in listed:
            raise MissingFileError(f"{root / str(index)}: missing from manifest.json")
        gguf, indexed = gguf_index.read_index(inside(root, index))
        model = ModelDir(root, config, meta, man_doc, gguf=gguf, indexed=indexed)
    else:
        model = ModelDir(root, config, meta, man_doc)
    for rel in (CONFIG_FILE, TOKENIZER_FILE):
        if rel not in listed:
            raise MissingFileError(f"{root / rel}: missing from manifest.json")
    if index is not None:
        _check_indexed(model)
        return model
    for rel, tensors in model.files().items():
        if rel not in listed:
            raise MissingFileError(f"{root / rel}: missing (the config needs it; not in manifest.json)")
        # experts' headers past the page cache: a readahead would keep them out of 2 MiB folios
        infos, _ = tensorfile.read_header(root / rel, quiet=rel.startswith("experts/"))
        model.headers[rel] = infos
        for name, shape in tensors.items():
            if name not in infos:
                raise BadHeaderError(f"{root / rel}: tensor {name!r} is missing")
            if infos[name].shape != shape:
                raise BadHeaderError(f"{root / rel}: tensor {name!r} has shape {list(infos[name].shape)}, "
                                     f"config.json implies {list(shape)}")
    return model


def _check_indexed(model: ModelDir) -> None:
    """Every expected tensor in the GGUF index with its shape; headers: each tensor file's part of it."""
    where = model.path / model.meta["layout"]["gguf"]
    for rel, tensors in model.files().items():
        infos = model.headers[rel] = {}
        for name, shape in tensors.items():
            t = model.indexed.get(name)
            if t is None:
                raise BadHeaderError(f"{where}: tensor {name!r} is missing")
            if t.info.shape != shape:
                raise BadHeaderError(f"{where}: tensor {name!r} has shape {list(t.info.shape)}, config.json "
                                     f"implies {list(shape)}")
            infos[name] = t.info


def config_document(cfg: ModelConfig, meta: dict) -> dict:
    return {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "model": asdict(cfg), **meta}
