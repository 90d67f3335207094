"""The paged KV write: this step's rows into their cache slots, quantised for fp8 caches.

Imports only ``triton``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from jax_decode.kernels.common import cast_rne, kv_scale


@triton.jit
def fp8_bits(x, MAN_BITS: tl.constexpr, BIAS: tl.constexpr, NAN_BITS: tl.constexpr):
    """Bits of float32 ``x`` (within the format's finite range, or NaN) rounded to
    nearest-even in an fp8 format with MAN_BITS mantissa bits and exponent bias BIAS;
    every NaN becomes NAN_BITS (a NaN's sign and payload depend on the hardware that
    made it, so none is kept).

    By integer arithmetic rather than ``x.to(float8)``, so that compiled kernels and
    Triton's interpreter (whose float8 casts round wrongly) store the same bits.
    """
    SHIFT: tl.constexpr = 23 - MAN_BITS
    bits = x.to(tl.uint32, bitcast=True)
    magnitude = bits & 0x7FFFFFFF
    # Normal numbers: round the fp32 mantissa to MAN_BITS (ties to even), re-bias.
    rounded = (magnitude + ((1 << (SHIFT - 1)) - 1) + ((magnitude >> SHIFT) & 1)) >> SHIFT
    normal = rounded - ((127 - BIAS) << MAN_BITS)
    # Subnormals: adding 2**(SHIFT + 1 - BIAS), whose fp32 ulp is the fp8 subnormal
    # step 2**(1 - BIAS - MAN_BITS), makes the FPU round to that step (ties to even);
    # the sum's low bits are then the fp8 subnormal's bits.
    MAGIC_BITS: tl.constexpr = (127 - BIAS + SHIFT + 1) << 23
    magic = tl.full(x.shape, MAGIC_BITS, tl.uint32).to(tl.float32, bitcast=True)
    subnormal = (tl.abs(x) + magic).to(tl.uint32, bitcast=True) - MAGIC_BITS
    MIN_NORMAL_BITS: tl.constexpr = (127 + 1 - BIAS) << 23
    out = tl.where(magnitude < MIN_NORMAL_BITS, subnormal, normal) | ((bits >> 31) << 7)
    out = tl.where(magnitude > 0x7F800000, NAN_BITS, out)
    return out.to(tl.uint8)


@triton.jit
def quantise_fp8(x, SATURATE: tl.constexpr, MAN_BITS: tl.constexpr, BIAS: tl.constexpr, NAN_BITS: tl.constexpr):
    """fp8 bits of ``x``: saturated to +-SATURATE (the format's largest finite value),
    rounded to nearest even; a NaN stays a NaN (the format's positive NaN)."""
    x = x.to(tl.float32)
    # tl.maximum would turn a NaN into -SATURATE: keep it a NaN.
    x = tl.where(x != x, x, tl.minimum(tl.maximum(x, -SATURATE), SATURATE))
    return fp8_bits(x, MAN_BITS, BIAS, NAN_BITS)


@triton.jit
def _write_cache(
    new_ptr,  # [num_tokens, num_kv_heads, head_dim]: this step's keys (or values)
    slots_ptr,  # int32 [num_tokens]: page * page_size + slot; outside [0, num_slots) skipped
    scale_ptr,  # f32 [1] or [num_kv_heads]: rows are divided by it (read if SCALE)
    num_slots,  # int: num_pages * page_size
    cache_in_ptr,  # the cache as an input; jax_triton 0.3 aliases it to cache_ptr (never read)
    cache_ptr,  # [num_pages, page_size, num_kv_heads, head_dim], written in place
    STRIDE_NT: tl.constexpr,
    STRIDE_NH: tl.constexpr,
    STRIDE_CP: tl.constexpr,
    STRIDE_CS: tl.constexpr,
    STRIDE_CH: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    SCALE: tl.constexpr,  # 0: none; 1: one per tensor; 2: one per KV head
    SATURATE: tl.constexpr,  # an fp8 cache's largest finite value
    FP8_MAN_BITS: tl.constexpr,  # > 0: the cache is fp8 with this many mantissa bits ...
    FP8_BIAS: tl.constexpr,  # ... and this exponent bias
    FP8_NAN_BITS: tl.constexpr,  # ... and this NaN
    ROUND_BY_BITS: tl.constexpr,  # the interpreter, whose float32 -> bfloat16 cast truncates
):
    """Scatter one token's row for one KV head into its cache slot (paged KV write).

    A scaled row is the correctly rounded float32 quotient ``row / scale``, then cast
    to the cache's dtype rounding to nearest even, as in every backend.  For an fp8
    cache the quotient is clamped to the format's finite range (no inf or NaN from a
    large value) before rounding; a NaN (in the row, or from a NaN scale) is stored as
    the format's positive NaN.
    """
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs = tl.arange(0, BLOCK_D)
    # The slot broadcast over the row, so every mask is a block (as the interpreter needs).
    slot = tl.load(slots_ptr + token + tl.zeros([BLOCK_D], tl.int32)).to(tl.int64)
    valid = (slot >= 0) & (slot < num_slots)
    slot = tl.where(valid, slot, 0)  # never form an address outside the cache
    mask = offs < HEAD_DIM
    row = tl.load(new_ptr + token * STRIDE_NT + head * STRIDE_NH + offs, mask=mask, other=0.0)
    if SCALE > 0:
        # div_rn: the correctly rounded quotient, as the interpreter and XLA compute it
        # (a plain `/` compiles to the approximate div.full.f32).
        row = tl.math.div_rn(row.to(tl.float32), kv_scale(scale_ptr, head, SCALE))
    if FP8_MAN_BITS > 0:
        bits = quantise_fp8(row, SATURATE, FP8_MAN_BITS, FP8_BIAS, FP8_NAN_BITS)
        row = bits.to(cache_ptr.dtype.element_ty, bitcast=True)
    else:
        # To nearest even: the GPU's cvt.rn, in the interpreter by bits.
        row = cast_rne(row, cache_ptr.dtype.element_ty, ROUND_BY_BITS)
    dst = cache_ptr + (slot // PAGE_SIZE) * STRIDE_CP + (slot % PAGE_SIZE) * STRIDE_CS + head * STRIDE_CH
    tl.store(dst + offs, row, mask=mask & valid)
