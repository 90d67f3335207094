"""``write_kv``: this step's keys and values into their paged-cache slots, for JAX.

Under ``jax.jit`` with the caches donated (``donate_argnums``) the update happens in
place: the triton backend aliases each cache to the kernel's output, and the xla
backend's scatter is updated in place by XLA; without donation XLA copies the cache
first (correct, but a full cache write per step).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_decode import kernels, triton_backend
from jax_decode.launch import FP8_FORMATS, check_cache_dtype_on_device, write_cache_launch
from jax_decode.operands import float_operand, scale_operand
from jax_decode.validation import check_write_kv_args

WRITE_BACKENDS = ("auto", "triton", "xla", "interpret")


def write_kv(k_cache, v_cache, k_new, v_new, slot_mapping, *, k_scale=None, v_scale=None, backend: str = "auto"):
    """Write token ``t``'s rows into flat slot ``slot_mapping[t]`` (= page * page_size + slot).

    Args:
      k_cache, v_cache: ``[num_pages, page_size, num_kv_heads, head_dim]`` (v_cache None
        for MLA's single latent cache, with v_new None).
      k_new, v_new: ``[num_tokens, num_kv_heads, head_dim]``; cast to the cache dtype.
        An fp8 cache stores ``k_new / k_scale`` rounded to nearest and saturated to the
        format's finite range (so no value becomes inf or NaN).
      k_scale, v_scale: float ``()``/``[1]`` or ``[num_kv_heads]``, or None (no division).
      slot_mapping: int32 ``[num_tokens]``; slots outside ``[0, num_pages * page_size)``
        (e.g. -1 for padding tokens) are skipped.  Two tokens with one slot: one wins.
      backend: as for ``decode_attention`` (``"auto"``: the Triton kernel on GPU, an XLA
        scatter elsewhere).

    Returns ``(k_cache, v_cache)`` updated (v_cache None when it was None).
    """
    if backend not in WRITE_BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, WRITE_BACKENDS))}, got {backend!r}")

    def spec(x):
        return None if x is None else (x.shape, x.dtype)

    k_scale, v_scale = float_operand(k_scale), float_operand(v_scale)
    num_tokens, num_slots, k_mode, v_mode = check_write_kv_args(
        k_cache=spec(k_cache), v_cache=spec(v_cache), k_new=spec(k_new), v_new=spec(v_new),
        slot_mapping=spec(slot_mapping), k_scale=spec(k_scale), v_scale=spec(v_scale),
    )  # fmt: skip
    k_scale, v_scale = scale_operand(k_scale), scale_operand(v_scale)
    k_out = _write_one(k_cache, k_new, slot_mapping, k_scale, k_mode, num_tokens, num_slots, backend)
    if v_cache is None:
        return k_out, None
    return k_out, _write_one(v_cache, v_new, slot_mapping, v_scale, v_mode, num_tokens, num_slots, backend)


def _launch(cache, num_tokens: int, scale_mode: int):
    _, page_size, kv_heads, head_dim = cache.shape
    return write_cache_launch(
        num_tokens, kv_heads, head_dim, page_size, (kv_heads * head_dim, head_dim),
        (page_size * kv_heads * head_dim, kv_heads * head_dim, head_dim), jnp.dtype(cache.dtype).name, scale_mode,
    )  # fmt: skip


def _write_xla(cache, new, slots, scale, num_slots: int):
    flat = cache.reshape(num_slots, *cache.shape[2:])
    in_range = (slots >= 0) & (slots < num_slots)
    index = jnp.where(in_range, slots, num_slots)  # past the end: dropped below
    if scale is not None:
        new = new.astype(jnp.float32) / scale[:, None]
    fp8 = FP8_FORMATS.get(jnp.dtype(cache.dtype).name)
    if fp8 is not None:  # the kernel's rule: clamp to the finite range, then round
        new = jnp.clip(new.astype(jnp.float32), -fp8.largest, fp8.largest)
    return flat.at[index].set(new.astype(cache.dtype), mode="drop").reshape(cache.shape)


def _write_triton(cache, new, slots, scale, scale_mode: int, num_tokens: int, num_slots: int):
    launch = _launch(cache, num_tokens, scale_mode)
    device = triton_backend.target_device()
    check_cache_dtype_on_device(jnp.dtype(cache.dtype).name, device)
    return triton_backend.triton_call(
        new, slots, slots if scale is None else scale, num_slots, cache,
        kernel=kernels.WRITE_CACHE_KERNEL,
        out_types=jax.ShapeDtypeStruct(cache.shape, cache.dtype),
        device=device,
        grid=launch.grid,
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
        input_output_aliases={3: 0},  # array operands: new, slots, scale, cache -> output 0
        **launch.meta(),
    )  # fmt: skip


def _write_interpret(cache, new, slots, scale, scale_mode: int, num_tokens: int, num_slots: int):
    from jax_decode.interpret_backend import host_array, host_tensor
    from jax_decode.torch_launch import launch_write_cache

    launch = _launch(cache, num_tokens, scale_mode)

    def host(cache, new, slots, *scale):
        cache_t = host_tensor(cache)
        scale_t = host_tensor(scale[0]) if scale else None
        launch_write_cache(
            launch, host_tensor(new), host_tensor(slots), num_slots, cache_t, scale=scale_t, interpret=True
        )
        return host_array(cache_t, cache.dtype)

    operands = (cache, new, slots) if scale is None else (cache, new, slots, scale)
    return jax.pure_callback(host, jax.ShapeDtypeStruct(cache.shape, cache.dtype), *operands)


def _write_one(cache, new, slots, scale, scale_mode: int, num_tokens: int, num_slots: int, backend: str):
    if num_tokens == 0:
        return cache
    if backend == "xla":
        return _write_xla(cache, new, slots, scale, num_slots)
    if backend == "interpret":
        return _write_interpret(cache, new, slots, scale, scale_mode, num_tokens, num_slots)
    usable = triton_backend.target_device() is not None and triton_backend.jax_triton_available()
    if backend == "triton" and not usable:
        raise ValueError("backend='triton' needs jax_triton and a GPU visible to JAX; use backend='xla' on CPU")
    if not usable:
        return _write_xla(cache, new, slots, scale, num_slots)

    def on_gpu():
        return _write_triton(cache, new, slots, scale, scale_mode, num_tokens, num_slots)

    if backend == "triton":
        return on_gpu()
    return jax.lax.platform_dependent(
        cuda=on_gpu, rocm=on_gpu, default=lambda: _write_xla(cache, new, slots, scale, num_slots)
    )
