"""What the dashboard says in plain words, derived from one `StatsSnapshot`; no Qt here.

`advice(snapshot)` turns figures into advice lines. The readers below it (`hardware`, `gpu`,
`throttle_events`, ...) read the figures newer engines add to the snapshot: an engine that does not
report one gives None or (), and the dashboard says "not available" with the reason.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

import psutil

HIT_RATE_LOW = 0.60  # below this the expert cache is too small for the model's routing
PREFETCH_LOW = 0.60  # below this prefetching mostly loads experts nobody asks for
MIN_LOOKUPS = 32  # fewer expert lookups than this say nothing about the hit rate
RAM_FILESYSTEMS = ("tmpfs", "ramfs")
NO_HARDWARE = "not available: this engine does not report hardware figures"
TUNER_REASONS = ("decode ", "other programs")  # how the thread tuner and the load cap word a change (not heat)


# --- readers: one figure each, None (or ()) where the engine does not report it -----------------
def hardware(snap: Any) -> Any | None:
    """The HardwareSnapshot carried by the stats snapshot, if any."""
    return getattr(snap, "hardware", None)


def gpu(snap: Any) -> Any | None:
    hw = hardware(snap)
    return getattr(hw, "gpu", None) if hw is not None else getattr(snap, "gpu", None)


def missing(snap: Any, key: str) -> str:
    """Why figure `key` ("cpu_temp", "cpu_power", "gpu", ...) is absent, as the panel shows it."""
    hw = hardware(snap)
    if hw is None:
        return NO_HARDWARE
    why = (getattr(hw, "unavailable", None) or {}).get(key)
    return str(why) if why else "not available"


def throttle_events(snap: Any) -> tuple:
    """ThrottleEvents (time, from_threads, to_threads, temp_c, reason), oldest first."""
    for holder in (snap, hardware(snap)):
        events = getattr(holder, "throttle_events", None)
        if events:
            return tuple(events)
    return ()


def joules_per_token(snap: Any) -> float | None:
    value = getattr(snap, "joules_per_token", None)
    if value is None:
        energy = getattr(snap, "energy", None)
        value = getattr(energy, "joules_per_token", None)
    return None if value is None else float(value)


def energy_missing(snap: Any) -> str:
    """Why joules per token is absent."""
    if not hasattr(snap, "energy"):
        return NO_HARDWARE
    energy = snap.energy
    if energy is None:
        return "not available until the first reply"
    reasons = list((getattr(energy, "unavailable", None) or {}).values())
    return "; ".join(dict.fromkeys(reasons)) if reasons else "not available"


def fallbacks(snap: Any) -> list[str]:
    """Each fallback to the CPU (GPU out of memory, no GPU kernel, ...) as one line."""
    found = getattr(snap, "fallbacks", None) or getattr(getattr(snap, "scheduler", None), "fallbacks", None) or ()
    return [str(f) for f in found]


def configured_threads(snap: Any) -> int:
    """The thread count asked for (the default is one per physical core)."""
    c = getattr(snap, "configured_threads", None)
    if c:
        return int(c)
    events = throttle_events(snap)
    return int(events[0].from_threads) if events else int(getattr(snap, "threads", 0) or 0)


def effective_threads(snap: Any) -> int:
    """Threads in use now: fewer than configured while the thermal governor holds some back."""
    events = throttle_events(snap)
    if getattr(snap, "configured_threads", None) is None and events:
        return int(events[-1].to_threads)  # an engine that reports only the events
    return int(getattr(snap, "threads", 0) or 0)


def throttled(snap: Any) -> bool:
    flag = getattr(snap, "throttled", None)
    if flag is not None:
        return bool(flag)
    return 0 < effective_threads(snap) < configured_threads(snap)


# --- the file system under the model ---------------------------------------------------------
def read_mounts(path: str = "/proc/mounts") -> list[tuple[str, str]]:
    """(mount point, file system type) of every mount; [] where /proc/mounts is unreadable."""
    try:
        text = Path(path).read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            out.append((parts[1].replace("\\040", " "), parts[2]))
    return out


def filesystem_of(path: str | os.PathLike, mounts: Iterable[tuple[str, str]]) -> tuple[str, str] | None:
    """The (mount point, type) holding `path`: the longest mount point that contains it."""
    p = os.path.realpath(path)
    best = None
    for point, fstype in mounts:
        inside = p == point or p.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, fstype)
    return best


# --- advice ----------------------------------------------------------------------------------
def advice(snap: Any, *, model_path: str | os.PathLike | None = None,
           mounts: Iterable[tuple[str, str]] | None = None, physical_cores: int | None = None) -> list[str]:
    """Plain-words advice from one stats snapshot, most important first; [] when all is well.
    `model_path` defaults to the snapshot's; `mounts` and `physical_cores` to this machine's."""
    lines: list[str] = []
    ec = getattr(snap, "expert_cache", None)
    moe = (getattr(snap, "num_experts", 1) or 1) > 1
    if moe and ec is not None and ec.hits + ec.misses >= MIN_LOOKUPS and ec.hit_rate < HIT_RATE_LOW:
        lines.append(f"Only {ec.hit_rate:.0%} of expert lookups found the expert already in memory: raise the "
                     f"expert cache size (Settings → expert_cache_size; now {ec.capacity_per_layer} of "
                     f"{snap.num_experts} experts per layer).")
    if moe and ec is not None and ec.prefetch_enabled and ec.prefetch_accuracy is not None \
            and ec.prefetch_accuracy < PREFETCH_LOW:
        if ec.prefetch_paused:  # the cache holds its guesses back by itself meanwhile
            lines.append(f"Prefetch guesses right only {ec.prefetch_accuracy:.0%} of the time, so Colibri has "
                         f"paused it (it resumes when its guesses improve); set prefetch_window to 0 to turn it "
                         f"off for good.")
        else:
            lines.append(f"Prefetch guesses right only {ec.prefetch_accuracy:.0%} of the time: set prefetch_window "
                         f"to 0 to stop loading experts that are not used.")
    for f in fallbacks(snap):
        lines.append(f"A fallback to the CPU happened: {f}.")
    events = throttle_events(snap)
    # fewer threads by the thread tuner's choice (other programs, a measured decode) is no heat: on a
    # machine without a sensor this said "the CPU reached nan °C"
    if throttled(snap) and not (events and events[-1].reason.startswith(TUNER_REASONS)):
        hw = hardware(snap)
        temp = events[-1].temp_c if events else getattr(hw, "cpu_temp_c", None)
        hot = f"the CPU reached {temp:.0f} °C, so " if temp is not None and temp == temp else ""
        lines.append(f"Thermal throttling is active: {hot}the engine runs on {effective_threads(snap)} of "
                     f"{configured_threads(snap)} threads until it cools down. Improve the cooling or set a lower "
                     f"power_limit.")
    wanted = int((getattr(snap, "params", None) or {}).get("threads") or 0)
    cores = physical_cores if physical_cores is not None else (psutil.cpu_count(logical=False) or 0)
    if wanted and cores and wanted > cores:
        lines.append(f"threads is set to {wanted} but this machine has {cores} physical cores: set threads to "
                     f"{cores} (threads sharing a core slow each other down).")
    path = model_path or getattr(snap, "model_path", None)
    if path:
        fs = filesystem_of(path, read_mounts() if mounts is None else mounts)
        if fs is not None and fs[1] in RAM_FILESYSTEMS:
            lines.append(f"The model files are on {fs[1]} ({fs[0]}): mmap saves nothing: the model is already "
                         f"in RAM. Keep models on a disk to leave that memory free.")
    return lines
