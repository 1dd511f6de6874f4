"""Every runtime parameter, declared once: name, type, default, range, help.

CLI flags, config-file validation, `Engine.set_param` and (later) the settings dialog are all
generated from this table. `scope` says who reads a value: the engine (`engine`) or each
generation request (`sampling`). `live` says whether a running engine applies a change at once.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

import psutil


def physical_cores() -> int:
    return psutil.cpu_count(logical=False) or psutil.cpu_count() or 1


def grammar(value: Any) -> str:
    """The grammar parameter's text: a Lark grammar, or a JSON schema as JSON text (a dict is
    written as one), kept as the user wrote it; engine.grammar compiles it."""
    if isinstance(value, dict):
        return json.dumps(value)
    if not isinstance(value, str):
        raise TypeError
    if value.lstrip().startswith("{") and not isinstance(json.loads(value), dict):  # (a ValueError: not valid)
        raise TypeError
    return value


@dataclass(frozen=True)
class Param:
    name: str
    type: type
    default: Any
    help: str
    scope: str = "engine"  # "engine" or "sampling"
    min: float | None = None
    max: float | None = None
    choices: tuple | None = None
    live: bool = True
    nullable: bool = False

    def check(self, value: Any) -> Any:
        """The value converted to this parameter's type, or ValueError naming name and range."""
        if self.nullable and (value is None or (isinstance(value, str) and value.lower() in ("auto", "none", ""))):
            return None
        try:
            if self.type is bool and isinstance(value, str):
                v: Any = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}[value.lower()]
            elif self.type is int and isinstance(value, float) and not value.is_integer():
                raise ValueError
            else:
                v = self.type(value)
        except (ValueError, TypeError, KeyError):
            raise ValueError(f"{self.name}: {value!r} is not a valid {self.type.__name__} ({self.range_text()})") from None
        if self.choices is not None and v not in self.choices:
            raise ValueError(f"{self.name}: {v!r} is not one of {', '.join(map(str, self.choices))}")
        if (self.min is not None and v < self.min) or (self.max is not None and v > self.max):
            raise ValueError(f"{self.name}: {v!r} is out of range ({self.range_text()})")
        return v

    def range_text(self) -> str:
        if self.choices is not None:
            return "one of " + ", ".join(map(str, self.choices))
        lo = "-inf" if self.min is None else f"{self.min:g}"
        hi = "inf" if self.max is None else f"{self.max:g}"
        return f"{lo} to {hi}"


