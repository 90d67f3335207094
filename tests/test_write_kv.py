"""write_kv: new tokens into their paged-cache slots, in place, in both frameworks (one kernel)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
from conftest import HAS_GPU, needs_interpreter
from torch_support import to_float64, to_tensor

import jax_decode
import torch_bridge
from jax_decode.synthetic import NUMPY_DTYPES

KERNEL_BACKEND = "triton" if HAS_GPU else "interpret"
DEVICE = "cuda" if HAS_GPU else "cpu"
kernel_param = pytest.param(KERNEL_BACKEND, marks=() if HAS_GPU else needs_interpreter)


def _problem(dtype="float32", mla=False, seed=0):
    rng = np.random.default_rng(seed)
    num_pages, page_size, kv_heads, dk, dv = 6, 4, 2, 40, 24
    np_dtype = NUMPY_DTYPES[dtype]
    k = rng.standard_normal((num_pages, page_size, kv_heads, dk)).astype(np_dtype)
    v = None if mla else rng.standard_normal((num_pages, page_size, kv_heads, dv)).astype(np_dtype)
    # Valid slots, one padding token (-1) and one past the cache: both skipped.
    slots = np.array([5, 0, -1, 23, 9, num_pages * page_size], np.int32)
    k_new = rng.standard_normal((len(slots), kv_heads, dk)).astype(np_dtype)
    v_new = None if mla else rng.standard_normal((len(slots), kv_heads, dv)).astype(np_dtype)
    return k, v, k_new, v_new, slots


def _expected(cache, new, slots):
    out = cache.copy()
    flat = out.reshape(-1, *cache.shape[2:])
    for t, s in enumerate(slots):
        if 0 <= s < flat.shape[0]:
            flat[s] = new[t]
    return out


@pytest.mark.parametrize("backend", ["xla", kernel_param])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("mla", [False, True], ids=["kv", "mla"])
def test_write_kv_jax(backend, dtype, mla):
    k, v, k_new, v_new, slots = _problem(dtype, mla)
    step = jax.jit(lambda *a: jax_decode.write_kv(*a, backend=backend), donate_argnums=(0, 1))
    arrays = [None if x is None else jnp.asarray(x) for x in (k, v, k_new, v_new, slots)]
    k_out, v_out = step(*arrays)
    np.testing.assert_array_equal(np.asarray(k_out), _expected(k, k_new, slots))
    if mla:
        assert v_out is None
    else:
        np.testing.assert_array_equal(np.asarray(v_out), _expected(v, v_new, slots))


@pytest.mark.parametrize("mla", [False, True], ids=["kv", "mla"])
def test_write_kv_torch_in_place_matches_jax(mla):
    k, v, k_new, v_new, slots = _problem("bfloat16", mla)
    tk, tv = to_tensor(k, DEVICE), to_tensor(v, DEVICE)
    pointer = tk.data_ptr()
    torch_bridge.write_kv(tk, tv, to_tensor(k_new, DEVICE), to_tensor(v_new, DEVICE), to_tensor(slots, DEVICE))
    assert tk.data_ptr() == pointer
    np.testing.assert_array_equal(to_float64(tk), _expected(k, k_new, slots).astype(np.float64))
    if not mla:
        np.testing.assert_array_equal(to_float64(tv), _expected(v, v_new, slots).astype(np.float64))


@pytest.mark.parametrize("mla", [False, True], ids=["kv", "mla"])
def test_write_kv_under_torch_compile_fullgraph(mla):
    """write_kv is a custom op under torch.compile: no graph break, the caches written in
    place as eagerly, and a decode step of write then attend compiles whole."""
    k, v, k_new, v_new, slots = _problem("float32", mla)
    tensors = [to_tensor(x, DEVICE) for x in (k, v, k_new, v_new, slots)]
    page_table = torch.arange(6, dtype=torch.int32, device=DEVICE).reshape(2, 3)
    seq_lens = torch.tensor([10, 7], dtype=torch.int32, device=DEVICE)
    q = torch.ones(2, 4, k.shape[-1], device=DEVICE)

    def step(k_cache, v_cache, k_new, v_new, slots):
        torch_bridge.write_kv(k_cache, v_cache, k_new, v_new, slots, k_scale=1.0)
        return torch_bridge.decode_attention(q, k_cache, v_cache, page_table, seq_lens,
                                             head_dim_v=16 if mla else None)  # fmt: skip

    compiled_caches = [t.clone() if t is not None else None for t in tensors[:2]]
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(*compiled_caches, *tensors[2:])
    eager = step(*tensors)
    np.testing.assert_array_equal(to_float64(compiled_caches[0]), _expected(k, k_new, slots).astype(np.float64))
    if not mla:
        np.testing.assert_array_equal(to_float64(compiled_caches[1]), _expected(v, v_new, slots).astype(np.float64))
    np.testing.assert_array_equal(to_float64(compiled), to_float64(eager))


def test_donated_caches_are_updated_in_place():
    """The compiled step aliases each donated cache to its output (no cache copy)."""
    k, v, k_new, v_new, slots = _problem()
    arrays = [jnp.asarray(x) for x in (k, v, k_new, v_new, slots)]
    step = jax.jit(lambda *a: jax_decode.write_kv(*a, backend="xla"), donate_argnums=(0, 1))
    hlo = step.lower(*arrays).compile().as_text()
    assert hlo.count("input_output_alias") >= 1 or "may-alias" in hlo or "must-alias" in hlo
    pointers = [arrays[0].unsafe_buffer_pointer(), arrays[1].unsafe_buffer_pointer()]
    k_out, v_out = step(*arrays)
    assert [k_out.unsafe_buffer_pointer(), v_out.unsafe_buffer_pointer()] == pointers


@pytest.mark.gpu
def test_donated_caches_are_updated_in_place_triton():
    k, v, k_new, v_new, slots = _problem("bfloat16")
    arrays = [jnp.asarray(x) for x in (k, v, k_new, v_new, slots)]
    pointers = [arrays[0].unsafe_buffer_pointer(), arrays[1].unsafe_buffer_pointer()]
    step = jax.jit(lambda *a: jax_decode.write_kv(*a, backend="triton"), donate_argnums=(0, 1))
    k_out, v_out = step(*arrays)
    assert [k_out.unsafe_buffer_pointer(), v_out.unsafe_buffer_pointer()] == pointers
    np.testing.assert_array_equal(np.asarray(k_out), _expected(k, k_new, slots))


def test_write_kv_errors():
    k, v, k_new, v_new, slots = _problem()
    with pytest.raises(ValueError, match="v_cache and v_new must both be given or both be None"):
        jax_decode.write_kv(jnp.asarray(k), jnp.asarray(v), jnp.asarray(k_new), None, jnp.asarray(slots))
    with pytest.raises(TypeError, match="slot_mapping must be int32"):
        jax_decode.write_kv(jnp.asarray(k), None, jnp.asarray(k_new), None, jnp.asarray(slots, jnp.float32))
    with pytest.raises(ValueError, match=r"k_new has 5 tokens but slot_mapping has 6"):
        jax_decode.write_kv(jnp.asarray(k), None, jnp.asarray(k_new[:5]), None, jnp.asarray(slots))
    with pytest.raises(ValueError, match=r"k_new shape \(6, 2, 8\) must be \[num_tokens, num_kv_heads, head_dim\]"):
        torch_bridge.write_kv(torch.from_numpy(k), None, torch.zeros(6, 2, 8), None, torch.from_numpy(slots))


def _quantised_expected(cache, new, slots, scale):
    """The documented rule: new / scale (per tensor or per KV head), clamped to the
    format's finite range, rounded to nearest (ml_dtypes' cast); every NaN the
    format's positive NaN."""
    limit = float(ml_dtypes.finfo(cache.dtype).max)
    scaled = new.astype(np.float32) / np.asarray(scale, np.float32).reshape(-1)[:, None]
    quantised = np.clip(scaled, -limit, limit).astype(cache.dtype)
    quantised[np.isnan(scaled)] = np.float32(np.nan).astype(cache.dtype)  # the positive NaN
    return _expected(cache, quantised, slots)


