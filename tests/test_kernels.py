"""The Triton kernels against the float64 oracle over the configuration matrix.

On a CPU-only machine they run in Triton's interpreter (backend="interpret"); on a
GPU they run compiled (backend="triton").  Same cases, same tolerances.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from cases import GQA4, MATRIX, MHA, MLA, Case
from conftest import HAS_GPU
from support import assert_matches_oracle, run_jax

KERNEL_BACKEND = "triton" if HAS_GPU else "interpret"


@pytest.mark.parametrize("case", MATRIX, ids=lambda c: c.id)
def test_kernels_match_oracle(case: Case):
    problem = case.problem()
    out, lse = run_jax(problem, backend=KERNEL_BACKEND, mla=case.mla, **case.options())
    assert_matches_oracle(problem, out, lse, mla=case.mla, logit_cap=case.logit_cap)


@pytest.mark.parametrize("case", [MHA, GQA4, MLA], ids=lambda c: c.id)
def test_empty_rows_are_zero_not_nan(case: Case):
    problem = dataclasses.replace(case, num_kv_splits=3).problem()
    problem.seq_lens[:] = 0
    out, lse = run_jax(problem, backend=KERNEL_BACKEND, mla=case.mla, num_kv_splits=3)
    assert (out == 0).all()
    assert (lse == -np.inf).all()


def test_sm_scale_is_applied():
    problem = GQA4.problem()
    out, lse = run_jax(problem, backend=KERNEL_BACKEND, sm_scale=0.3)
    assert_matches_oracle(problem, out, lse, sm_scale=0.3)


@pytest.mark.parametrize("case", [MHA, GQA4], ids=lambda c: c.id)
def test_out_of_range_pages_and_lengths_are_masked(case: Case):
    """Bad page ids are left out of the softmax; lengths clamp to the page table."""
    problem = case.problem()
    num_pages = problem.k_cache.shape[0]
    problem.page_table[1, 0] = -5  # row 1's only token sits on a bad page: empty row
    problem.page_table[2, 1] = num_pages  # one page of row 2 is past the cache
    problem.page_table[3, 0] = 2**31 - 1
    problem.seq_lens[3] = 10**6  # far past capacity: clamped to max_pages * page_size
    out, lse = run_jax(problem, backend=KERNEL_BACKEND, **case.options())
    assert_matches_oracle(problem, out, lse)
    assert (out[1] == 0).all() and (lse[1] == -np.inf).all()


def test_negative_lengths_are_empty_rows():
    problem = MHA.problem()
    problem.seq_lens[2] = -7
    out, lse = run_jax(problem, backend=KERNEL_BACKEND, **MHA.options())
    assert (out[2] == 0).all() and (lse[2] == -np.inf).all()
    assert_matches_oracle(problem, out, lse)
