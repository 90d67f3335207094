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
(:func:`typed_chosen`; e.g. to compare them, as ``benchmarks.host_overhead --jax`` does).

``JAX_DECODE_TRITON_CALL=graph`` asks for the typed call under a name of ours,
:data:`GRAPH_TARGET`: jaxlib's own handler (its stages as jaxlib registers them),
registered again with the trait that lets XLA trace a custom call into a command buffer
(a CUDA graph), which jaxlib's registration does not declare.  XLA then may replay a
jitted program's launches as one graph instead of launching each from the host.  The
handler can be traced: jaxlib loads the kernel in its initialize stage, before any
launch, so its execute stage only launches (one ``cuLaunchKernel``, fixed grid, no host
synchronisation).  It stays a choice until it is measured on a GPU.

Which call is emitted, per kernel line:

* Gluon kernels (:mod:`jax_decode.backends.gluon_call`) are lowered by us and emit it
  directly (:func:`lowering_rule`).
* Portable kernels go through ``jax_triton.triton_call``.  jax_triton 0.4 emits the
  typed call itself (:func:`route_jax_triton_04` renames our kernels' calls to
  :data:`GRAPH_TARGET` where that is chosen); for 0.3, whose lowering takes a
  custom-call target name but always writes API version 2, :func:`route_jax_triton_03`
  wraps that lowering so a call whose target is a typed one (only ours ask for those)
  comes out in the typed form: jax_triton compiles the kernel and serializes its call
  as ever, and the typed call takes that call (as ``opaque``), the same operands and
  aliases.  Calls naming any other target are left as jax_triton lowers them.
