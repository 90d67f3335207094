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
    run_kernel_interpreted(kernel, launch.grid, args, num_warps=launch.num_warps, num_stages=launch.num_stages,
                           **launch.meta())  # fmt: skip


def run_kernel_interpreted(kernel, grid: tuple, args: tuple, **options) -> None:
    """Run the ``@triton.jit`` ``kernel`` on ``grid`` in the interpreter: ``args`` (CPU
    tensors and ints) and ``options`` (constexprs, warps, stages) as a launch takes them."""
    with interpreting():
        try:
            _interpreted(kernel.fn)[grid](*args, **options)
        except Exception as error:
            if _NUMPY_SCALAR_CONVERSION in str(error):
                raise RuntimeError(_incompatible_interpreter()) from error
            raise


# Older Triton interpreters turn a loaded loop bound into an int through a 1-element
# array, a conversion NumPy 2.4 removed (seen with Triton 3.6 and NumPy 2.4.6; NumPy
# 2.3.5 runs the same kernels).
_NUMPY_SCALAR_CONVERSION = "only 0-dimensional arrays can be converted to Python scalars"


def _incompatible_interpreter() -> str:
    import numpy
    import triton

    return (
        f"Triton {triton.__version__}'s interpreter cannot run these kernels with NumPy {numpy.__version__} "
        "(it converts 1-element arrays to ints, which NumPy 2.4 removed): install 'numpy<2.4' or a newer triton"
    )
