"""The ``"interpret"`` backend: the Triton kernels run by Triton's interpreter on the host.

A ``jax.pure_callback`` hands the arrays to the host, where they become CPU torch
tensors (the interpreter addresses memory through ``data_ptr``) and run the very
launches a GPU would (:func:`jax_decode.interpreter.run_interpreted`).  Slow, exact,
and it needs torch: this is how the kernels themselves are tested on CPU-only machines.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_decode import operands
from jax_decode.interpreter import run_interpreted
from jax_decode.launch import LaunchConfig, WriteProblem, write_cache_launch

# ml_dtypes' types NumPy's torch bridge does not know, by the unsigned type of their width.
_BIT_VIEWS = {"bfloat16": np.uint16, "float8_e4m3fn": np.uint8, "float8_e5m2": np.uint8}


def require_torch():
    """torch, or an ImportError that says what to install."""
    try:
        import torch
    except ImportError as error:
        raise ImportError(
            "backend='interpret' runs the kernels in Triton's interpreter, which works on torch tensors: "
            "install PyTorch (`pip install 'jax-decode[torch]'`; on a CPU-only machine the CPU build, "
            "`pip install torch --index-url https://download.pytorch.org/whl/cpu`, avoids the CUDA libraries)"
        ) from error
    return torch


def host_tensor(array: np.ndarray):
    torch = require_torch()
    array = np.array(array)  # writable, contiguous copy owned by the callback
    if array.dtype.name in _BIT_VIEWS:
        bits = torch.from_numpy(array.view(_BIT_VIEWS[array.dtype.name]))
        return bits.view(getattr(torch, array.dtype.name))
    return torch.from_numpy(array)


def host_array(tensor, dtype: np.dtype) -> np.ndarray:
    torch = require_torch()
    dtype = np.dtype(dtype)
    if dtype.name in _BIT_VIEWS:
        return tensor.view(getattr(torch, "uint16" if dtype.itemsize == 2 else "uint8")).numpy().view(dtype)
    return tensor.numpy()


def _on_host(fn, result_types, ops):
    """``fn(host tensors as ops' NamedTuple)`` in a callback, on the given operands only."""
    given = [name for name, x in zip(ops._fields, ops, strict=True) if x is not None]

    def host(*arrays):
        tensors = dict(zip(given, map(host_tensor, arrays), strict=True))
        return fn(type(ops)(*(tensors.get(name) for name in ops._fields)))

    return jax.pure_callback(host, result_types, *(getattr(ops, name) for name in given))


def decode_attention(ops: operands.DecodeOperands, config: LaunchConfig):
    """Returns (out, lse) computed by the interpreted kernels."""
    torch = require_torch()
    p = config.problem
    out_type = jax.ShapeDtypeStruct(p.out_shape, ops.q.dtype)
    lse_type = jax.ShapeDtypeStruct(p.lse_shape, jnp.float32)
    strides = config.contiguous_strides()

    def host(t: operands.DecodeOperands):
        out = torch.empty(out_type.shape, dtype=t.q.dtype)
        lse = torch.empty(lse_type.shape, dtype=torch.float32)
        if config.portable_scheduled:
            schedule = torch.empty(config.schedule_shape, dtype=torch.int32)
            run_interpreted(config.schedule(), (*operands.schedule_inputs(t, p), schedule))
            mid_o = torch.empty(config.mid_o_shape, dtype=torch.float32)
            mid_lse = torch.empty(config.mid_lse_shape, dtype=torch.float32)
            run_interpreted(config.stage1(strides), (*operands.stage1_inputs(t, p, schedule), mid_o, mid_lse))
            merge_inputs = operands.schedule_merge_inputs(t, mid_o, mid_lse, schedule, out, lse)
            run_interpreted(config.schedule_merge(strides), (*merge_inputs, out, lse))
        elif config.one_pass:
            run_interpreted(config.stage1(strides), (*operands.stage1_inputs(t, p), out, lse))
        else:
            mid_o = torch.empty(config.mid_o_shape, dtype=torch.float32)
            mid_lse = torch.empty(config.mid_lse_shape, dtype=torch.float32)
            run_interpreted(config.stage1(strides), (*operands.stage1_inputs(t, p), mid_o, mid_lse))
            run_interpreted(config.stage2(strides), (*operands.stage2_inputs(t, mid_o, mid_lse), out, lse))
        return host_array(out, out_type.dtype), lse.numpy()

    return _on_host(host, (out_type, lse_type), ops)


def write_cache(ops: operands.WriteOperands, problem: WriteProblem):
    """The cache with this step's rows written by the interpreted write kernel."""
    require_torch()
    launch = write_cache_launch(problem, *problem.contiguous_strides(), interpreted=True)
    cache_type = jax.ShapeDtypeStruct(ops.cache.shape, ops.cache.dtype)

    def host(t: operands.WriteOperands):
        run_interpreted(launch, operands.write_inputs(t, problem, t.cache, t.cache))
        return host_array(t.cache, cache_type.dtype)

    return _on_host(host, cache_type, ops)
