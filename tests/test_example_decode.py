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


def test_llama_preset_has_llama_3_1_8b_shapes():
    """--preset llama-3.1-8b: Llama-3.1-8B's layer count, heads, widths and vocabulary in
    bf16 (shapes only: nothing is allocated), and its paged cache's layout."""
    import jax
    import jax.numpy as jnp

    cfg = llama.PRESETS["llama-3.1-8b"]
    assert (cfg.layers, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.dim, cfg.hidden, cfg.vocab, cfg.page_size,
            cfg.dtype) == (32, 32, 8, 128, 4096, 14336, 128256, 16, "bfloat16")  # fmt: skip
    params = jax.eval_shape(lambda: llama.init_params(cfg))
    leaves = jax.tree.leaves(params)
    assert {x.dtype for x in leaves} == {jnp.dtype(jnp.bfloat16)}
    # Llama-3.1-8B's 8,030,261,248 parameters less its 65 RMSNorm gains of 4096 (this model has none).
    assert sum(x.size for x in leaves) == 8_030_261_248 - 65 * 4096
    layer = params["layers"][0]
    assert (layer["wq"].shape, layer["wk"].shape, layer["wo"].shape, layer["w_gate"].shape) == (
        (4096, 4096), (4096, 1024), (4096, 4096), (4096, 14336))  # fmt: skip
    assert params["embed"].shape == (128256, 4096) and params["head"].shape == (4096, 128256)
    shape, page_table = llama.cache_layout(dataclasses.replace(cfg, max_len=8192 + 48), 64)
    assert shape[1:] == (16, 8, 128) and shape[0] >= 64 * 515 and page_table.shape == (64, 515)
    assert len(set(np.asarray(page_table).ravel().tolist())) == 64 * 515  # each row owns its pages


def test_llama_preset_times_steps_with_xla_attention(capsys):
    """A scaled-down preset (one layer, a small vocabulary, the real heads and widths)
    decodes from a pre-filled cache with the attention of backend="xla", and reports
    tokens/s and attention's share of the step."""
    import re

    llama.main(["--preset", "llama-3.1-8b", "--layers", "1", "--vocab", "512", "--batch", "2", "--context", "64",
                "--steps", "2", "--attention", "xla"])  # fmt: skip
    out = capsys.readouterr().out
    assert "llama-3.1-8b: 1 layer, 32/8 heads of 128, dim 4096, MLP 14336, vocab 512, bfloat16" in out
    assert re.search(
        r"batch 2, context 64, attention xla on [\w ]+: [\d.]+ tokens/s \([\d.]+ ms per step over 2 "
        r"steps\); with a stand-in for attention [\d.]+ ms: (attention [\d.]+% of the step|attention's share "
        r"within the noise)",
        out,
    ), out


def test_llama_preset_fa3_says_why_it_cannot_run_and_options_need_the_preset(capsys):
    import jax

    try:
        import flash_attn3_jax  # noqa: F401
    except Exception:
        reason = "does not import here"
    else:
        device = jax.devices()[0]
        if device.platform == "gpu" and str(getattr(device, "compute_capability", "")).startswith("9."):
            pytest.skip("FlashAttention-3 runs here")
        reason = "CUDA GPU only" if device.platform != "gpu" else "sm_90"
    with pytest.raises(SystemExit, match=f"--attention fa3.*{reason}"):
        llama.main(["--preset", "llama-3.1-8b", "--layers", "1", "--vocab", "512", "--attention", "fa3"])
    with pytest.raises(SystemExit):
        llama.main(["--attention", "xla", "--context", "4k"])
    assert "--attention, --context apply to --preset only" in capsys.readouterr().err
    assert llama.parse_context("4k") == 4096 and llama.parse_context("1000") == 1000


def test_the_draft_tokens_warm_up_runs_a_verify_step(monkeypatch, capsys):
    """main's untimed warm-up must compile what the timed run calls: at least one verify
    step, whatever the prompts' lengths (with every prompt of 3+ tokens a 2-step warm-up
    ran none, and the timed figure included the compile)."""
    counts = []
    real = llama.speculative_greedy

    def recording(*args, **kwargs):
        tokens, calls = real(*args, **kwargs)
        counts.append(calls)
        return tokens, calls

    monkeypatch.setattr(llama, "speculative_greedy", recording)
    llama.main(["--backend", "xla", "--draft-tokens", "4", "--steps", "4", "--batch", "4"])
    assert "--draft-tokens 4: the same tokens" in capsys.readouterr().out
    assert len(counts) == 2 and counts[0] >= 1, counts
