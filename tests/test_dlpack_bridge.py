"""to_jax / to_torch share memory (same pointer) for every dtype the kernels take; jax_function."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from cases import GQA4
from conftest import HAS_GPU
from torch_support import to_float64, to_tensor

import jax_decode
import torch_bridge

DEVICE = "cuda" if HAS_GPU else "cpu"
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.int32, torch.float8_e4m3fn, torch.float8_e5m2]


def _pointer(array: jax.Array) -> int:
    return array.unsafe_buffer_pointer()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_to_jax_is_zero_copy(dtype):
    tensor = (torch.arange(24, device=DEVICE) * 3).to(dtype).reshape(2, 3, 4)
    array = torch_bridge.to_jax(tensor)
    assert _pointer(array) == tensor.data_ptr()
    assert array.shape == (2, 3, 4) and array.dtype == jnp.dtype(str(dtype).removeprefix("torch."))
    np.testing.assert_array_equal(np.asarray(array.astype(jnp.float32)), tensor.float().cpu().numpy())


JAX_DTYPES = [jnp.float16, jnp.bfloat16, jnp.float32, jnp.int32, jnp.float8_e4m3fn, jnp.float8_e5m2]


@pytest.mark.parametrize("dtype", JAX_DTYPES, ids=lambda d: d.__name__)
def test_to_torch_is_zero_copy_and_round_trips(dtype):
    array = jax.device_put((jnp.arange(24) * 3).astype(dtype).reshape(4, 6), jax.devices()[0])
    tensor = torch_bridge.to_torch(array)
    assert tensor.data_ptr() == _pointer(array)
    back = torch_bridge.to_jax(tensor)
    assert _pointer(back) == _pointer(array) and back.dtype == array.dtype
    np.testing.assert_array_equal(np.asarray(back.astype(jnp.float32)), np.asarray(array.astype(jnp.float32)))


def test_non_contiguous_needs_copy():
    tensor = torch.arange(12, dtype=torch.float32, device=DEVICE).reshape(3, 4).t()
    with pytest.raises(ValueError, match=r"strides \(1, 4\) is not contiguous, so it cannot be shared with JAX"):
        torch_bridge.to_jax(tensor)
    copied = torch_bridge.to_jax(tensor, copy=True)
    assert _pointer(copied) != tensor.data_ptr()
    np.testing.assert_array_equal(np.asarray(copied), tensor.cpu().numpy())


def test_a_view_jax_would_copy_is_refused_not_copied_silently():
    """JAX copies a buffer it cannot take as it is (on the CPU: not 64-byte aligned);
    to_jax promises shared memory, so it refuses, and copy=True or jax_function copy."""
    base = torch.zeros(64, device=DEVICE)
    view = base[1:9]  # contiguous, 4 bytes past the storage's start
    try:
        array = jax.dlpack.from_dlpack(view)
    except Exception:  # noqa: BLE001
        pytest.skip("this platform's JAX refuses the view itself")
    if _pointer(array) == view.data_ptr():
        pytest.skip("this platform's JAX shares a 4-byte-offset buffer")
    with pytest.raises(ValueError, match=r"not aligned as JAX requires, so JAX copied it"):
        torch_bridge.to_jax(view)
    view.fill_(7.0)
    np.testing.assert_array_equal(np.asarray(torch_bridge.to_jax(view, copy=True)), np.full(8, 7.0, np.float32))
    np.testing.assert_array_equal(np.asarray(torch_bridge.jax_function(lambda x: x * 2)(view).cpu()), np.full(8, 14.0))


@pytest.mark.parametrize("kind", ["neg", "conj_imag", "conj"])
def test_lazily_negated_or_conjugated_views_are_refused_or_resolved(kind):
    """Their memory holds other values than the tensor: shared as stored they would
    arrive with the wrong sign, so only copy=True passes them, resolved."""
    base = torch.tensor([1 + 2j, -3 + 0.5j])
    tensor = {"neg": torch.tensor([1.0, -2.0])._neg_view(), "conj_imag": base.conj().imag, "conj": base.conj()}[kind]
    with pytest.raises(ValueError, match="lazily negated or conjugated view"):
        torch_bridge.to_jax(tensor)
    np.testing.assert_array_equal(
        np.asarray(torch_bridge.to_jax(tensor, copy=True)), tensor.resolve_neg().resolve_conj().numpy()
    )


def test_copy_true_does_not_share():
    tensor = torch.ones(8, device=DEVICE)
    assert _pointer(torch_bridge.to_jax(tensor, copy=True)) != tensor.data_ptr()
    array = jnp.ones(8)
    assert torch_bridge.to_torch(array, copy=True).data_ptr() != _pointer(array)


def test_bridge_type_errors():
    with pytest.raises(TypeError, match=r"tensor must be a torch.Tensor, got ndarray"):
        torch_bridge.to_jax(np.ones(3))
    with pytest.raises(TypeError, match=r"array must be a jax.Array, got Tensor"):
        torch_bridge.to_torch(torch.ones(3))


def test_jax_function_runs_decode_attention_on_tensors():
    problem = GQA4.problem()
    tensors = [to_tensor(a, DEVICE) for a in problem.arrays]
    backend = "triton" if HAS_GPU else "xla"
    traces = []

    @torch_bridge.jax_function(static_argnames=("logit_cap",))
    def attend(q, k, v, pt, sl, logit_cap):
        traces.append(1)
        return jax_decode.decode_attention(q, k, v, pt, sl, logit_cap=logit_cap, backend=backend, return_lse=True)

    out, lse = attend(*tensors, logit_cap=10.0)
    assert isinstance(out, torch.Tensor) and out.device.type == DEVICE and out.shape == (4, 8, 64)
    attend(*tensors, logit_cap=10.0)
    assert len(traces) == 1, "jitted once per signature"
    expected, expected_lse = jax_decode.decode_attention_reference(*problem.arrays, logit_cap=10.0)
    np.testing.assert_allclose(to_float64(out), expected, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(to_float64(lse), expected_lse, atol=1e-4)


@pytest.mark.parametrize(
    "view",
    [
        lambda a: a.t(),  # transposed
        lambda a: a[:, ::2],  # strided
        lambda a: a[:1].expand(4, 6),  # stride 0
        lambda a: a._neg_view(),  # lazily negated
        lambda a: a[1:],  # a row slice (off JAX's alignment on the CPU)
    ],
    ids=["transposed", "strided", "expanded", "negated", "row_slice"],
)
def test_jax_function_copies_what_to_jax_refuses(view):
    """jax_function's arguments are read, never written through: one that cannot be
    shared (to_jax refuses it) is copied, with its values as torch sees them."""
    a = torch.arange(24, dtype=torch.float32, device=DEVICE).reshape(4, 6)
    double = torch_bridge.jax_function(lambda x: x * 2)
    arg = view(a)
    torch.testing.assert_close(double(arg), arg * 2, rtol=0, atol=0)
