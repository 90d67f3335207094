"""jax_decode: Triton decode attention over a paged KV cache, for JAX and PyTorch."""

from jax_decode.api import decode_attention, merge_attention_states
from jax_decode.backends import BACKENDS
from jax_decode.backends.triton import compile_target
from jax_decode.kv_write import write_kv
from jax_decode.launch import DecodeProblem, DeviceInfo, KernelStrides, LaunchConfig, make_launch_config
from jax_decode.reference import decode_attention_reference
from jax_decode.sharding import ShardingError

__all__ = [
    "ShardingError",
    "BACKENDS",
    "DecodeProblem",
    "DeviceInfo",
    "KernelStrides",
    "LaunchConfig",
    "compile_target",
    "decode_attention",
    "decode_attention_reference",
    "make_launch_config",
    "merge_attention_states",
    "write_kv",
]
__version__ = "0.1.0"
