"""Architecture name (config.json) -> the class that runs it."""
from __future__ import annotations

from engine.errors import ModelFormatError
from engine.models.base import Transformer
from engine.models.llama import Llama
from engine.models.mixtral import Mixtral
from engine.models.olmoe import Olmoe
from engine.models.qwen_moe import QwenMoe

ARCHITECTURES: dict[str, type[Transformer]] = {
    "llama": Llama, "mistral": Llama, "qwen2": Llama, "qwen3": Llama,
    "mixtral": Mixtral, "qwen2_moe": QwenMoe, "qwen3_moe": QwenMoe, "olmoe": Olmoe,
}


def model_class(architecture: str) -> type[Transformer]:
    try:
        return ARCHITECTURES[architecture]
    except KeyError:
        raise ModelFormatError(f"architecture {architecture!r} is not supported; supported: "
                               f"{', '.join(ARCHITECTURES)}") from None
