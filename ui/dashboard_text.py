"""The dashboard's words: a snapshot's figures (StatsSnapshot, DefragResult, GPU readings) as lines of
text, apart from the widgets that show them (ui.dashboard)."""
from __future__ import annotations

from PySide6.QtCore import QCoreApplication

from app import advice as A
from app.model_info import human_bytes

_mb = human_bytes


def _tr(text: str) -> str:
    return QCoreApplication.translate("Dashboard", text)


def defrag_text(r) -> str:
    """What a defrag did: the pool's release and the change in RSS (only resident pages count there)."""
    before, after, change = _mb(r.rss_before), _mb(r.rss_after), r.rss_change
    rss = f"RSS {before} → {after} ({'−' if change < 0 else '+'}{_mb(abs(change))})"
    if r.returned_bytes <= 0:
        return _tr("Nothing to give back: the pool had no free pages it could release · {rss}").format(rss=rss)
    if -change >= r.returned_bytes // 2:
        return _tr("Gave {size} back to the system · {rss}").format(size=_mb(r.returned_bytes), rss=rss)
    return _tr("Released {size} of free pool pages, but RSS did not drop by as much ({rss}): most of those pages "
               "were never in physical memory, or the system has not reclaimed them yet").format(
        size=_mb(r.returned_bytes), rss=rss)


def pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.0%}"


def kernels_line(snap) -> str:
    """What runs: the dot-product path and how it was chosen, the inner kernel per format, and the
    route the last step took through the decoder loop and why (stats())."""
    path, kernels = getattr(snap, "simd_path", ""), getattr(snap, "kernels", None) or {}
    if not path:
        return ""
    per = ", ".join(f"{fmt} {k.split(' ')[0]}" for fmt, k in kernels.items())
    route = getattr(snap, "route", "")
    return f" · kernels {path}" + (f": {per}" if per else "") + (f" · route {route}" if route else "")


def watts(name: str, watts, limit, why: str) -> str:
    if watts is None:
        return f"{name} {why}"
    return f"{name} {watts:.1f} W" + (f" (limit {limit:g} W)" if limit else "")

def no_gpu(snap, hw) -> str:
    if hw is None:
        return f"GPU {A.NO_HARDWARE}"
    why = A.missing(snap, "gpu").removeprefix("not available: ")
    return why[:1].upper() + why[1:] if why.lower().startswith("no nvidia gpu") else f"No NVIDIA GPU: {why}"

def gpu_text(snap, hw, g) -> str:
    if g is None:
        return "The engine runs on the CPU." if hw is not None else ""

    def v(x, fmt):
        return "—" if x is None else fmt.format(x)
    mem = "—" if g.mem_used_bytes is None else f"{g.mem_used_bytes / 2**30:.1f} / {g.mem_total_bytes / 2**30:.1f} GiB"
    return (f"GPU {g.index}: {g.name} · {v(g.temp_c, '{:.0f} °C')} · {v(g.power_w, '{:.0f} W')} of "
            f"{v(g.power_limit_w, '{:.0f} W')} limit · busy {v(g.util_percent, '{:.0f}%')} · memory {mem}")