PARAMS: dict[str, Param] = {p.name: p for p in [
    # engine
    Param("threads", int, None, "compute threads (default: the number of physical cores)", min=1, max=1024,
          nullable=True),
    Param("context_length", int, 4096, "tokens the KV cache holds (capped by the model's own limit)",
          min=16, max=1 << 20, live=False),
    Param("kv_cache_quantize", str, "f16", "KV cache storage: f32, f16 (half the memory) or int8 (a quarter)",
          choices=("f32", "f16", "int8"), live=False),
    Param("expert_cache_size", int, None, "experts of each layer kept in memory; auto (default) sizes the "
          "cache from free memory, the model and the KV cache", min=1, max=4096, nullable=True, live=False),
    Param("expert_cache_bytes", int, None, "expert cache budget in bytes, instead of a count per layer",
          min=1, max=1 << 50, nullable=True, live=False),
    Param("expert_cache_policy", str, "lfu", "which expert leaves a full expert cache first: lfu, the one "
          "least used lately (fewer misses on real routing), or lru, the one least recently used",
          choices=("lfu", "lru"), live=False),
    Param("prefetch_window", int, 16, "tokens whose expert choices guide prefetching; 0 = no prefetch "
          "(experts load when needed)", min=0, max=4096, live=False),
    Param("gpu_layers", int, 0, "layers whose attention runs on the NVIDIA GPU (numba-cuda), first layers "
          "first; other matmuls go where the cost model says; 0 = CPU only. No GPU: everything on the CPU",
          min=0, max=4096, live=False),
    Param("int8_activations", bool, True, "multiply q4_0/q4_1/q8_0 weights with activations rounded to 8-bit "
          "blocks, in integers, as llama.cpp does (2-3x faster; logits within about 1%); off = float "
          "activations everywhere (bit-for-bit the float reference, slower)"),
    Param("batch_size", int, 128, "prompt tokens processed per forward step during prefill", min=1, max=8192),
    Param("simd", str, "auto", "instruction set the kernels are compiled for: auto (avx512 on AMD, where it "
          "measured faster; avx2 elsewhere, as many Intel CPUs clock down under AVX-512), avx2, or avx512; "
          "applied at the next start", choices=("auto", "avx2", "avx512"), live=False),
    Param("simd_path", str, "auto", "byte dot-product instructions of the int8 kernels: auto (the fastest correct "
          "path, measured once per CPU and cached), vnni, avx2, or generic; applied at the next start",
          choices=("auto", "vnni", "avx2", "generic"), live=False),
    Param("log_level", str, "INFO", "log verbosity", choices=("DEBUG", "INFO", "WARN", "WARNING", "ERROR")),
    Param("power_limit", float, None, "CPU package power limit in watts (Linux RAPL, long-term limit; "
          "needs root); auto = leave it as is; a limit we set is put back on exit", min=1.0, max=10_000.0,
          nullable=True),
    Param("gpu_power_limit", float, None, "NVIDIA GPU power limit in watts (NVML; needs root; checked "
          "against the GPU's own range); auto = leave it as is; put back on exit", min=1.0, max=10_000.0,
          nullable=True),
    Param("throttle_high_c", float, 85.0, "CPU temperature (°C) above which the engine drops one thread "
          "per step", min=40.0, max=150.0),
    Param("throttle_low_c", float, 75.0, "CPU temperature (°C) below which dropped threads come back one "
          "per step; must be below throttle_high_c", min=20.0, max=145.0),
    Param("thread_tuning", bool, True, "use fewer threads while other programs share the cores: decode steps "
          "are timed, and a smaller count is kept while it decodes faster (an OpenMP team stalls whenever one of "
          "its threads is preempted); off = always the thread count above"),
    Param("affinity", bool, False, "pin the engine to one logical CPU per physical core (sched_setaffinity)"),
    # sampling
    Param("max_tokens", int, 512, "most tokens to generate for one reply", scope="sampling", min=1, max=1 << 20),
    Param("temperature", float, 0.7, "randomness; 0 = always the most likely token (greedy)", scope="sampling",
          min=0.0, max=5.0),
    Param("top_k", int, 40, "sample among the k most likely tokens; 0 = no limit", scope="sampling", min=0,
          max=1 << 20),
    Param("top_p", float, 0.95, "sample among the most likely tokens whose probabilities sum to p",
          scope="sampling", min=0.0, max=1.0),
    Param("min_p", float, 0.05, "drop tokens less likely than min_p × the top token's probability",
          scope="sampling", min=0.0, max=1.0),
    Param("repeat_penalty", float, 1.0, "penalise tokens seen in the last 64 tokens: divide a positive logit "
          "by it, multiply a negative one; 1 = off (0 would divide by zero)", scope="sampling", min=0.01, max=10.0),
    Param("frequency_penalty", float, 0.0, "subtract this × how often a token occurs in the last 64 tokens "
          "from its logit (OpenAI's frequency_penalty); 0 = off", scope="sampling", min=-2.0, max=2.0),
    Param("presence_penalty", float, 0.0, "subtract this from the logit of every token seen in the last 64 "
          "tokens (OpenAI's presence_penalty); 0 = off", scope="sampling", min=-2.0, max=2.0),
    Param("speculative", str, "off", "speculative decoding: tokens drafted from the conversation's own text "
          "(n-gram lookup) and checked in one batched step, the output unchanged; auto = on while it measurably "
          "decodes faster in this conversation (greedy only when a seed is set), ngram = always, off = never",
          scope="sampling", choices=("off", "auto", "ngram")),
    Param("draft_max", int, 16, "most tokens drafted per speculative step (the length adapts below it to "
          "what is accepted)", scope="sampling", min=1, max=64),
    Param("seed", int, None, "random seed; the same seed gives the same text", scope="sampling", min=0,
          max=2**63 - 1, nullable=True),
    Param("grammar", grammar, None, "answer in a form: a JSON schema the reply must match, or a grammar "
          "(llguidance's Lark dialect; %json {schema} embeds a schema); the reply ends where the grammar does; "
          "none = free text", scope="sampling", nullable=True),
]}


def defaults(scope: str) -> dict[str, Any]:
    return {p.name: p.default for p in PARAMS.values() if p.scope == scope}


def check(name: str, value: Any) -> Any:
    try:
        return PARAMS[name].check(value)
    except KeyError:
        raise ValueError(f"unknown parameter {name!r}; known: {', '.join(PARAMS)}") from None


def validate(values: dict[str, Any], scope: str | None = None) -> dict[str, Any]:
    out = {}
    for name, value in values.items():
        p = PARAMS.get(name)
        if p is None or (scope is not None and p.scope != scope):
            known = ", ".join(n for n, q in PARAMS.items() if scope is None or q.scope == scope)
            raise ValueError(f"unknown parameter {name!r}; known: {known}")
        out[name] = p.check(value)
    return out


def add_arguments(parser: argparse.ArgumentParser, scopes: tuple[str, ...] = ("engine", "sampling")) -> None:
    """One --flag per parameter, defaulting to None so that only what the user gave is passed on."""
    for p in PARAMS.values():
        if p.scope not in scopes:
            continue
        kind = str if p.type is bool or p.nullable else p.type  # nullable ones also take "auto"
        extra = {"choices": p.choices} if p.choices else {}
        default = "physical cores" if p.name == "threads" else "auto" if p.nullable and p.default is None \
            and p.name != "seed" else p.default
        text = f"{p.help} [default: {default}]".replace("%", "%%")  # argparse formats help with %
        parser.add_argument(f"--{p.name}", type=kind, default=None, help=text, **extra)


def from_args(args: argparse.Namespace, scope: str) -> dict[str, Any]:
    return validate({p.name: getattr(args, p.name) for p in PARAMS.values()
                     if p.scope == scope and getattr(args, p.name, None) is not None})

