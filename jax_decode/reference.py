"""The float64 NumPy oracle: gather each row's pages through the page table, dense softmax.

Independent of the kernels and of the xla backend (a per-row loop over tokens, in
float64), and used by the tests, the benchmarks and ``python -m jax_decode`` as the
one reference.  It implements the documented semantics for awkward inputs too:

* ``seq_len`` is clamped to ``[0, max_pages * page_size]``;
* a token whose page id lies outside ``[0, num_pages)`` is left out of the softmax;
* a row with no token left gives an all-zero output and LSE ``-inf`` (with a sink:
  zeros and LSE = the sink, the softmax's whole weight being on the sink).
"""

from __future__ import annotations

import numpy as np

# Elementwise tolerances against this oracle, by q's dtype: what the kernels, the xla
# backend and both frontends are held to (tests, benchmarks, the main job).  16-bit
# rows are looser because p is rounded to the cache dtype before p @ V (tensor-core
# input) and the output is rounded to q's dtype; the LSE is float32 in every case.
OUT_TOLERANCE = {
    "float32": dict(atol=2e-5, rtol=2e-5),
    "float16": dict(atol=4e-3, rtol=4e-3),
    "bfloat16": dict(atol=3e-2, rtol=3e-2),
}
LSE_TOLERANCE = dict(atol=1e-4, rtol=1e-5)
# Kernels that multiply e4m3 operands on Hopper's tensor cores (the fp8 GQA stage 1):
# an fp8 warpgroup MMA adds its 32 products with about 14 bits of mantissa, whatever
# the accumulator's type, so a score carries a relative error near 2**-14 of the
# products' magnitudes (measured on an H100: 1.3e-4 on an LSE of 2.6; the same
# accumulation emulated with 13 fraction bits on tests/test_gqa_hopper.py's problems
# stays within 1/8 of this tolerance) -- far below what the e4m3 cache's own 3-bit
# mantissas put into the scores.
FP8_MMA_LSE_TOLERANCE = dict(atol=1e-3, rtol=1e-4)


def tolerance_excess(got, expected, dtype: str) -> float:
    """max(|got - expected| - (atol + rtol * |expected|)) over the elements: <= 0 passes
    :data:`OUT_TOLERANCE` (NaN where either holds NaN, so it never passes)."""
    tol = OUT_TOLERANCE[dtype]
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    excess = np.abs(got - expected) - (tol["atol"] + tol["rtol"] * np.abs(expected))
    return float(np.nan) if np.isnan(excess).any() else float(excess.max(initial=-np.inf))


def decode_attention_reference(
    q,
    k_cache,
    v_cache,
    page_table,
    seq_lens,
    *,
    sm_scale: float | None = None,
    logit_cap: float = 0.0,
    head_dim_v: int | None = None,
    k_scale=None,
    v_scale=None,
    sinks=None,
    window_left: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Returns ``(out float64[batch, num_heads, head_dim_v], lse float64[batch, num_heads])``,
    or with a 4-D ``q [batch, q_len, num_heads, head_dim_qk]`` (several query tokens per
    row) ``out [batch, q_len, num_heads, head_dim_v]`` and ``lse [batch, q_len, num_heads]``.

    Query token ``t`` of row ``b`` is position ``seq_lens[b] - q_len + t``: it attends to
    the positions before it and itself (causal among the row's new tokens).
    Inputs are anything ``np.asarray`` takes (bfloat16 and fp8 arrays included);
    ``v_cache=None`` means V is ``k_cache[..., :head_dim_v]``.  The cache holds
    ``K / k_scale`` (a scalar or one per KV head; ``v_cache=None``: V takes k_scale);
    ``sinks[h]`` adds ``exp(sinks[h])`` to head h's denominator (and to the LSE);
    ``window_left=W`` keeps only the last W + 1 positions of each row.
    """

    def dequantised(cache, scale):
        cache = np.asarray(cache).astype(np.float64)
        if scale is None:
            return cache
        return cache * np.broadcast_to(np.asarray(scale, np.float64).reshape(-1), (cache.shape[2],))[:, None]

    q = np.asarray(q).astype(np.float64)
    k_cache = dequantised(k_cache, k_scale)
    v_cache = k_cache[..., :head_dim_v] if v_cache is None else dequantised(v_cache, v_scale)
    sinks = None if sinks is None else np.asarray(sinks).astype(np.float64)
    page_table = np.asarray(page_table).astype(np.int64)
    seq_lens = np.asarray(seq_lens).astype(np.int64)

    token_axis = q.ndim == 4
    if not token_axis:
        q = q[:, None]
    batch, q_len, num_heads, head_dim_qk = q.shape
    num_pages, page_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    scale = 1.0 / np.sqrt(head_dim_qk) if sm_scale is None else float(sm_scale)
    capacity = page_table.shape[1] * page_size

    out = np.zeros((batch, q_len, num_heads, v_cache.shape[-1]), np.float64)
    lse = np.full((batch, q_len, num_heads), -np.inf, np.float64)
    for b, t in np.ndindex(batch, q_len):
        length = min(max(int(seq_lens[b]), 0), capacity)
        end = length - q_len + 1 + t  # this token's position, plus one
        first = 0 if window_left is None or window_left < 0 else max(end - 1 - window_left, 0)
        positions = np.arange(first, max(end, 0))
        pages = page_table[b, positions // page_size]
        keep = (pages >= 0) & (pages < num_pages)
        pages, slots = pages[keep], positions[keep] % page_size
        for h in range(num_heads):
            kv_head = h // group
            keys = k_cache[pages, slots, kv_head]  # [tokens, head_dim_qk]
            values = v_cache[pages, slots, kv_head]  # [tokens, head_dim_v]
            scores = keys @ q[b, t, h] * scale
            if logit_cap > 0:
                scores = logit_cap * np.tanh(scores / logit_cap)
            # A sink is one more logit whose value is zero.
            extra = [] if sinks is None or sinks[h] == -np.inf else [sinks[h]]
            if scores.size + len(extra) == 0:
                continue
            peak = max(scores.max(initial=-np.inf), *extra) if extra else scores.max()
            weights = np.exp(scores - peak)
            total = weights.sum() + sum(np.exp(x - peak) for x in extra)
            out[b, t, h] = weights @ values / total
            lse[b, t, h] = peak + np.log(total)
    return (out, lse) if token_axis else (out[:, 0], lse[:, 0])
