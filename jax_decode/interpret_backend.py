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


def host_tensor(array: np.ndarray):
    import torch

    array = np.array(array)  # writable, contiguous copy owned by the callback
    if array.dtype.name == "bfloat16":  # NumPy has no bfloat16 torch knows of
        return torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def host_array(tensor, dtype: np.dtype) -> np.ndarray:
    import torch

    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(dtype)
    return tensor.numpy()


def decode_attention_interpret(q, k_cache, v_cache, page_table, seq_lens, config: LaunchConfig):
    """Returns (out, lse) computed by the interpreted kernels."""
    import torch

    from jax_decode.torch_launch import launch_decode

    p = config.problem
    out_type = jax.ShapeDtypeStruct((p.batch, p.num_heads, p.head_dim_v), q.dtype)
    lse_type = jax.ShapeDtypeStruct((p.batch, p.num_heads), jnp.float32)

    def host(q, k_cache, v_cache, page_table, seq_lens):
        q_t, k_t = host_tensor(q), host_tensor(k_cache)
        v_t = k_t if p.v_from_k else host_tensor(v_cache)
        out = torch.empty(out_type.shape, dtype=q_t.dtype)
        lse = torch.empty(lse_type.shape, dtype=torch.float32)
        mid_o = torch.empty(config.mid_o_shape, dtype=torch.float32)
        mid_lse = torch.empty(config.mid_lse_shape, dtype=torch.float32)
        launch_decode(
            config,
            q_t,
            k_t,
            v_t,
            host_tensor(page_table),
            host_tensor(seq_lens),
            mid_o,
            mid_lse,
            out,
            lse,
            interpret=True,
        )
        return host_array(out, out_type.dtype), lse.numpy()

    v_arg = k_cache if p.v_from_k else v_cache  # a placeholder operand for MLA
    return jax.pure_callback(host, (out_type, lse_type), q, k_cache, v_arg, page_table, seq_lens)