FP8_WRITES = [("float8_e4m3fn", "head"), ("float8_e5m2", "tensor"), ("float8_e4m3fn", "none")]


def _fp8_problem(cache_dtype, scales, mla=False):
    k, v, k_new, v_new, slots = _problem("bfloat16", mla)
    # Saturate (not inf / NaN); a NaN stays NaN.
    k_new[0, 0, :8] = [1e6, -1e6, 3.0, -0.0, np.nan, -np.nan, np.inf, -np.inf]
    k, v = (None if c is None else c.astype(np.float32).astype(NUMPY_DTYPES[cache_dtype]) for c in (k, v))
    shape = {"head": (2,), "tensor": (), "none": None}[scales]
    k_scale = None if shape is None else np.full(shape, 0.25, np.float32)
    v_scale = None if shape is None or mla else np.linspace(0.5, 2.0, 2 if shape else 1).astype(np.float32)
    return k, v, k_new, v_new, slots, k_scale, v_scale


@pytest.mark.parametrize("backend", ["xla", kernel_param])
@pytest.mark.parametrize(("cache_dtype", "scales"), FP8_WRITES, ids=[f"{d}-{s}" for d, s in FP8_WRITES])
@pytest.mark.parametrize("mla", [False, True], ids=["kv", "mla"])
def test_write_kv_quantises_into_fp8(backend, cache_dtype, scales, mla):
    k, v, k_new, v_new, slots, k_scale, v_scale = _fp8_problem(cache_dtype, scales, mla)
    extras = {name: jnp.asarray(x) for name, x in dict(k_scale=k_scale, v_scale=v_scale).items() if x is not None}
    step = jax.jit(lambda *a, **kw: jax_decode.write_kv(*a, backend=backend, **kw), donate_argnums=(0, 1))
    arrays = [None if x is None else jnp.asarray(x) for x in (k, v, k_new, v_new, slots)]
    k_out, v_out = step(*arrays, **extras)
    expected_k = _quantised_expected(k, k_new, slots, 1.0 if k_scale is None else k_scale)
    np.testing.assert_array_equal(np.asarray(k_out).view(np.uint8), expected_k.view(np.uint8))
    k_values = np.asarray(k_out).astype(np.float32)
    assert np.isnan(k_values).sum() == 2 and np.isfinite(k_values[~np.isnan(k_values)]).all()
    if not mla:
        expected_v = _quantised_expected(v, v_new, slots, 1.0 if v_scale is None else v_scale)
        np.testing.assert_array_equal(np.asarray(v_out).view(np.uint8), expected_v.view(np.uint8))


