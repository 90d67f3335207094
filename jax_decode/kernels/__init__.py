"""The Triton kernels, by the name the launch config gives them.

This package imports only ``triton``: the JAX frontend (through ``jax_triton``), the
PyTorch frontend and the interpreter all launch these very kernel objects, with the
arguments :mod:`jax_decode.operands` orders and :mod:`jax_decode.launch` computes.
"""

from jax_decode.kernels.decode import _decode_stage1, _decode_stage2
from jax_decode.kernels.schedule import _schedule_merge, _work_schedule
from jax_decode.kernels.write_cache import _write_cache

KERNELS = {
    "stage1": _decode_stage1,
    "stage2": _decode_stage2,
    "write_cache": _write_cache,
    "work_schedule": _work_schedule,
    "schedule_merge": _schedule_merge,
}
