"""Shared test helpers: per-dtype tolerances, running a problem, comparing with the oracle."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jax_decode
from jax_decode.reference import LSE_TOLERANCE, OUT_TOLERANCE, decode_attention_reference
from jax_decode.synthetic import PagedProblem

OUT_TOL, LSE_TOL = OUT_TOLERANCE, LSE_TOLERANCE  # the one tolerance table


def device_arrays(problem: PagedProblem) -> tuple:
    return tuple(None if a is None else jnp.asarray(a) for a in problem.arrays)


def run_jax(problem: PagedProblem, *, backend: str, mla: bool = False, jit: bool = True, **options):
    """decode_attention on the problem; returns NumPy (out float64, lse float64)."""
    head_dim_v = problem.head_dim_v if mla else None

    def call(*arrays, **extras):
        return jax_decode.decode_attention(
            *arrays, head_dim_v=head_dim_v, return_lse=True, backend=backend, **extras, **options
        )

    extras = {name: jnp.asarray(x) for name, x in problem.extras.items()}
    fn = jax.jit(call) if jit else call
    out, lse = fn(*device_arrays(problem), **extras)
    return np.asarray(out.astype(jnp.float32), np.float64), np.asarray(lse, np.float64)


def assert_matches_oracle(problem: PagedProblem, out, lse, *, mla: bool = False, lse_tol=None, **options) -> None:
    """Compare with the oracle (the problem's scales and sinks included); ``lse_tol``
    replaces :data:`LSE_TOL` (kernels on fp8 tensor cores: ``FP8_MMA_LSE_TOLERANCE``)."""
    expected_out, expected_lse = decode_attention_reference(
        *problem.arrays, head_dim_v=problem.head_dim_v if mla else None, **problem.extras, **options
    )
    dtype = problem.q.dtype.name
    np.testing.assert_allclose(out, expected_out, **OUT_TOL[dtype])
    np.testing.assert_allclose(lse, expected_lse, **(lse_tol or LSE_TOL))  # -inf rows must match exactly
    assert np.isfinite(out).all(), "no NaN or inf in any output"


def run_isolated(path: str, name: str, *args) -> None:
    """Run ``name(*args)`` of the test file ``path`` in a fresh Python (the repo and tests/
    on its path): a failed run of Triton's interpreter elsewhere in the session
    (conftest's probe, on NumPy >= 2.4) can leave ``triton.language`` patched, which
    breaks later Gluon compiles in that process."""
    import os
    import subprocess
    import sys

    tests = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(tests)
    code = f"import runpy; runpy.run_path({path!r})[{name!r}](*{args!r})"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, tests, os.environ.get("PYTHONPATH", "")]))
    # A kernel whose barriers never complete would hang the suite: a timeout fails it instead.
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