"""

from __future__ import annotations

import functools
import os

import jax
from jax.interpreters import mlir

TYPED_FFI_TARGET = "triton_kernel_call_ffi"
LEGACY_TARGET = "triton_kernel_call"
# jaxlib's typed handler under our name, declared command-buffer compatible (module docstring).
GRAPH_TARGET = "jax_decode_triton_call_ffi"
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
CALL_CHOICES = ("typed", "legacy", "graph")


def call_choice() -> str:
    """The environment variable ``JAX_DECODE_TRITON_CALL``: ``typed`` (the default),
    ``legacy`` or ``graph`` (see the module docstring).  Read when a program is
    lowered (a jitted function lowered before it changed keeps its calls)."""
    choice = os.environ.get(CALL_VARIABLE, "typed")
    if choice not in CALL_CHOICES:
        raise ValueError(f"{CALL_VARIABLE} must be one of {', '.join(map(repr, CALL_CHOICES))}, got {choice!r}")
    return choice


def typed_chosen() -> bool:
    """Whether our launches use the typed call (under jaxlib's name or ours): jaxlib has
    it and :func:`call_choice` is not ``legacy``.  Under jax_triton 0.4 the portable
    kernels are always typed: that is jax_triton's own choice."""
    return call_choice() != "legacy" and typed_ffi_registered()


@functools.cache
def _register_graph_target() -> None:
    """Register jaxlib's typed Triton handler again as :data:`GRAPH_TARGET`, with the
    command-buffer trait (once per process)."""
    from jax._src.lib import gpu_triton, xla_client

    stages = gpu_triton._cuda_triton.registrations()[TYPED_FFI_TARGET]
    jax.ffi.register_ffi_target(
        GRAPH_TARGET, stages, platform="CUDA", traits=xla_client.CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE
    )


def target() -> str:
    """The custom call our launches emit here (registering :data:`GRAPH_TARGET` first
    where it is chosen)."""
    if not typed_chosen():
        return LEGACY_TARGET
    if call_choice() == "graph":
        _register_graph_target()
        return GRAPH_TARGET
    return TYPED_FFI_TARGET


def _typed_call(name: str, serialized_call: bytes, operand_output_aliases=None):
    """A lowering rule launching ``serialized_call`` (a compressed ``TritonKernelCall``
    proto) through the typed-FFI handler registered as ``name``."""
    rule = jax.ffi.ffi_lowering(name, api_version=_TYPED_FFI_API_VERSION, operand_output_aliases=operand_output_aliases)
    return functools.partial(rule, opaque=serialized_call)


def lowering_rule(serialized_call: bytes):
    """A lowering rule launching ``serialized_call`` through :func:`target`."""
    name = target()
    if name == LEGACY_TARGET:
        return jax.ffi.ffi_lowering(LEGACY_TARGET, api_version=2, backend_config=serialized_call)
    return _typed_call(name, serialized_call)


def jax_triton_03_target(jax_triton) -> str:
    """The target our jax_triton 0.3 calls name: :func:`target` where the CUDA lowering
    registered now is :func:`route_jax_triton_03`'s wrapper, else the legacy call (a
    typed target reaching an unwrapped lowering would come out as an API-version-2 call
    that jaxlib has no handler for)."""
    rule = _cuda_lowering(jax_triton.triton_lib.triton_kernel_call_p)
    routed = getattr(rule, "_jax_decode_typed_ffi", False)
    return target() if routed else LEGACY_TARGET


def _cuda_lowering(primitive):
    """The CUDA lowering rule registered for ``primitive`` now, or None (read from JAX's
    private registry: where that is not found, nothing is wrapped)."""
    from jax._src.interpreters import mlir as mlir_internal

    entry = getattr(mlir_internal, "_platform_specific_lowerings", {}).get("cuda", {}).get(primitive)
    return getattr(entry, "rule", entry)


def _jax_tritons_lowering(jax_triton, line: str) -> tuple:
    """(jax_triton's primitive, the CUDA lowering registered for it now) where
    ``jax_triton`` is of ``line`` ("0.3" or "0.4"), else (None, None)."""
    lib = getattr(jax_triton, "triton_lib", None)
    primitive = getattr(lib, "triton_kernel_call_p", None)
    # (get_cuda_backend: jax_triton 0.3's; 0.4 has no such function)
    if primitive is None or hasattr(lib, "get_cuda_backend") != (line == "0.3"):
        return None, None
    return primitive, _cuda_lowering(primitive)


def route_jax_triton_03(jax_triton) -> bool:
    """Make jax_triton 0.3's CUDA lowering emit the typed-FFI form for calls that name
    :data:`TYPED_FFI_TARGET` (see the module docstring).  The rule registered at the
    time is wrapped (jax_triton's own, or one a user put in its place), and every other
    call goes to it unchanged.  Returns whether the wrapper is in place; no-op for
    jax_triton 0.4 (which emits the typed call itself) and where jaxlib has no typed call."""
    primitive, current = _jax_tritons_lowering(jax_triton, line="0.3")
    if current is None or not typed_ffi_registered():
        return False
    if getattr(current, "_jax_decode_typed_ffi", False):
        return True
    from jax._src.lib.mlir import ir

    def typed_where_asked(ctx, *arrays, custom_call_target_name, **params):
        if custom_call_target_name not in (TYPED_FFI_TARGET, GRAPH_TARGET):
            return current(ctx, *arrays, custom_call_target_name=custom_call_target_name, **params)
        # jax_triton compiles the kernel and emits the legacy call; the typed call
        # replaces it, taking the same operands and its serialized kernel call.
        legacy = current(ctx, *arrays, custom_call_target_name=LEGACY_TARGET, **params)
        op = legacy[0].owner
        op = getattr(op, "operation", op)
        serialized_call = ir.StringAttr(op.attributes["backend_config"]).value_bytes
        aliases = dict(params["input_output_aliases"])
        typed = _typed_call(custom_call_target_name, serialized_call, aliases)(ctx, *arrays)
        op.erase()
        return typed

    typed_where_asked._jax_decode_typed_ffi = True
    mlir.register_lowering(primitive, typed_where_asked, platform="cuda")
    return True


def route_jax_triton_04(jax_triton, ours) -> bool:
    """Under jax_triton 0.4, make the typed calls of kernels for which ``ours(kernel)``
    holds come out as :data:`GRAPH_TARGET` where :func:`call_choice` is ``graph``:
    the CUDA lowering registered now is wrapped, and the typed custom calls it adds for
    such a kernel are renamed (every other call is left as it lowers).  Returns whether
    the wrapper is in place; no-op for jax_triton 0.3 (:func:`route_jax_triton_03`)."""
    primitive, current = _jax_tritons_lowering(jax_triton, line="0.4")
    if current is None:
        return False
    if getattr(current, "_jax_decode_graph", False):
        return True
    from jax._src.lib.mlir import ir

    def graph_where_asked(ctx, *arrays, fn, **params):
        if not ours(fn) or call_choice() != "graph":
            return current(ctx, *arrays, fn=fn, **params)
        block = ir.InsertionPoint.current.block
        before = len(block.operations)
        results = current(ctx, *arrays, fn=fn, **params)
        name = target()
        for op in list(block.operations)[before:]:
            op = getattr(op, "operation", op)
            if op.name == "stablehlo.custom_call" and ir.StringAttr(op.attributes["call_target_name"]).value == (
                TYPED_FFI_TARGET
            ):
                op.attributes["call_target_name"] = ir.StringAttr.get(name)
        return results

    graph_where_asked._jax_decode_graph = True
    mlir.register_lowering(primitive, graph_where_asked, platform="cuda")
    return True
