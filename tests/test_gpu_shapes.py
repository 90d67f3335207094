"""On the GPU: jitted decode_attention (triton backend) on the seed's six benchmark shapes, bf16.

The caches are generated on the device; the float64 oracle checks a few rows, on a
compact copy of just the pages those rows use.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support import OUT_TOL

import jax_decode
from jax_decode.reference import decode_attention_reference
from jax_decode.synthetic import SEED_SHAPES

pytestmark = pytest.mark.gpu


def _device_problem(batch, num_heads, num_kv_heads, dqk, dv, context, page_size, mla, seed=0):
    max_pages = context // page_size
    num_pages = batch * max_pages + 7
    keys = jax.random.split(jax.random.key(seed), 3)
    normal = lambda key, shape: jax.random.normal(key, shape, jnp.float32).astype(jnp.bfloat16)  # noqa: E731
    q = normal(keys[0], (batch, num_heads, dqk))
    k = normal(keys[1], (num_pages, page_size, num_kv_heads, dqk))
    v = None if mla else normal(keys[2], (num_pages, page_size, num_kv_heads, dv))
    rng = np.random.default_rng(seed)
    page_table = rng.permutation(num_pages)[: batch * max_pages].reshape(batch, max_pages).astype(np.int32)
    seq_lens = np.linspace(context // 3, context, batch).astype(np.int32)  # ragged, last row full
    return q, k, v, page_table, seq_lens


def _oracle_rows(q, k, v, page_table, seq_lens, rows, head_dim_v):
    """Oracle on `rows`, with the cache cut down to the pages those rows reference."""
    used = np.unique(page_table[rows])
    remap = np.zeros(k.shape[0], np.int32)
    remap[used] = np.arange(used.size, dtype=np.int32)
    idx = jnp.asarray(used)
    k_small = np.asarray(k[idx])
    v_small = None if v is None else np.asarray(v[idx])
    return decode_attention_reference(
        np.asarray(q)[rows], k_small, v_small, remap[page_table[rows]], seq_lens[rows], head_dim_v=head_dim_v
    )


@pytest.mark.parametrize("name", list(SEED_SHAPES))
def test_seed_shape_matches_oracle(name):
    batch, num_heads, num_kv_heads, dqk, dv, context, page_size, mla = SEED_SHAPES[name]
    q, k, v, page_table, seq_lens = _device_problem(*SEED_SHAPES[name])
    head_dim_v = dv if mla else None
    step = jax.jit(lambda *a: jax_decode.decode_attention(*a, head_dim_v=head_dim_v, return_lse=True))
    out, lse = step(q, k, v, jnp.asarray(page_table), jnp.asarray(seq_lens))
    rows = np.unique([0, batch // 2, batch - 1])
    expected_out, expected_lse = _oracle_rows(q, k, v, page_table, seq_lens, rows, head_dim_v)
    got = np.asarray(out.astype(jnp.float32))[rows]
    np.testing.assert_allclose(got, expected_out, **OUT_TOL["bfloat16"])
    np.testing.assert_allclose(np.asarray(lse)[rows], expected_lse, atol=1e-3, rtol=1e-4)
    assert np.isfinite(np.asarray(out.astype(jnp.float32))).all()
