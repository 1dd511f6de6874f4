"""The one decoder loop (base.Transformer.forward: every architecture, driven by its spec in
engine.arch), its fused routes (fused) and N sequences' steps through it (rows)."""
from __future__ import annotations

from engine.models.base import Transformer

__all__ = ["Transformer"]
