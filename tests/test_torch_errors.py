"""torch_bridge gives the JAX frontend's message for the same mistake, plus torch-only checks."""

from __future__ import annotations

import jax.numpy as jnp
import pytest
import torch
from test_errors import BAD_ARRAYS, BAD_EXTRAS, BAD_OPTIONS, BAD_WINDOWS, GOOD

import torch_bridge

TORCH_DTYPES = {
    jnp.dtype(jnp.float16): torch.float16,
    jnp.dtype(jnp.bfloat16): torch.bfloat16,
    jnp.dtype(jnp.float32): torch.float32,
    jnp.dtype(jnp.int32): torch.int32,
    jnp.dtype(jnp.int16): torch.int16,
    jnp.dtype(jnp.complex64): torch.complex64,
    jnp.dtype(jnp.int8): torch.int8,
    jnp.dtype(jnp.float8_e4m3fn): torch.float8_e4m3fn,
    jnp.dtype(jnp.float8_e5m2): torch.float8_e5m2,
}


def tensors(**replace):
    specs = {**GOOD, **replace}
    return {name: torch.zeros(s.shape, dtype=TORCH_DTYPES[jnp.dtype(s.dtype)]) for name, s in specs.items()}


@pytest.mark.parametrize(("name", "arrays", "error", "match"), BAD_ARRAYS, ids=[b[0] for b in BAD_ARRAYS])
def test_same_messages_as_jax(name, arrays, error, match):
    with pytest.raises(error, match=match):
        torch_bridge.decode_attention(**tensors(**arrays))


OPTIONS = [b for b in BAD_OPTIONS if "backend" not in b[1]]


@pytest.mark.parametrize(("name", "options", "error", "match"), OPTIONS, ids=[b[0] for b in OPTIONS])
def test_same_option_messages_as_jax(name, options, error, match):
    with pytest.raises(error, match=match):
        torch_bridge.decode_attention(**tensors(), **options)


def test_device_mismatch():
    args = tensors()
    args["k_cache"] = args["k_cache"].to("meta")
    with pytest.raises(ValueError, match=r"k_cache is on meta but q is on cpu; move them together"):
        torch_bridge.decode_attention(**args)


def test_unsupported_device():
    args = {name: t.to("meta") for name, t in tensors().items()}
    with pytest.raises(ValueError, match=r"tensors must be on a CUDA device or the CPU \(interpreter\), got meta"):
        torch_bridge.decode_attention(**args)


def test_non_contiguous_last_dim():
    args = tensors()
    args["q"] = torch.zeros(2, 64, 8).transpose(1, 2)
    with pytest.raises(ValueError, match=r"q must have a contiguous last dimension \(stride 1\), got strides"):
        torch_bridge.decode_attention(**args)


def test_wrong_out():
    with pytest.raises(ValueError, match=r"out must be float16 of shape \(2, 8, 64\), got float32"):
        torch_bridge.decode_attention(**tensors(), out=torch.zeros(2, 8, 64))


def test_not_a_tensor():
    args = tensors()
    args["seq_lens"] = [1, 2]
    with pytest.raises(TypeError, match=r"seq_lens must be a torch.Tensor, got list"):
        torch_bridge.decode_attention(**args)


def _fwd_args():
    t = tensors()
    q, k, v, pt, sl = t["q"], t["k_cache"], t["v_cache"], t["page_table"], t["seq_lens"]
    o = torch.zeros(2, 8, 64, dtype=torch.float16)
    logits = torch.zeros(2, 8, 4, 65)
    return [q, k, v, o, pt, sl, logits, 4, 0.1]


def test_fwd_page_size_mismatch():
    with pytest.raises(ValueError, match=r"k_buffer page_size \(4\) must equal page_size \(1\)"):
        torch_bridge.decode_attention_fwd(*_fwd_args(), page_size=1)


def test_fwd_three_d_needs_page_size_one():
    args = _fwd_args()
    args[1], args[2] = args[1][:, 0], args[2][:, 0]
    with pytest.raises(ValueError, match=r"3-D k_buffer \[num_tokens, num_kv_heads, D\] needs page_size 1, got 4"):
        torch_bridge.decode_attention_fwd(*args, page_size=4)


def test_fwd_attn_logits_shape():
    args = _fwd_args()
    args[6] = torch.zeros(2, 8, 4, 64)
    with pytest.raises(ValueError, match=r"attn_logits must be float32 of shape \(2, 8, 4, 65\)"):
        torch_bridge.decode_attention_fwd(*args, page_size=4)


@pytest.mark.parametrize(("name", "arrays", "error", "match"), BAD_EXTRAS, ids=[b[0] for b in BAD_EXTRAS])
def test_same_fp8_scale_and_sink_messages_as_jax(name, arrays, error, match):
    with pytest.raises(error, match=match):
        torch_bridge.decode_attention(**tensors(**arrays))


@pytest.mark.parametrize(("name", "options", "error", "match"), BAD_WINDOWS, ids=[b[0] for b in BAD_WINDOWS])
def test_same_window_messages_as_jax(name, options, error, match):
    with pytest.raises(error, match=match):
        torch_bridge.decode_attention(**tensors(), **options)


def test_scale_of_wrong_type():
    with pytest.raises(TypeError, match=r"k_scale must be a torch.Tensor, a float or None, got str"):
        torch_bridge.decode_attention(**tensors(), k_scale="1")


def test_write_kv_into_an_empty_cache_is_accepted():
    """A cache with no slots (all strides 0) has nothing to share: every slot is outside
    it, so nothing is written; JAX accepts the same."""
    cache = torch.zeros(0, 4, 2, 8)
    torch_bridge.write_kv(cache, cache.clone(), torch.ones(3, 2, 8), torch.ones(3, 2, 8),
                          torch.tensor([0, 1, -1], dtype=torch.int32))  # fmt: skip


def test_fwd_page_size_must_be_an_int():
    with pytest.raises(TypeError, match=r"page_size must be an int, got bool"):
        torch_bridge.decode_attention_fwd(*_fwd_args(), page_size=True)


def test_vllm_drop_in_splits_message_offers_no_none():
    """vLLM's signature sizes attn_logits by num_kv_splits: None is no choice there, and
    the message for a bad count must not offer it."""
    import re

    q, k, v = torch.zeros(1, 2, 8), torch.zeros(4, 1, 8), torch.zeros(4, 1, 8)
    o, logits = torch.zeros(1, 2, 8), torch.zeros(1, 2, 1, 9)
    pt, sl = torch.zeros(1, 4, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match=re.escape("num_kv_splits must be in [1, 256], got 0")):
        torch_bridge.decode_attention_fwd(q, k, v, o, pt, sl, logits, 0, 0.3)
