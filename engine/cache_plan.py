"""How a model's memory splits: what stays resident, the expert cache's byte budget, the KV cache.

The one estimate of a model's memory: the engine sizes its expert cache from it, plans it again
when memory pressure moves, and the app's fit check shows it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from engine import sysmem
from engine.expert_store import DIRECT_ALIGN, ExpertStore, routed_bytes
from engine.experts import SPARE_SLOTS, min_budget
from engine.mempool import MemoryPool
from engine.model_dir import ModelDir
from engine.sysmem import MemoryBudget

MiB = 1 << 20


@dataclass(frozen=True)
class CachePlan:
    """How the model's memory splits: what always stays resident, the expert cache, the KV cache."""
    capacity: int  # experts per layer the budget amounts to (the per-layer limit, if one was given)
    expert_bytes: int  # one routed expert's slot
    reason: str
    resident_bytes: int  # output head, attention, routers, shared experts (all of a dense model); an
    # untied embedding table stays mapped and is not counted (a token touches one row of it)
    cache_bytes: int  # the expert cache's byte budget, shared by every layer
    kv_bytes: int  # a full KV cache
    available: int  # memory free for this process when planned
    per_layer: int | None = None  # expert_cache_size: at most this many experts of each layer
    budget: MemoryBudget | None = None  # auto: how the room was split (None for an explicit size)
    auto: bool = False  # re-planned when memory pressure changes
    settled: bool = False  # planned after warm-up: the runtime has grown already (a smaller margin)
    # under a cgroup, its active page cache when settled: what it grows by later (clean, reclaimable
    # pages turning active) is room for the pool, not pressure
    active_file: int = 0
    # an explicit size (expert_cache_size or _bytes) that did not fit the memory measured: its bytes,
    # now the most the auto budget may reach (an expert cache pinned beyond the room gets the process
    # OOM-killed under a cgroup, where pool slots are never reclaimed)
    asked: int | None = None
    asked_words: str = ""

    @property
    def warning(self) -> str | None:
        words = None if self.budget is None else self.budget.warning
        if self.asked is not None and self.cache_bytes < self.asked:
            b = self.budget
            cut = (f"{self.asked_words} asks for {self.asked / 1e6:.0f} MB of experts; only {self.cache_bytes / 1e6:.0f} MB "
                   f"fit ({b.room / 1e6:.0f} MB free, {b.limited_by}), so the expert cache holds about "
                   f"{self.capacity} a layer and grows back to the setting when memory frees up.")
            words = cut if words is None else f"{cut} {words}"
        return words


def activation_bytes(cfg, tokens: int = 256) -> int:
    """A prefill's activation buffers, estimated: per token the hidden state, attention and one
    expert's gate/up rows several times over (float32), plus the logits."""
    ff = max(cfg.intermediate_size or 0, cfg.hidden_size)
    return tokens * (4 * ff + 12 * cfg.hidden_size) * 4 + 2 * cfg.vocab_size * 4 + 8 * MiB


