"""A SentencePiece-style BPE from a GGUF's vocabulary (tokenizer.ggml.model "gemma4"), as llama.cpp
runs it: spaces become U+2581, runs of newlines and runs of other text are merged apart (llama.cpp's
gemma4 pre-tokenizer "[^\\n]+|[\\n]+"), characters no token covers fall back to their <0xNN> byte
tokens, and decoding undoes all three. Byte-level GGUFs ("gpt2") are built in tokenizer_import."""
from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

SPACE = "\u2581"
SPM_MODELS = ("gemma4",)


def spm_bpe(vocab: dict[str, int], merges: list[tuple[str, str]]) -> Tokenizer:
    """The tokenizer without its special tokens (the caller adds those from the token types)."""
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, byte_fallback=True, fuse_unk=False))
    tok.normalizer = normalizers.Replace(" ", SPACE)
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|[\n]+"), behavior="isolated")
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    return tok
