"""Multi-token decode: q ``[batch, q_len, num_heads, head_dim]`` (speculative drafts,
multi-token prediction), every backend and frontend against the float64 oracle.

Query token ``t`` of a row of length ``L`` is position ``L - q_len + t``: it attends to
the positions before it and itself.  Rows shorter than ``q_len`` (lengths 0 and 1 in
every case's batch) give defined outputs: zeros and LSE ``-inf`` for a token with no
position left, or the sink.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from cases import FEATURES, GQA4, GQA8, MATRIX, MHA, MLA, MQA, Case
from conftest import HAS_GPU
from support import assert_matches_oracle, device_arrays, run_jax
from torch_support import to_float64, to_tensor

import jax_decode
import torch_bridge
from jax_decode.reference import decode_attention_reference

KERNEL_BACKEND = "triton" if HAS_GPU else "interpret"
DEVICE = "cuda" if HAS_GPU else "cpu"


def _multi(case: Case, q_len: int) -> Case:
    return dataclasses.replace(case, q_len=q_len)


CASES = [
    _multi(MHA, 4),
    _multi(GQA4, 2),
    _multi(GQA4, 4),
    _multi(GQA8, 3),
    _multi(MQA, 16),
    _multi(MLA, 2),
    _multi(dataclasses.replace(GQA4, dtype="bfloat16", logit_cap=5.0), 4),
    _multi(dataclasses.replace(MHA, page_size=3, max_pages=14, num_kv_splits=5), 3),
    _multi(GQA4, 1),  # a 4-D q of one token: 4-D outputs, the one-token kernels
    *(_multi(c, 4) for c in FEATURES[:6] + FEATURES[7:9] + FEATURES[12:14]),  # fp8, windows, sinks
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("backend", [KERNEL_BACKEND, "xla"])
def test_multi_token_matches_oracle(case: Case, backend: str):
    problem = case.problem()
    out, lse = run_jax(problem, backend=backend, mla=case.mla, **case.options())
    assert out.shape == (*problem.q.shape[:-1], problem.head_dim_v)
    assert_matches_oracle(problem, out, lse, mla=case.mla, **case.oracle_options())


@pytest.mark.parametrize("case", [_multi(GQA4, 4), _multi(MLA, 2), _multi(MHA, 3)], ids=lambda c: c.id)
def test_each_token_is_the_one_token_call_at_its_position(case: Case):
    """Token t of a q_len call attends exactly as a one-token call whose row ends at t."""
    problem = case.problem()
    q_len = case.q_len
    out, _ = run_jax(problem, backend="xla", mla=case.mla, **case.options())
    for t in range(q_len):
        one = dataclasses.replace(problem, q=problem.q[:, t], seq_lens=problem.seq_lens - (q_len - 1 - t))
        expected, _ = run_jax(one, backend="xla", mla=case.mla, **case.options())
        np.testing.assert_allclose(out[:, t], expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("case", [_multi(GQA4, 4), _multi(MLA, 2), _multi(MHA, 2)], ids=lambda c: c.id)
def test_jax_and_torch_are_bit_identical(case: Case):
    problem = case.problem()
    head_dim_v = problem.head_dim_v if case.mla else None
    jax_out, jax_lse = jax_decode.decode_attention(
        *device_arrays(problem), head_dim_v=head_dim_v, backend=KERNEL_BACKEND, return_lse=True, **case.options()
    )
    tensors = [to_tensor(a, DEVICE) for a in problem.arrays]
    t_out, t_lse = torch_bridge.decode_attention(*tensors, head_dim_v=head_dim_v, return_lse=True, **case.options())
    np.testing.assert_array_equal(to_float64(t_out), np.asarray(jax_out, np.float64))
    np.testing.assert_array_equal(to_float64(t_lse), np.asarray(jax_lse, np.float64))


def test_torch_compile_with_a_token_axis_matches_eager():
    problem = _multi(GQA4, 3).problem()
    tensors = [to_tensor(a, DEVICE) for a in problem.arrays]

    def layer(q, k, v, page_table, seq_lens):
        return torch_bridge.decode_attention(q, k, v, page_table, seq_lens, num_kv_splits=2, return_lse=True)

    compiled = torch.compile(layer, fullgraph=True, backend="inductor" if HAS_GPU else "aot_eager")
    for got, want in zip(compiled(*tensors), layer(*tensors), strict=True):
        torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_torch_out_with_a_token_axis_is_written_in_place():
    problem = _multi(GQA4, 2).problem()
    tensors = [to_tensor(a, DEVICE) for a in problem.arrays]
    out = torch.full((*problem.q.shape[:-1], problem.head_dim_v), float("nan"), device=DEVICE)[:, :, :, :]
    result = torch_bridge.decode_attention(*tensors, out=out, num_kv_splits=2)
    assert result is out
    expected, _ = decode_attention_reference(*problem.arrays)
    np.testing.assert_allclose(to_float64(out), expected, atol=2e-5, rtol=2e-5)
    with pytest.raises(ValueError, match=r"out must be float32 of shape \(4, 2, 8, 64\)"):
        torch_bridge.decode_attention(*tensors, out=torch.empty(4, 8, 64, device=DEVICE))


def test_check_inputs_refuses_rows_shorter_than_q_len():
    problem = _multi(GQA4, 4).problem()  # lengths 0, 1, 32, 64
    message = r"seq_lens\[0\] = 0 is shorter than q_len \(4\)"
    with pytest.raises(ValueError, match=message):
        jax_decode.decode_attention(*device_arrays(problem), backend="xla", check_inputs=True)
    with pytest.raises(ValueError, match=message):
        torch_bridge.decode_attention(*(to_tensor(a) for a in problem.arrays), check_inputs=True)
    problem.seq_lens[:2] = 4
    jax_decode.decode_attention(*device_arrays(problem), backend="xla", check_inputs=True)


def test_one_token_rows_of_length_zero_stay_allowed_in_checked_mode():
    problem = GQA4.problem()  # a 3-D q; row 0 has length 0 (an empty row)
    jax_decode.decode_attention(*device_arrays(problem), backend="xla", check_inputs=True)


def test_q_len_range_and_the_vllm_drop_in():
    problem = _multi(GQA4, 17).problem()
    with pytest.raises(ValueError, match=r"q q_len \(17\) must be in \[1, 16\]"):
        jax_decode.decode_attention(*device_arrays(problem), backend="xla")
    problem = _multi(GQA4, 2).problem()
    q, k, v, page_table, seq_lens = (to_tensor(a) for a in problem.arrays)
    o = torch.empty(4, 8, 64)
    logits = torch.empty(4, 8, 2, 65)
    with pytest.raises(ValueError, match=r"q must be 3-D \[batch, num_heads, head_dim\] \(one token per row\)"):
        torch_bridge.decode_attention_fwd(q, k, v, o, page_table, seq_lens, logits, 2, 0.125, 16)


def test_vmap_over_rows_with_a_token_axis():
    problem = _multi(GQA4, 3).problem()
    q, k, v, page_table, seq_lens = device_arrays(problem)
    batched = jax.vmap(lambda q, t, s: jax_decode.decode_attention(q, k, v, t, s, backend="xla", return_lse=True))
    out, lse = batched(jnp.stack([q, q]), jnp.stack([page_table, page_table]), jnp.stack([seq_lens, seq_lens]))
    whole, whole_lse = jax_decode.decode_attention(q, k, v, page_table, seq_lens, backend="xla", return_lse=True)
    assert out.shape == (2, *whole.shape) and lse.shape == (2, *whole_lse.shape)
    # XLA on a GPU may fuse the batched program differently (last-bit differences,
    # measured on an H100); the values are the same attention.
    for i in range(2):
        np.testing.assert_allclose(np.asarray(out[i]), np.asarray(whole), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(np.asarray(lse[i]), np.asarray(whole_lse), rtol=1e-6, atol=1e-6)


def test_merge_with_a_token_axis():
    """Two halves of each row's pages, merged, equal attention over the whole row."""
    problem = _multi(GQA4, 2).problem()
    q, k, v, page_table, seq_lens = device_arrays(problem)
    half = problem.page_table.shape[1] // 2
    first, second = page_table.at[:, half:].set(-1), page_table.at[:, :half].set(-1)
    parts = [jax_decode.decode_attention(q, k, v, t, seq_lens, backend="xla", return_lse=True) for t in (first, second)]
    out, lse = jax_decode.merge_attention_states(*parts[0], *parts[1])
    expected, expected_lse = decode_attention_reference(*problem.arrays)
    np.testing.assert_allclose(np.asarray(out, np.float64), expected, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(np.asarray(lse, np.float64), expected_lse, atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("case", [c for c in MATRIX if c.dtype == "bfloat16"][:3], ids=lambda c: c.id)
def test_one_token_results_do_not_change_with_a_token_axis_of_one(case: Case):
    """A 4-D q of one token runs the one-token kernels: the same bits as a 3-D q."""
    problem = case.problem()
    three, three_lse = run_jax(problem, backend=KERNEL_BACKEND, mla=case.mla, **case.options())
    four_d = dataclasses.replace(problem, q=problem.q[:, None])
    four, four_lse = run_jax(four_d, backend=KERNEL_BACKEND, mla=case.mla, **case.options())
    np.testing.assert_array_equal(four[:, 0], three)
    np.testing.assert_array_equal(four_lse[:, 0], three_lse)


@pytest.mark.parametrize("backend", [KERNEL_BACKEND, "xla"])
def test_a_window_near_int32_max_over_rows_shorter_than_q_len(backend):
    """seq_len - q_len - window_left would overflow int32: the window holds the whole row."""
    case = dataclasses.replace(_multi(GQA4, 4), window_left=2**31 - 1)
    problem = case.problem()
    problem.seq_lens[:] = [2, 3, 1, 0]
    out, lse = run_jax(problem, backend=backend, **case.options())
    assert_matches_oracle(problem, out, lse, **case.oracle_options())
    whole, _ = run_jax(problem, backend=backend, num_kv_splits=2)
    np.testing.assert_array_equal(out, whole)
