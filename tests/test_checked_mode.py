"""check_inputs=True: bad page ids and lengths raise a clear error at run time, in both frameworks.

The rule (jax_decode.validation.check_index_values) reads only the pages a row's tokens
live on, so -1 padding past a row's length is accepted.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
import torch
from cases import GQA4
from conftest import HAS_GPU
from support import device_arrays
from torch_support import to_tensor

import jax_decode
import torch_bridge

DEVICE = "cuda" if HAS_GPU else "cpu"

# (what to break, expected message).  GQA4 rows have lengths [0, 1, 32, 64], page 16,
# max_pages 4 (capacity 64).
BAD_VALUES = {
    "negative_length": (lambda p: p.seq_lens.__setitem__(2, -1), r"seq_lens\[2\] = -1 is outside \[0, 64\]"),
    "length_past_capacity": (lambda p: p.seq_lens.__setitem__(3, 65), r"seq_lens\[3\] = 65 is outside \[0, 64\]"),
    "negative_page": (
        lambda p: p.page_table.__setitem__((2, 1), -1),
        r"page_table\[2, 1\] = -1 is outside \[0, num_pages = \d+\) but holds tokens of row 2",
    ),
    "page_past_cache": (
        lambda p: p.page_table.__setitem__((1, 0), p.k_cache.shape[0]),
        r"page_table\[1, 0\] = \d+ is outside \[0, num_pages = \d+\)",
    ),
}


def _problem(break_it=None):
    problem = GQA4.problem()
    problem.page_table[0, :] = -1  # row 0 is empty: its entries are never read
    problem.page_table[2, 2:] = -1  # row 2 uses two of its four pages
    if break_it is not None:
        break_it(problem)
    return problem


@pytest.mark.parametrize("name", BAD_VALUES)
def test_jax_checked_mode_raises_at_run_time(name, caplog):
    """Under jax.jit the call fails with JaxRuntimeError whose message ends in the
    check's; nothing else is logged.  Eagerly it is the ValueError itself."""
    break_it, message = BAD_VALUES[name]
    arrays = device_arrays(_problem(break_it))
    fn = jax.jit(lambda *a: jax_decode.decode_attention(*a, backend="xla", check_inputs=True))
    with pytest.raises(jax.errors.JaxRuntimeError, match=message):
        jax.block_until_ready(fn(*arrays))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], "the failure is reported once, not logged"
    with pytest.raises(ValueError, match=message):
        jax_decode.decode_attention(*arrays, backend="xla", check_inputs=True)


