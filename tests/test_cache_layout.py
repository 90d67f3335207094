"""benchmarks.cache_layout: the page walk reads exactly stage 1's bytes -- each split's
tokens, window included -- in either layout, as elements or as words (Triton's
interpreter, tiny shapes)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from benchmarks.cache_layout import head_major, page_walk
from benchmarks.inputs import TorchArrays
from jax_decode.synthetic import make_paged_problem

LENGTHS = [5, 0, 13, 50]
PAGE_SIZE, BLOCK_N, SPLITS, HEAD_DIM = 4, 8, 3, 24  # tiles across pages; a head dim not a power of 2


def _problem(kv_dtype):
    return make_paged_problem(batch=len(LENGTHS), num_heads=4, num_kv_heads=2, head_dim_qk=HEAD_DIM,
                              head_dim_v=HEAD_DIM, page_size=PAGE_SIZE, seq_lens=np.array(LENGTHS), dtype="bfloat16",
                              max_pages=16, seed=0, kv_dtype=kv_dtype, kv_scales="head" if kv_dtype else "none",
                              arrays=TorchArrays("cpu"))  # fmt: skip


def _split_tokens(length: int, window_left: int | None) -> list[range]:
    """Stage 1's split rule, written out: the window's first position (one query token),
    then splits of whole BLOCK_N tiles."""
    first = max(length - 1 - window_left, 0) if window_left is not None else 0
    per_split = math.ceil(math.ceil((length - first) / SPLITS) / BLOCK_N) * BLOCK_N
    return [range(first + s * per_split, min(first + (s + 1) * per_split, length)) for s in range(SPLITS)]


def _expected(problem, words: bool, window_left: int | None):
    """[row, split, KV head, column]: the sum of K + V over the split's tokens."""
    k, v = problem.k_cache, problem.v_cache
    if words:
        k, v = k.view(torch.int32), v.view(torch.int32)
    sums = torch.zeros(len(LENGTHS), SPLITS, k.shape[2], k.shape[3], dtype=torch.float64)
    for row, length in enumerate(LENGTHS):
        for split, tokens in enumerate(_split_tokens(length, window_left)):
            for token in tokens:
                page, slot = problem.page_table[row, token // PAGE_SIZE], token % PAGE_SIZE
                sums[row, split] += k[page, slot].double() + v[page, slot].double()
    return sums


@pytest.mark.parametrize("kv_dtype", [None, "float8_e4m3fn"])
@pytest.mark.parametrize("words", [False, True])
@pytest.mark.parametrize("window_left", [None, 20])
def test_page_walk_sums_each_splits_tokens_in_both_layouts(kv_dtype, words, window_left):
    problem = _problem(kv_dtype)
    expected = _expected(problem, words, window_left)
    assert expected[3, 2].abs().sum() > 0  # the last split holds tokens
    strided = dataclasses.replace(problem, k_cache=head_major(problem.k_cache), v_cache=head_major(problem.v_cache))
    assert strided.k_cache.stride(2) == PAGE_SIZE * HEAD_DIM  # a KV head's tokens of a page are contiguous
    assert torch.equal(strided.k_cache, problem.k_cache)
    for p in (problem, strided):
        walk = page_walk(p, SPLITS, BLOCK_N, num_warps=1, num_stages=1, words=words, window_left=window_left)
        torch.testing.assert_close(walk().double(), expected, rtol=1e-5, atol=1e-3)
