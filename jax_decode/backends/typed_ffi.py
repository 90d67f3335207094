"""Every Triton launch from JAX through jaxlib's typed-FFI Triton call.

jaxlib has two custom calls that launch a serialized Triton kernel call: the legacy
``triton_kernel_call`` (custom-call API version 2, the call in ``backend_config``),
which jax_triton 0.3 emits, and the typed-FFI ``triton_kernel_call_ffi`` (API version
4, the same serialized call as the ``opaque`` attribute), which jax_triton 0.4 emits.
Both run the same kernel on the same parameters (our outputs are bit-identical), but
XLA launches the typed one with less host work per call: on an H100 (jax 0.11.2,
jax_triton 0.3.1) a jitted program of 16 independent DeepSeek-V3 MLA decode calls
(three launches each, 72.8 µs of kernels per call) spanned 81.3 µs per call on the
GPU through the legacy call and 73.5 µs through the typed one (docs/performance.md).

So our launches use the typed call wherever this jaxlib registers it:

* Gluon kernels (:mod:`jax_decode.backends.gluon_call`) are lowered by us and emit it
  directly (:func:`lowering_rule`).
* Portable kernels go through ``jax_triton.triton_call``.  jax_triton 0.4 emits the
  typed call itself; for 0.3, whose lowering takes a custom-call target name but
  always writes API version 2, :func:`route_jax_triton_03` wraps that lowering so a
  call whose target is ``triton_kernel_call_ffi`` (only ours ask for it) comes out in
  the typed form: jax_triton compiles the kernel and serializes its call as ever, and
  the typed call takes that call (as ``opaque``), the same operands and aliases.
  Calls naming any other target are left as jax_triton lowers them.
"""

from __future__ import annotations

import functools

import jax
from jax.interpreters import mlir

TYPED_FFI_TARGET = "triton_kernel_call_ffi"
LEGACY_TARGET = "triton_kernel_call"
_TYPED_FFI_API_VERSION = 4


@functools.cache
def typed_ffi_registered() -> bool:
    """jaxlib's CUDA plugin registers the typed-FFI Triton call (jaxlib 0.4.36 and later)."""
    try:
        from jax._src.lib import gpu_triton
    except ImportError:
        return False
    plugin = getattr(gpu_triton, "_cuda_triton", None)
    registrations = getattr(plugin, "registrations", None)
    return registrations is not None and TYPED_FFI_TARGET in registrations()


def target() -> str:
    """The custom call our Triton launches lower to here."""
    return TYPED_FFI_TARGET if typed_ffi_registered() else LEGACY_TARGET


def lowering_rule(serialized_call: bytes):
    """A lowering rule launching ``serialized_call`` (a compressed ``TritonKernelCall``
    proto) through :func:`target`."""
    if target() == TYPED_FFI_TARGET:
        rule = jax.ffi.ffi_lowering(TYPED_FFI_TARGET, api_version=_TYPED_FFI_API_VERSION)
        return functools.partial(rule, opaque=serialized_call)
    return jax.ffi.ffi_lowering(LEGACY_TARGET, api_version=2, backend_config=serialized_call)


def route_jax_triton_03(jax_triton) -> None:
    """Make jax_triton 0.3's CUDA lowering emit the typed-FFI form for calls that name
    :data:`TYPED_FFI_TARGET` (see the module docstring).  No-op for other versions."""
    lib = getattr(jax_triton, "triton_lib", None)
    lowering = getattr(lib, "triton_kernel_call_lowering", None)
    backend = getattr(lib, "get_cuda_backend", None)  # jax_triton 0.3's name; 0.4 has no such function
    if lowering is None or backend is None or not typed_ffi_registered():
        return
    from jax._src.lib.mlir import ir

    def typed_where_asked(ctx, *arrays, custom_call_target_name, **params):
        if custom_call_target_name != TYPED_FFI_TARGET:
            return lowering(backend, ctx, *arrays, custom_call_target_name=custom_call_target_name, **params)
        # jax_triton compiles the kernel and emits the legacy call; the typed call
        # replaces it, taking the same operands and its serialized kernel call.
        legacy = lowering(backend, ctx, *arrays, custom_call_target_name=LEGACY_TARGET, **params)
        op = legacy[0].owner
        op = getattr(op, "operation", op)
        serialized_call = ir.StringAttr(op.attributes["backend_config"]).value_bytes
        typed = jax.ffi.ffi_lowering(
            TYPED_FFI_TARGET, api_version=_TYPED_FFI_API_VERSION,
            operand_output_aliases=dict(params["input_output_aliases"]),
        )(ctx, *arrays, opaque=serialized_call)  # fmt: skip
        op.erase()
        return typed

    mlir.register_lowering(lib.triton_kernel_call_p, typed_where_asked, platform="cuda")
