"""jax.vmap of decode_attention (mapped axis folded into the batch) and LSE merging, both frameworks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from cases import GQA4, MLA
from conftest import HAS_GPU, needs_interpreter
from support import OUT_TOL, device_arrays
from torch_support import to_float64, to_tensor

import jax_decode
import torch_bridge
from jax_decode.reference import decode_attention_reference
from jax_decode.synthetic import make_paged_problem

KERNEL_BACKEND = "triton" if HAS_GPU else "interpret"
kernel_param = pytest.param(KERNEL_BACKEND, marks=() if HAS_GPU else needs_interpreter)


def _stacked_problem(mla=False):
    """Three 'sequences of requests' sharing one cache: q/page_table/seq_lens stacked on axis 0."""
    case = MLA if mla else GQA4
    problem = case.problem()  # rows [0, 1, 32, capacity]
    rng = np.random.default_rng(1)
    qs = np.stack([problem.q, problem.q[::-1], rng.standard_normal(problem.q.shape).astype(problem.q.dtype)])
    tables = np.stack([problem.page_table, problem.page_table[::-1], np.roll(problem.page_table, 1, axis=0)])
    lens = np.stack([problem.seq_lens, problem.seq_lens[::-1], np.array([5, 0, 17, 3], np.int32)])
    return problem, qs, tables, lens


@pytest.mark.parametrize("backend", ["xla", kernel_param])
@pytest.mark.parametrize("mla", [False, True], ids=["gqa", "mla"])
def test_vmap_over_requests_with_a_shared_cache(backend, mla):
    problem, qs, tables, lens = _stacked_problem(mla)
    head_dim_v = problem.head_dim_v if mla else None

    def call(q, k, v, pt, sl):
        return jax_decode.decode_attention(q, k, v, pt, sl, head_dim_v=head_dim_v, return_lse=True, backend=backend)

    k = jnp.asarray(problem.k_cache)
    v = None if problem.v_cache is None else jnp.asarray(problem.v_cache)
    out, lse = jax.jit(jax.vmap(call, in_axes=(0, None, None, 0, 0)))(
        jnp.asarray(qs), k, v, jnp.asarray(tables), jnp.asarray(lens)
    )
    assert out.shape == (3, *problem.q.shape[:2], problem.head_dim_v)
    for i in range(3):
        expected, expected_lse = decode_attention_reference(
            qs[i], problem.k_cache, problem.v_cache, tables[i], lens[i], head_dim_v=head_dim_v
        )
        np.testing.assert_allclose(np.asarray(out[i], np.float64), expected, **OUT_TOL["float32"])
        np.testing.assert_allclose(np.asarray(lse[i], np.float64), expected_lse, atol=1e-4, rtol=1e-5)


def test_vmap_of_an_unmapped_argument_and_nested_vmap():
    problem, qs, tables, lens = _stacked_problem()
    arrays = device_arrays(problem)

    def call(q, pt, sl):
        return jax_decode.decode_attention(q, arrays[1], arrays[2], pt, sl, backend="xla")

    shared_table = jax.vmap(call, in_axes=(0, None, 0))(jnp.asarray(qs), arrays[3], jnp.asarray(lens))
    expected = decode_attention_reference(qs[1], problem.k_cache, problem.v_cache, problem.page_table, lens[1])[0]
    np.testing.assert_allclose(np.asarray(shared_table[1]), expected, **OUT_TOL["float32"])
    nested = jax.vmap(jax.vmap(call))(jnp.asarray(qs)[None], jnp.asarray(tables)[None], jnp.asarray(lens)[None])
    np.testing.assert_allclose(np.asarray(nested[0]), np.asarray(jax.vmap(call)(qs, tables, lens)), atol=0, rtol=0)


@pytest.mark.parametrize("backend", ["xla", KERNEL_BACKEND])
def test_vmap_over_an_empty_axis(backend):
    """A mapped axis of size 0 gives empty outputs, as a batch of 0 rows does."""
    problem = GQA4.problem()
    q, k, v, pt, sl = device_arrays(problem)
    call = jax.vmap(lambda q, pt, sl: jax_decode.decode_attention(q, k, v, pt, sl, return_lse=True, backend=backend))
    out, lse = call(jnp.zeros((0, *q.shape), q.dtype), jnp.zeros((0, *pt.shape), pt.dtype),
                    jnp.zeros((0, *sl.shape), sl.dtype))  # fmt: skip
    assert out.shape == (0, *q.shape[:-1], problem.head_dim_v) and lse.shape == (0, *q.shape[:-1])


def test_vmap_over_the_cache_is_refused():
    problem = GQA4.problem()
    q, k, v, pt, sl = device_arrays(problem)
    mapped_cache = jax.vmap(lambda kk: jax_decode.decode_attention(q, kk, v, pt, sl, backend="xla"))
    with pytest.raises(ValueError, match="k_cache and v_cache must not be mapped"):
        mapped_cache(jnp.stack([k, k]))


def test_vmap_past_the_batch_limit_says_the_mapped_axis_folded_into_it():
    """Mapped elements of rows one call each could take, too many together: the message
    says the mapped axis joined the batch, not a batch the caller never passed."""
    sds = jax.ShapeDtypeStruct
    q, k = sds((2, 40000, 4, 16), jnp.float32), sds((4, 4, 2, 16), jnp.float32)
    pt, sl = sds((2, 40000, 1), jnp.int32), sds((2, 40000), jnp.int32)
    mapped = jax.vmap(lambda q, pt, sl: jax_decode.decode_attention(q, k_cache, k_cache, pt, sl, backend="xla"))
    k_cache = jnp.zeros(k.shape, k.dtype)
    with pytest.raises(ValueError, match=r"folds the mapped axis into the batch: 2 mapped elements of 40000 rows make "
                                         r"80000 rows, more than the 65535 one call takes"):  # fmt: skip
        jax.jit(mapped).trace(q, pt, sl)


def _split_problem():
    """One row set whose pages are split into a 'prefix' part and a 'suffix' part."""
    problem = make_paged_problem(
        batch=3, num_heads=8, num_kv_heads=2, head_dim_qk=64, page_size=4, seq_lens=[12, 0, 8], max_pages=3
    )
    prefix = make_paged_problem(
        batch=3, num_heads=8, num_kv_heads=2, head_dim_qk=64, page_size=4, seq_lens=[8, 0, 0], max_pages=3
    )
    prefix.q = problem.q
    # The union: all of prefix's tokens then all of problem's, as one row's attention.
    union_k = np.concatenate([prefix.k_cache, problem.k_cache])
    union_v = np.concatenate([prefix.v_cache, problem.v_cache])
    offset = prefix.k_cache.shape[0]
    union_table = np.full((3, 6), -1, np.int32)
    union_lens = np.zeros(3, np.int32)
    for row in range(3):
        pages = [prefix.page_table[row, p] for p in range(-(-prefix.seq_lens[row] // 4))]
        pages += [offset + problem.page_table[row, p] for p in range(-(-problem.seq_lens[row] // 4))]
        union_table[row, : len(pages)] = pages
        union_lens[row] = 4 * len(pages)  # every part here is whole pages
    expected = decode_attention_reference(problem.q, union_k, union_v, union_table, union_lens)
    return prefix, problem, expected


def test_merge_equals_attention_over_both_parts_jax_and_torch():
    prefix, suffix, (expected, expected_lse) = _split_problem()
    parts = [jax_decode.decode_attention(*device_arrays(p), backend="xla", return_lse=True) for p in (prefix, suffix)]
    out, lse = jax.jit(jax_decode.merge_attention_states)(*parts[0], *parts[1])
    np.testing.assert_allclose(np.asarray(out, np.float64), expected, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(np.asarray(lse, np.float64), expected_lse, atol=1e-5, rtol=1e-6)
    assert np.isneginf(np.asarray(lse)[1]).all() and (np.asarray(out)[1] == 0).all()  # both parts empty

    t_parts = [tuple(to_tensor(np.asarray(x)) for x in part) for part in parts]
    t_out, t_lse = torch_bridge.merge_attention_states(*t_parts[0], *t_parts[1])
    # One definition, but XLA and torch may fuse it differently (rounding in the last bit).
    np.testing.assert_allclose(to_float64(t_out), np.asarray(out, np.float64), atol=1e-6, rtol=1e-6)
    np.testing.assert_allclose(to_float64(t_lse), np.asarray(lse, np.float64), atol=1e-6, rtol=1e-7)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_merge_with_an_empty_part_is_exact(dtype):
    rng = np.random.default_rng(0)
    out_a = jnp.asarray(rng.standard_normal((2, 4, 8)), dtype)
    lse_a = jnp.asarray(rng.standard_normal((2, 4)), jnp.float32)
    empty_out, empty_lse = jnp.zeros_like(out_a), jnp.full((2, 4), -jnp.inf)
    for args in ((out_a, lse_a, empty_out, empty_lse), (empty_out, empty_lse, out_a, lse_a)):
        out, lse = jax_decode.merge_attention_states(*args)
        np.testing.assert_array_equal(np.asarray(out), np.asarray(out_a))
        np.testing.assert_array_equal(np.asarray(lse), np.asarray(lse_a))
    t = torch.from_numpy(np.array(out_a, np.float32)).to(torch.bfloat16 if dtype == jnp.bfloat16 else torch.float32)
    t_lse = torch.from_numpy(np.array(lse_a))
    out, lse = torch_bridge.merge_attention_states(t, t_lse, torch.zeros_like(t), torch.full_like(t_lse, -torch.inf))
    assert torch.equal(out, t) and torch.equal(lse, t_lse)


def test_merge_shape_errors():
    out = jnp.zeros((2, 4, 8))
    with pytest.raises(ValueError, match=r"lse_b shape \(2, 3\) must be out_a's leading shape \(2, 4\)"):
        jax_decode.merge_attention_states(out, jnp.zeros((2, 4)), out, jnp.zeros((2, 3)))


@pytest.mark.parametrize("backend", ["xla", kernel_param])
def test_vmap_with_fp8_scales_window_and_sinks(backend):
    """Scales and sinks are shared like the cache; the window is static: all survive the fold."""
    import dataclasses

    case = dataclasses.replace(GQA4, kv_dtype="float8_e4m3fn", kv_scales="head", sinks=True, dtype="bfloat16")
    problem = case.problem()
    qs = np.stack([problem.q, problem.q[::-1]])
    tables = np.stack([problem.page_table, problem.page_table[::-1]])
    lens = np.stack([problem.seq_lens, np.array([7, 64, 0, 30], np.int32)])
    extras = {name: jnp.asarray(x) for name, x in problem.extras.items()}

    def call(q, pt, sl):
        return jax_decode.decode_attention(
            q, jnp.asarray(problem.k_cache), jnp.asarray(problem.v_cache), pt, sl, window_left=12,
            return_lse=True, backend=backend, **extras,
        )  # fmt: skip

    out, lse = jax.jit(jax.vmap(call))(jnp.asarray(qs), jnp.asarray(tables), jnp.asarray(lens))
    for i in range(2):
        expected, expected_lse = decode_attention_reference(
            qs[i], problem.k_cache, problem.v_cache, tables[i], lens[i], window_left=12, **problem.extras
        )
        np.testing.assert_allclose(np.asarray(out[i].astype(jnp.float32), np.float64), expected, **OUT_TOL["bfloat16"])
        np.testing.assert_allclose(np.asarray(lse[i], np.float64), expected_lse, atol=1e-4, rtol=1e-5)


def test_vmap_over_a_scale_is_refused():
    problem = GQA4.problem()
    q, k, v, pt, sl = device_arrays(problem)
    mapped = jax.vmap(lambda s: jax_decode.decode_attention(q, k, v, pt, sl, k_scale=s, backend="xla"))
    with pytest.raises(ValueError, match="nor k_scale, v_scale or sinks"):
        mapped(jnp.ones((3, 1)))


def test_vmap_with_check_inputs():
    """check_inputs=True under jax.vmap: valid inputs give the unchecked result, a bad
    page id in one mapped element fails the call naming it."""
    q, k, v, page_table, seq_lens = device_arrays(GQA4.problem())
    qs, tables, lens = jnp.stack([q, q * 0.5]), jnp.stack([page_table, page_table]), jnp.stack([seq_lens, seq_lens])
    call = lambda check: jax.vmap(  # noqa: E731
        lambda q, t, s: jax_decode.decode_attention(q, k, v, t, s, backend="xla", check_inputs=check)
    )
    np.testing.assert_array_equal(np.asarray(call(True)(qs, tables, lens)), np.asarray(call(False)(qs, tables, lens)))
    row = int(np.argmax(np.asarray(seq_lens) > 0))  # a row with tokens on its first page
    bad = tables.at[1, row, 0].set(-5)
    with pytest.raises(jax.errors.JaxRuntimeError, match=rf"page_table\[{row}, 0\] = -5 is outside"):
        jax.block_until_ready(jax.jit(call(True))(qs, bad, lens))


def test_merge_ignores_what_an_empty_part_holds():
    """An empty part (lse -inf) is never read: NaN or inf in its out changes nothing."""
    rng = np.random.default_rng(1)
    out_a = rng.standard_normal((3, 4, 8)).astype(np.float32)
    lse_a = rng.standard_normal((3, 4)).astype(np.float32)
    junk = np.full_like(out_a, np.nan)
    junk[0] = np.inf
    empty_lse = np.full_like(lse_a, -np.inf)
    for xp, wrap in ((jax_decode, jnp.asarray), (torch_bridge, torch.from_numpy)):
        for args in ((out_a, lse_a, junk, empty_lse), (junk, empty_lse, out_a, lse_a)):
            out, lse = xp.merge_attention_states(*map(wrap, args))
            np.testing.assert_array_equal(np.asarray(out), out_a)
            np.testing.assert_array_equal(np.asarray(lse), lse_a)
        out, lse = xp.merge_attention_states(*map(wrap, (junk, empty_lse, junk, empty_lse)))
        assert (np.asarray(out) == 0).all() and np.isneginf(np.asarray(lse)).all()


def test_merge_refuses_integer_outputs():
    out, lse = np.zeros((2, 4, 8), np.int32), np.zeros((2, 4), np.float32)
    for xp, wrap in ((jax_decode, jnp.asarray), (torch_bridge, torch.from_numpy)):
        with pytest.raises(TypeError, match=r"out_a dtype must be one of float16, bfloat16, float32, got int32"):
            xp.merge_attention_states(*map(wrap, (out, lse, out.astype(np.float32), lse)))