def test_jax_checked_mode_failure_is_not_raised_again_at_exit():
    """The check is a data dependency of the kernels, not a side effect, so a failed call
    leaves nothing behind for JAX to re-raise when the interpreter exits."""
    script = textwrap.dedent(
        """
        import jax, jax.numpy as jnp, jax_decode
        q = jnp.ones((2, 4, 16)); k = jnp.ones((3, 4, 2, 16))
        page_table, seq_lens = jnp.array([[0, -1], [1, 2]], jnp.int32), jnp.array([6, 5], jnp.int32)
        try:
            out = jax.jit(lambda *a: jax_decode.decode_attention(*a, check_inputs=True))(q, k, k, page_table, seq_lens)
            jax.block_until_ready(out)
        except jax.errors.JaxRuntimeError as error:
            print("refused:", str(error).splitlines()[-1])
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "refused: " in result.stdout and "page_table[0, 1] = -1 is outside" in result.stdout
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, result.stderr[-2000:]


@pytest.mark.parametrize("name", BAD_VALUES)
def test_torch_checked_mode_raises_eagerly(name):
    break_it, message = BAD_VALUES[name]
    tensors = [to_tensor(a) for a in _problem(break_it).arrays]
    with pytest.raises(ValueError, match=message):
        torch_bridge.decode_attention(*tensors, check_inputs=True)


def test_vllm_drop_in_checked_mode():
    problem = _problem(BAD_VALUES["negative_page"][0])
    q, k, v, pt, sl = (to_tensor(a) for a in problem.arrays)
    o = torch.empty(4, 8, 64)
    logits = torch.empty(4, 8, 2, 65)
    with pytest.raises(ValueError, match=BAD_VALUES["negative_page"][1]):
        torch_bridge.decode_attention_fwd(q, k, v, o, pt, sl, logits, 2, 0.125, 16, check_inputs=True)


def _vllm_checked(q, k, v, pt, sl):
    o = torch.empty(4, 8, 64, device=q.device)
    logits = torch.empty(4, 8, 2, 65, device=q.device)
    torch_bridge.decode_attention_fwd(q, k, v, o, pt, sl, logits, 2, 0.125, 16, check_inputs=True)
    return o


def _checked(q, k, v, pt, sl):
    return torch_bridge.decode_attention(q, k, v, pt, sl, check_inputs=True)


@pytest.mark.parametrize("entry", [_checked, _vllm_checked], ids=["decode_attention", "decode_attention_fwd"])
def test_torch_checked_mode_under_torch_compile_runs_eagerly(entry):
    """Under torch.compile the checked call runs eagerly (a graph break: the check needs
    the index values on the host): the same result as eager on good values, the same
    ValueError on bad ones; fullgraph=True refuses the break, saying why."""
    torch._dynamo.reset()
    good = [to_tensor(a, DEVICE) for a in _problem().arrays]
    compiled = torch.compile(entry, backend="aot_eager")
    torch.testing.assert_close(compiled(*good), entry(*good), rtol=0, atol=0)
    break_it, message = BAD_VALUES["negative_page"]
    with pytest.raises(ValueError, match=message):
        compiled(*[to_tensor(a, DEVICE) for a in _problem(break_it).arrays])
    torch._dynamo.reset()
    with pytest.raises(Exception, match="check_inputs=True copies page tables to the host: it runs eagerly"):
        torch.compile(entry, backend="aot_eager", fullgraph=True)(*good)


def test_checked_mode_accepts_padding_and_changes_nothing():
    problem = _problem()
    arrays = device_arrays(problem)
    checked = jax.jit(lambda *a: jax_decode.decode_attention(*a, backend="xla", check_inputs=True))(*arrays)
    plain = jax.jit(lambda *a: jax_decode.decode_attention(*a, backend="xla"))(*arrays)
    np.testing.assert_array_equal(np.asarray(checked), np.asarray(plain))
    tensors = [to_tensor(a, DEVICE) for a in problem.arrays]
    torch.testing.assert_close(
        torch_bridge.decode_attention(*tensors, check_inputs=True, num_kv_splits=2),
        torch_bridge.decode_attention(*tensors, num_kv_splits=2),
        atol=0,
        rtol=0,
    )


def test_checked_mode_off_adds_no_callback():
    arrays = device_arrays(_problem())
    text = jax.jit(lambda *a: jax_decode.decode_attention(*a, backend="xla")).lower(*arrays).as_text()
    assert "callback" not in text
    checked = jax.jit(lambda *a: jax_decode.decode_attention(*a, backend="xla", check_inputs=True))
    assert "callback" in checked.lower(*arrays).as_text()


def test_freed_pages_before_a_window_are_accepted_but_pages_inside_it_checked():
    """Sliding-window engines free the pages a window has left behind (-1 in the table)."""
    problem = _problem()
    problem.page_table[3, :2] = -1  # row 3 (64 tokens, page 16): pages 0-1 hold tokens 0-31
    arrays = device_arrays(problem)
    windowed = jax.jit(
        lambda *a: jax_decode.decode_attention(*a, backend="xla", window_left=20, check_inputs=True)
    )  # row 3 attends to tokens 43..63: pages 2 and 3
    jax.block_until_ready(windowed(*arrays))
    tensors = [to_tensor(a, DEVICE) for a in problem.arrays]
    torch_bridge.decode_attention(*tensors, window_left=20, check_inputs=True)
    with pytest.raises(ValueError, match=r"page_table\[3, 1\] = -1 .* holds tokens of row 3"):
        torch_bridge.decode_attention(*tensors, window_left=40, check_inputs=True)  # tokens 23..63: page 1 too
    with pytest.raises(Exception, match=r"page_table\[3, 0\] = -1"):
        jax.block_until_ready(jax.jit(lambda *a: jax_decode.decode_attention(*a, check_inputs=True))(*arrays))
