"""jax_decode: Triton decode attention over a paged KV cache, for JAX and PyTorch.

The names below are imported when first used (PEP 562), so ``import jax_decode`` and
``python -m jax_decode --help`` do not import JAX, Triton or the kernels; the first
``jax_decode.decode_attention`` (or ``from jax_decode import decode_attention``) does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jax_decode.api import decode_attention, merge_attention_states
    from jax_decode.backends import BACKENDS
    from jax_decode.backends.triton import compile_target
    from jax_decode.kv_write import write_kv
    from jax_decode.launch import DecodeProblem, DeviceInfo, KernelStrides, LaunchConfig, make_launch_config
    from jax_decode.reference import decode_attention_reference
    from jax_decode.sharding import ShardingError

# Each public name and the module that defines it.
_EXPORTS = {
    "ShardingError": "jax_decode.sharding",
    "BACKENDS": "jax_decode.backends",
    "DecodeProblem": "jax_decode.launch",
    "DeviceInfo": "jax_decode.launch",
    "KernelStrides": "jax_decode.launch",
    "LaunchConfig": "jax_decode.launch",
    "compile_target": "jax_decode.backends.triton",
    "decode_attention": "jax_decode.api",
    "decode_attention_reference": "jax_decode.reference",
    "make_launch_config": "jax_decode.launch",
    "merge_attention_states": "jax_decode.api",
    "write_kv": "jax_decode.kv_write",
}
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


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:  # a submodule, e.g. jax_decode.launch after a bare `import jax_decode`
        try:
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
