"""The ``"interpret"`` backend: the Triton kernels run by Triton's interpreter on the host.

A ``jax.pure_callback`` hands the arrays to the host, where they become CPU torch
tensors (the interpreter addresses memory through ``data_ptr``) and go through the same
launch as every other path.  Slow, exact, and it needs torch: this is how the kernels
themselves are tested on CPU-only machines.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_decode.launch import LaunchConfig

# ml_dtypes' types NumPy's torch bridge does not know, by the unsigned type of their width.
_BIT_VIEWS = {"bfloat16": np.uint16, "float8_e4m3fn": np.uint8, "float8_e5m2": np.uint8}


def host_tensor(array: np.ndarray):
    import torch

    array = np.array(array)  # writable, contiguous copy owned by the callback
    if array.dtype.name in _BIT_VIEWS:
        bits = torch.from_numpy(array.view(_BIT_VIEWS[array.dtype.name]))
        return bits.view(getattr(torch, array.dtype.name))
    return torch.from_numpy(array)


def host_array(tensor, dtype: np.dtype) -> np.ndarray:
    import torch

    dtype = np.dtype(dtype)
    if dtype.name in _BIT_VIEWS:
        return tensor.view(getattr(torch, "uint16" if dtype.itemsize == 2 else "uint8")).numpy().view(dtype)
    return tensor.numpy()


def decode_attention_interpret(
    q, k_cache, v_cache, page_table, seq_lens, k_scale, v_scale, sinks, config: LaunchConfig
):  # fmt: skip
    """Returns (out, lse) computed by the interpreted kernels."""
    import torch

    from jax_decode.torch_launch import launch_decode

    p = config.problem
    out_type = jax.ShapeDtypeStruct((p.batch, p.num_heads, p.head_dim_v), q.dtype)
    lse_type = jax.ShapeDtypeStruct((p.batch, p.num_heads), jnp.float32)
    operands = dict(q=q, k=k_cache, v=v_cache, page_table=page_table, seq_lens=seq_lens,
                    k_scale=k_scale, v_scale=v_scale, sinks=sinks)  # fmt: skip
    given = {name: x for name, x in operands.items() if x is not None}

    def host(*arrays):
        t = dict(zip(given, map(host_tensor, arrays), strict=True))
        out = torch.empty(out_type.shape, dtype=t["q"].dtype)
        lse = torch.empty(lse_type.shape, dtype=torch.float32)
        mid_o = torch.empty(config.mid_o_shape, dtype=torch.float32)
        mid_lse = torch.empty(config.mid_lse_shape, dtype=torch.float32)
        launch_decode(
            config, t["q"], t["k"], t["k"] if p.v_from_k else t["v"], t["page_table"], t["seq_lens"],
            mid_o, mid_lse, out, lse,
            k_scale=t.get("k_scale"), v_scale=t.get("v_scale"), sinks=t.get("sinks"), interpret=True,
        )  # fmt: skip
        return host_array(out, out_type.dtype), lse.numpy()

    return jax.pure_callback(host, (out_type, lse_type), *given.values())
