"""One file per architecture family: its spec rows, tensor names per source format, its
hyper-parameter keys and its quirks (the shared types: engine.families.spec; engine.arch
gathers the families listed here). A new family is a file here, one line below, and the blocks
it needs."""
from engine.families import dense, gemma4, gpt_oss, lfm2, mixtral, olmoe, qwen3_5, qwen_moe

FAMILIES = tuple(m.FAMILY for m in (dense, mixtral, qwen_moe, olmoe, lfm2, gpt_oss, qwen3_5, gemma4))
