"""Synthetic paged-cache problems: the one setup factory for tests, benchmarks and the main job.

Random normal data (never zeros), pages handed out in a shuffled order so that a row's
pages are not contiguous in the cache, and a few spare pages nobody uses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import ml_dtypes
import numpy as np

# The six shapes of the seed's published H200 table (bf16): name -> (batch, num_heads,
# num_kv_heads, head_dim_qk, head_dim_v, context, page_size, mla).  Shared by the GPU
# tests and the benchmarks.
SEED_SHAPES = {
    "GQA 32/8 d128 b32 ctx4096": (32, 32, 8, 128, 128, 4096, 16, False),
    "GQA 32/8 d128 b128 ctx8192": (128, 32, 8, 128, 128, 8192, 16, False),
    "GQA 32/8 d128 b1 ctx32768": (1, 32, 8, 128, 128, 32768, 16, False),
    "MHA 32/32 d128 b64 ctx2048": (64, 32, 32, 128, 128, 2048, 16, False),
    "MQA 8/1 d256 b8 ctx8192": (8, 8, 1, 256, 256, 8192, 16, False),
    "MLA 16/1 576/512 page1 b64 ctx4096": (64, 16, 1, 576, 512, 4096, 1, True),
}

NUMPY_DTYPES = {
    "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16,
    "float32": np.float32,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
}


@dataclasses.dataclass
class PagedProblem:
    """NumPy inputs of one decode-attention call (``v_cache`` None for MLA)."""

    q: np.ndarray  # [batch, num_heads, head_dim_qk]
    k_cache: np.ndarray  # [num_pages, page_size, num_kv_heads, head_dim_qk]
    v_cache: np.ndarray | None  # [num_pages, page_size, num_kv_heads, head_dim_v]
    page_table: np.ndarray  # int32 [batch, max_pages]
    seq_lens: np.ndarray  # int32 [batch]
    head_dim_v: int
    k_scale: np.ndarray | None = None  # float32 [1] or [num_kv_heads]: the cache holds K / k_scale
    v_scale: np.ndarray | None = None
    sinks: np.ndarray | None = None  # float32 [num_heads]

    @property
    def arrays(self) -> tuple:
        return self.q, self.k_cache, self.v_cache, self.page_table, self.seq_lens

    @property
    def extras(self) -> dict:
        """The optional operands that are set, as keyword arguments."""
        named = dict(k_scale=self.k_scale, v_scale=self.v_scale, sinks=self.sinks)
        return {name: x for name, x in named.items() if x is not None}

    def kv_bytes(self, window_left: int | None = None) -> int:
        """Bytes of K and V that one call must read (an MLA latent counted once)."""
        _, page_size, num_kv_heads, head_dim_qk = self.k_cache.shape
        width = head_dim_qk if self.v_cache is None else head_dim_qk + self.head_dim_v
        tokens = np.clip(self.seq_lens, 0, self.page_table.shape[1] * page_size)
        if window_left is not None and window_left >= 0:
            tokens = np.minimum(tokens, window_left + 1)
        return int(tokens.sum()) * num_kv_heads * width * self.k_cache.dtype.itemsize


def make_paged_problem(
    *,
    batch: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim_qk: int,
    head_dim_v: int | None = None,
    page_size: int,
    seq_lens: Sequence[int],
    dtype: str = "float32",
    mla: bool = False,
    max_pages: int | None = None,
    spare_pages: int = 3,
    seed: int = 0,
    kv_dtype: str | None = None,
    kv_scales: str = "none",
    sinks: bool = False,
) -> PagedProblem:
    """A random problem; ``max_pages`` defaults to what the longest row needs.

    ``kv_dtype`` (e.g. ``"float8_e4m3fn"``) quantises the caches: with ``kv_scales``
    ``"tensor"`` or ``"head"`` they hold ``K / k_scale`` for random scales (one, or
    one per KV head), with ``"none"`` the values themselves.  ``sinks`` draws one sink
    logit per head.
    """
    rng = np.random.default_rng(seed)
    np_dtype = NUMPY_DTYPES[dtype]
    head_dim_v = head_dim_qk if head_dim_v is None else head_dim_v
    seq_lens = np.asarray(seq_lens, np.int32)
    assert seq_lens.shape == (batch,), "one length per row"
    pages_needed = -(-int(seq_lens.max(initial=0)) // page_size)
    max_pages = max(pages_needed, 1) if max_pages is None else max_pages
    num_pages = batch * max_pages + spare_pages
    order = rng.permutation(num_pages).astype(np.int32)
    page_table = order[: batch * max_pages].reshape(batch, max_pages)

    def normal(*shape):
        return rng.standard_normal(shape, dtype=np.float32).astype(np_dtype)

    q = normal(batch, num_heads, head_dim_qk)
    k_cache = normal(num_pages, page_size, num_kv_heads, head_dim_qk)
    v_cache = None if mla else normal(num_pages, page_size, num_kv_heads, head_dim_v)
    problem = PagedProblem(q, k_cache, v_cache, page_table, seq_lens, head_dim_v)
    if kv_dtype is not None:
        problem = _quantised(problem, rng, NUMPY_DTYPES[kv_dtype], kv_scales)
    if sinks:
        problem.sinks = rng.uniform(-2.0, 4.0, num_heads).astype(np.float32)
    return problem


def _quantised(problem: PagedProblem, rng, cache_dtype, kv_scales: str) -> PagedProblem:
    num_kv_heads = problem.k_cache.shape[2]

    def quantise(cache):
        if cache is None:
            return None, None
        if kv_scales == "none":
            return cache.astype(np.float32).astype(cache_dtype), None
        scale = rng.uniform(0.2, 0.8, num_kv_heads if kv_scales == "head" else 1).astype(np.float32)
        return (cache.astype(np.float32) / scale[:, None]).astype(cache_dtype), scale

    problem.k_cache, problem.k_scale = quantise(problem.k_cache)
    problem.v_cache, problem.v_scale = quantise(problem.v_cache)
    return problem
