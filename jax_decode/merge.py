"""Merge two partial attention results by their log-sum-exp (cascade / shared-prefix decoding).

One definition of the maths, written against the operations JAX and torch share
(``where``, ``maximum``, ``exp``, ``log``), used by ``jax_decode.merge_attention_states``
and ``torch_bridge.merge_attention_states``.  Plain framework ops: XLA and torch fuse
this elementwise work into one or two kernels, which a Triton kernel would not beat.
"""

from __future__ import annotations

from types import ModuleType

from jax_decode.validation import SUPPORTED_DTYPES, check_arrays, dtype_name


def merge_states(xp: ModuleType, to_float32, out_a, lse_a, out_b, lse_b):
    """``(out, lse)`` of attention over the union of the keys of parts a and b.

    ``out_*`` are ``[..., head_dim_v]`` (normalised outputs of each part), ``lse_*``
    float32 ``[...]`` (natural log-sum-exp of each part's scores, ``-inf`` for a part
    with no keys).  An empty part contributes exactly nothing: merging with it returns
    the other part's output unchanged; two empty parts give zeros and ``-inf``.  A part
    whose LSE is NaN or ``+inf`` is no attention state: the merged output and LSE are
    NaN (never a silent "no keys").
    """
    peak = xp.maximum(lse_a, lse_b)  # NaN if either is NaN
    empty = peak == -float("inf")
    peak_safe = xp.where(empty, 0.0, peak)
    weight_a = xp.exp(lse_a - peak_safe)  # 0 for an empty part; NaN for a NaN or +inf one
    weight_b = xp.exp(lse_b - peak_safe)
    total = weight_a + weight_b
    total_safe = xp.where(empty, 1.0, total)
    # An empty part's out is never read: it may hold anything, NaN included.
    part_a = xp.where((lse_a == -float("inf"))[..., None], 0.0, to_float32(out_a) * weight_a[..., None])
    part_b = xp.where((lse_b == -float("inf"))[..., None], 0.0, to_float32(out_b) * weight_b[..., None])
    merged = (part_a + part_b) / total_safe[..., None]
    lse = xp.where(empty, -float("inf"), peak_safe + xp.log(total_safe))
    return merged, lse


def check_merge_args(out_a, lse_a, out_b, lse_b) -> None:
    """Floating dtypes; shapes must agree: out [..., head_dim_v], lse [...] (the leading
    dims of out)."""
    check_arrays(dict(out_a=out_a, lse_a=lse_a, out_b=out_b, lse_b=lse_b))
    for name, x in (("out_a", out_a), ("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b)):
        if dtype_name(x.dtype) not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} dtype must be one of {', '.join(SUPPORTED_DTYPES)}, got {dtype_name(x.dtype)}")
    if tuple(out_a.shape) != tuple(out_b.shape):
        raise ValueError(f"out_a shape {tuple(out_a.shape)} must equal out_b shape {tuple(out_b.shape)}")
    for name, lse in (("lse_a", lse_a), ("lse_b", lse_b)):
        if tuple(lse.shape) != tuple(out_a.shape[:-1]):
            raise ValueError(f"{name} shape {tuple(lse.shape)} must be out_a's leading shape {tuple(out_a.shape[:-1])}")
