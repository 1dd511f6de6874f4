"""The forward pass (base.Transformer: one class for every architecture, driven by its spec in
engine.arch) and the one-call decode (fused)."""
from __future__ import annotations

from engine.models.base import Transformer

__all__ = ["Transformer"]
