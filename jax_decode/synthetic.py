"""Synthetic paged-cache problems: the one input builder for tests, benchmarks and the main job.

Random normal data (never zeros), pages handed out in a shuffled order so that a row's
pages are not contiguous in the cache, and a few spare pages nobody uses.  The arrays
come from an :class:`ArrayFactory`: NumPy by default (tests, the main job), or one
that makes them on a GPU (the benchmarks' caches are gigabytes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

import ml_dtypes
import numpy as np

# The core benchmark shapes: the six rows of vLLM 0.9's published H200 table (bf16):
# name -> (batch, num_heads, num_kv_heads, head_dim_qk, head_dim_v, context, page_size, mla).
# Shared by the GPU tests and the benchmarks.
CORE_SHAPES = {
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


class ArrayFactory(Protocol):
    """Where a problem's arrays live: how to draw, convert and quantise them."""

    def normal(self, rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> Any:
        """Standard normal values of ``dtype``, drawn from ``rng`` (or seeded by it)."""

    def from_numpy(self, array: np.ndarray) -> Any: ...

    def to_numpy(self, array: Any) -> np.ndarray:
        """A host copy (bfloat16 and fp8 as ml_dtypes arrays)."""

    def quantise(self, cache: Any, scale: np.ndarray | None, dtype: str) -> Any:
        """``cache / scale`` (one scale, or one per KV head) in an fp8 ``dtype``."""


class NumpyArrays:
    """NumPy arrays on the host (ml_dtypes for bfloat16 and fp8)."""

    def normal(self, rng, shape, dtype):
        return rng.standard_normal(shape, dtype=np.float32).astype(NUMPY_DTYPES[dtype])

    def from_numpy(self, array):
        return array

    def to_numpy(self, array):
        return np.asarray(array)

    def quantise(self, cache, scale, dtype):
        values = cache.astype(np.float32)
        if scale is not None:
            values = values / scale[:, None]
        return values.astype(NUMPY_DTYPES[dtype])


NUMPY = NumpyArrays()


@dataclasses.dataclass
class PagedProblem:
    """The inputs of one decode-attention call (``v_cache`` None for MLA)."""

    q: Any  # [batch, num_heads, head_dim_qk], or [batch, q_len, num_heads, head_dim_qk]
    k_cache: Any  # [num_pages, page_size, num_kv_heads, head_dim_qk]
    v_cache: Any | None  # [num_pages, page_size, num_kv_heads, head_dim_v]
    page_table: Any  # int32 [batch, max_pages]
    seq_lens: Any  # int32 [batch]
    head_dim_v: int
    k_scale: Any | None = None  # float32 [1] or [num_kv_heads]: the cache holds K / k_scale
    v_scale: Any | None = None
    sinks: Any | None = None  # float32 [num_heads]
    arrays_from: ArrayFactory = NUMPY

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
        seq_lens = self.arrays_from.to_numpy(self.seq_lens)
        tokens = np.clip(seq_lens, 0, self.page_table.shape[1] * page_size)
        if window_left is not None and window_left >= 0:
            tokens = np.minimum(tokens, window_left + 1)
        itemsize = np.dtype(NUMPY_DTYPES[_dtype_name(self.k_cache.dtype)]).itemsize
        return int(tokens.sum()) * num_kv_heads * width * itemsize

    def host_rows(self, rows: Sequence[int]) -> PagedProblem:
        """A NumPy problem of just ``rows``, its cache cut down to the pages they use
        (for the float64 oracle on a few rows of a large problem)."""
        to_numpy = self.arrays_from.to_numpy
        rows = np.asarray(rows)
        page_table = to_numpy(self.page_table)[rows]
        num_pages = self.k_cache.shape[0]
        used = np.unique(page_table[(page_table >= 0) & (page_table < num_pages)])
        remap = np.full(num_pages, -1, np.int64)
        remap[used] = np.arange(used.size)
        table = np.where((page_table >= 0) & (page_table < num_pages), remap[np.clip(page_table, 0, num_pages - 1)], -1)

        def pages(cache):
            return None if cache is None else to_numpy(cache[self.arrays_from.from_numpy(used)])

        def host(x):
            return None if x is None else to_numpy(x)

        return PagedProblem(
            q=to_numpy(self.q)[rows],
            k_cache=pages(self.k_cache),
            v_cache=pages(self.v_cache),
            page_table=table.astype(np.int32),
            seq_lens=to_numpy(self.seq_lens)[rows],
            head_dim_v=self.head_dim_v,
            k_scale=host(self.k_scale),
            v_scale=host(self.v_scale),
            sinks=host(self.sinks),
        )


def _dtype_name(dtype) -> str:
    name = getattr(dtype, "name", None)
    return name if isinstance(name, str) else str(dtype).removeprefix("torch.")


def long_tailed_lengths(rng: np.random.Generator, batch: int, mean: int, longest: int) -> np.ndarray:
    """``batch`` sequence lengths from a long-tailed (log-normal) distribution of about
    ``mean`` tokens, capped at ``longest``: most rows short, a few long, as a serving
    batch mixes requests."""
    sigma = 1.0
    lengths = rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, batch)
    return np.clip(np.round(lengths), 1, longest).astype(np.int32)


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
    compact: bool = False,
    arrays: ArrayFactory = NUMPY,
    q_len: int | None = None,
) -> PagedProblem:
    """A random problem; ``max_pages`` defaults to what the longest row needs.

    ``kv_dtype`` (e.g. ``"float8_e4m3fn"``) quantises the caches: with ``kv_scales``
    ``"tensor"`` or ``"head"`` they hold ``K / k_scale`` for random scales (one, or
    one per KV head), with ``"none"`` the values themselves.  ``sinks`` draws one sink
    logit per head.  ``compact`` gives each row only the pages its length needs (the
    rest of its page-table row is -1 padding, never read), as a serving engine's
    cache holds a batch of mixed lengths.  ``q_len`` gives q a token axis,
    ``[batch, q_len, num_heads, head_dim_qk]`` (multi-token decode).  Page table,
    lengths, scales and sinks are drawn on the host and handed to ``arrays``; q and the
    caches are drawn by it.
    """
    rng = np.random.default_rng(seed)
    head_dim_v = head_dim_qk if head_dim_v is None else head_dim_v
    seq_lens = np.asarray(seq_lens, np.int32)
    if seq_lens.shape != (batch,):
        raise ValueError(f"seq_lens must have one length per row, got shape {seq_lens.shape} for batch {batch}")
    pages_needed = -(-int(seq_lens.max(initial=0)) // page_size)
    max_pages = max(pages_needed, 1) if max_pages is None else max_pages
    if compact:
        row_pages = -(-seq_lens.astype(np.int64) // page_size)
        num_pages = int(row_pages.sum()) + spare_pages
        order = rng.permutation(num_pages).astype(np.int32)
        page_table = np.full((batch, max_pages), -1, np.int32)
        starts = np.concatenate([[0], np.cumsum(row_pages)])
        for row in range(batch):
            page_table[row, : row_pages[row]] = order[starts[row] : starts[row + 1]]
    else:
        num_pages = batch * max_pages + spare_pages
        order = rng.permutation(num_pages).astype(np.int32)
        page_table = order[: batch * max_pages].reshape(batch, max_pages)

    q = arrays.normal(rng, (batch, *(() if q_len is None else (q_len,)), num_heads, head_dim_qk), dtype)
    k_cache = arrays.normal(rng, (num_pages, page_size, num_kv_heads, head_dim_qk), dtype)
    v_cache = None if mla else arrays.normal(rng, (num_pages, page_size, num_kv_heads, head_dim_v), dtype)
    problem = PagedProblem(
        q, k_cache, v_cache, arrays.from_numpy(page_table), arrays.from_numpy(seq_lens), head_dim_v, arrays_from=arrays
    )
    if kv_dtype is not None:
        for name in ("k", "v"):
            cache = getattr(problem, f"{name}_cache")
            if cache is None:
                continue
            scale = None
            if kv_scales != "none":
                scale = rng.uniform(0.2, 0.8, num_kv_heads if kv_scales == "head" else 1).astype(np.float32)
                setattr(problem, f"{name}_scale", arrays.from_numpy(scale))
            setattr(problem, f"{name}_cache", arrays.quantise(cache, scale, kv_dtype))
    if sinks:
        problem.sinks = arrays.from_numpy(rng.uniform(-2.0, 4.0, num_heads).astype(np.float32))
    return problem
