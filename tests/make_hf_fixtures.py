"""Build tiny, randomly initialised Hugging Face checkpoints plus transformers reference outputs.

Why this exists
---------------
Colibri converts Hugging Face checkpoints and runs them with its own Numba kernels. To test that
without torch, we commit small real checkpoint folders (config.json, safetensors, tokenizer) for
8 architectures together with the logits / hidden states / router logits / greedy tokens that
`transformers` itself computes from exactly those stored weights. The test suite only reads the
files under ``tests/fixtures/hf/<name>/``; this script is needed only to (re)generate them.

What each fixture folder holds
------------------------------
* ``config.json``, ``generation_config.json``, ``model.safetensors`` (mixtral: sharded
  ``model-0000k-of-0000n.safetensors`` + ``model.safetensors.index.json``) -- from
  ``save_pretrained(safe_serialization=True)``. MoE experts are saved per expert (the
  pre-v5 "original" layout that transformers reverts to on save).
* ``tokenizer.json`` / ``tokenizer_config.json`` -- a tiny byte-level BPE trained here
  (shared by all fixtures), ChatML chat template, bos ``<|endoftext|>``, eos ``<|im_end|>``.
* ``reference.npz`` -- ``input_ids`` [T], ``text``, ``logits`` [T, V] f32, ``hidden_states``
  [L+1, T, H] f32 (as transformers returns them; see reference.json for whether the last entry
  is after the final norm), ``final_norm_input`` [T, H] (the residual stream entering the final
  norm), ``greedy_ids`` [8], and for MoE ``router_logits`` [L, T, E].
* ``reference.json`` -- versions, class, storage dtype, seed, config essentials, notes.

Reference outputs are computed in float32 from the weights *as stored* (rounded to the storage
dtype, then widened back), with ``attn_implementation="eager"`` (and ``experts_implementation=
"eager"`` for MoE), one forward pass, no cache. Seeds are chosen so every greedy step and every
routing decision has a margin >= MIN_MARGIN (the script asserts it), so an engine that sums in
another order still picks the same tokens and experts.

``config_style="legacy"`` fixtures (llama, mistral, qwen2, mixtral) get their config.json rewritten
the way transformers < 5 wrote it (``rope_theta`` + ``rope_scaling``, ``torch_dtype``), which is
what most hub checkpoints look like; the others keep the transformers-5 form (``rope_parameters``,
``dtype``; qwen3_moe writes ``num_local_experts`` instead of ``num_experts``). transformers 5
loads both forms to identical logits.

Re-run (needs the torch venv, never the project venv; no network is used)::

    python3 -m venv .venv-fixtures
    .venv-fixtures/bin/pip install torch==2.13.0 transformers safetensors tokenizers numpy
    .venv-fixtures/bin/python tests/make_hf_fixtures.py [--out tests/fixtures/hf] [--only llama,qwen2]

Output is deterministic for a given torch/transformers/tokenizers version (fixed seeds,
single-threaded tokenizer training).
"""

from __future__ import annotations

import os

# Must be set before `tokenizers` (Rust/rayon) and torch start their thread pools.
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import argparse
import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers
import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)

# ----------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BOS_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
TOKENIZER_VOCAB_SIZE = 384
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

PROMPT_MESSAGES = [{"role": "user", "content": "What is 2+3?"}]

