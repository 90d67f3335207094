"""Gluon kernels inside ``jax.jit``: our own lowering to jaxlib's Triton custom call.

jax_triton 0.3 cannot launch Gluon kernels, and 0.4 needs a newer Triton than the one
Gluon's Hopper kernels are measured with, so this module does what ``triton_call``
does for them: the launch is compiled once for the target
(:func:`jax_decode.kernels.gluon_compile.compile_launch`, the binary torch runs too),
and the lowering hands its PTX to jaxlib's Triton call (the typed-FFI one where
jaxlib has it: :mod:`jax_decode.backends.typed_ffi`) with one parameter
per kernel argument -- a TMA descriptor that jaxlib fills at run time from the
operand's address, a buffer, or an int.  Needs a jaxlib whose Triton call takes TMA
descriptors (``create_tma_descriptor_parameter``: jax 0.11 and later).
"""

from __future__ import annotations

import functools
import zlib

import jax
from jax._src import dispatch
from jax.extend import core as jex_core
from jax.interpreters import mlir

from jax_decode.backends import typed_ffi
from jax_decode.launch import DeviceInfo, KernelLaunch


def _gpu_triton():
    from jax._src.lib import gpu_triton

    return gpu_triton


@functools.cache
def jaxlib_tma_missing() -> str | None:
    """Why jaxlib's Triton call cannot take this module's launches here, or None."""
    try:
        gpu_triton = _gpu_triton()
    except ImportError as error:
        return f"jaxlib has no Triton call ({error})"
    if not hasattr(gpu_triton, "create_tma_descriptor_parameter"):
        return f"jaxlib {jax.lib.__version__} passes no TMA descriptors to Triton kernels (jax >= 0.11 does)"
    return None


gluon_call_p = jex_core.Primitive("jax_decode_gluon_call")
gluon_call_p.multiple_results = True
gluon_call_p.def_impl(functools.partial(dispatch.apply_primitive, gluon_call_p))


def gluon_call(*operands, launch: KernelLaunch, out_types, device: DeviceInfo):
    """Launch ``launch`` (a Gluon launch of jax_decode.launch) on ``operands``: the
    arrays its TMA views name, in order (``launch.tma[i].operand``), then the arrays
    and ints of its other parameters; returns the arrays of ``out_types`` (the
    kernel's last parameters)."""
    arrays = tuple(x for x in operands if hasattr(x, "shape"))
    scalars = tuple((i, x) for i, x in enumerate(operands) if not hasattr(x, "shape"))
    return gluon_call_p.bind(
        *arrays,
        launch=launch,
        scalars=scalars,
        out_types=tuple(jax.ShapeDtypeStruct(t.shape, t.dtype) for t in out_types),
        compute_capability=device.compute_capability,
    )


@gluon_call_p.def_abstract_eval
def _abstract_eval(*arrays, launch, scalars, out_types, compute_capability):
    return [jax.core.ShapedArray(t.shape, t.dtype) for t in out_types]


def _parameters(launch: KernelLaunch, scalars: tuple, compiled) -> list:
    """jaxlib's parameters, one per kernel argument; a descriptor is followed by its
    shape (i32) and strides (i64), as Triton's own launcher passes them."""
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST

    gpu_triton = _gpu_triton()
    scalar_at = dict(scalars)
    params, views, metas = [], iter(launch.tma), iter(compiled.metadata.tensordesc_meta)
    for index, (_, kind) in enumerate(launch.param_types):
        if kind == "tma":
            view, meta = next(views), next(metas)
            shape, strides = [view.rows, view.cols], [view.row_stride, 1]
            fields = dict(
                elem_type=TMA_DTYPE_DEVICE_TO_HOST[meta["elem_type"]],
                swizzle=meta["swizzle"],
                shape=shape,
                strides=strides,
                block_shape=list(meta["block_size"]),
                oob_fill=0,
            )
            if "elem_size_bytes" in (gpu_triton.create_tma_descriptor_parameter.__doc__ or ""):  # newer jaxlib
                fields["elem_size_bytes"] = meta["elem_size"]
            params.append(gpu_triton.create_tma_descriptor_parameter(**fields))
            params += [gpu_triton.create_scalar_parameter(int(d), "i32") for d in shape]
            params += [gpu_triton.create_scalar_parameter(int(s), "i64") for s in strides]
        elif kind.startswith("*"):
            params.append(gpu_triton.create_array_parameter(0, 16))
        else:
            params.append(gpu_triton.create_scalar_parameter(int(scalar_at[index]), kind))
    return params


def _lowering(ctx, *arrays, launch, scalars, out_types, compute_capability):
    from jax_decode.kernels.gluon_compile import compile_launch

    missing = jaxlib_tma_missing()
    if missing is not None:
        raise NotImplementedError(f"the Gluon kernel {launch.kernel_name!r} cannot be launched from JAX: {missing}")
    compiled = compile_launch(launch, compute_capability)
    md = compiled.metadata
    gpu_triton = _gpu_triton()
    scratch = getattr(md, "global_scratch_size", 0) or 0
    if scratch or (getattr(md, "profile_scratch_size", 0) or 0):
        raise NotImplementedError(f"{md.name} needs a global scratch buffer, which this lowering does not provide")
    # md.num_warps: every warp the kernel runs, its warp-specialised partitions' included
    # (launch.num_warps counts the default partition's alone).
    kernel = gpu_triton.TritonKernel(md.name, md.num_warps, 1, md.shared, compiled.asm["ptx"], "", compute_capability)
    call = gpu_triton.TritonKernelCall(kernel, *launch.grid, _parameters(launch, scalars, compiled))
    return typed_ffi.lowering_rule(zlib.compress(call.to_proto(md.name, b"")))(ctx, *arrays)


mlir.register_lowering(gluon_call_p, _lowering, platform="cuda")
