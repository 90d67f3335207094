"""benchmarks.cache_layout: the page walk reads exactly stage 1's bytes, in either
layout, as elements or as words (Triton's interpreter, tiny shapes)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from benchmarks.cache_layout import head_major, page_walk
from benchmarks.inputs import TorchArrays
from jax_decode.synthetic import make_paged_problem

LENGTHS = [5, 0, 13]


def _problem(kv_dtype):
    return make_paged_problem(batch=3, num_heads=4, num_kv_heads=2, head_dim_qk=16, head_dim_v=16, page_size=4,
                              seq_lens=np.array(LENGTHS), dtype="bfloat16", max_pages=4, seed=0, kv_dtype=kv_dtype,
                              kv_scales="head" if kv_dtype else "none", arrays=TorchArrays("cpu"))  # fmt: skip


def _expected(problem, words: bool):
    """Per row and KV head: the sum over the row's tokens of K + V (as the walk reads them)."""
    k, v = problem.k_cache, problem.v_cache
    if words:
        k, v = k.view(torch.int32), v.view(torch.int32)
    sums = torch.zeros(len(LENGTHS), k.shape[2], k.shape[3], dtype=torch.float64)
    for row, length in enumerate(LENGTHS):
        for token in range(length):
            page, slot = problem.page_table[row, token // 4], token % 4
            sums[row] += k[page, slot].double() + v[page, slot].double()
    return sums


@pytest.mark.parametrize("kv_dtype", [None, "float8_e4m3fn"])
@pytest.mark.parametrize("words", [False, True])
def test_page_walk_sums_each_rows_tokens_in_both_layouts(kv_dtype, words):
    problem = _problem(kv_dtype)
    expected = _expected(problem, words)
    strided = dataclasses.replace(problem, k_cache=head_major(problem.k_cache), v_cache=head_major(problem.v_cache))
    assert strided.k_cache.stride(2) == 4 * 16  # a KV head's tokens of a page are contiguous
    assert torch.equal(strided.k_cache, problem.k_cache)
    for p in (problem, strided):
        got = page_walk(p, splits=2, block_n=4, num_warps=1, num_stages=1, words=words)()
        torch.testing.assert_close(got.sum(1).double(), expected, rtol=1e-5, atol=1e-3)
