"""The tokenizer and chat template that travel with a converted model.

From a Hugging Face folder: tokenizer.json as it is, the template from tokenizer_config.json
(or chat_template.jinja / chat_template.json). From a GGUF: a `tokenizers` BPE built from the
file's vocabulary, merges and pre-tokenizer name. Templates are only parsed here (in a Jinja2
sandbox); a model file's template is untrusted input and is never rendered at conversion.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from jinja2 import TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from engine.convert.tokenizer_spm import SPM_MODELS, spm_bpe
from engine.errors import ConfigError, SourceFormatError

_GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_LLAMA3 = (r"""(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"""
           r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
_QWEN2 = (r"""(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
          r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
_O200K = (r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
          r"""|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
          r"""|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
_QWEN35 = (r"""(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"""
           r"""| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
# GGUF `tokenizer.ggml.pre` -> the regex splits applied before byte-level BPE, in order
PRE_TOKENIZERS: dict[str, tuple[str, ...]] = {
    "default": (_GPT2,), "gpt-2": (_GPT2,), "gpt2": (_GPT2,), "olmo": (_GPT2,),
    "smollm": (r"\p{N}", _GPT2),
    "llama-bpe": (_LLAMA3,), "llama3": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "gpt-4o": (_O200K,), "qwen35": (_QWEN35,), "lfm2": (_LLAMA3,),  # gpt-oss (o200k), Qwen3.5, LFM2
}
# pre-tokenizers whose words found whole in the vocabulary skip the merges (llama.cpp's ignore_merges;
# llama.cpp also sets it for llama-bpe/llama3, which are kept as they were here)
IGNORE_MERGES = frozenset({"lfm2"})
_CONTROL, _USER_DEFINED = 3, 4


@dataclass
class TokenizerBundle:
    tokenizer_json: str
    chat_template: str | None
    meta: dict = field(default_factory=dict)  # bos/eos tokens and ids, add_bos_token


def check_template(template: str | None, where: str) -> None:
    if template is None:
        return
    try:
        ImmutableSandboxedEnvironment().parse(template)
    except TemplateSyntaxError as e:
        raise ConfigError(f"{where}: chat template does not parse: {e.message} (line {e.lineno})") from None


def _token_text(tok) -> str | None:
    return tok.get("content") if isinstance(tok, dict) else tok


def from_hf_folder(folder: Path) -> TokenizerBundle:
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise SourceFormatError(f"{folder}: no tokenizer.json (Colibri needs the fast-tokenizer file)")
    text = path.read_text(encoding="utf-8")
    try:
        tok = Tokenizer.from_str(text)
    except Exception as e:  # tokenizers raises a bare Exception for malformed files
        raise SourceFormatError(f"{path}: not a valid tokenizer.json: {e}") from None
    tcfg = {}
    if (folder / "tokenizer_config.json").is_file():
        try:
            tcfg = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        except ValueError as e:
            raise ConfigError(f"{folder / 'tokenizer_config.json'}: not valid JSON: {e}") from None
    template = tcfg.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template}
        template = named.get("default") or next(iter(named.values()), None)
    if template is None and (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    if template is None and (folder / "chat_template.json").is_file():
        template = json.loads((folder / "chat_template.json").read_text(encoding="utf-8")).get("chat_template")
    check_template(template, str(folder))
    bos, eos = _token_text(tcfg.get("bos_token")), _token_text(tcfg.get("eos_token"))
    eos_ids = [i for i in [tok.token_to_id(eos) if eos else None] if i is not None]
    gen = folder / "generation_config.json"
    if gen.is_file():
        extra = json.loads(gen.read_text()).get("eos_token_id")
        eos_ids += [i for i in (extra if isinstance(extra, list) else [extra]) if i is not None and i not in eos_ids]
    meta = {"bos_token": bos, "bos_token_id": tok.token_to_id(bos) if bos else None,
            "eos_token": eos, "eos_token_ids": eos_ids,
            "add_bos_token": bool(tcfg.get("add_bos_token", False))}
    return TokenizerBundle(text, template, meta)


def from_gguf_fields(f: dict, where: str) -> TokenizerBundle:
    """`f`: the GGUF's `tokenizer.ggml.*` / `tokenizer.chat_template` values."""
    model = f.get("tokenizer.ggml.model")
    if model != "gpt2" and model not in SPM_MODELS:
        raise SourceFormatError(f"{where}: GGUF tokenizer model {model!r} is not supported yet; "
                                f"supported: 'gpt2' (byte-level BPE), {', '.join(map(repr, SPM_MODELS))} "
                                "(SentencePiece-style BPE)")
    pre = f.get("tokenizer.ggml.pre", "default")
    if model == "gpt2" and pre not in PRE_TOKENIZERS:
        raise SourceFormatError(f"{where}: GGUF pre-tokenizer {pre!r} is not supported; supported: "
                                f"{', '.join(sorted(PRE_TOKENIZERS))}")
    tokens, merges = f.get("tokenizer.ggml.tokens"), f.get("tokenizer.ggml.merges")
    if not tokens or merges is None:
        raise SourceFormatError(f"{where}: GGUF has no tokenizer vocabulary or merges")
    types = f.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if not all(isinstance(t, str) for t in tokens) or not all(isinstance(m, str) and " " in m for m in merges) \
            or len(types) != len(tokens):
        raise SourceFormatError(f"{where}: GGUF tokenizer.ggml.tokens / merges / token_type are malformed (tokens and "
                                f"merges must be strings, merges 'a b', one type per token)")
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    try:
        if model in SPM_MODELS:
            tok = spm_bpe(vocab, pairs)
        else:
            tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False,
                                       ignore_merges=pre in IGNORE_MERGES))
    except Exception as e:  # tokenizers raises a bare Exception (a merge of tokens not in the vocabulary)
        raise SourceFormatError(f"{where}: GGUF tokenizer.ggml.merges do not fit tokenizer.ggml.tokens: {e}") from None
    if model == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_TOKENIZERS[pre]]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, k in zip(tokens, types) if k == _CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, k in zip(tokens, types) if k == _USER_DEFINED])

    def token(key: str) -> tuple[str | None, int | None]:
        i = f.get(key)
        ok = isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(tokens)
        return (tokens[i], int(i)) if ok else (None, None)

    bos, bos_id = token("tokenizer.ggml.bos_token_id")
    eos, eos_id = token("tokenizer.ggml.eos_token_id")
    _, eot_id = token("tokenizer.ggml.eot_token_id")
    add_bos = bool(f.get("tokenizer.ggml.add_bos_token", False))
    if add_bos and bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)])
    template = f.get("tokenizer.chat_template")
    check_template(template, where)
    meta = {"bos_token": bos, "bos_token_id": bos_id, "eos_token": eos,
            "eos_token_ids": [i for i in dict.fromkeys([eos_id, eot_id]) if i is not None],
            "add_bos_token": add_bos, "gguf_pre_tokenizer": pre}
    return TokenizerBundle(tok.to_str(), template, meta)
