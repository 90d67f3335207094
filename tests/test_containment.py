"""A NaN or inf in one row's data reaches only that row; stale cache contents reach nobody.

Every backend (kernels in the interpreter or compiled, xla, torch) processes rows
independently and loads only the tokens a row owns, so poison must not spread.
"""

from __future__ import annotations

import numpy as np
import pytest
from cases import GQA4, MHA, MLA, Case
from conftest import HAS_GPU
from support import OUT_TOL, run_jax
from torch_support import to_float64, to_tensor

import torch_bridge
from jax_decode.reference import decode_attention_reference

KERNEL_BACKEND = "triton" if HAS_GPU else "interpret"
DEVICE = "cuda" if HAS_GPU else "cpu"


def _poisoned(case: Case):
    """Rows have lengths [0, 1, 32, 64] (page 16, max_pages 4; MLA: page 1, 40 pages).

    * row 1's only token has NaN in K and inf in V: row 1 may be NaN, nobody else;
    * row 3's q has an inf: row 3 may be NaN, nobody else;
    * row 2's unused pages (past its 32 tokens), the unused slots of its last used
      page, and the spare pages nobody owns hold NaN and inf: nothing reads them.
    Returns (clean problem, poisoned problem, rows that must match the clean oracle).
    """
    clean = case.problem()
    poisoned = case.problem()
    page_size = clean.k_cache.shape[1]
    v = poisoned.k_cache if poisoned.v_cache is None else poisoned.v_cache
    first_page = poisoned.page_table[1, 0]
    poisoned.k_cache[first_page, 0, :, 0] = np.nan
    v[first_page, 0, :, 1] = np.inf
    poisoned.q[3, 0, 0] = np.inf
    used_pages = -(-int(clean.seq_lens[2]) // page_size)
    for page in poisoned.page_table[2, used_pages:]:
        poisoned.k_cache[page] = np.nan
        v[page] = np.inf
    owned = set(poisoned.page_table.ravel().tolist())
    for page in set(range(poisoned.k_cache.shape[0])) - owned:
        poisoned.k_cache[page] = np.inf
        v[page] = np.nan
    return clean, poisoned, [0, 2]


def _check(clean, out, lse, rows, mla):
    expected, expected_lse = decode_attention_reference(*clean.arrays, head_dim_v=clean.head_dim_v if mla else None)
    np.testing.assert_allclose(out[rows], expected[rows], **OUT_TOL[clean.q.dtype.name])
    np.testing.assert_allclose(lse[rows], expected_lse[rows], atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("backend", [KERNEL_BACKEND, "xla"])
@pytest.mark.parametrize("case", [MHA, GQA4, MLA], ids=lambda c: c.id)
def test_poison_stays_in_its_row_jax(case, backend):
    clean, poisoned, rows = _poisoned(case)
    out, lse = run_jax(poisoned, backend=backend, mla=case.mla, num_kv_splits=3)
    _check(clean, out, lse, rows, case.mla)


@pytest.mark.parametrize("case", [MHA, GQA4, MLA], ids=lambda c: c.id)
def test_poison_stays_in_its_row_torch(case):
    clean, poisoned, rows = _poisoned(case)
    tensors = [to_tensor(a, DEVICE) for a in poisoned.arrays]
    head_dim_v = clean.head_dim_v if case.mla else None
    out, lse = torch_bridge.decode_attention(*tensors, head_dim_v=head_dim_v, num_kv_splits=3, return_lse=True)
    _check(clean, to_float64(out), to_float64(lse), rows, case.mla)
