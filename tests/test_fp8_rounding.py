"""The fp8 quantisation of write_kv rounds exactly as ml_dtypes does (nearest even,
saturating), and stores every NaN as the format's positive NaN, compiled on a GPU and
in Triton's interpreter alike."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from conftest import HAS_GPU

from jax_decode.kernels.write_cache import quantise_fp8
from jax_decode.launch import FP8_FORMATS


@triton.jit
def _quantise(x_ptr, y_ptr, N: tl.constexpr, LIMIT: tl.constexpr, MAN: tl.constexpr, BIAS: tl.constexpr,
              NAN: tl.constexpr):  # fmt: skip
    offs = tl.program_id(0) * N + tl.arange(0, N)
    tl.store(y_ptr + offs, quantise_fp8(tl.load(x_ptr + offs), LIMIT, MAN, BIAS, NAN))


def _values() -> np.ndarray:
    """Every finite float16 (all fp8 values, every halfway point between them) and
    random float32 over many magnitudes, saturating ones included."""
    rng = np.random.default_rng(0)
    halves = np.arange(2**16, dtype=np.uint16).view(np.float16)
    halves = halves[np.isfinite(halves)].astype(np.float32)
    wide = rng.standard_normal(30000).astype(np.float32) * (10.0 ** rng.uniform(-5, 6, 30000)).astype(np.float32)
    values = np.concatenate([halves, wide, np.float32([np.inf, -np.inf, 0.0, -0.0, np.nan, -np.nan])])
    padded = np.zeros(-(-len(values) // 1024) * 1024, np.float32)
    padded[: len(values)] = values
    return padded


@pytest.mark.parametrize("fmt", sorted(FP8_FORMATS))
def test_fp8_rounding_matches_ml_dtypes(fmt):
    x = _values()
    limit, man, bias, nan = FP8_FORMATS[fmt]
    device = "cuda" if HAS_GPU else "cpu"
    x_t = torch.from_numpy(x).to(device)
    y_t = torch.empty(x.shape, dtype=torch.uint8, device=device)
    grid = (len(x) // 1024,)
    if HAS_GPU:
        _quantise[grid](x_t, y_t, N=1024, LIMIT=limit, MAN=man, BIAS=bias, NAN=nan)
    else:
        from triton.runtime.interpreter import InterpretedFunction

        from jax_decode.interpreter import interpreting

        with interpreting():
            InterpretedFunction(_quantise.fn)[grid](x_t, y_t, N=1024, LIMIT=limit, MAN=man, BIAS=bias, NAN=nan)
    expected = np.clip(x, -limit, limit).astype(getattr(ml_dtypes, fmt)).view(np.uint8)
    expected = np.where(np.isnan(x), np.uint8(nan), expected)
    assert (expected[np.isnan(x)] == np.float32(np.nan).astype(getattr(ml_dtypes, fmt)).view(np.uint8)).all()
    np.testing.assert_array_equal(y_t.cpu().numpy(), expected)
