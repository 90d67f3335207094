"""The ``"triton"`` backend: the kernels inside ``jax.jit`` through ``jax_triton.triton_call``.

Both jax_triton lines are supported: 0.3 (Python 3.11; output pointers follow the
inputs, in-place updates alias an input to an output) and 0.4 (Python >= 3.12,
Triton >= 3.7; ``out_type``, in-place updates through ``jax.new_ref`` arguments, and
the typed-FFI custom call ``triton_kernel_call_ffi``).  Either way every launch goes
through that typed call where jaxlib has it (:mod:`jax_decode.backends.typed_ffi`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import os

import jax
import jax.numpy as jnp

from jax_decode import kernels, operands
from jax_decode.backends import typed_ffi
from jax_decode.launch import DeviceInfo, KernelLaunch, LaunchConfig, WriteProblem, write_cache_launch

_COMPILE_TARGET: contextvars.ContextVar[DeviceInfo | None] = contextvars.ContextVar(
    "jax_decode_compile_target", default=None
)


@functools.cache
def import_jax_triton():
    """Import jax_triton lazily (0.3 needs JAX's CUDA plugin) and undo its side effect.

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
    _fix_dce_rule(jax_triton)
    typed_ffi.route_jax_triton_03(jax_triton)
    ours = frozenset(map(id, kernels.KERNELS.values()))
    typed_ffi.route_jax_triton_04(jax_triton, lambda kernel: id(kernel) in ours)
    return jax_triton


def _fix_dce_rule(jax_triton) -> None:
    """jax_triton 0.4.1 registers a dead-code rule for its primitive that takes
    ``(used_outs, eqn)``, while jax >= 0.12 calls such rules with ``(used_outs, live_ins,
    eqn)``: every jitted function with a ``jax.new_ref`` argument to a Triton call then
    fails to trace.  Where that mismatch is found, register the same rule (keep every
    input, keep the call) with the arity jax calls."""
    from jax._src.interpreters import partial_eval as pe

    primitive = getattr(getattr(jax_triton, "triton_lib", None), "triton_kernel_call_p", None)
    rule = pe.dce_rules.get(primitive) if primitive is not None else None
    if rule is not None and len(inspect.signature(rule).parameters) == 2:
        # Either arity: the equation comes last.
        pe.dce_rules[primitive] = lambda used_outs, *rest: ([True] * len(rest[-1].invars), rest[-1])


def jax_triton_import_error() -> str | None:
    """Why jax_triton does not import here (its own error), or None if it does."""
    try:
        import_jax_triton()
    except Exception as error:  # ImportError, or the CUDA plugin failing to load
        return f"{type(error).__name__}: {error}"
    return None


def jax_triton_available() -> bool:
    return jax_triton_import_error() is None


def why_unusable(device: DeviceInfo | None) -> str | None:
    """What keeps the triton backend from compiling for ``device`` here, or None."""
    error = jax_triton_import_error()
    if error is not None:
        return (
            f"needs jax_triton, which does not import here ({error}); install it with "
            "`pip install 'jax-decode[gpu]'` and JAX's CUDA plugin (`pip install 'jax[cuda12]'`)"
        )
    if device is None:
        return (
            "needs a GPU visible to JAX, or jax_decode.compile_target(DeviceInfo(...)) to lower for one "
            "ahead of time; use backend='xla' on a CPU"
        )
    return None


@functools.cache
def is_jax_triton_04() -> bool:
    """jax_triton 0.4 renamed triton_call's out_shape to out_type (and aliases through Refs)."""
    return "out_type" in inspect.signature(import_jax_triton().triton_call).parameters


def triton_call(*args, launch: KernelLaunch, out_types, device: DeviceInfo, **options):
    """``jax_triton.triton_call`` as every kernel of ours is launched from JAX: the
    launch config's kernel, grid, warps, stages and constexprs, outputs under the
    keyword this jax_triton version takes, compiled for ``device``."""
    jt = import_jax_triton()
    if device.compute_capability is not None:
        options["compute_capability"] = device.compute_capability
    if not is_jax_triton_04() and device.vendor == "nvidia":
        # 0.4 emits the typed-FFI call itself; 0.3 does where we name it (typed_ffi).
        options["custom_call_target_name"] = typed_ffi.jax_triton_03_target(jt)
    return jt.triton_call(
        *args,
        kernel=kernels.KERNELS[launch.kernel_name],
        grid=launch.grid,
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
        **{"out_type" if is_jax_triton_04() else "out_shape": out_types},
        **options,
        **launch.meta(),
    )


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
    cc = int(major) * 10 + int(minor)
    return DeviceInfo(vendor="nvidia", compute_capability=cc, num_sms=int(gpu.core_count),
                      hopper_kernels=cc == 90 and hopper_kernels_launchable())  # fmt: skip


def hopper_kernels_launchable() -> bool:
    """The Gluon Hopper kernels build here (:func:`hopper_kernels_usable`) and jaxlib's
    Triton call passes their TMA descriptors."""
    from jax_decode.backends.gluon_call import jaxlib_tma_missing
    from jax_decode.kernels.gluon_compile import hopper_kernels_usable

    return hopper_kernels_usable() and jaxlib_tma_missing() is None


def target_device() -> DeviceInfo | None:
    """The device the triton backend compiles for: compile_target's, else the first GPU."""
    return _COMPILE_TARGET.get() or _visible_gpu()


def decode_attention(ops: operands.DecodeOperands, config: LaunchConfig):
    """Stage 1 and stage 2 through triton_call (a Gluon stage 1 through
    :mod:`jax_decode.backends.gluon_call` where the config chooses it: JAX arrays are
    row-major, so always TMA-addressable); under the device-side schedule, the schedule,
    stage 1 and the schedule's merge.  Returns (out, lse)."""
    p = config.problem
    strides = config.contiguous_strides()
    mid_types = (
        jax.ShapeDtypeStruct(config.mid_o_shape, jnp.float32),
        jax.ShapeDtypeStruct(config.mid_lse_shape, jnp.float32),
    )
    out_types = (jax.ShapeDtypeStruct(p.out_shape, ops.q.dtype), jax.ShapeDtypeStruct(p.lse_shape, jnp.float32))
    schedule = None
    if config.schedule_programs:
        schedule = triton_call(
            *operands.schedule_inputs(ops, p),
            launch=config.schedule(),
            out_types=(jax.ShapeDtypeStruct(config.schedule_shape, jnp.int32),),
            device=config.device,
        )[0]
    if config.hopper_mla or config.hopper_gqa:
        from jax_decode.backends.gluon_call import gluon_call

        launch = config.hopper_stage1(strides)
        arrays = dict(q=ops.q, k_cache=ops.k_cache, v_cache=ops.v_cache)
        descriptors = tuple(arrays[view.operand] for view in launch.tma)
        inputs = (*descriptors, *operands.hopper_stage1_inputs(ops, p, schedule, config.hopper_q_pointer))
        if schedule is not None and config.scheduled_rows_direct:
            # The seesaw writes the rows of one chunk itself; the merge writes the others
            # into the same out and lse.
            mid_o, mid_lse, out, lse = gluon_call(*inputs, launch=launch, out_types=(*mid_types, *out_types),
                                                  device=config.device)  # fmt: skip
            return _merge_in_place(ops, mid_o, mid_lse, schedule, out, lse, config.schedule_merge(strides),
                                   config.device)  # fmt: skip
        if config.one_pass:
            return tuple(gluon_call(*inputs, launch=launch, out_types=out_types, device=config.device))
        mid_o, mid_lse = gluon_call(*inputs, launch=launch, out_types=mid_types, device=config.device)
    else:
        inputs = operands.stage1_inputs(ops, p, schedule)
        if config.one_pass:
            return tuple(triton_call(*inputs, launch=config.stage1(strides), out_types=out_types, device=config.device))
        mid_o, mid_lse = triton_call(*inputs, launch=config.stage1(strides), out_types=mid_types, device=config.device)
    if schedule is not None:  # stage 1 wrote partials only
        merge_inputs = operands.schedule_merge_inputs(ops, mid_o, mid_lse, schedule, mid_o, mid_lse)
        merge = config.schedule_merge(strides)
        return tuple(triton_call(*merge_inputs, launch=merge, out_types=out_types, device=config.device))
    return triton_call(
        *operands.stage2_inputs(ops, mid_o, mid_lse),
        launch=config.stage2(strides),
        out_types=out_types,
        device=config.device,
    )


def _merge_in_place(ops: operands.DecodeOperands, mid_o, mid_lse, schedule, out, lse, launch: KernelLaunch,
                    device: DeviceInfo):  # fmt: skip
    """The scheduled chunks' merge into ``out`` and ``lse`` as stage 1 left them."""
    if is_jax_triton_04():
        # Refs are the kernel's in-place outputs; the unread input slots get placeholders.
        out_ref, lse_ref = jax.new_ref(out), jax.new_ref(lse)
        inputs = operands.schedule_merge_inputs(ops, mid_o, mid_lse, schedule, ops.seq_lens, ops.seq_lens)
        triton_call(*inputs, out_ref, lse_ref, launch=launch, out_types=(), device=device)
        return jax.freeze(out_ref), jax.freeze(lse_ref)
    inputs = operands.schedule_merge_inputs(ops, mid_o, mid_lse, schedule, out, lse)
    out_types = (jax.ShapeDtypeStruct(out.shape, out.dtype), jax.ShapeDtypeStruct(lse.shape, lse.dtype))
    # jax_triton 0.3 numbers array operands only (all of them are): out and lse are the last two.
    last = len(inputs) - 1
    return tuple(triton_call(*inputs, launch=launch, out_types=out_types, device=device,
                             input_output_aliases={last - 1: 0, last: 1}))  # fmt: skip


def write_cache(ops: operands.WriteOperands, problem: WriteProblem, device: DeviceInfo):
    """The cache with this step's rows written, in place where the caller donated it."""
    launch = write_cache_launch(problem, *problem.contiguous_strides(), interpreted=False)
    if is_jax_triton_04():
        # A Ref argument is the kernel's in-place cache; the unread input slot gets a placeholder.
        cache = jax.new_ref(ops.cache)
        triton_call(
            *operands.write_inputs(ops, problem, ops.slot_mapping, cache), launch=launch, out_types=(), device=device
        )
        return jax.freeze(cache)
    inputs = operands.write_inputs(ops, problem, ops.cache)
    return triton_call(
        *inputs,
        launch=launch,
        out_types=jax.ShapeDtypeStruct(ops.cache.shape, ops.cache.dtype),
        device=device,
        # jax_triton 0.3 numbers array operands only (the slot count is a scalar).
        input_output_aliases={sum(hasattr(x, "shape") for x in inputs) - 1: 0},
    )
