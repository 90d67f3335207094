"""Every Triton launch from JAX through jaxlib's typed-FFI Triton call.

jaxlib has two custom calls that launch a serialized Triton kernel call: the legacy
``triton_kernel_call`` (custom-call API version 2, the call in ``backend_config``),
which jax_triton 0.3 emits, and the typed-FFI ``triton_kernel_call_ffi`` (API version
4, the same serialized call as the ``opaque`` attribute), which jax_triton 0.4 emits.
Both run the same kernel on the same parameters (our outputs are bit-identical), but
through the typed one the GPU waits less between launches: on an H100 (jax 0.11.2,
jax_triton 0.3.1) a jitted program of 16 independent DeepSeek-V3 MLA decode calls
(three launches each; the same kernels take 72.8 µs per call from torch) spanned
81.3 µs per call on the GPU through the legacy call and 73.5 µs through the typed one;
the wall time per call moved with the host's noise (docs/performance.md, "The JAX call
path").

Programs exported with ``jax.export`` hold ``triton_kernel_call_ffi`` custom calls:
allow them with ``jax.export.DisabledSafetyCheck.custom_call("triton_kernel_call_ffi")``,
and run them with a jaxlib that has the typed call.

So our launches use the typed call wherever this jaxlib registers it, unless the
environment variable ``JAX_DECODE_TRITON_CALL=legacy`` asks for the legacy one
(:func:`typed_chosen`; e.g. to compare them, as ``benchmarks.host_overhead --jax`` does):

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
import os

import jax
from jax.interpreters import mlir

TYPED_FFI_TARGET = "triton_kernel_call_ffi"
LEGACY_TARGET = "triton_kernel_call"
_TYPED_FFI_API_VERSION = 4


@functools.cache
def typed_ffi_registered() -> bool:
    """jaxlib's CUDA plugin registers the typed-FFI Triton call (found at run time)."""
    try:
        from jax._src.lib import gpu_triton
    except ImportError:
        return False
    plugin = getattr(gpu_triton, "_cuda_triton", None)
    registrations = getattr(plugin, "registrations", None)
    return registrations is not None and TYPED_FFI_TARGET in registrations()


CALL_VARIABLE = "JAX_DECODE_TRITON_CALL"


def typed_chosen() -> bool:
    """Whether our launches use the typed call: jaxlib has it, and the environment
    variable ``JAX_DECODE_TRITON_CALL`` is ``typed`` (the default), not ``legacy``.  Read
    when a program is lowered (a jitted function lowered before it changed keeps its
    calls).  Under jax_triton 0.4 the portable kernels are always typed: that is
    jax_triton's own choice."""
    choice = os.environ.get(CALL_VARIABLE, "typed")
    if choice not in ("typed", "legacy"):
        raise ValueError(f"{CALL_VARIABLE} must be 'typed' or 'legacy', got {choice!r}")
    return choice == "typed" and typed_ffi_registered()


def target() -> str:
    """The custom call our own lowerings (the Gluon kernels') emit here."""
    return TYPED_FFI_TARGET if typed_chosen() else LEGACY_TARGET


def _typed_call(serialized_call: bytes, operand_output_aliases=None):
    """A lowering rule launching ``serialized_call`` (a compressed ``TritonKernelCall``
    proto) through the typed-FFI call."""
    rule = jax.ffi.ffi_lowering(
        TYPED_FFI_TARGET, api_version=_TYPED_FFI_API_VERSION, operand_output_aliases=operand_output_aliases
    )
    return functools.partial(rule, opaque=serialized_call)


def lowering_rule(serialized_call: bytes):
    """A lowering rule launching ``serialized_call`` through :func:`target`."""
    if target() == TYPED_FFI_TARGET:
        return _typed_call(serialized_call)
    return jax.ffi.ffi_lowering(LEGACY_TARGET, api_version=2, backend_config=serialized_call)


def jax_triton_03_target(jax_triton) -> str:
    """The target our jax_triton 0.3 calls name: the typed call where the CUDA lowering
    registered now is :func:`route_jax_triton_03`'s wrapper, else the legacy call (a
    typed target reaching an unwrapped lowering would come out as an API-version-2 call
    that jaxlib has no handler for)."""
    rule = _cuda_lowering(jax_triton.triton_lib.triton_kernel_call_p)
    routed = getattr(rule, "_jax_decode_typed_ffi", False)
    return TYPED_FFI_TARGET if routed and typed_chosen() else LEGACY_TARGET


def _cuda_lowering(primitive):
    """The CUDA lowering rule registered for ``primitive`` now, or None (read from JAX's
    private registry: where that is not found, nothing is wrapped)."""
    from jax._src.interpreters import mlir as mlir_internal

    entry = getattr(mlir_internal, "_platform_specific_lowerings", {}).get("cuda", {}).get(primitive)
    return getattr(entry, "rule", entry)


def route_jax_triton_03(jax_triton) -> bool:
    """Make jax_triton 0.3's CUDA lowering emit the typed-FFI form for calls that name
    :data:`TYPED_FFI_TARGET` (see the module docstring).  The rule registered at the
    time is wrapped (jax_triton's own, or one a user put in its place), and every other
    call goes to it unchanged.  Returns whether the wrapper is in place; no-op for
    jax_triton 0.4 (which emits the typed call itself) and where jaxlib has no typed call."""
    lib = getattr(jax_triton, "triton_lib", None)
    primitive = getattr(lib, "triton_kernel_call_p", None)
    if primitive is None or not hasattr(lib, "get_cuda_backend") or not typed_ffi_registered():
        return False  # (get_cuda_backend: jax_triton 0.3's; 0.4 has no such function)
    current = _cuda_lowering(primitive)
    if current is None:
        return False
    if getattr(current, "_jax_decode_typed_ffi", False):
        return True
    from jax._src.lib.mlir import ir

    def typed_where_asked(ctx, *arrays, custom_call_target_name, **params):
        if custom_call_target_name != TYPED_FFI_TARGET:
            return current(ctx, *arrays, custom_call_target_name=custom_call_target_name, **params)
        # jax_triton compiles the kernel and emits the legacy call; the typed call
        # replaces it, taking the same operands and its serialized kernel call.
        legacy = current(ctx, *arrays, custom_call_target_name=LEGACY_TARGET, **params)
        op = legacy[0].owner
        op = getattr(op, "operation", op)
        serialized_call = ir.StringAttr(op.attributes["backend_config"]).value_bytes
        typed = _typed_call(serialized_call, dict(params["input_output_aliases"]))(ctx, *arrays)
        op.erase()
        return typed

    typed_where_asked._jax_decode_typed_ffi = True
    mlir.register_lowering(primitive, typed_where_asked, platform="cuda")
    return True
