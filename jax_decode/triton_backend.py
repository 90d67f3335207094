"""The ``"triton"`` backend: the kernels inside ``jax.jit`` through ``jax_triton.triton_call``."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import os

import jax
import jax.numpy as jnp

from jax_decode import kernels
from jax_decode.launch import DeviceInfo, LaunchConfig, stage1_scales

_COMPILE_TARGET: contextvars.ContextVar[DeviceInfo | None] = contextvars.ContextVar(
    "jax_decode_compile_target", default=None
)


@functools.cache
def import_jax_triton():
    """Import jax_triton lazily (it needs JAX's CUDA plugin) and undo its side effect.

    jax_triton 0.3.x sets TRITON_CACHE_DIR="" on import, after which Triton launches
    from torch in the same process fail; restore what was there.
    """
    saved = os.environ.get("TRITON_CACHE_DIR")
    try:
        import jax_triton
    finally:
        if saved is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = saved
    return jax_triton


def jax_triton_available() -> bool:
    try:
        import_jax_triton()
    except Exception:  # ImportError, or the CUDA plugin failing to load
        return False
    return True


@functools.cache
def out_shape_keyword() -> str:
    # jax_triton 0.4 renamed triton_call's out_shape to out_type.
    params = inspect.signature(import_jax_triton().triton_call).parameters
    return "out_type" if "out_type" in params else "out_shape"


def triton_call(*args, kernel, out_types, device: DeviceInfo, **launch):
    """``jax_triton.triton_call`` as every kernel of ours is launched from JAX: outputs
    under the keyword this jax_triton version takes, compiled for ``device``."""
    jt = import_jax_triton()
    if device.compute_capability is not None:
        launch["compute_capability"] = device.compute_capability
    return jt.triton_call(*args, kernel=kernel, **{out_shape_keyword(): out_types}, **launch)


@contextlib.contextmanager
def compile_target(device: DeviceInfo):
    """Compile the triton backend for ``device`` instead of the visible GPU.

    For ahead-of-time lowering on a machine without that GPU, e.g.
    ``with compile_target(DeviceInfo("nvidia", 90, 132)):
    jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",))``.
    """
    token = _COMPILE_TARGET.set(device)
    try:
        yield device
    finally:
        _COMPILE_TARGET.reset(token)


@functools.cache
def _visible_gpu() -> DeviceInfo | None:
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        return None
    if gpu.platform == "rocm":
        return DeviceInfo(vendor="amd", compute_capability=None, num_sms=int(getattr(gpu, "core_count", 304)))
    major, minor = str(gpu.compute_capability).split(".")
    return DeviceInfo(vendor="nvidia", compute_capability=int(major) * 10 + int(minor), num_sms=int(gpu.core_count))


def target_device() -> DeviceInfo | None:
    """The device the triton backend compiles for: compile_target's, else the first GPU."""
    return _COMPILE_TARGET.get() or _visible_gpu()


def decode_attention_triton(
    q, k_cache, v_cache, page_table, seq_lens, k_scale, v_scale, sinks, config: LaunchConfig
):  # fmt: skip
    """Stage 1 and stage 2 through triton_call; returns (out, lse)."""
    p = config.problem
    strides = config.contiguous_strides()
    stage1 = config.stage1(strides)
    k_scale, v_scale = stage1_scales(k_scale, v_scale, seq_lens, p.v_from_k)
    mid_o, mid_lse = triton_call(
        q,
        k_cache,
        k_cache if p.v_from_k else v_cache,
        page_table,
        seq_lens,
        k_scale,
        v_scale,
        p.num_pages,
        kernel=kernels.STAGE1_KERNELS[stage1.kernel_name],
        out_types=(
            jax.ShapeDtypeStruct(config.mid_o_shape, jnp.float32),
            jax.ShapeDtypeStruct(config.mid_lse_shape, jnp.float32),
        ),
        device=config.device,
        grid=stage1.grid,
        num_warps=stage1.num_warps,
        num_stages=stage1.num_stages,
        **stage1.meta(),
    )
    stage2 = config.stage2(strides)
    return triton_call(
        mid_o,
        mid_lse,
        mid_lse if sinks is None else sinks,  # a placeholder when there are no sinks
        kernel=kernels.STAGE2_KERNEL,
        out_types=(
            jax.ShapeDtypeStruct((p.batch, p.num_heads, p.head_dim_v), q.dtype),
            jax.ShapeDtypeStruct((p.batch, p.num_heads), jnp.float32),
        ),
        device=config.device,
        grid=stage2.grid,
        num_warps=stage2.num_warps,
        num_stages=stage2.num_stages,
        **stage2.meta(),
    )
