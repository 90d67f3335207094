"""The README's example runs, its commands are the ones CI runs, in the order a
newcomer reads them, and what it says about the head layout is what the code does."""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest
from conftest import HAS_GPU, needs_interpreter

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert blocks, "the README has a Python example"
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)
    np.testing.assert_array_equal(np.asarray(namespace["seq_lens"]), [4, 20, 43, 103])
    assert namespace["attn"].shape == (4, 512)
    assert np.isfinite(np.asarray(namespace["attn"], np.float32)).all()


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"```bash\n(.*?)\n```", README, flags=re.S)
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command in (ROOT / ".ci" / "run").read_text()


def test_cpu_torch_is_installed_before_either_command():
    """A newcomer copying the blocks in order on a CPU-only machine gets torch's CPU build
    (not 6 GB of CUDA libraries), and pip resolves triton once, against it."""
    commands = re.findall(r"```bash\n(.*?)\n```", README, flags=re.S)
    cpu_torch = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
    main_job = next(i for i, c in enumerate(commands) if "python -m jax_decode" in c)
    tests = next(i for i, c in enumerate(commands) if "pytest" in c)
    assert commands[0] == cpu_torch and 0 < main_job < tests
    ci = (ROOT / ".ci" / "run").read_text()
    assert cpu_torch in ci and ci.index(cpu_torch) < ci.index(commands[tests])


KERNEL_BACKEND = "triton" if HAS_GPU else "interpret"


@pytest.mark.parametrize("backend", ["xla", pytest.param(KERNEL_BACKEND, marks=() if HAS_GPU else needs_interpreter)])
def test_query_heads_share_kv_heads_as_the_readme_says(backend):
    """KV head j holds the value j everywhere, so each query head's output is its KV head."""
    import jax.numpy as jnp

    from jax_decode import decode_attention

    assert "Query head `h` attends with KV head `h // (num_heads // num_kv_heads)`" in README
    num_heads, num_kv_heads, head_dim, page_size = 12, 3, 16, 4
    v = jnp.broadcast_to(jnp.arange(num_kv_heads, dtype=jnp.float32)[:, None], (2, page_size, num_kv_heads, head_dim))
    q = jnp.ones((1, num_heads, head_dim), jnp.float32)
    table, lens = jnp.array([[0, 1]], jnp.int32), jnp.array([7], jnp.int32)
    out = decode_attention(q, jnp.ones_like(v), v, table, lens, backend=backend)
    heads = np.arange(num_heads)
    np.testing.assert_array_equal(np.asarray(out)[0, :, 0], heads // (num_heads // num_kv_heads))
