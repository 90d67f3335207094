"""Launch jax_triton 0.3.x kernel calls through jaxlib's typed-FFI Triton handler.

jax_triton 0.3.1 lowers ``triton_call`` to the legacy custom call ``triton_kernel_call``
(API version 2). On every execution jaxlib's legacy handler copies and hashes the whole
compressed kernel (PTX, TTIR and the cubin) to find its cached launch, and XLA cannot put
the call into a command buffer. jaxlib >= 0.10.1 also registers ``triton_kernel_call_ffi``,
a typed-FFI handler fed the same bytes (an ``opaque`` attribute) that resolves the kernel
once when the executable is initialised; jax_triton >= 0.4 lowers to it already.

``install()`` re-registers jax_triton's CUDA lowering so that calls made with
``custom_call_target_name=FFI_MARKER`` (ours) are lowered as jax_triton lowers them and the
resulting custom call is then retargeted; every other ``triton_call`` in the process keeps
jax_triton's own lowering untouched.
"""

from __future__ import annotations

import functools
import os

LEGACY_TARGET = "triton_kernel_call"
FFI_TARGET = "triton_kernel_call_ffi"
FFI_MARKER = "jax_decode_triton_kernel_call_ffi"  # our calls ask for the retarget with this name
_TYPED_FFI_API_VERSION = 4  # stablehlo.custom_call's api_version for XLA FFI handlers
OPT_OUT_ENV = "JAX_DECODE_LEGACY_CUSTOM_CALL"  # "1": keep the legacy target (for comparison)


def _ffi_handler_registered() -> bool:
    try:
        from jaxlib.plugin_support import import_from_plugin
    except ImportError:
        return False
    triton = import_from_plugin("cuda", "_triton")
    registrations = getattr(triton, "registrations", None)
    return registrations is not None and FFI_TARGET in registrations()


def _retarget(results) -> None:
    """Turn the legacy custom call that produced ``results`` into the typed-FFI one."""
    from jax._src.lib.mlir import ir

    op = results[0].owner
    if not isinstance(op, ir.Operation):
        op = op.operation
    attributes = op.attributes
    opaque = attributes["backend_config"]  # the zlib-compressed kernel-call proto, as bytes
    attributes["call_target_name"] = ir.StringAttr.get(FFI_TARGET)
    attributes["api_version"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32), _TYPED_FFI_API_VERSION)
    attributes["backend_config"] = ir.DictAttr.get({"opaque": opaque})


@functools.cache
def install(jax_triton) -> str:
    """Route our calls to the FFI handler when this jax_triton / jaxlib pair allows it.

    Returns the ``custom_call_target_name`` our ``triton_call``s pass: ``FFI_MARKER`` when
    installed, else jax_triton's default (nothing changes).
    """
    triton_lib = getattr(jax_triton, "triton_lib", None)
    lowering = getattr(triton_lib, "triton_kernel_call_lowering", None)
    cuda_backend = getattr(triton_lib, "get_cuda_backend", None)  # 0.3.x only; 0.4 lowers to FFI itself
    if os.environ.get(OPT_OUT_ENV) == "1" or lowering is None or cuda_backend is None:
        return LEGACY_TARGET
    if not _ffi_handler_registered():
        return LEGACY_TARGET
    from jax.interpreters import mlir

    jax_triton_lowering = functools.partial(lowering, cuda_backend)

    def lowering_with_ffi_target(ctx, *args, custom_call_target_name, **params):
        ours = custom_call_target_name == FFI_MARKER
        target = LEGACY_TARGET if ours else custom_call_target_name
        results = jax_triton_lowering(ctx, *args, custom_call_target_name=target, **params)
        if ours:
            _retarget(results)
        return results

    mlir.register_lowering(triton_lib.triton_kernel_call_p, lowering_with_ffi_target, platform="cuda")
    hip_backend = getattr(triton_lib, "get_hip_backend", None)
    if hip_backend is not None:  # ROCm has no FFI handler: our calls keep the legacy target there
        hip_lowering = functools.partial(lowering, hip_backend)

        def lowering_on_rocm(ctx, *args, custom_call_target_name, **params):
            if custom_call_target_name == FFI_MARKER:
                custom_call_target_name = LEGACY_TARGET
            return hip_lowering(ctx, *args, custom_call_target_name=custom_call_target_name, **params)

        mlir.register_lowering(triton_lib.triton_kernel_call_p, lowering_on_rocm, platform="rocm")
    return FFI_MARKER
