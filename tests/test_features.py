"""fp8 KV caches, sliding windows and attention sinks: every backend against the float64
oracle, and the torch path bit for bit against the JAX path (same kernels, same launch).

On a CPU-only machine the kernels run in Triton's interpreter; on a GPU compiled.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from cases import FEATURES, GQA4, MHA, MLA, Case
from conftest import HAS_GPU
from support import assert_matches_oracle, device_arrays, run_jax
from torch_support import to_float64, to_tensor

import jax_decode
import torch_bridge
from jax_decode.reference import decode_attention_reference

KERNEL_BACKEND = "triton" if HAS_GPU else "interpret"
DEVICE = "cuda" if HAS_GPU else "cpu"


@pytest.mark.parametrize("backend", [KERNEL_BACKEND, "xla"])
@pytest.mark.parametrize("case", FEATURES, ids=lambda c: c.id)
def test_features_match_oracle(case: Case, backend: str):
    problem = case.problem()
    out, lse = run_jax(problem, backend=backend, mla=case.mla, **case.options())
    assert_matches_oracle(problem, out, lse, mla=case.mla, **case.oracle_options())


def _run_torch(problem, case: Case):
    tensors = [to_tensor(a, DEVICE) for a in problem.arrays]
    extras = {name: to_tensor(x, DEVICE) for name, x in problem.extras.items()}
    return torch_bridge.decode_attention(
        *tensors, head_dim_v=problem.head_dim_v if case.mla else None, return_lse=True, **extras, **case.options()
    )


@pytest.mark.parametrize("case", FEATURES, ids=lambda c: c.id)
def test_torch_matches_jax_bit_for_bit(case: Case):
    problem = case.problem()
    out, lse = _run_torch(problem, case)
    assert_matches_oracle(problem, to_float64(out), to_float64(lse), mla=case.mla, **case.oracle_options())
    jax_out, jax_lse = run_jax(problem, backend=KERNEL_BACKEND, mla=case.mla, **case.options())
    np.testing.assert_array_equal(to_float64(out), jax_out)
    np.testing.assert_array_equal(to_float64(lse), jax_lse)


def test_fp8_cache_reads_half_the_bytes():
    problem = dataclasses.replace(GQA4, kv_dtype="float8_e4m3fn", kv_scales="head").problem()
    assert problem.k_cache.dtype.itemsize == 1
    assert problem.kv_bytes() == GQA4.problem().kv_bytes() // 4  # float32 -> fp8


def test_scale_is_applied_not_ignored():
    """A per-head scale changes the result exactly as dequantising the cache does."""
    case = dataclasses.replace(GQA4, kv_dtype="float8_e4m3fn", kv_scales="head", dtype="bfloat16")
    problem = case.problem()
    doubled = dataclasses.replace(problem, k_scale=problem.k_scale * 2, v_scale=problem.v_scale * 3)
    out, lse = run_jax(doubled, backend=KERNEL_BACKEND, **case.options())
    assert_matches_oracle(doubled, out, lse)
    base, _ = run_jax(problem, backend=KERNEL_BACKEND, **case.options())
    assert not np.allclose(out, base, atol=1e-2)


def test_python_float_scales():
    case = dataclasses.replace(MHA, kv_dtype="float8_e4m3fn", dtype="bfloat16")
    problem = case.problem()
    out, lse = jax_decode.decode_attention(
        *device_arrays(problem), k_scale=0.5, v_scale=2.0, return_lse=True, backend=KERNEL_BACKEND, num_kv_splits=2
    )
    with_scales = dataclasses.replace(problem, k_scale=np.float32([0.5]), v_scale=np.float32([2.0]))
    assert_matches_oracle(with_scales, np.asarray(out, np.float64), np.asarray(lse, np.float64))
    t_out = torch_bridge.decode_attention(
        *(to_tensor(a, DEVICE) for a in problem.arrays), k_scale=0.5, v_scale=2.0, num_kv_splits=2
    )
    np.testing.assert_array_equal(to_float64(t_out), np.asarray(out.astype(jnp.float32), np.float64))


@pytest.mark.parametrize("case", [MHA, GQA4, MLA], ids=lambda c: c.id)
def test_window_skips_what_lies_before_it(case: Case):
    """Tokens before the window may hold anything: NaN K/V and bad page ids change nothing."""
    window = 9
    problem = dataclasses.replace(case, window_left=window).problem()
    clean_out, clean_lse = run_jax(problem, backend=KERNEL_BACKEND, mla=case.mla, window_left=window)
    page_size = problem.k_cache.shape[1]
    for row, length in enumerate(problem.seq_lens):
        first = max(int(length) - 1 - window, 0)
        for pos in range(first):
            page = problem.page_table[row, pos // page_size]
            problem.k_cache[page, pos % page_size] = np.nan
            if problem.v_cache is not None:
                problem.v_cache[page, pos % page_size] = np.nan
        # Pages wholly before the window: their ids are never looked up.
        problem.page_table[row, : first // page_size] = -(10**6)
    out, lse = run_jax(problem, backend=KERNEL_BACKEND, mla=case.mla, window_left=window)
    np.testing.assert_array_equal(out, clean_out)
    np.testing.assert_array_equal(lse, clean_lse)


def test_window_of_whole_row_equals_no_window():
    problem = GQA4.problem()
    capacity = problem.page_table.shape[1] * problem.k_cache.shape[1]
    full = run_jax(problem, backend=KERNEL_BACKEND, num_kv_splits=2)
    wide = run_jax(problem, backend=KERNEL_BACKEND, num_kv_splits=2, window_left=capacity)
    np.testing.assert_array_equal(full[0], wide[0])
    np.testing.assert_array_equal(full[1], wide[1])


def test_sinks_on_empty_rows():
    """No tokens: the sink takes the whole weight, so the output is 0 and the LSE the sink."""
    problem = dataclasses.replace(GQA4, sinks=True).problem()
    problem.seq_lens[:] = 0
    for backend in (KERNEL_BACKEND, "xla"):
        out, lse = run_jax(problem, backend=backend, num_kv_splits=2)
        assert (out == 0).all()
        np.testing.assert_allclose(lse, np.broadcast_to(problem.sinks, lse.shape), rtol=1e-6)


def test_sinks_lower_the_weights_exactly():
    """out_with_sink = out * exp(lse) / (exp(lse) + exp(sink)): the sink only adds to the denominator."""
    problem = dataclasses.replace(MHA, sinks=True).problem()
    out_sink, lse_sink = run_jax(problem, backend=KERNEL_BACKEND, num_kv_splits=2)
    plain = dataclasses.replace(problem, sinks=None)
    out, lse = run_jax(plain, backend=KERNEL_BACKEND, num_kv_splits=2)
    weight = 1 / (1 + np.exp(problem.sinks[None, :] - lse))  # 0 for empty rows (lse -inf)
    np.testing.assert_allclose(out_sink, out * weight[..., None], atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(lse_sink, np.logaddexp(lse, problem.sinks[None, :]), rtol=1e-5)


def test_fp8_cache_with_huge_q_stays_finite():
    """bfloat16 q over an fp8 cache runs its dots in float16: q beyond +-65504 saturates, never inf."""
    case = dataclasses.replace(GQA4, kv_dtype="float8_e4m3fn", kv_scales="head", dtype="bfloat16")
    problem = case.problem()
    problem.q[1:, 0, :] = 1e6  # rows with tokens; one head's q far beyond float16's range
    out, lse = run_jax(problem, backend=KERNEL_BACKEND, **case.options())
    assert np.isfinite(out).all() and np.isfinite(lse[1:]).all()


def test_torch_compile_fullgraph_with_every_feature():
    """The custom op's optional tensors (scales, sinks) and window pass through torch.compile."""
    import torch

    case = dataclasses.replace(
        GQA4, kv_dtype="float8_e4m3fn", kv_scales="head", window_left=20, sinks=True, dtype="bfloat16"
    )
    problem = case.problem()
    tensors = [to_tensor(a, DEVICE) for a in problem.arrays]
    extras = {name: to_tensor(x, DEVICE) for name, x in problem.extras.items()}

    def layer(q, k, v, pt, sl, k_scale, v_scale, sinks):
        out = torch_bridge.decode_attention(
            q * 2, k, v, pt, sl, k_scale=k_scale, v_scale=v_scale, sinks=sinks, window_left=20, num_kv_splits=2
        )
        return out * 0.5  # exact elementwise work only: compiled and eager agree bit for bit

    compiled = torch.compile(layer, fullgraph=True, backend="inductor" if HAS_GPU else "aot_eager")
    args = (*tensors, extras["k_scale"], extras["v_scale"], extras["sinks"])
    torch.testing.assert_close(compiled(*args), layer(*args), atol=0, rtol=0)


