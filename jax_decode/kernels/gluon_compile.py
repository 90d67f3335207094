"""Compile a Gluon launch for one GPU target: the one compiled kernel both frontends run.

Triton's JIT specialises a kernel on the arguments of each call; a Gluon launch of
ours is instead compiled once from what its :class:`~jax_decode.launch.KernelLaunch`
states (parameter types, TMA blocks, constexprs, warps), with every pointer taken as
16-byte aligned and no integer specialised.  The JAX frontend hands the result to
jaxlib's Triton custom call, the torch frontend launches it directly, so the two run
the same machine code.  Imports only ``triton``.
"""

from __future__ import annotations

import functools
import importlib
import os

# Gluon kernels by launch name: (module, function).  Imported on first use, as they
# need Gluon's Hopper API.
GLUON_KERNELS = {
    "mla_hopper": ("jax_decode.kernels.mla_hopper", "_mla_stage1_hopper"),
    "mla_hopper_scheduled": ("jax_decode.kernels.mla_hopper", "_mla_stage1_hopper_scheduled"),
    "mla_hopper_seesaw": ("jax_decode.kernels.mla_hopper", "_mla_stage1_hopper_seesaw"),
    "mla_hopper_seesaw_scheduled": ("jax_decode.kernels.mla_hopper", "_mla_stage1_hopper_seesaw_scheduled"),
    "mla_hopper_narrow": ("jax_decode.kernels.mla_narrow", "_mla_stage1_hopper_narrow"),
    "mla_hopper_narrow_scheduled": ("jax_decode.kernels.mla_narrow", "_mla_stage1_hopper_narrow_scheduled"),
    "gqa_hopper_fp8": ("jax_decode.kernels.gqa_hopper", "_gqa_stage1_hopper_fp8"),
}


@functools.cache
def gluon_hopper_missing() -> str | None:
    """Why this Triton cannot build the Gluon Hopper kernels, or None."""
    try:
        hopper = importlib.import_module("triton.experimental.gluon.language.nvidia.hopper")
        for name in ("warpgroup_mma", "warpgroup_mma_wait", "fence_async_shared"):
            getattr(hopper, name)
        hopper.tma.tensor_descriptor  # noqa: B018
        importlib.import_module("triton.experimental.gluon._runtime").GluonASTSource  # noqa: B018
        importlib.import_module("triton.experimental.gluon.nvidia.hopper").TensorDescriptor  # noqa: B018
        for module, _ in GLUON_KERNELS.values():
            importlib.import_module(module)
    except Exception as error:  # noqa: BLE001 - any failure to import means: not this Triton
        version = getattr(importlib.import_module("triton"), "__version__", "?")
        return f"Triton {version} lacks Gluon's Hopper API ({type(error).__name__}: {error})"
    return None


def hopper_kernels_usable() -> bool:
    """Whether a frontend may launch the Gluon Hopper kernels: this Triton builds them
    and ``JAX_DECODE_HOPPER_KERNELS=0`` (the portable kernels everywhere) is not set."""
    return os.environ.get("JAX_DECODE_HOPPER_KERNELS", "1") != "0" and gluon_hopper_missing() is None


def gluon_kernel(name: str):
    module, function = GLUON_KERNELS[name]
    return getattr(importlib.import_module(module), function)


@functools.cache
def tma_layout(block: tuple[int, int], dtype: str = "bf16"):
    """The shared-memory layout a TMA block of ``dtype`` elements (Triton's name: "bf16",
    "fp8e4nv") lands in (the widest swizzle the block allows)."""
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout.get_default_for(list(block), {"bf16": gl.bfloat16, "fp8e4nv": gl.float8e4nv}[dtype])


def signature(launch) -> dict[str, str]:
    """Triton's signature of ``launch``: runtime parameter types, then its constexprs."""
    sig, tma = {}, iter(launch.tma)
    for name, kind in launch.param_types:
        if kind == "tma":
            view = next(tma)
            block = ", ".join(map(str, view.block))
            sig[name] = f"tensordesc<{view.dtype}[{block}],{tma_layout(view.block, view.dtype)!r}>"
        else:
            sig[name] = kind
    sig.update({name: "constexpr" for name, _ in launch.constexprs})
    return sig


@functools.lru_cache(maxsize=256)
def compile_launch(launch, compute_capability: int, device_index: int | None = None):
    """``launch``'s kernel compiled for ``sm_<compute_capability>`` (a CompiledKernel;
    Triton's own cache keeps it across processes).  Needs no GPU.  A CompiledKernel
    loads its module on one device, the first it runs on: a launcher per device passes
    ``device_index`` for an object of its own."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.experimental.gluon._runtime import GluonASTSource

    target = GPUTarget("cuda", compute_capability, 32)
    aligned = make_backend(target).parse_attr("D")  # "divisible by 16", as Triton's JIT says it
    attrs = {(i,): aligned for i, (_, kind) in enumerate(launch.param_types) if kind.startswith("*")}
    source = GluonASTSource(gluon_kernel(launch.kernel_name), signature(launch), launch.meta(), attrs)
    options = dict(num_warps=launch.num_warps)
    if launch.max_registers:
        options["maxnreg"] = launch.max_registers
    return triton.compile(source, target=target, options=options)
