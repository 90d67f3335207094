"""The float64 NumPy oracle: gather each row's pages through the page table, dense softmax.

Independent of the kernels and of the xla backend (a per-row loop over tokens, in
float64), and used by the tests, the benchmarks and ``python -m jax_decode`` as the
one reference.  It implements the documented semantics for awkward inputs too:

* ``seq_len`` is clamped to ``[0, max_pages * page_size]``;
* a token whose page id lies outside ``[0, num_pages)`` is left out of the softmax;
* a row with no token left gives an all-zero output and LSE ``-inf``.
"""

from __future__ import annotations

import numpy as np


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
) -> tuple[np.ndarray, np.ndarray]:
    """Returns ``(out float64[batch, num_heads, head_dim_v], lse float64[batch, num_heads])``.

    Inputs are anything ``np.asarray`` takes (bfloat16 arrays included); ``v_cache=None``
    means V is ``k_cache[..., :head_dim_v]``.
    """
    q = np.asarray(q).astype(np.float64)
    k_cache = np.asarray(k_cache).astype(np.float64)
    v_cache = k_cache[..., :head_dim_v] if v_cache is None else np.asarray(v_cache).astype(np.float64)
    page_table = np.asarray(page_table).astype(np.int64)
    seq_lens = np.asarray(seq_lens).astype(np.int64)

    batch, num_heads, head_dim_qk = q.shape
    num_pages, page_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    scale = 1.0 / np.sqrt(head_dim_qk) if sm_scale is None else float(sm_scale)
    capacity = page_table.shape[1] * page_size

    out = np.zeros((batch, num_heads, v_cache.shape[-1]), np.float64)
    lse = np.full((batch, num_heads), -np.inf, np.float64)
    for b in range(batch):
        positions = np.arange(min(max(int(seq_lens[b]), 0), capacity))
        pages = page_table[b, positions // page_size]
        keep = (pages >= 0) & (pages < num_pages)
        pages, slots = pages[keep], positions[keep] % page_size
        if pages.size == 0:
            continue
        for h in range(num_heads):
            kv_head = h // group
            keys = k_cache[pages, slots, kv_head]  # [tokens, head_dim_qk]
            values = v_cache[pages, slots, kv_head]  # [tokens, head_dim_v]
            scores = keys @ q[b, h] * scale
            if logit_cap > 0:
                scores = logit_cap * np.tanh(scores / logit_cap)
            peak = scores.max()
            weights = np.exp(scores - peak)
            out[b, h] = weights @ values / weights.sum()
            lse[b, h] = peak + np.log(weights.sum())
    return out, lse