@pytest.mark.parametrize(("cache_dtype", "scales"), FP8_WRITES, ids=[f"{d}-{s}" for d, s in FP8_WRITES])
def test_write_kv_fp8_torch_matches_jax(cache_dtype, scales):
    k, v, k_new, v_new, slots, k_scale, v_scale = _fp8_problem(cache_dtype, scales)
    tk, tv = to_tensor(k, DEVICE), to_tensor(v, DEVICE)
    extras = {name: to_tensor(x, DEVICE) for name, x in dict(k_scale=k_scale, v_scale=v_scale).items() if x is not None}
    torch_bridge.write_kv(
        tk, tv, to_tensor(k_new, DEVICE), to_tensor(v_new, DEVICE), to_tensor(slots, DEVICE), **extras
    )
    k_out, v_out = jax_decode.write_kv(
        *(jnp.asarray(x) for x in (k, v, k_new, v_new, slots)),
        **{name: jnp.asarray(x) for name, x in dict(k_scale=k_scale, v_scale=v_scale).items() if x is not None},
        backend=KERNEL_BACKEND,
    )
    np.testing.assert_array_equal(tk.view(torch.uint8).cpu().numpy(), np.asarray(k_out).view(np.uint8))
    np.testing.assert_array_equal(tv.view(torch.uint8).cpu().numpy(), np.asarray(v_out).view(np.uint8))


def test_write_kv_scale_errors():
    k, v, k_new, v_new, slots, _, _ = _fp8_problem("float8_e4m3fn", "none")
    args = [jnp.asarray(x) for x in (k, v, k_new, v_new, slots)]
    with pytest.raises(ValueError, match=r"k_scale must have shape \(\) or \(1,\) .* or \(2,\)"):
        jax_decode.write_kv(*args, k_scale=jnp.ones(3))
    with pytest.raises(ValueError, match=r"v_scale must be None when v_cache is None"):
        jax_decode.write_kv(args[0], None, args[2], None, args[4], v_scale=1.0)


@pytest.mark.parametrize("backend", ["xla", kernel_param])
def test_write_kv_nan_scale_stores_nan_in_every_backend(backend):
    """A NaN scale makes its KV head's rows NaN (not the format's largest value), as
    dividing by NaN does; the other head's rows are quantised as usual."""
    k, _, k_new, _, slots, _, _ = _fp8_problem("float8_e4m3fn", "none", mla=True)
    k_scale = np.float32([np.nan, 0.5])
    step = jax.jit(lambda *a, **kw: jax_decode.write_kv(*a, backend=backend, **kw))
    k_out, _ = step(jnp.asarray(k), None, jnp.asarray(k_new), None, jnp.asarray(slots), k_scale=jnp.asarray(k_scale))
    np.testing.assert_array_equal(
        np.asarray(k_out).view(np.uint8), _quantised_expected(k, k_new, slots, k_scale).view(np.uint8)
    )
    written = np.asarray(k_out).astype(np.float32)[5 // 4, 5 % 4]  # token 0's slot
    assert np.isnan(written[0]).all() and not np.isnan(written[1]).any()
