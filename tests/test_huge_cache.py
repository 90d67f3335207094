"""Caches of more than 2**31 elements: pages past the int32 element offset limit read right.

GPU only (about 9.7 GB): K and V caches of 2**31 + 2**20 elements each, bf16, rows
whose pages all lie beyond the 2**31-element mark, through torch_bridge and through
jax_decode (the same buffers, handed over by DLPack), against the oracle on those rows.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import LSE_TOL, OUT_TOL
from torch_support import to_float64

import torch_bridge
from jax_decode.reference import decode_attention_reference

pytestmark = pytest.mark.gpu

PAGE, KV_HEADS, DIM = 16, 8, 128
PAGE_ELEMENTS = PAGE * KV_HEADS * DIM
NUM_PAGES = 2**31 // PAGE_ELEMENTS + 64  # 2**31 + 2**20 elements per cache
FIRST_HIGH_PAGE = 2**31 // PAGE_ELEMENTS  # its first element is number 2**31


@pytest.fixture(scope="module")
def huge_problem():
    torch.manual_seed(0)
    k = torch.empty(NUM_PAGES, PAGE, KV_HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    v = torch.empty_like(k)
    assert k.numel() > 2**31
    # Only the pages in use get data (filling 9 GB would only cost time): one page just
    # below the mark (row 0 straddles it), then 39 past it in shuffled order.
    high = FIRST_HIGH_PAGE + torch.randperm(64, device="cuda")[:39]
    used = torch.cat([torch.tensor([FIRST_HIGH_PAGE - 1], device="cuda"), high])
    k[used] = torch.randn(len(used), PAGE, KV_HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    v[used] = torch.randn(len(used), PAGE, KV_HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    page_table = used.to(torch.int32).reshape(4, 10)
    seq_lens = torch.tensor([160, 1, 97, 150], device="cuda", dtype=torch.int32)
    q = torch.randn(4, 32, DIM, device="cuda", dtype=torch.bfloat16)
    yield q, k, v, page_table, seq_lens, used
    del k, v
    torch.cuda.empty_cache()


def _check(out, lse, q, k, v, seq_lens, used):
    """Against the oracle, which sees only the used pages, renumbered 0..39."""

    def host(t):
        return t.float().cpu().numpy()

    table = np.arange(40, dtype=np.int32).reshape(4, 10)
    expected = decode_attention_reference(host(q), host(k[used]), host(v[used]), table, seq_lens.cpu().numpy())
    np.testing.assert_allclose(out, expected[0], **OUT_TOL["bfloat16"])
    np.testing.assert_allclose(lse, expected[1], **LSE_TOL)


@pytest.mark.parametrize("num_heads", [32, 8], ids=["gqa", "mha"])
def test_huge_cache_torch(huge_problem, num_heads):
    q, k, v, pt, sl, used = huge_problem
    q = q[:, :num_heads].contiguous()
    out, lse = torch_bridge.decode_attention(q, k, v, pt, sl, return_lse=True)
    _check(to_float64(out), to_float64(lse), q, k, v, sl, used)


def test_huge_cache_jax(huge_problem):
    import jax

    import jax_decode

    q, k, v, pt, sl, used = huge_problem
    arrays = [torch_bridge.to_jax(t) for t in (q, k, v, pt, sl)]
    out, lse = jax.jit(lambda *a: jax_decode.decode_attention(*a, backend="triton", return_lse=True))(*arrays)
    _check(np.asarray(out.astype("float32"), np.float64), np.asarray(lse, np.float64), q, k, v, sl, used)