def test_vllm_drop_in_with_fp8_buffers_and_scales():
    import torch

    case = dataclasses.replace(GQA4, kv_dtype="float8_e4m3fn", kv_scales="tensor", dtype="bfloat16")
    problem = case.problem()
    q, k, v, pt, sl = (to_tensor(a, DEVICE) for a in problem.arrays)
    o = torch.empty(q.shape[0], q.shape[1], v.shape[-1], dtype=q.dtype, device=DEVICE)
    logits = torch.empty(q.shape[0], q.shape[1], 3, v.shape[-1] + 1, dtype=torch.float32, device=DEVICE)
    k_scale, v_scale = (to_tensor(problem.extras[name], DEVICE) for name in ("k_scale", "v_scale"))
    torch_bridge.decode_attention_fwd(
        q, k, v, o, pt, sl, logits, 3, 0.125, page_size=case.page_size, k_scale=k_scale, v_scale=v_scale
    )
    expected, _ = decode_attention_reference(*problem.arrays, **problem.extras, sm_scale=0.125)
    np.testing.assert_allclose(to_float64(o), expected, atol=3e-2, rtol=3e-2)


# Soft-caps from one where most scores saturate to ones so large that score / cap is
# tiny: tanh must keep its relative accuracy there (``2 sigmoid(2x) - 1`` lost every
# digit of the scores by cap 1e7, giving the mean of V).
@pytest.mark.parametrize("logit_cap", [0.5, 50.0, 1e3, 1e5, 1e8])
def test_soft_cap_of_any_size_matches_oracle(logit_cap: float):
    case = dataclasses.replace(GQA4, logit_cap=logit_cap)
    problem = case.problem()
    out, lse = _run_torch(problem, case)
    assert_matches_oracle(problem, to_float64(out), to_float64(lse), **case.oracle_options())
    jax_out, jax_lse = run_jax(problem, backend=KERNEL_BACKEND, **case.options())
    np.testing.assert_array_equal(to_float64(out), jax_out)
    np.testing.assert_array_equal(to_float64(lse), jax_lse)
