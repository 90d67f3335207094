"""One rounding rule in every backend: float downcasts round to nearest even (as a GPU's
``cvt.rn`` does; Triton's interpreter truncates float32 -> bfloat16 unless told), and
write_kv stores the correctly rounded float32 quotient ``new / scale``, cast from there
(XLA would otherwise multiply by the reciprocal, and divide approximately on a GPU, as a
compiled kernel's ``/`` does)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from conftest import HAS_GPU, needs_interpreter
from torch_support import to_tensor

import jax_decode
import torch_bridge
from jax_decode.kernels.common import cast_rne, to_f16_clamped
from jax_decode.reference import decode_attention_reference
from jax_decode.synthetic import NUMPY_DTYPES

KERNEL_BACKEND = "triton" if HAS_GPU else "interpret"
DEVICE = "cuda" if HAS_GPU else "cpu"
# "torch": torch_bridge on DEVICE's tensors (CPU tensors run the kernels interpreted).
WRITE_BACKENDS = ["xla", pytest.param(KERNEL_BACKEND, marks=() if HAS_GPU else needs_interpreter), "torch"]


@triton.jit
def _cast(x_ptr, y_ptr, N: tl.constexpr, BY_BITS: tl.constexpr, CLAMPED: tl.constexpr):
    offs = tl.program_id(0) * N + tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    if CLAMPED:
        y = to_f16_clamped(x)
    else:
        y = cast_rne(x, y_ptr.dtype.element_ty, BY_BITS)
    tl.store(y_ptr + offs, y)


def _finite_values(dtype: str) -> np.ndarray:
    """Every finite value of a 16- or 8-bit float format, ascending, as float64."""
    np_dtype = NUMPY_DTYPES[dtype]
    bits = np.arange(2 ** (8 * np.dtype(np_dtype).itemsize)).astype(f"u{np.dtype(np_dtype).itemsize}")
    values = bits.view(np_dtype)
    return np.unique(values[np.isfinite(values)].astype(np.float64))


def _ties(dtype: str) -> np.ndarray:
    """The points halfway between neighbouring finite values (exact in float32)."""
    grid = _finite_values(dtype)
    return ((grid[1:] + grid[:-1]) / 2).astype(np.float32)


def _casts_to_check(dtype: str) -> np.ndarray:
    """float32 values around every finite value of ``dtype``: the value, exact ties with
    its neighbour and a hair either side of them; random ones over many magnitudes;
    overflow to inf; inf, NaN, zeros."""
    rng = np.random.default_rng(0)
    grid = _finite_values(dtype)
    ties = _ties(dtype)
    near = [np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(-np.inf))]
    wide = rng.standard_normal(20000).astype(np.float32) * (10.0 ** rng.uniform(-40, 38, 20000)).astype(np.float32)
    special = np.float32([np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, 3.4e38, -3.4e38, 1.01171875, 1e-45])
    values = np.concatenate([grid.astype(np.float32), ties, *near, wide, special])
    padded = np.zeros(-(-len(values) // 4096) * 4096, np.float32)
    padded[: len(values)] = values
    return padded


def _run_cast(x: np.ndarray, dtype: str, by_bits: bool, clamped: bool = False) -> np.ndarray:
    x_t = torch.from_numpy(x).to(DEVICE)
    y_t = torch.empty(x.shape, dtype=getattr(torch, dtype), device=DEVICE)
    grid, meta = (len(x) // 4096,), dict(N=4096, BY_BITS=by_bits, CLAMPED=clamped)
    if HAS_GPU:
        _cast[grid](x_t, y_t, **meta)
    else:
        from triton.runtime.interpreter import InterpretedFunction

        from jax_decode.interpreter import interpreting

        with interpreting():
            InterpretedFunction(_cast.fn)[grid](x_t, y_t, **meta)
    return y_t.view(torch.int16).cpu().numpy().view(np.uint16)


def _assert_same_floats(got_bits: np.ndarray, expected: np.ndarray):
    """Bit-identical, except that any NaN matches any NaN (its bits are the hardware's)."""
    got = got_bits.view(expected.dtype)
    got_nan, expected_nan = np.isnan(got.astype(np.float32)), np.isnan(expected.astype(np.float32))
    np.testing.assert_array_equal(got_nan, expected_nan)
    np.testing.assert_array_equal(got_bits[~got_nan], expected.view(got_bits.dtype)[~expected_nan])


@pytest.mark.parametrize(
    "by_bits",
    [True, pytest.param(False, marks=pytest.mark.gpu)],  # the interpreter's own cast truncates: why BY_BITS exists
    ids=["by_bits", "plain_cast"],
)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cast_rne_matches_ml_dtypes(dtype, by_bits):
    """cast_rne rounds as ml_dtypes / NumPy do (nearest even, overflow to inf), and a
    GPU's plain cast already did."""
    x = _casts_to_check(dtype)
    with np.errstate(over="ignore"):  # float16's overflow to inf is part of the rule
        _assert_same_floats(_run_cast(x, dtype, by_bits), x.astype(NUMPY_DTYPES[dtype]))


def test_to_f16_clamped_rounds_to_nearest_even():
    x = _casts_to_check("float16")
    x[np.isnan(x)] = 0.0  # tl.maximum and tl.minimum drop a NaN: not this test's subject
    _assert_same_floats(_run_cast(x, "float16", True, clamped=True), np.clip(x, -65504, 65504).astype(np.float16))


# ---------------------------------------------------------------------------------------
# write_kv: new / scale, correctly rounded in float32, then cast (or quantised).

NUM_PAGES, PAGE_SIZE, KV_HEADS, HEAD_DIM = 5, 4, 2, 48
SCALES = ["none", "float", "scalar", "one", "head"]  # a Python float, shapes (), (1,), (num_kv_heads,)


def _scales(rng, size) -> np.ndarray:
    """Random scales of 12 significant bits (tie * scale stays exact in float32: ties
    have at most 12) whose float32 reciprocal is off by more than a quarter ulp, so that
    a product by it often misses the quotient."""
    candidates = (rng.integers(2**11 + 1, 2**12, 64) * 2.0 ** (rng.integers(-3, 4, 64) - 11)).astype(np.float32)
    error = np.abs((np.float32(1) / candidates).astype(np.float64) * candidates - 1)
    return candidates[error > 2.0**-25][: int(np.prod(size))].reshape(size)


def _write_problem(cache_dtype: str, scale_kind: str, seed: int):
    """Random float32 rows over a few magnitudes, and in rows 1 to 4 the cache format's
    rounding ties times the scale: their quotients are exact ties, which a quotient off
    by one float32 ulp rounds the wrong way."""
    rng = np.random.default_rng(seed)
    cache = rng.standard_normal((NUM_PAGES, PAGE_SIZE, KV_HEADS, HEAD_DIM)).astype(NUMPY_DTYPES[cache_dtype])
    slots = np.concatenate([rng.permutation(NUM_PAGES * PAGE_SIZE)[:9], [-1]]).astype(np.int32)
    new = rng.standard_normal((len(slots), KV_HEADS, HEAD_DIM)).astype(np.float32)
    new *= (10.0 ** rng.uniform(-1, 1, new.shape)).astype(np.float32)
    scale = {
        "none": None,
        "float": float(_scales(rng, ())),
        "scalar": _scales(rng, ()),
        "one": _scales(rng, 1),
        "head": _scales(rng, KV_HEADS),
    }[scale_kind]
    ties = _ties("bfloat16" if cache_dtype == "float32" else cache_dtype)
    limit = ml_dtypes.finfo(NUMPY_DTYPES[cache_dtype]).max
    ties = ties[(np.abs(ties) > 1e-30) & (np.abs(ties) < limit / 16)]  # tie * scale stays finite
    head_scales = np.ones(KV_HEADS, np.float32) if scale is None else np.resize(np.float32(scale), KV_HEADS)
    new[1:5] = rng.choice(ties, (4, KV_HEADS, HEAD_DIM)) * head_scales[:, None]
    return cache, new, slots, scale


def _stored(cache: np.ndarray, new: np.ndarray, slots: np.ndarray, scale) -> np.ndarray:
    """The rule, in NumPy: float32 new / float32 scale (per KV head), then ml_dtypes' cast
    (nearest even), saturated for fp8; rows at slots outside the cache dropped."""
    values = new.astype(np.float32)
    if scale is not None:
        values = values / np.asarray(scale, np.float32).reshape(-1)[:, None]
    if cache.dtype.itemsize == 1:
        limit = np.float32(ml_dtypes.finfo(cache.dtype).max)
        values = np.clip(values, -limit, limit)
    out = cache.copy()
    flat = out.reshape(-1, *cache.shape[2:])
    for token, slot in enumerate(slots):
        if 0 <= slot < flat.shape[0]:
            flat[slot] = values[token].astype(cache.dtype)
    return out


def _write(backend: str, cache, new, slots, scale) -> np.ndarray:
    if backend == "torch":
        cache_t = to_tensor(cache, DEVICE)
        scale_t = scale if scale is None or isinstance(scale, float) else torch.from_numpy(np.array(scale)).to(DEVICE)
        torch_bridge.write_kv(cache_t, None, to_tensor(new, DEVICE), None, to_tensor(slots, DEVICE), k_scale=scale_t)
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[cache.itemsize]
        return cache_t.view(bits).cpu().numpy().view(cache.dtype)
    scale_arg = scale if scale is None or isinstance(scale, float) else jnp.asarray(scale)
    # Jitted: XLA simplifies the whole step (a Python float scale becomes a constant).
    step = jax.jit(lambda c, n, s: jax_decode.write_kv(c, None, n, None, s, k_scale=scale_arg, backend=backend)[0])
    return np.asarray(step(jnp.asarray(cache), jnp.asarray(new), jnp.asarray(slots)))


@pytest.mark.parametrize("backend", WRITE_BACKENDS)
@pytest.mark.parametrize("scale_kind", SCALES)
@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"])
def test_write_kv_stores_the_rounded_quotient(cache_dtype, scale_kind, backend):
    """Bit-identical to NumPy's ``np.float32(new) / np.float32(scale)`` cast by ml_dtypes,
    from float32 rows, for every backend and every form of scale."""
    if cache_dtype == "float32" and scale_kind == "none":
        pytest.skip("a plain float32 copy: nothing is rounded")
    cache, new, slots, scale = _write_problem(cache_dtype, scale_kind, seed=len(cache_dtype) + len(scale_kind))
    got = _write(backend, cache, new, slots, scale)
    expected = _stored(cache, new, slots, scale)
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32}[cache.itemsize]
    np.testing.assert_array_equal(got.view(width), expected.view(width))