TRAINING_TEXT = """\
The quick brown fox jumps over the lazy dog. A small model can still tell a story: once upon a
time there was a tiny language model that lived inside a test suite. It read the same sentence
every day, and every day it answered with the same numbers, because its weights never changed.

Mixture-of-experts models route each token to a few experts. The router scores every expert,
keeps the top two, and mixes their outputs with the normalised weights. Shared experts see every
token. Attention uses rotary position embeddings, grouped query heads and a causal mask.

<|im_start|>system
You are a helpful assistant.<|im_end|>
<|im_start|>user
What is the capital of France?<|im_end|>
<|im_start|>assistant
The capital of France is Paris.<|im_end|>
<|im_start|>user
What is 2+3? And what is 12*7?<|im_end|>
<|im_start|>assistant
2+3 is 5, and 12*7 is 84.<|im_end|>

def fibonacci(n: int) -> list[int]:
    \"\"\"Return the first n Fibonacci numbers.\"\"\"
    values = [0, 1]
    while len(values) < n:
        values.append(values[-1] + values[-2])
    return values[:n]

for i in range(10):
    print(i, fibonacci(i))

class Expert:
    def __init__(self, weight):
        self.weight = weight

    def forward(self, x):
        return self.weight @ x

0123456789 3.14159 2.71828 1024 2048 4096 65536 1e-6 1e-5 10000 1000000

你好，世界！今天天气很好。我们正在测试一个小型语言模型。
专家混合模型把每个词元分配给少数几个专家。
"""


def train_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    # Exactly the Qwen2 layout (NFC, regex Split, ByteLevel without its own regex). It matters beyond
    # realism: transformers 5 rebuilds the pre-tokenizer itself for some model types (model_type
    # "qwen2" -> Qwen2Tokenizer, whatever tokenizer_class says), so only this layout makes
    # AutoTokenizer agree with tokenizer.json for every fixture.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # The special tokens inside the training text are split out first, as they will be at run time.
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.train_from_iterator([TRAINING_TEXT], trainer=trainer)
    return tok


