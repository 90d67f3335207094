"""Launch configuration: plain Python on ints, shared by every frontend.

From a :class:`DecodeProblem` (shapes, dtypes, scalars) and a :class:`DeviceInfo` the
planner computes everything a launch needs -- kernel variant, block sizes, warps,
stages, number of KV splits, grids and the constexpr arguments -- so that the JAX
frontend, the torch frontend and the interpreter launch the very same kernels with
the very same parameters (and so give bit-identical results).

Nothing here imports a framework or Triton; the objects are frozen and hashable, so
they can be ``jax.jit`` static arguments and cache keys.
"""

from jax_decode.launch.config import (
    KernelLaunch,
    KernelStrides,
    LaunchConfig,
    TmaView,
    Variant,
    WriteProblem,
    write_cache_launch,
)
from jax_decode.launch.planner import (
    MAX_AUTO_KV_SPLITS,
    MAX_BATCH,
    MAX_KV_SPLITS,
    MIN_DOT_DIM,
    SPLIT_CHOICES,
    check_cache_dtype_on_device,
    choose_splits,
    default_sm_scale,
    hopper_mla_splits,
    make_launch_config,
    program_shape,
    shared_memory_budget,
    split_head_dim,
)
from jax_decode.launch.problem import (
    FP8_FORMATS,
    NO_FP8,
    SCALE_NONE,
    SCALE_PER_KV_HEAD,
    SCALE_PER_TENSOR,
    DecodeProblem,
    DeviceInfo,
    Fp8Format,
    cdiv,
    itemsize,
    next_power_of_2,
)

__all__ = [
    "FP8_FORMATS",
    "MAX_AUTO_KV_SPLITS",
    "SPLIT_CHOICES",
    "MAX_BATCH",
    "MAX_KV_SPLITS",
    "MIN_DOT_DIM",
    "NO_FP8",
    "SCALE_NONE",
    "SCALE_PER_KV_HEAD",
    "SCALE_PER_TENSOR",
    "DecodeProblem",
    "DeviceInfo",
    "Fp8Format",
    "KernelLaunch",
    "KernelStrides",
    "LaunchConfig",
    "TmaView",
    "Variant",
    "WriteProblem",
    "cdiv",
    "check_cache_dtype_on_device",
    "choose_splits",
    "default_sm_scale",
    "hopper_mla_splits",
    "itemsize",
    "make_launch_config",
    "program_shape",
    "next_power_of_2",
    "shared_memory_budget",
    "split_head_dim",
    "write_cache_launch",
]