def plan_expert_cache(model: ModelDir, params: dict, context_limit: int,
                      available: int | None = None, refuse: bool = False) -> CachePlan:
    """The expert cache's byte budget: what the user asked for, or (auto) the room left after dense
    weights, the KV cache, activations and a margin (engine.sysmem.plan)."""
    from engine.kvcache import model_cache_bytes
    cfg, files = model.config, model.tensor_bytes()  # (a GGUF run in place: its tensors' bytes)
    E, L, k = cfg.num_experts, cfg.num_layers - cfg.dense_layers, cfg.top_k  # L: the layers with experts
    routed = lambda rel: rel.startswith("experts/") and not rel.endswith("_shared.bin")  # noqa: E731
    expert_files = sum(size for rel, size in files.items() if routed(rel))
    # a slot: one expert's span widened to whole pages (O_DIRECT), as the memory pool rounds it
    pages = -(-(expert_files // max(1, E * L)) // DIRECT_ALIGN) + 1  # the file's, and one the span may cross
    one = MemoryPool.block_size(pages * DIRECT_ALIGN)
    kv = model_cache_bytes(cfg, context_limit, params.get("kv_cache_quantize") or "f16")
    resident = sum(size for rel, size in files.items() if E == 1 or not routed(rel))
    if not cfg.tie_word_embeddings:  # the embedding table stays mapped: a token reads its one row
        resident -= model.headers["embeddings.bin"]["token_embd.weight"].nbytes
    if cfg.per_layer_input_size:  # Gemma 4 E2B/E4B's per-layer table, as mapped: a token reads its one row
        resident -= model.headers["embeddings.bin"]["per_layer_token_embd.weight"].nbytes
    measured = None if available is None else (available, "given")
    spare = SPARE_SLOTS * one
    if E > 1 and L > 0:  # every expert's slot as the cache counts it (ExpertCache.all_bytes), and its spares
        probe = ExpertStore(model)
        spare = SPARE_SLOTS * MemoryPool.block_size(probe.span(cfg.dense_layers, 0).slot_bytes)
        everything = routed_bytes(probe) + spare
    else:
        everything = one * E * L + spare
    if E == 1:  # dense: the MLP is resident like everything else (ExpertCache keeps all of them)
        b = sysmem.plan(resident, kv, activation_bytes(cfg), 0, 0, 0, measured, refuse=refuse,
                        compile=sysmem.compile_reserve() if refuse else 0)
        return CachePlan(1, one, "dense model: its one MLP per layer stays in memory", resident, 0, kv, b.room,
                         budget=b)
    b = sysmem.plan(resident, kv, activation_bytes(cfg), L * k * one, everything, min_budget(k, one),
                    measured, refuse=refuse, compile=sysmem.compile_reserve() if refuse else 0)
    asked = None
    if params.get("expert_cache_size"):
        cap = min(E, params["expert_cache_size"])
        nbytes = everything if cap >= E else cap * one * L + spare  # (spares as ExpertCache counts them)
        asked = CachePlan(cap, one, f"{cap} of {E} experts per layer (expert_cache_size)", resident,
                          nbytes, kv, b.room, per_layer=cap, asked_words=f"expert_cache_size {cap}")
    elif params.get("expert_cache_bytes"):
        nbytes = params["expert_cache_bytes"]
        cap = max(1, min(E, (nbytes - SPARE_SLOTS * one) // max(1, one * L)))
        asked = CachePlan(cap, one, f"{nbytes / 1e6:.0f} MB, about {cap} of {E} experts per layer "
                          f"(expert_cache_bytes)", resident, nbytes, kv, b.room,
                          asked_words=f"expert_cache_bytes {nbytes / 1e6:.0f} MB")
    if asked is None:
        return _auto_plan(b, one, E, L, resident, kv)
    if min(asked.cache_bytes, everything) <= b.experts:  # fits: exactly the setting, never re-planned
        return asked
    # re-planned as memory moves, never above the setting
    return _lowered(_auto_plan(b, one, E, L, resident, kv), min(asked.cache_bytes, everything), asked.per_layer,
                    asked.asked_words, E)


def _lowered(plan: CachePlan, asked: int, per_layer: int | None, words: str, E: int) -> CachePlan:
    """An auto plan standing in for an explicit size that did not fit: the setting's per-layer limit,
    its bytes as the ceiling, its words in the reason."""
    return replace(plan, per_layer=per_layer, capacity=min(plan.capacity, per_layer or E), asked=asked,
                   asked_words=words, reason=f"{words}, lowered to fit: {plan.reason}")


def _auto_plan(b: MemoryBudget, one: int, E: int, L: int, resident: int, kv: int) -> CachePlan:
    cap = E if b.experts >= b.all_experts else max(1, min(E - 1, (b.experts - SPARE_SLOTS * one) // max(1, one * L)))
    reason = (f"auto: {b.experts / 1e6:.0f} MB for experts, about {cap} of {E} per layer ({b.room / 1e6:.0f} MB "
              f"free, {b.limited_by}; dense weights {resident / 1e6:.0f} MB, KV cache {kv / 1e6:.0f} MB)")
    return CachePlan(cap, one, reason, resident, b.experts, kv, b.room, budget=b, auto=True)


def replan(plan: CachePlan, num_experts: int, num_layers: int, cache_used: int, kv_used: int,
           settled: bool | None = None) -> CachePlan:
    """The auto plan again with the room measured now (memory pressure changed). `settled` (after
    warm-up; kept by later plans): the runtime has grown, a smaller margin."""
    b, one = plan.budget, plan.expert_bytes
    settled = plan.settled if settled is None else settled
    free, source = sysmem.room()
    active = sysmem.cgroup_active_file() if source == "cgroup limit" else None
    active_file = plan.active_file if plan.settled else (active or 0)
    if plan.settled and active is not None:
        free += max(0, active - plan.active_file)
    k = b.cycle // max(1, num_layers * one)
    held_back = sysmem.margin(free, settled)
    left = cache_used + free - max(0, b.kv - kv_used) - b.activations - held_back
    experts = max(min_budget(k, one), min(b.all_experts, left, plan.asked or b.all_experts))
    nb = replace(b, room=free, limited_by=source, experts=experts, margin=held_back)
    new = _auto_plan(nb, one, num_experts, num_layers, plan.resident_bytes, plan.kv_bytes)
    if plan.asked is not None:  # an explicit size lowered to fit stays one
        new = _lowered(new, plan.asked, plan.per_layer, plan.asked_words, num_experts)
    return replace(new, settled=settled, active_file=active_file)
