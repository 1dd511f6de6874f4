"""The gated delta rule (Gated DeltaNet, qwen3.5's linear attention), per value head h with its key head,
q and k L2-normalised, q scaled by dk^-1/2:

    S <- S * exp(g_t)                      (S: dk x dv state, g_t <= 0 the decay)
    S <- S + k_t (beta_t (v_t - S^T k_t))^T  (the delta rule: write only what S mispredicts)
    o_t = S^T q_t

Value heads come in one of two orders: transformers' grouped order (value head h reads key head
h // (Hv / Hk)) or llama.cpp's tiled order (its converter reorders them so that value head h reads
key head h % Hk: `tiled`), so a GGUF runs as stored.

The recurrent form is one pass over the tokens (decode: T = 1; prefill: any T, exactly the same
arithmetic, O(T Hv dk dv)); the chunked form (transformers' torch_chunk_gated_delta_rule, for
matrix units) is kept as a numpy twin: both must agree with transformers to ~1e-5.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

import engine.kernels.ready  # noqa: F401  (engine.kernels.setup() first: fails otherwise)


def _prepare(q: np.ndarray, k: np.ndarray, Hv: int, tiled: bool) -> tuple[np.ndarray, np.ndarray]:
    rep = Hv // q.shape[1]
    spread = (lambda a: np.tile(a, (1, rep, 1))) if tiled else (lambda a: np.repeat(a, rep, axis=1))
    q, k = spread(q.astype(np.float64)), spread(k.astype(np.float64))
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    return q / np.sqrt(q.shape[-1]), k


def delta_rule_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                   state: np.ndarray, tiled: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """numpy twin of delta_rule (recurrent): q, k (T, Hk, dk), v (T, Hv, dv), g, beta (T, Hv),
    state (Hv, dk, dv) -> out (T, Hv, dv), new state."""
    q, k = _prepare(q, k, v.shape[1], tiled)
    S = state.astype(np.float64).copy()
    out = np.zeros(v.shape, np.float64)
    for t in range(len(v)):
        S *= np.exp(g[t])[:, None, None]
        pred = np.einsum("hkv,hk->hv", S, k[t])
        delta = (v[t] - pred) * beta[t][:, None]
        S += k[t][:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hkv,hk->hv", S, q[t])
    return out.astype(np.float32), S.astype(np.float32)


def delta_rule_chunked_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                           state: np.ndarray, chunk: int = 64, tiled: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The chunked form (WY/UT transform per chunk, then a scan over chunks): same result."""
    q, k = _prepare(q, k, v.shape[1], tiled)
    T, Hv, dv = v.shape
    S = state.astype(np.float64).copy()
    out = np.zeros((T, Hv, dv))
    for c0 in range(0, T, chunk):
        sl = slice(c0, min(T, c0 + chunk))
        n = sl.stop - sl.start
        for h in range(Hv):
            Q, K, V = q[sl, h], k[sl, h], v[sl, h].astype(np.float64)
            b, cum = beta[sl, h].astype(np.float64), np.cumsum(g[sl, h].astype(np.float64))
            decay = np.tril(np.exp(cum[:, None] - cum[None, :]))
            A = np.eye(n) + np.tril((b[:, None] * K) @ K.T * decay, -1)
            U = np.linalg.solve(A, b[:, None] * V)                   # the new values
            W = np.linalg.solve(A, (b * np.exp(cum))[:, None] * K)   # decayed keys reading S
            Vn = U - W @ S[h]
            out[sl, h] = (Q * np.exp(cum)[:, None]) @ S[h] + (Q @ K.T * decay) @ Vn
            S[h] = S[h] * np.exp(cum[-1]) + (K * np.exp(cum[-1] - cum)[:, None]).T @ Vn
    return out.astype(np.float32), S.astype(np.float32)


def work_for(v_heads: int, k_dim: int, v_dim: int) -> np.ndarray:
    """delta_rule's scratch: per value head the normalised q and k and the delta."""
    return np.empty((v_heads, 2 * k_dim + v_dim), np.float32)


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def delta_rule(q, k, v, g, beta, state, tiled, work, out):
    # q, k (T, Hk, dk), v (T, Hv, dv), g, beta (T, Hv) f32; state (Hv, dk, dv) updated in place;
    # work (Hv, 2 dk + dv) scratch; out (T, Hv, dv); tiled: value head h reads key head h % Hk,
    # else h // (Hv / Hk). One value head per thread; tokens in order (the recurrence is sequential).
    T, Hk, dk = q.shape
    Hv, dv = v.shape[1], v.shape[2]
    rep = Hv // Hk
    for h in prange(Hv):
        kh = h % Hk if tiled else h // rep
        qn, kn, pred = work[h, :dk], work[h, dk:2 * dk], work[h, 2 * dk:2 * dk + dv]
        for t in range(T):
            sq, sk = np.float32(0.0), np.float32(0.0)
            for i in range(dk):
                sq += q[t, kh, i] * q[t, kh, i]
                sk += k[t, kh, i] * k[t, kh, i]
            fq = np.float32(1.0) / np.sqrt(sq + np.float32(1e-6)) / np.sqrt(np.float32(dk))
            fk = np.float32(1.0) / np.sqrt(sk + np.float32(1e-6))
            for i in range(dk):
                qn[i] = q[t, kh, i] * fq
                kn[i] = k[t, kh, i] * fk
            a = np.exp(g[t, h])
            for j in range(dv):
                pred[j] = 0.0
            for i in range(dk):  # pass 1 reads S only: (a S)^T k = a (S^T k)
                for j in range(dv):
                    pred[j] += state[h, i, j] * kn[i]
            for j in range(dv):
                pred[j] = (v[t, h, j] - a * pred[j]) * beta[t, h]
                out[t, h, j] = 0.0
            for i in range(dk):  # pass 2: decay, write the delta, read the output, in one sweep
                for j in range(dv):
                    s = a * state[h, i, j] + kn[i] * pred[j]
                    state[h, i, j] = s
                    out[t, h, j] += s * qn[i]


def gated_delta(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, state: np.ndarray,
                tiled: bool = False) -> np.ndarray:
    """delta_rule() with its shapes checked and its buffers allocated; the state is updated in place."""
    T, Hk, dk = q.shape
    Hv, dv = v.shape[1], v.shape[2]
    if k.shape != q.shape or v.shape[0] != T or Hv % Hk or g.shape != (T, Hv) or beta.shape != (T, Hv) \
            or state.shape != (Hv, dk, dv) or state.dtype != np.float32:
        raise ValueError(f"gated delta rule: q {q.shape}, k {k.shape}, v {v.shape}, g {g.shape}, beta {beta.shape}, "
                         f"state {state.shape} {state.dtype} do not fit: need q, k (T, Hk, dk), v (T, Hv, dv) with "
                         "Hk dividing Hv, g and beta (T, Hv), a float32 state (Hv, dk, dv)")
    out = np.empty((T, Hv, dv), np.float32)
    f32 = lambda a: np.ascontiguousarray(a, np.float32)  # noqa: E731
    delta_rule(f32(q), f32(k), f32(v), f32(g), f32(beta), state, tiled, work_for(Hv, dk, dv), out)
    return out
