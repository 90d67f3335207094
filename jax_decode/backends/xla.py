"""The ``"xla"`` backend: the same maths in plain JAX, for any platform (the CPU path).

Gathers each row's pages into a dense [batch, capacity] view, masks tokens past
``seq_len`` or on out-of-range pages, and runs a float32 softmax.  Same semantics as
the kernels for every input (see :mod:`jax_decode.reference`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_decode.launch import FP8_FORMATS, DecodeProblem, WriteProblem
from jax_decode.operands import DecodeOperands, WriteOperands


def decode_attention(ops: DecodeOperands, problem: DecodeProblem):
    """Returns (out ``problem.out_shape`` in q's dtype, lse f32 ``problem.lse_shape``).

    ``k_scale``/``v_scale`` float32 ``[1]`` or ``[num_kv_heads]`` or None; ``sinks``
    float32 ``[num_heads]`` or None.
    """
    p = problem
    page_ok = (ops.page_table >= 0) & (ops.page_table < p.num_pages)
    pages = jnp.where(page_ok, ops.page_table, 0)

    def gather(cache, scale):  # [num_pages, page_size, kv, d] -> [batch, capacity, kv, d] f32
        rows = cache[pages].astype(jnp.float32)
        rows = rows.reshape(p.batch, p.capacity, p.num_kv_heads, cache.shape[-1])
        return rows if scale is None else rows * scale[:, None]

    keys = gather(ops.k_cache, ops.k_scale)
    values = keys[..., : p.head_dim_v] if p.v_from_k else gather(ops.v_cache, ops.v_scale)
    positions = jnp.arange(p.capacity)
    lengths = jnp.clip(ops.seq_lens, 0, p.capacity)
    # Query token t of a row of length L is position L - q_len + t: it sees positions
    # up to its own, and with a window only the last window_left + 1 of them.
    limits = lengths[:, None] - p.q_len + 1 + jnp.arange(p.q_len)  # [batch, q_len]
    token_ok = (positions[None, None, :] < limits[..., None]) & jnp.repeat(page_ok, p.page_size, axis=1)[:, None]
    if p.window_left >= 0:  # (in this form int32 cannot overflow for a window near INT32_MAX)
        token_ok &= limits[..., None] - 1 - positions[None, None, :] <= p.window_left

    # Zero the values of tokens no query attends to: weight 0 times a stale NaN/inf would still be NaN.
    values = jnp.where(token_ok.any(axis=1)[:, :, None, None], values, 0.0)

    grouped_q = ops.q.astype(jnp.float32).reshape(p.batch, p.q_len, p.num_kv_heads, p.kv_group, p.head_dim_qk)
    hi = jax.lax.Precision.HIGHEST
    scores = jnp.einsum("bqkgd,btkd->bqkgt", grouped_q, keys, precision=hi) * p.sm_scale
    if p.logit_cap > 0:
        scores = p.logit_cap * jnp.tanh(scores / p.logit_cap)
    scores = jnp.where(token_ok[:, :, None, None, :], scores, -jnp.inf)
    peak = scores.max(axis=-1, initial=-jnp.inf)  # a page table of width 0 holds no tokens
    sinks = None if ops.sinks is None else ops.sinks.reshape(p.num_kv_heads, p.kv_group)
    if sinks is not None:
        peak = jnp.maximum(peak, sinks)
    peak = jnp.where(peak == -jnp.inf, 0.0, peak)  # an empty row must not give NaN
    weights = jnp.exp(scores - peak[..., None])
    total = weights.sum(axis=-1)
    if sinks is not None:
        total = total + jnp.exp(sinks - peak)  # a sink's value is zero: denominator only
    safe_total = jnp.where(total > 0, total, 1.0)
    out = jnp.einsum("bqkgt,btkd->bqkgd", weights, values, precision=hi) / safe_total[..., None]
    lse = jnp.where(total > 0, peak + jnp.log(safe_total), -jnp.inf)
    return out.reshape(p.out_shape).astype(ops.q.dtype), lse.reshape(p.lse_shape)


def write_cache(ops: WriteOperands, problem: WriteProblem):
    """The cache with this step's rows scattered into their slots (slots outside the cache dropped)."""
    cache, new, slots = ops.cache, ops.new, ops.slot_mapping
    num_slots = problem.num_slots
    in_range = (slots >= 0) & (slots < num_slots)
    index = jnp.where(in_range, slots, num_slots)  # past the end: dropped below
    if ops.scale is not None:
        # The correctly rounded float32 quotient, as the kernels' div_rn: a float64
        # quotient rounded to float32 is that (53 >= 2 * 24 + 2 bits), whereas XLA divides
        # float32 approximately on GPUs (div.full.f32, an ulp off for ~20% of quotients).
        # The barriers keep it a float64 division: XLA's simplifier would turn a division
        # by a broadcast into a multiply by the reciprocal, and LLVM would narrow
        # f32(f64(a) / f64(b)) back to a float32 division.
        if hasattr(jax, "enable_x64"):
            enable_x64 = jax.enable_x64
        else:  # older JAX
            from jax.experimental import enable_x64
        with enable_x64(True):
            divisor = jnp.broadcast_to(ops.scale[:, None], new.shape)
            wide = jax.lax.optimization_barrier((new.astype(jnp.float64), divisor.astype(jnp.float64)))
            new = jax.lax.optimization_barrier(wide[0] / wide[1]).astype(jnp.float32)
    fp8 = FP8_FORMATS.get(problem.cache_dtype)
    if fp8 is None:
        flat = cache.reshape(num_slots, *cache.shape[2:])
        return flat.at[index].set(new.astype(cache.dtype), mode="drop").reshape(cache.shape)
    # The kernel's rule: clamp to the finite range, round; every NaN the format's positive
    # NaN.  Scattered as bits: XLA may widen fp8 through f32, whose NaNs vary by platform.
    values = new.astype(jnp.float32)
    bits = jax.lax.bitcast_convert_type(jnp.clip(values, -fp8.largest, fp8.largest).astype(cache.dtype), jnp.uint8)
    bits = jnp.where(jnp.isnan(values), jnp.uint8(fp8.nan_bits), bits)
    flat = jax.lax.bitcast_convert_type(cache, jnp.uint8).reshape(num_slots, *cache.shape[2:])
    flat = flat.at[index].set(bits, mode="drop")
    return jax.lax.bitcast_convert_type(flat.reshape(cache.shape), cache.dtype)
