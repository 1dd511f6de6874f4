"""Operations the 2026 architectures add (gpt_oss, qwen3_5_moe, lfm2_moe, gemma4), each a numpy twin
beside its Numba kernel, plus the per-layer-type caches. Nothing here knows an architecture: the
model spec says which op a layer runs and with which fields (docs/architectures-2026.md).

rope       inverse frequencies (default, partial rotary, yarn, proportional) and their tables
attention  causal attention over keys with positions: sliding window, sinks, softcap, any scale
cache      FullKV (grows), RingKV (sliding window, fixed slots), ConvState, DeltaState
conv       causal depthwise conv1d with a carried state (DeltaNet's qkv conv, LFM2's short conv)
deltanet   the gated delta rule: recurrent step (decode and prefill) and the chunked twin
ffn        clamped SwiGLU with biases (gpt_oss), GELU-tanh, routers (biased sigmoid, scaled softmax)
norms      RMSNorm variants (zero-centred, unscaled, gated), l2norm, softcapping
"""
