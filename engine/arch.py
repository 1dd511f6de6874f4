"""What an architecture is: the families of engine/families gathered, one frozen `ArchSpec` per
architecture and one `Family` (the converters' facts) per family, each declared once in its
family's file. The converters, the model-directory layout, the forward pass and the fused decode
all read them; none holds a table of architectures of its own.
"""
from __future__ import annotations

from engine.errors import ModelFormatError
from engine.families import FAMILIES
from engine.families.spec import (FEATURES, IMPLEMENTED, ArchSpec, Family, LayerKind, Rope, Router,
                                  UnsupportedFeatureError)

__all__ = ["ARCHITECTURES", "FAMILIES", "FEATURES", "GGUF_ARCHS", "HF_CLASSES", "IMPLEMENTED", "SPECS", "ArchSpec", "Family",
           "LayerKind", "Rope", "Router", "UnsupportedFeatureError", "family", "gguf_spec", "spec"]

SPECS: dict[str, ArchSpec] = {s.name: s for f in FAMILIES for s in f.specs}
ARCHITECTURES = tuple(SPECS)
HF_CLASSES = {c: s for s in SPECS.values() for c in s.hf_classes}  # Hugging Face class -> spec
GGUF_ARCHS = {s.gguf_arch: s for s in SPECS.values() if s.gguf_arch}  # general.architecture -> spec
_FAMILIES = {f.name: f for f in FAMILIES}


def spec(architecture: str) -> ArchSpec:
    """The spec of one of our architecture names; unknown ones name the supported list."""
    try:
        return SPECS[architecture]
    except KeyError:
        raise ModelFormatError(f"architecture {architecture!r} is not supported; supported: "
                               f"{', '.join(SPECS)}") from None


def family(architecture: str) -> Family:
    """The family that declares one of our architecture names (its tensor names and keys)."""
    return _FAMILIES[spec(architecture).family]


def gguf_spec(gguf_arch: str, experts: int) -> ArchSpec | None:
    """The spec of a GGUF general.architecture with `experts` experts (llama with experts is Mixtral)."""
    if experts > 1:
        for s in SPECS.values():
            if s.gguf_experts == gguf_arch:
                return s
    return GGUF_ARCHS.get(gguf_arch)
