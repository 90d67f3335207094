from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Eight host devices for the sharding tests (tests/test_sharding.py); a GPU's devices
# are unaffected.  Set before JAX initialises its backends.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# Property tests: a fixed, small set of examples in CI ("ci", the default); many more,
# freshly drawn, with --hypothesis-profile=thorough.
settings.register_profile(
    "ci", max_examples=12, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("thorough", max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def pytest_configure(config):
    if not config.getoption("hypothesis_profile", None):
        settings.load_profile("ci")


def _has_gpu() -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


HAS_GPU = _has_gpu()


_PROBE = """
import jax.numpy as jnp, numpy as np, jax_decode
q = jnp.ones((1, 1, 16), jnp.float32)
cache = jnp.ones((1, 1, 1, 16), jnp.float32)
table, lens = jnp.zeros((1, 1), jnp.int32), jnp.ones((1,), jnp.int32)
try:
    out = jax_decode.decode_attention(q, cache, cache, table, lens, backend="interpret")
    np.testing.assert_allclose(np.asarray(out), 1.0)
except Exception as error:  # the interpreter of some Triton/NumPy pairs breaks
    print(f"{type(error).__name__}: {str(error).splitlines()[-1][:200]}")
"""


def _interpreter_failure() -> str | None:
    """Why Triton's interpreter cannot run our kernels here, or None if it can.  Probed in
    a fresh Python: a failing interpreter (Triton 3.6 with NumPy >= 2.4) leaves
    triton.language patched, and every later Gluon compile in the process would fail."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return f"the probe failed: {last[:200]}"
    return done.stdout.strip() or None


INTERPRETER_FAILURE = _interpreter_failure()
needs_interpreter = pytest.mark.skipif(
    INTERPRETER_FAILURE is not None,
    reason=f"Triton's interpreter does not run on this machine: {INTERPRETER_FAILURE}",
)


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU visible to JAX; this machine has none")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
