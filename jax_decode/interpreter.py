"""Run the kernels in Triton's interpreter, on the host.

Imports only ``triton``.  The interpreter addresses memory through ``data_ptr()``, so
its arrays are CPU torch tensors: the ``"interpret"`` JAX backend wraps host copies of
its arrays, and ``torch_bridge`` passes CPU tensors.  Both call :func:`run_interpreted`
with the launch the launch config computed, as a GPU launch would run it.
"""

from __future__ import annotations

import contextlib
import functools
import threading

from jax_decode.kernels import KERNELS
from jax_decode.launch import KernelLaunch

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
def interpreting():
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


def run_interpreted(launch: KernelLaunch, args: tuple) -> None:
    """Run ``launch`` on ``args`` (CPU tensors and ints, in the kernel's parameter order)."""
    kernel = KERNELS[launch.kernel_name]
    with interpreting():
        _interpreted(kernel.fn)[launch.grid](
            *args, num_warps=launch.num_warps, num_stages=launch.num_stages, **launch.meta()
        )
