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


def speed_line(snap, step, reply) -> str:
    """The speeds now (`step`: a reply is being written) or the last reply's (`reply`: its last Step,
    None when it was written before the dashboard opened), then the engine's totals since it loaded,
    named as such: under "last reply" they read as that reply's own."""
    s = step if step is not None else reply
    prefill = s.prefill_tok_s if s is not None else snap.prefill_tok_s
    decode = s.decode_tok_s if s is not None else snap.decode_tok_s
    ttft = s.ttft_s if s is not None else snap.ttft_s
    own = "" if s is None else _tr(", {gen:,} tokens written, a prompt of {prompt:,}").format(
        gen=s.generated_tokens, prompt=s.prompt_tokens)
    head = _tr("now") if step is not None else _tr("last reply")
    return (f"{head}: prefill {prefill:,.0f} tok/s · decode {decode:,.1f} tok/s · first token {ttft:.2f} s{own} · "
            + _tr("since the model loaded: {gen:,} tokens generated, {pre:,} prefilled, {re:,} reused").format(
                gen=snap.tokens_generated, pre=snap.tokens_prefilled, re=snap.tokens_reused))


def prefetch_text(ec) -> str:
    """Prefetch accuracy, or "—" and why there is none."""
    if not ec.prefetch_enabled:
        return "— " + _tr("(off: prefetch_window is 0)")
    if getattr(ec, "prefetch_paused", False):
        return pct(ec.prefetch_accuracy) + " " + _tr("(paused: its guesses were mostly wrong)")
    if ec.prefetch_accuracy is None:
        return "— " + _tr("(no guess checked yet)")
    return pct(ec.prefetch_accuracy)


def thermal(event) -> bool:
    """A ThrottleEvent of the thermal governor, not of the thread tuner or the load cap (which say
    what a measured decode or other programs did)."""
    return not event.reason.startswith(A.TUNER_REASONS)


def events_text(events) -> str:
    """Thread changes in two kinds: the heat's, and the thread tuner's (and load cap's)."""
    heat = [e for e in events if thermal(e)]
    tuner = [e for e in events if not thermal(e)]
    parts = [_tr("thermal: {n} throttle event(s), last: {why}").format(n=len(heat), why=heat[-1].reason)
             if heat else _tr("no thermal throttling")]
    if tuner:
        parts.append(_tr("thread tuner: {n} change(s), last: {why}").format(n=len(tuner), why=tuner[-1].reason))
    return " · ".join(parts)


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
