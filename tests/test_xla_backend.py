"""The plain-JAX backend against the float64 oracle, and how "auto" resolves on the CPU."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from cases import GQA4, MATRIX, MLA, Case
from conftest import HAS_GPU, needs_interpreter
from support import assert_matches_oracle, device_arrays, run_jax

import jax_decode


@pytest.mark.parametrize("case", MATRIX, ids=lambda c: c.id)
def test_xla_matches_oracle(case: Case):
    problem = case.problem()
    out, lse = run_jax(problem, backend="xla", mla=case.mla, **case.options())
    assert_matches_oracle(problem, out, lse, mla=case.mla, logit_cap=case.logit_cap)


@pytest.mark.skipif(HAS_GPU, reason="on a GPU 'auto' runs the Triton kernels")
@pytest.mark.parametrize("case", [GQA4, MLA], ids=lambda c: c.id)
def test_auto_is_xla_on_cpu(case: Case):
    problem = case.problem()
    auto = run_jax(problem, backend="auto", mla=case.mla)
    xla = run_jax(problem, backend="xla", mla=case.mla)
    np.testing.assert_array_equal(auto[0], xla[0])
    np.testing.assert_array_equal(auto[1], xla[1])


@pytest.mark.parametrize("backend", ["xla", pytest.param("interpret", marks=needs_interpreter)])
def test_eager_call_and_return_shapes(backend):
    problem = GQA4.problem()
    out = jax_decode.decode_attention(*device_arrays(problem), backend=backend)
    assert out.shape == (4, 8, 64) and out.dtype == problem.q.dtype
    out, lse = jax_decode.decode_attention(*device_arrays(problem), backend=backend, return_lse=True)
    assert lse.shape == (4, 8) and lse.dtype == np.float32
    # Read the values: a failing host callback on a GPU only surfaces when synchronised.
    assert_matches_oracle(problem, np.asarray(out, np.float64), np.asarray(lse, np.float64))


def test_empty_batch():
    problem = GQA4.problem()
    q, k, v, pt, sl = device_arrays(problem)
    out, lse = jax_decode.decode_attention(q[:0], k, v, pt[:0], sl[:0], return_lse=True)
    assert out.shape == (0, 8, 64) and lse.shape == (0, 8)


def test_jit_traces_once_per_shape():
    """Everything static comes from shapes: new values reuse the compiled function."""
    problem = GQA4.problem()
    traces = []

    @jax.jit
    def step(q, k, v, pt, sl):
        traces.append(1)
        return jax_decode.decode_attention(q, k, v, pt, sl, backend="xla")

    arrays = device_arrays(problem)
    step(*arrays)
    step(arrays[0] * 2, *arrays[1:4], arrays[4] // 2)
    assert len(traces) == 1