# ---------------------------------------------------------------------------------------
# decode: a bfloat16 output is the float32 result rounded to nearest even.


def _bfloat16_decode(num_heads: int, num_kv_heads: int) -> tuple[np.ndarray, np.ndarray]:
    """(the interpreted kernels' bfloat16 output, the float64 oracle rounded to bfloat16)."""
    rng = np.random.default_rng(num_heads)
    batch, head_dim, num_pages, max_pages = 3, 64, 16, 5
    bf16 = ml_dtypes.bfloat16
    q = rng.standard_normal((batch, num_heads, head_dim)).astype(bf16)
    k = rng.standard_normal((num_pages, PAGE_SIZE, num_kv_heads, head_dim)).astype(bf16)
    v = rng.standard_normal((num_pages, PAGE_SIZE, num_kv_heads, head_dim)).astype(bf16)
    page_table = rng.permutation(num_pages)[: batch * max_pages].reshape(batch, max_pages).astype(np.int32)
    seq_lens = np.array([5, 17, 2], np.int32)
    out = jax_decode.decode_attention(*(jnp.asarray(x) for x in (q, k, v, page_table, seq_lens)), backend="interpret")
    expected, _ = decode_attention_reference(q, k, v, page_table, seq_lens)
    rounded = np.asarray(expected, np.float64).astype(np.float32).astype(bf16)
    return np.asarray(out).astype(np.float64), rounded.astype(np.float64)


@needs_interpreter
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "min_exact"),
    [
        (4, 4, 0.99),  # one head per program: float32 throughout, so (nearly) always the oracle's rounding
        (16, 2, 0.7),  # head blocks through tl.dot: p rounds to bfloat16 first, as on the tensor cores
    ],
    ids=["mha", "grouped"],
)
def test_bfloat16_decode_output_rounds_to_nearest_even(num_heads, num_kv_heads, min_exact):
    """Truncating casts (the interpreter's own) left ~half of the outputs one bfloat16
    step nearer zero than the oracle rounded to nearest even, and none farther."""
    out, expected = _bfloat16_decode(num_heads, num_kv_heads)
    exact = np.mean(out == expected)
    nearer_zero = int(np.sum(np.abs(out) < np.abs(expected)))
    farther = int(np.sum(np.abs(out) > np.abs(expected)))
    assert exact >= min_exact, f"{exact=:.3f}, {nearer_zero=}, {farther=}"
    # No bias: a mismatch is as likely on either side (4 standard deviations of a fair coin).
    assert abs(nearer_zero - farther) <= 4 * np.sqrt(nearer_zero + farther), f"{nearer_zero=}, {farther=}"
