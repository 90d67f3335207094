"""examples/llama_decode.py: paged decoding (write_kv + decode_attention in one jitted step)
produces the same greedy tokens as the same model with dense causal attention."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import pathlib
import sys

import numpy as np
import pytest
from conftest import HAS_GPU, needs_interpreter

_PATH = pathlib.Path(__file__).resolve().parents[1] / "examples" / "llama_decode.py"
_spec = importlib.util.spec_from_file_location("llama_decode", _PATH)
llama = importlib.util.module_from_spec(_spec)
sys.modules["llama_decode"] = llama  # dataclasses look their module up there
_spec.loader.exec_module(llama)

KERNEL_BACKEND = "triton" if HAS_GPU else "interpret"
CFG = llama.Config(vocab=64, dim=64, layers=2, heads=8, kv_heads=2, head_dim=16, hidden=128, page_size=4, max_len=16)
PROMPTS = [[5, 9, 2], [7], [1, 2, 3, 4, 5, 6]]
STEPS = 12


@pytest.fixture(scope="module")
def dense_tokens():
    return llama.dense_greedy(llama.init_params(CFG), CFG, PROMPTS, STEPS)


@pytest.mark.parametrize("backend", ["xla", pytest.param(KERNEL_BACKEND, marks=() if HAS_GPU else needs_interpreter)])
def test_paged_decoding_matches_dense(backend, dense_tokens):
    tokens = llama.paged_greedy(llama.init_params(CFG), CFG, PROMPTS, STEPS, backend)
    np.testing.assert_array_equal(tokens, dense_tokens)
    assert tokens[1, 0] != 0 or tokens[1, 1] != 0  # generated, not padding
    for row, prompt in enumerate(PROMPTS):  # prompts are replayed, then the model takes over
        np.testing.assert_array_equal(tokens[row, : len(prompt) - 1], prompt[1:])


def test_the_documented_commands_run():
    """Every command in the example's docstring runs as written (on the CPU: xla)."""
    import re
    import subprocess

    doc = llama.__doc__.replace("\\\n", " ")
    commands = re.findall(r"^\s+((?:\w+=\S+\s+)*)python (examples/llama_decode\.py.*?)(?:\s+#.*)?$", doc, flags=re.M)
    assert len(commands) >= 3
    for env_vars, command in commands:
        env = dict(os.environ, **dict(v.split("=", 1) for v in env_vars.split()))
        result = subprocess.run([sys.executable, *command.split()], capture_output=True, text=True, timeout=600,
                                cwd=_PATH.parents[1], env=env)  # fmt: skip
        assert result.returncode == 0, (command, result.stderr[-2000:])
        assert "tokens/s" in result.stdout


@pytest.mark.parametrize(("tp", "sp"), [(2, 1), (1, 2), (2, 2), (1, 4)])
def test_sharded_decoding_gives_the_single_device_tokens(tp, sp, dense_tokens):
    """The same step over a mesh (heads over "tp", cache pages over "sp"; host devices)."""
    import jax
    from jax.sharding import Mesh

    devices = jax.devices("cpu")
    if len(devices) < tp * sp:
        pytest.skip(f"needs {tp * sp} host devices")
    mesh = Mesh(np.array(devices[: tp * sp]).reshape(sp, tp), ("sp", "tp"))
    tokens = llama.paged_greedy(llama.init_params(CFG), CFG, PROMPTS, STEPS, "xla", mesh)
    np.testing.assert_array_equal(tokens, dense_tokens)


@pytest.mark.parametrize("draft_tokens", [2, 4])
@pytest.mark.parametrize("backend", ["xla", pytest.param(KERNEL_BACKEND, marks=() if HAS_GPU else needs_interpreter)])
def test_speculative_decoding_gives_the_one_token_tokens(backend, draft_tokens, dense_tokens):
    """Verifying several tokens per row in one call (q with a token axis) keeps greedy
    decoding's tokens, in fewer steps than tokens."""
    cfg = dataclasses.replace(CFG, max_len=CFG.max_len + 4)
    tokens, calls = llama.speculative_greedy(llama.init_params(cfg), cfg, PROMPTS, STEPS, draft_tokens, backend)
    np.testing.assert_array_equal(tokens, dense_tokens)
    assert calls < STEPS
