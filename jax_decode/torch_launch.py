"""Launch the kernels on torch tensors: CUDA tensors compiled, CPU tensors interpreted.

Used by the ``"interpret"`` JAX backend (host arrays wrapped as CPU tensors) and by
``torch_bridge``.  Imports torch only when called, so ``jax_decode`` never needs it.
The launch parameters all come from :class:`jax_decode.launch.LaunchConfig`.
"""

from __future__ import annotations

import contextlib
import functools
import threading

from jax_decode import kernels
from jax_decode.launch import KernelLaunch, KernelStrides, LaunchConfig, stage1_scales

_INTERPRETER_LOCK = threading.Lock()


@functools.cache
def _interpreted(fn):
    from triton.runtime.interpreter import InterpretedFunction

    return InterpretedFunction(fn)


def _call_helper_interpreted(helper, *args, **kwargs):
    """Run a @triton.jit helper called from an interpreted kernel, interpreted too."""
    from triton.runtime.interpreter import _patch_lang

    scope = _patch_lang(helper.fn)
    try:
        return _interpreted(helper.fn).rewrite()(*args, **kwargs)
    finally:
        # InterpretedFunction.__call__ would leave triton.language patched for good,
        # and later compilations in this process would then fail; undo ours.
        if hasattr(scope, "restore"):
            scope.restore()


@contextlib.contextmanager
def _interpreting():
    """Run jitted helpers (ours and triton.language's, e.g. tl.sum) interpreted too.

    TRITON_INTERPRET is read when functions are decorated, long before we run; a
    kernel wrapped in InterpretedFunction still calls its @triton.jit helpers as
    JITFunctions, which refuse to run outside a compiled kernel.  For the duration of
    an interpreted launch (under a lock: the interpreter patches triton.language
    globally) a helper call is routed to the interpreted version of the same function.
    """
    from triton.runtime.jit import JITFunction

    with _INTERPRETER_LOCK:
        original = JITFunction.__call__
        JITFunction.__call__ = _call_helper_interpreted
        try:
            yield
        finally:
            JITFunction.__call__ = original


def _kernel(kernel_name: str):
    if kernel_name == "stage2":
        return kernels.STAGE2_KERNEL
    if kernel_name == "write_cache":
        return kernels.WRITE_CACHE_KERNEL
    return kernels.STAGE1_KERNELS[kernel_name]


class _StageLaunch:
    """One stage's launch on torch tensors, with its compiled kernels cached.

    The first launch on a device goes through ``JITFunction.run`` (which binds ~40
    arguments, specialises and compiles); later launches call the compiled kernel's
    launcher directly, which is most of the host time saved per call.  Triton's own
    cache key for these kernels varies only with what we key on: the constexprs and
    grid are fixed by (config, strides), dtypes and ``num_pages`` are in the config,
    and the one remaining specialisation is each pointer's 16-byte alignment.
    """

    def __init__(self, launch: KernelLaunch):
        self.kernel = _kernel(launch.kernel_name)
        self.grid = launch.grid
        self.options = dict(num_warps=launch.num_warps, num_stages=launch.num_stages, **launch.meta())
        meta = launch.meta()
        # Compiled launchers take every argument in signature order, constexprs included.
        names = self.kernel.arg_names
        self.num_runtime_args = len(names) - len(meta)
        self.constexpr_values = tuple(meta[name] for name in names[self.num_runtime_args :])
        self.runners: dict[tuple, object] = {}

    def run(self, args: tuple, interpret: bool) -> None:
        if interpret:
            with _interpreting():
                _interpreted(self.kernel.fn)[self.grid](*args, **self.options)
            return
        key = (args[0].get_device(), *(a.data_ptr() % 16 == 0 for a in args if hasattr(a, "data_ptr")))
        runner = self.runners.get(key)
        if runner is not None:
            runner(*args, *self.constexpr_values)
            return
        compiled = self.kernel[self.grid](*args, **self.options)
        if hasattr(compiled, "__getitem__"):  # a CompiledKernel; its runner takes all args
            self.runners[key] = compiled[self.grid]


_LAUNCHES: dict[tuple, tuple[_StageLaunch, _StageLaunch]] = {}


def _launches(config: LaunchConfig, strides: KernelStrides) -> tuple[_StageLaunch, _StageLaunch]:
    """Both stages' launches (launch_decode caches them, so a call only looks them up)."""
    return _StageLaunch(config.stage1(strides)), _StageLaunch(config.stage2(strides))


def strides_of(q, k, v, page_table, mid_o, mid_lse, out, lse) -> KernelStrides:
    """KernelStrides of torch tensors (their last dimensions must be contiguous)."""
    k_s, v_s, mo_s, ml_s = k.stride(), v.stride(), mid_o.stride(), mid_lse.stride()
    return KernelStrides(
        q=q.stride()[:2],
        k=k_s[:3],
        v=v_s[:3],
        page_table=page_table.stride(0),
        mid_o=mo_s[:3],
        mid_lse=ml_s[:3],
        out=out.stride()[:2],
        lse=lse.stride()[:2],
    )


def launch_decode(
    config: LaunchConfig, q, k, v, page_table, seq_lens, mid_o, mid_lse, out, lse, *,
    k_scale=None, v_scale=None, sinks=None, interpret: bool,
) -> None:  # fmt: skip
    """Run stage 1 and stage 2, writing ``out`` and ``lse`` (and the scratch) in place.

    ``v`` is the V cache, or ``k`` itself for MLA (V = k[..., :head_dim_v]); shapes
    and dtypes are the ones ``config`` was made for.  ``k_scale``/``v_scale`` float32
    ``[1]``/``[num_kv_heads]`` and ``sinks`` float32 ``[num_heads]`` are given exactly
    when the config says so.  Tensors live on one device.
    """
    if config.problem.batch == 0:
        return
    # Keyed on raw stride tuples: cheaper per call than building KernelStrides.
    key = (config, q.stride(), k.stride(), v.stride(), page_table.stride(), mid_o.stride(), mid_lse.stride(),
           out.stride(), lse.stride())  # fmt: skip
    stages = _LAUNCHES.get(key)
    if stages is None:
        stages = _LAUNCHES[key] = _launches(config, strides_of(q, k, v, page_table, mid_o, mid_lse, out, lse))
    stage1, stage2 = stages
    k_scale, v_scale = stage1_scales(k_scale, v_scale, seq_lens, config.problem.v_from_k)
    stage1.run((q, k, v, page_table, seq_lens, k_scale, v_scale, config.problem.num_pages, mid_o, mid_lse), interpret)
    stage2.run((mid_o, mid_lse, mid_lse if sinks is None else sinks, out, lse), interpret)


_WRITES: dict[KernelLaunch, _StageLaunch] = {}


def launch_write_cache(
    launch: KernelLaunch, new, slots, num_slots: int, cache, *, scale=None, interpret: bool
) -> None:  # fmt: skip
    """Scatter ``new`` rows into ``cache`` in place (see kernels._write_cache)."""
    if launch.grid[0] == 0:
        return
    stage = _WRITES.get(launch)
    if stage is None:
        stage = _WRITES[launch] = _StageLaunch(launch)
    stage.run((new, slots, slots if scale is None else scale, num_slots, cache, cache), interpret)
