"""Where a JAX call runs: one dispatch for decode_attention and write_kv.

* ``"triton"``: the Triton kernels inside the jitted program, through jax_triton
  (:mod:`jax_decode.backends.triton`); CUDA (and ROCm) GPUs.
* ``"xla"``: the same maths in plain JAX (:mod:`jax_decode.backends.xla`); any platform.
* ``"interpret"``: the Triton kernels run by Triton's interpreter on the host through a
  callback (:mod:`jax_decode.backends.interpret`); needs torch; for testing.
* ``"auto"``: triton on a GPU, xla elsewhere, chosen when the function is lowered for
  a platform, so one jitted function serves both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, TypeVar

import jax

from jax_decode.backends import triton as triton_backend
from jax_decode.launch import DeviceInfo

Backend = Literal["auto", "triton", "xla", "interpret"]
BACKENDS = ("auto", "triton", "xla", "interpret")

T = TypeVar("T")


def check_backend(backend: object) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")


def dispatch(
    backend: str,
    *,
    on_gpu: Callable[[DeviceInfo], T],
    on_xla: Callable[[], T],
    on_interpreter: Callable[[], T],
) -> T:
    """The result of the chosen backend's function (``on_gpu`` takes the target device)."""
    if backend == "xla":
        return on_xla()
    if backend == "interpret":
        return on_interpreter()
    device = triton_backend.target_device()
    unusable = triton_backend.why_unusable(device)
    if unusable is not None:
        if backend == "triton":
            raise ValueError(f"backend='triton' {unusable}")
        return on_xla()
    if backend == "triton":
        return on_gpu(device)
    # auto: both staged out; lowering keeps the one for its platform.
    return jax.lax.platform_dependent(cuda=lambda: on_gpu(device), rocm=lambda: on_gpu(device), default=on_xla)
