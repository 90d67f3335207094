"""What a launch is planned from: the problem (shapes, dtypes, scalars) and the device.

Plain Python on ints and strings, frozen and hashable: ``jax.jit`` static arguments
and cache keys.  No framework or Triton import.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, NamedTuple

# How a cache's dequantisation scale is given (the kernels' K_SCALE / V_SCALE / SCALE).
SCALE_NONE, SCALE_PER_TENSOR, SCALE_PER_KV_HEAD = 0, 1, 2


class Fp8Format(NamedTuple):
    """An fp8 cache format: quantised writes saturate at ``largest`` (its largest finite
    value), round to ``mantissa_bits`` with exponent ``bias``, and store every NaN as
    ``nan_bits`` (the format's positive NaN, as ml_dtypes writes it)."""

    largest: float
    mantissa_bits: int
    bias: int
    nan_bits: int


FP8_FORMATS = {"float8_e4m3fn": Fp8Format(448.0, 3, 7, 0x7F), "float8_e5m2": Fp8Format(57344.0, 2, 15, 0x7E)}
NO_FP8 = Fp8Format(0.0, 0, 0, 0)  # the write kernel's constexprs for a 16/32-bit cache


def itemsize(dtype: str) -> int:
    """Bytes per element of a q or cache dtype name."""
    return 1 if dtype in FP8_FORMATS else 4 if dtype == "float32" else 2


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def prev_power_of_2(n: int) -> int:
    """The largest power of two <= n (n >= 1)."""
    return 1 << (n.bit_length() - 1)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """What the launch heuristics need to know about the device.

    ``vendor`` is ``"nvidia"``, ``"amd"`` or ``"cpu"`` (Triton's interpreter);
    ``compute_capability`` is e.g. 90 for sm_90 (None on the CPU); ``num_sms`` is the
    number of streaming multiprocessors (compute units; CPU cores for the interpreter);
    ``hopper_kernels``: the frontend can launch the Gluon sm_90 kernels here (this
    Triton has Gluon's Hopper API and, for JAX, jaxlib passes TMA descriptors), so the
    planner may choose them.
    """

    vendor: Literal["nvidia", "amd", "cpu"]
    compute_capability: int | None
    num_sms: int
    hopper_kernels: bool = False

    @classmethod
    def interpreter(cls) -> DeviceInfo:
        # A fixed stand-in, so interpreter launches (and the parity tests built on
        # them) do not depend on the host's core count.
        return cls(vendor="cpu", compute_capability=None, num_sms=4)


@dataclasses.dataclass(frozen=True)
class DecodeProblem:
    """Static description of one decode-attention call (shapes, dtypes, scalars)."""

    batch: int
    num_heads: int
    num_kv_heads: int
    head_dim_qk: int
    head_dim_v: int
    num_pages: int
    page_size: int
    max_pages: int
    dtype: str  # q, cache and output dtype name: "float16", "bfloat16", "float32"
    v_from_k: bool  # V is k_cache[..., :head_dim_v] (MLA): no separate V array
    sm_scale: float
    logit_cap: float
    kv_dtype: str | None = None  # cache dtype when it differs from q's (fp8)
    k_scale: int = SCALE_NONE  # SCALE_* mode of k_scale
    v_scale: int = SCALE_NONE  # SCALE_* mode of v_scale
    window_left: int = -1  # >= 0: attend to the last window_left + 1 tokens only
    has_sinks: bool = False  # per-head sink logits join the softmax denominator
    q_len: int = 1  # query tokens per row: the last q_len positions, causal among themselves
    token_axis: bool = False  # q, out and lse have a q_len axis after the batch (q was 4-D)

    @property
    def kv_group(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def rows_per_kv_head(self) -> int:
        """Query rows that share one KV head's tiles: (token, head) pairs."""
        return self.q_len * self.kv_group

    @property
    def out_shape(self) -> tuple[int, ...]:
        """``out``: [batch, (q_len,) num_heads, head_dim_v], as q has the token axis or not."""
        return (self.batch, *((self.q_len,) if self.token_axis else ()), self.num_heads, self.head_dim_v)

    @property
    def lse_shape(self) -> tuple[int, ...]:
        return self.out_shape[:-1]

    @property
    def capacity(self) -> int:
        """Most tokens one row can hold: max_pages * page_size."""
        return self.max_pages * self.page_size

    @property
    def cache_dtype(self) -> str:
        return self.kv_dtype or self.dtype

    @property
    def max_attended(self) -> int:
        """Most tokens one row attends to (and stage 1 reads): the capacity or the window."""
        return self.capacity if self.window_left < 0 else min(self.capacity, self.window_left + 1)
