"""How much memory this process may still use, and how the engine splits it (the one budget).

Room: the smaller of the machine's MemAvailable and what the process's memory cgroup (v2 or v1)
still allows, counting the cgroup's inactive file pages as room (they are reclaimed first).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import psutil

from engine.errors import ColibriError

MiB = 1 << 20
FLOOR_EXTRA = 200_000_000  # below dense weights + this (200 MB), a model is refused before it loads
# runtime growth after planning: loaded kernels and their libraries' pages, thread stacks, Python
# objects (what the bench models grew by from import to decode, with room to spare)
MARGIN = 96 * MiB
# after warm-up most of that growth has happened: what is left is a prompt's and a few tokens' worth
SETTLED_MARGIN = 32 * MiB
# the first start of a kernel version compiles every kernel (Numba, LLVM), for minutes, with a peak
# RSS well above a warm start's: this is room for that compile
COMPILE_BYTES = 700 * MiB


def margin(free: int, settled: bool = False) -> int:
    """What the budget holds back for runtime growth when `free` bytes are room: MARGIN + 2%
    (`settled`, planned again after warm-up: SETTLED_MARGIN + 2%)."""
    return (SETTLED_MARGIN if settled else MARGIN) + free // 50


class InsufficientMemoryError(ColibriError, MemoryError):
    """Too little memory to run the model at all; raised before anything is loaded."""


def _stat(path: Path, *keys: str) -> int:
    try:
        fields = dict(line.split() for line in path.read_text().splitlines() if line.count(" ") == 1)
    except (OSError, ValueError):
        return 0
    return next((int(fields[k]) for k in keys if k in fields), 0)


def _cgroup(root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc/self/cgroup")) -> tuple[int, int] | None:
    """(limit, working set) of this process's memory cgroup, if it has a limit."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        rel = rel.lstrip("/")
        if controllers == "":  # v2 unified hierarchy
            base = root / rel
            limit_file, usage_file, inactive = base / "memory.max", base / "memory.current", ("inactive_file",)
        elif "memory" in controllers.split(","):
            base = root / "memory" / rel
            limit_file, usage_file = base / "memory.limit_in_bytes", base / "memory.usage_in_bytes"
            inactive = ("total_inactive_file", "inactive_file")
        else:
            continue
        try:
            limit = limit_file.read_text().strip()
            usage = int(usage_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or int(limit) >= 1 << 60:
            continue
        return int(limit), max(0, usage - _stat(base / "memory.stat", *inactive))
    return None


def cgroup_active_file(root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc/self/cgroup")) -> int | None:
    """Active page cache charged to this process's memory cgroup (None without a limited one):
    clean file pages the working set counts although reclaim can take them."""
    if _cgroup(root, proc) is None:
        return None
    for line in proc.read_text().splitlines():
        _, controllers, rel = line.split(":", 2)
        rel = rel.lstrip("/")
        if controllers == "":
            return _stat(root / rel / "memory.stat", "active_file")
        if "memory" in controllers.split(","):
            return _stat(root / "memory" / rel / "memory.stat", "total_active_file", "active_file")
    return None


def _cgroup_room(root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc/self/cgroup")) -> int | None:
    cg = _cgroup(root, proc)
    return None if cg is None else max(0, cg[0] - cg[1])


def room() -> tuple[int, str]:
    """Bytes this process may still use, and what limits it."""
    host = psutil.virtual_memory().available
    cg = _cgroup_room()
    if cg is not None and cg < host:
        return cg, "cgroup limit"
    return host, "MemAvailable"


def _rss() -> int:
    """Memory this process holds that the room does not count (in a cgroup its working set, else anonymous)."""
    mi = psutil.Process().memory_info()
    cg = _cgroup()
    return min(cg[1], mi.rss) if cg is not None else mi.rss - getattr(mi, "shared", 0)


def compile_reserve(cache_dir: str | None = None) -> int:
    """COMPILE_BYTES while this kernel version's Numba cache holds nothing yet (the first start
    after an install or an upgrade compiles everything), else 0."""
    cache_dir = cache_dir or os.environ.get("NUMBA_CACHE_DIR")
    if not cache_dir:
        return 0
    for _, _, files in os.walk(cache_dir):
        if any(f.endswith(".nbi") for f in files):
            return 0
    return COMPILE_BYTES


def available_memory() -> int:
    return room()[0]


@dataclass(frozen=True)
class MemoryBudget:
    """The one memory budget: the room measured, what stays resident, what is left for experts."""
    room: int  # bytes this process may still use, when measured
    limited_by: str  # "MemAvailable" or "cgroup limit"
    process: int  # this process's resident set when measured (already paid, inside the limit)
    dense: int  # weights that stay resident: embeddings, attention, routers, shared experts
    kv: int  # the KV cache when full
    activations: int  # a prefill's activation buffers
    margin: int  # runtime growth after planning
    experts: int  # the expert cache: what is left (at least its working minimum), at most every expert
    cycle: int  # one token's worst case: layers x top-k x one expert
    all_experts: int  # every routed expert

    @property
    def floor(self) -> int:
        return self.dense + FLOOR_EXTRA

    @property
    def warning(self) -> str | None:
        """Plain words when the budget is below one token's experts (LRU then gets no hits)."""
        if self.experts >= self.cycle or self.experts >= self.all_experts:
            return None
        return (f"The expert cache has {self.experts / 1e6:.0f} MB, less than one token's experts "
                f"({self.cycle / 1e6:.0f} MB): almost every expert is read from disk again for every "
                f"token, so decoding runs at disk speed. Free memory (now {self.room / 1e6:.0f} MB, "
                f"{self.limited_by}), shorten context_length or use a smaller quantization.")


def plan(dense: int, kv: int, activations: int, cycle: int, all_experts: int, minimum: int,
         measured: tuple[int, str] | None = None, process: int | None = None, refuse: bool = False,
         compile: int = 0) -> MemoryBudget:
    """The budget for the expert cache: room - dense - KV - activations - margin, within [minimum,
    all_experts]. `refuse`: InsufficientMemoryError when this process may use less than dense weights
    + 200 MB (+ `compile`, the first start's compile)."""
    free, source = measured or room()
    rss = _rss() if process is None else process
    held_back = margin(free)
    experts = max(minimum, min(all_experts, free - dense - kv - activations - held_back))
    b = MemoryBudget(free, source, rss, dense, kv, activations, held_back, experts, cycle, all_experts)
    if refuse and free + rss < b.floor:
        raise InsufficientMemoryError(
            f"not enough memory for this model: it needs at least {b.floor / 1e6:.0f} MB (dense weights "
            f"{dense / 1e6:.0f} MB + 200 MB), and this process may use {(free + rss) / 1e6:.0f} MB in all "
            f"({free / 1e6:.0f} MB free, {source}). Close other programs or raise the memory limit.")
    if refuse and free + rss < b.floor + compile:
        raise InsufficientMemoryError(
            f"not enough memory for a first start: this version compiles its kernels once, which takes about "
            f"{compile / 1e6:.0f} MB more for a few minutes, so it needs {(b.floor + compile) / 1e6:.0f} MB now and "
            f"this process may use {(free + rss) / 1e6:.0f} MB ({free / 1e6:.0f} MB free, {source}). Start it once "
            f"with more memory; after that {b.floor / 1e6:.0f} MB suffice (dense weights {dense / 1e6:.0f} MB + 200 MB).")
    return b
