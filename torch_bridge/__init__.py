"""torch_bridge: jax_decode's kernels for PyTorch, and zero-copy tensors between torch and JAX."""

import os

try:
    import torch  # noqa: F401
except ImportError as error:
    raise ImportError(
        "torch_bridge needs PyTorch: `pip install 'jax-decode[torch]'` (on a CPU-only machine, the CPU build: "
        "`pip install torch --index-url https://download.pytorch.org/whl/cpu`)"
    ) from error

from torch_bridge.ops import (  # noqa: E402
    DecodeSchedule,
    decode_attention,
    decode_attention_fwd,
    decode_schedule,
    merge_attention_states,
    write_kv,
)

# An empty TRITON_CACHE_DIR (what jax_triton 0.3 leaves behind if it was imported
# before us) makes every Triton launch from torch fail; empty never means anything else.
if os.environ.get("TRITON_CACHE_DIR") == "":
    del os.environ["TRITON_CACHE_DIR"]


def __getattr__(name: str):
    """The DLPack bridge imports JAX, so it is imported on first use: ``import torch_bridge``
    alone does not import JAX."""
    if name in ("jax_function", "to_jax", "to_torch"):
        from torch_bridge import dlpack

        return getattr(dlpack, name)
    raise AttributeError(f"module 'torch_bridge' has no attribute {name!r}")


__all__ = [
    "DecodeSchedule",
    "decode_attention",
    "decode_attention_fwd",
    "decode_schedule",
    "jax_function",
    "merge_attention_states",
    "to_jax",
    "to_torch",
    "write_kv",
]