def tokenizer_config() -> dict[str, Any]:
    added = {}
    for i, t in enumerate(SPECIAL_TOKENS):
        added[str(i)] = {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
    return {
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": BOS_TOKEN,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS_TOKEN,
        "model_max_length": 256,
        "pad_token": EOS_TOKEN,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def render_prompt() -> str:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(CHAT_TEMPLATE).render(messages=PROMPT_MESSAGES, add_generation_prompt=True)


# ----------------------------------------------------------------------------------------------
# Architectures
# ----------------------------------------------------------------------------------------------

COMMON = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "hidden_act": "silu",
}


@dataclass
class Arch:
    name: str
    cls_name: str
    config_cls_name: str
    seed: int
    dtype: str  # storage dtype: float32 / bfloat16 / float16
    config: dict[str, Any]
    moe: bool = False
    shard_size: str | None = None  # max_shard_size for save_pretrained -> sharded checkpoint
    # "legacy": rewrite config.json the way transformers < 5 wrote it (rope_theta + rope_scaling,
    # torch_dtype) -- most checkpoints on the hub look like that. "v5": keep rope_parameters/dtype.
    config_style: str = "v5"
    notes: list[str] = field(default_factory=list)


def _rope(theta: float, **scaling: Any) -> dict[str, Any]:
    rp = {"rope_type": "default", "rope_theta": theta}
    rp.update(scaling)
    return rp


ARCHS: list[Arch] = [
    Arch(
        "llama",
        "LlamaForCausalLM",
        "LlamaConfig",
        seed=1401,
        dtype="float32",
        config_style="legacy",
        config={
            "num_hidden_layers": 2,
            "intermediate_size": 96,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False,
            "rope_parameters": _rope(
                10000.0,
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=32,
            ),
        },
        notes=[
            (
                "llama3 rope scaling: with head_dim 16 the 8 frequencies cover the unscaled, "
                "smoothed and fully scaled (/factor) bands"
            )
        ],
    ),
    Arch(
        "mistral",
        "MistralForCausalLM",
        "MistralConfig",
        seed=1202,
        dtype="bfloat16",
        config_style="legacy",
        config={
            "num_hidden_layers": 3,
            "intermediate_size": 96,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False,
            "sliding_window": None,
            "rope_parameters": _rope(10000.0),
        },
        notes=["3 layers; stored as bfloat16 safetensors; sliding_window null"],
    ),
    Arch(
        "qwen2",
        "Qwen2ForCausalLM",
        "Qwen2Config",
        seed=1203,
        dtype="float16",
        config_style="legacy",
        config={
            "num_hidden_layers": 2,
            "intermediate_size": 96,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": True,
            "use_sliding_window": False,
            "rope_parameters": _rope(1000000.0),
        },
        notes=[
            (
                "tied embeddings (no lm_head.weight in the file); q/k/v have biases, o_proj none; "
                "stored as float16"
            )
        ],
    ),
    Arch(
        "qwen3",
        "Qwen3ForCausalLM",
        "Qwen3Config",
        seed=1004,
        dtype="float32",
        config={
            "num_hidden_layers": 2,
            "intermediate_size": 96,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "use_sliding_window": False,
            "rope_parameters": _rope(1000000.0),
        },
        notes=["q_norm/k_norm are RMSNorm over head_dim (per head), applied before RoPE"],
    ),
    Arch(
        "qwen3_yarn",
        "Qwen3ForCausalLM",
        "Qwen3Config",
        seed=1006,
        dtype="bfloat16",
        config_style="legacy",
        config={
            "num_hidden_layers": 2,
            "intermediate_size": 96,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": True,
            "attention_bias": False,
            "use_sliding_window": False,
            "rope_parameters": _rope(1000000.0, rope_type="yarn", factor=4.0, original_max_position_embeddings=8),
        },
        notes=[
            (
                "yarn rope scaling (factor 4 over 8 original positions, as Qwen3's long-context configs "
                "write it in rope_scaling): its frequency ramp and attention factor 0.1*ln(4)+1"
            )
        ],
    ),
    Arch(
        "mixtral",
        "MixtralForCausalLM",
        "MixtralConfig",
        seed=1405,
        dtype="float32",
        moe=True,
        shard_size="250KB",
        config_style="legacy",
        config={
            "num_hidden_layers": 2,
            "intermediate_size": 32,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False,
            "sliding_window": None,
            "rope_parameters": _rope(1000000.0),
        },
        notes=["sharded checkpoint; softmax over all experts, top-2, renormalised (always)"],
    ),
    Arch(
        "qwen2_moe",
        "Qwen2MoeForCausalLM",
        "Qwen2MoeConfig",
        seed=1506,
        dtype="float32",
        moe=True,
        config={
            "num_hidden_layers": 2,
            "intermediate_size": 96,
            "moe_intermediate_size": 32,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "shared_expert_intermediate_size": 48,
            "norm_topk_prob": False,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False,
            "use_sliding_window": False,
            "rope_parameters": _rope(1000000.0),
        },
        notes=[
            (
                "shared expert (intermediate 48) scaled by sigmoid(shared_expert_gate(x)); "
                "norm_topk_prob False (top-k softmax probs used as is); q/k/v biases"
            )
        ],
    ),
    Arch(
        "qwen3_moe",
        "Qwen3MoeForCausalLM",
        "Qwen3MoeConfig",
        seed=1707,
        dtype="float32",
        moe=True,
        config={
            "num_hidden_layers": 2,
            "intermediate_size": 96,
            "moe_intermediate_size": 32,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "use_sliding_window": False,
            "rope_parameters": _rope(1000000.0),
        },
        notes=["norm_topk_prob True; q_norm/k_norm per head over head_dim"],
    ),
    Arch(
        "olmoe",
        "OlmoeForCausalLM",
        "OlmoeConfig",
        seed=1008,
        dtype="float32",
        moe=True,
        config={
            "num_hidden_layers": 2,
            "intermediate_size": 32,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "norm_topk_prob": False,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "clip_qkv": None,
            "rope_parameters": _rope(10000.0),
        },
        notes=[
            (
                "q_norm/k_norm are RMSNorm over the FULL projection width (q: heads*head_dim=64, "
                "k: kv_heads*head_dim=32), applied before the per-head reshape; norm_topk_prob False"
            )
        ],
    ),
]

# ----------------------------------------------------------------------------------------------
# Weights
# ----------------------------------------------------------------------------------------------

STD_LINEAR = 0.15
STD_EMBED = 0.5
STD_LM_HEAD = 0.35  # logits std over the vocab ~ 8 * 0.35 ~ 3 (untied models)
STD_BIAS = 0.1
STD_NORM = 0.2
STD_ROUTER = 1.0
STD_SHARED_GATE = 0.3


def _param_std(name: str) -> tuple[str, float]:
    """('norm'|'normal', std) for a parameter name (internal transformers names)."""
    if name.endswith("norm.weight"):  # input/post_attention layernorm, final norm, q_norm, k_norm
        return "norm", STD_NORM
    if name.endswith(".bias"):
        return "normal", STD_BIAS
    if name.endswith("mlp.gate.weight"):  # MoE router
        return "normal", STD_ROUTER
    if name.endswith("shared_expert_gate.weight"):
        return "normal", STD_SHARED_GATE
    if name.endswith("embed_tokens.weight"):
        return "normal", STD_EMBED
    if name == "lm_head.weight":
        return "normal", STD_LM_HEAD
    return "normal", STD_LINEAR


@torch.no_grad()
def redraw_weights(model: torch.nn.Module, seed: int, storage_dtype: torch.dtype) -> None:
    """Replace every parameter deterministically and round it to the storage dtype (kept as f32)."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():  # tied parameters are yielded once
        kind, std = _param_std(name)
        noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
        value = 1.0 + std * noise if kind == "norm" else std * noise
        p.copy_(value.to(storage_dtype).to(torch.float32))


# ----------------------------------------------------------------------------------------------
# Reference computation
# ----------------------------------------------------------------------------------------------

N_GREEDY = 8
# The seeds in ARCHS were picked (from a handful tried) so that every greedy step's top-1/top-2 logit
# gap and every top-k/next router-logit gap is >= 0.1: an engine computing in float32 with another
# summation order must reproduce the same tokens and expert choices. Enforced below.
MIN_MARGIN = 0.1


@torch.no_grad()
def forward_all(model, ids: torch.Tensor, moe: bool):
    captured = {}

    def hook(_mod, args):
        captured["final_norm_input"] = args[0].detach().clone()

    h = model.model.norm.register_forward_pre_hook(hook)
    try:
        kwargs = {"output_hidden_states": True, "use_cache": False}
        if moe:
            kwargs["output_router_logits"] = True
        out = model(input_ids=ids[None], **kwargs)
    finally:
        h.remove()
    return out, captured["final_norm_input"][0]


@torch.no_grad()
def greedy(model, ids: torch.Tensor, n: int) -> tuple[list[int], float]:
    """Greedy tokens by full recomputation (no cache, eos ignored); returns (ids, min top1-top2 gap)."""
    seq = ids.clone()
    out_ids, min_gap = [], float("inf")
    for _ in range(n):
        logits = model(input_ids=seq[None], use_cache=False).logits[0, -1]
        top2 = torch.topk(logits, 2).values
        min_gap = min(min_gap, float(top2[0] - top2[1]))
        nxt = int(torch.argmax(logits))
        out_ids.append(nxt)
        seq = torch.cat([seq, torch.tensor([nxt], dtype=seq.dtype)])
    return out_ids, min_gap


def make_legacy_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """config.json as transformers < 5 wrote it: rope_theta (+ rope_scaling), torch_dtype."""
    cfg = dict(cfg)
    rp = dict(cfg.pop("rope_parameters"))
    cfg["rope_theta"] = rp.pop("rope_theta")
    cfg["rope_scaling"] = rp if rp.get("rope_type", "default") != "default" else None
    cfg["torch_dtype"] = cfg.pop("dtype")
    return dict(sorted(cfg.items()))


def build_one(arch: Arch, out_dir: Path, tok: Tokenizer, tok_json: str, prompt: str) -> dict[str, Any]:
    storage_dtype = getattr(torch, arch.dtype)
    config_cls = getattr(transformers, arch.config_cls_name)
    model_cls = getattr(transformers, arch.cls_name)

    vocab = tok.get_vocab_size()
    cfg = config_cls(
        vocab_size=vocab,
        bos_token_id=tok.token_to_id(BOS_TOKEN),
        eos_token_id=tok.token_to_id(EOS_TOKEN),
        pad_token_id=None,
        **COMMON,
        **arch.config,
    )
    torch.manual_seed(arch.seed)
    impl = {"attn_implementation": "eager"}
    if arch.moe:  # transformers 5 defaults to "grouped_mm"; the eager per-expert loop is the plain math
        impl["experts_implementation"] = "eager"
    model = model_cls._from_config(cfg, dtype=torch.float32, **impl)
    model.eval()
    redraw_weights(model, arch.seed, storage_dtype)

    # --- reference outputs (f32 compute, weights already rounded to the storage dtype) ---
    enc = tok.encode(prompt)
    ids = torch.tensor(enc.ids, dtype=torch.long)
    assert tok.decode(enc.ids, skip_special_tokens=False) == prompt
    out, final_norm_input = forward_all(model, ids, arch.moe)
    logits = out.logits[0].float()
    hs = torch.stack([h[0] for h in out.hidden_states]).float()
    L = cfg.num_hidden_layers
    assert hs.shape[0] == L + 1, hs.shape
    assert torch.isfinite(logits).all() and torch.isfinite(hs).all()

    # Which semantics does the last hidden_states entry have?
    normed = model.model.norm(final_norm_input)
    last_is_post_norm = bool(torch.allclose(hs[-1], normed, atol=1e-6, rtol=0))
    last_is_pre_norm = bool(torch.allclose(hs[-1], final_norm_input, atol=1e-6, rtol=0))
    assert last_is_post_norm != last_is_pre_norm
    assert torch.allclose(model.lm_head(normed), logits, atol=1e-5)

    greedy_ids, greedy_gap = greedy(model, ids, N_GREEDY)
    assert greedy_ids[0] == int(torch.argmax(logits[-1]))

    arrays: dict[str, np.ndarray] = {
        "input_ids": ids.numpy().astype(np.int64),
        "text": np.array(prompt),
        "logits": logits.numpy().astype(np.float32),
        "hidden_states": hs.numpy().astype(np.float32),
        "final_norm_input": final_norm_input.float().numpy().astype(np.float32),
        "greedy_ids": np.array(greedy_ids, dtype=np.int64),
        "greedy_text": np.array(tok.decode(greedy_ids, skip_special_tokens=False)),
    }
    router_info = {}
    if arch.moe:
        rl = torch.stack([r.reshape(len(ids), -1) for r in out.router_logits]).float()
        assert rl.shape[0] == L
        arrays["router_logits"] = rl.numpy().astype(np.float32)
        k = cfg.num_experts_per_tok
        srt = torch.sort(rl, dim=-1, descending=True).values
        router_info = {
            "router_min_gap_topk_vs_next": float((srt[..., k - 1] - srt[..., k]).min()),
            "experts_used_per_layer": [
                sorted(set(torch.topk(rl[i], k).indices.flatten().tolist())) for i in range(L)
            ],
        }

    assert greedy_gap >= MIN_MARGIN, f"{arch.name}: greedy top1/top2 gap {greedy_gap} -- pick another seed"
    if arch.moe:
        gap = router_info["router_min_gap_topk_vs_next"]
        assert gap >= MIN_MARGIN, f"{arch.name}: router top-k gap {gap} -- pick another seed"
    std_over_vocab = logits.std(dim=-1)
    assert float(std_over_vocab.min()) > 1.0, f"{arch.name}: degenerate logits {std_over_vocab}"

    # --- save the checkpoint ---
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    save_kwargs = {"safe_serialization": True}
    if arch.shard_size:
        save_kwargs["max_shard_size"] = arch.shard_size
    model.to(storage_dtype).save_pretrained(out_dir, **save_kwargs)
    cfg_path = out_dir / "config.json"
    saved_cfg = json.loads(cfg_path.read_text())
    if arch.config_style == "legacy":
        saved_cfg = make_legacy_config(saved_cfg)
        cfg_path.write_text(json.dumps(saved_cfg, indent=2) + "\n")
    (out_dir / "tokenizer.json").write_text(tok_json)
    tok_cfg = json.dumps(tokenizer_config(), indent=2, ensure_ascii=False) + "\n"
    (out_dir / "tokenizer_config.json").write_text(tok_cfg)
    np.savez(out_dir / "reference.npz", **arrays)

    files = sorted(p.name for p in out_dir.glob("*.safetensors"))
    assert not list(out_dir.glob("*.bin")) and not list(out_dir.glob("*.pt"))
    ref = {
        "name": arch.name,
        "class": arch.cls_name,
        "model_type": cfg.model_type,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "tokenizers_version": tokenizers.__version__,
        "storage_dtype": arch.dtype,
        "compute_dtype": "float32",
        "attn_implementation": "eager",
        "experts_implementation": "eager" if arch.moe else None,
        "seed": arch.seed,
        "weight_init": {
            "linear_std": STD_LINEAR,
            "embed_std": STD_EMBED,
            "lm_head_std": STD_LM_HEAD,
            "bias_std": STD_BIAS,
            "norm": f"1 + {STD_NORM}*N(0,1)",
            "router_std": STD_ROUTER,
            "shared_expert_gate_std": STD_SHARED_GATE,
        },
        "config_style": arch.config_style,
        "safetensors_files": files,
        "T": len(ids),
        "vocab_size": vocab,
        "num_layers": L,
        "hidden_states_len": L + 1,
        "hidden_states_last_is_post_final_norm": last_is_post_norm,
        "hidden_states_semantics": (
            "hidden_states[0] = token embeddings; hidden_states[i] (1 <= i < L) = residual stream after "
            "layer i-1; hidden_states[L] = "
            + (
                "OUTPUT OF THE FINAL NORM (model.norm applied to the residual after the last layer); "
                "the pre-norm residual is stored separately as final_norm_input"
                if last_is_post_norm
                else "residual stream after the last layer (before the final norm)"
            )
        ),
        "logits_std_over_vocab_min": float(std_over_vocab.min()),
        "logits_std_over_vocab_mean": float(std_over_vocab.mean()),
        "greedy_min_top1_top2_gap": greedy_gap,
        "greedy_note": f"{N_GREEDY} tokens by argmax with full recomputation each step, eos ignored",
        "prompt_messages": PROMPT_MESSAGES,
        "prompt_note": "text = ChatML rendering of prompt_messages with add_generation_prompt=True; "
        "input_ids = tokenizer.json encoding of text (no BOS added)",
        **router_info,
        "notes": arch.notes,
    }
    (out_dir / "reference.json").write_text(json.dumps(ref, indent=2, ensure_ascii=False) + "\n")
    return ref


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "fixtures" / "hf"))
    ap.add_argument("--only", default="", help="comma-separated fixture names (default: all)")
    args = ap.parse_args(argv)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    out_root = Path(args.out)
    only = {s for s in args.only.split(",") if s}
    unknown = only - {a.name for a in ARCHS}
    if unknown:
        ap.error(f"unknown fixture(s): {sorted(unknown)}")

    tok = train_tokenizer()
    tok_json = tok.to_str(pretty=True) + "\n"
    assert tok.get_vocab_size() == TOKENIZER_VOCAB_SIZE, tok.get_vocab_size()
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i
    prompt = render_prompt()

    for arch in ARCHS:
        if only and arch.name not in only:
            continue
        ref = build_one(arch, out_root / arch.name, tok, tok_json, prompt)
        print(
            f"{arch.name:10s} T={ref['T']} logits std(min)={ref['logits_std_over_vocab_min']:.2f} "
            f"greedy gap={ref['greedy_min_top1_top2_gap']:.3f} "
            + (f"router gap={ref['router_min_gap_topk_vs_next']:.3f}" if arch.moe else "")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
