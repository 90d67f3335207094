"""Argument checking shared by every frontend.

Reads only shapes, dtype names and Python scalars, so the JAX and the torch frontend
give the same message for the same mistake.  Every message names the argument, the
rule and the values.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np

from jax_decode.launch import (
    FP8_FORMATS,
    MAX_BATCH,
    MAX_KV_SPLITS,
    SCALE_NONE,
    SCALE_PER_KV_HEAD,
    SCALE_PER_TENSOR,
    DecodeProblem,
    WriteProblem,
    default_sm_scale,
)
from jax_decode.operands import DecodeOperands, WriteOperands

SUPPORTED_DTYPES = ("float16", "bfloat16", "float32")
FP8_DTYPES = tuple(FP8_FORMATS)  # cache-only dtypes: float8_e4m3fn, float8_e5m2
INDEX_DTYPE = "int32"
MAX_HEAD_DIM = 1024
# Query tokens per row (speculative-decoding drafts, multi-token prediction).
MAX_Q_LEN = 16
# The kernels count a row's tokens in int32, with room for a block past the end.
MAX_TOKENS_PER_ROW = 2**30
INT32_MAX = 2**31 - 1
# CUDA's limit on a grid's second and third axes (stage 2 puts the heads on one).
MAX_GRID_AXIS = 65535
FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32: below it, flushed to 0 in places


def dtype_name(dtype: object) -> str:
    """'bfloat16' for jnp.bfloat16, np.dtype('bfloat16') and torch.bfloat16 alike."""
    name = getattr(dtype, "name", None)
    if isinstance(name, str):
        return name
    return str(dtype).removeprefix("torch.")


def _check_rank(name: str, shape: Sequence[int], rank: int, layout: str) -> None:
    if len(shape) != rank:
        raise ValueError(f"{name} must be {rank}-D {layout}, got shape {tuple(shape)}")


def _check_float_dtype(name: str, dtype: str) -> None:
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} dtype must be one of {', '.join(SUPPORTED_DTYPES)}, got {dtype}")


def _check_index_dtype(name: str, dtype: str) -> None:
    if dtype != INDEX_DTYPE:
        raise TypeError(f"{name} must be int32, got {dtype}; cast it with .astype(int32) / .to(torch.int32)")


def check_real_type(name: str, value: object) -> None:
    """A float option must be a real number (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a Python float, got {type(value).__name__}")


def check_int_type(name: str, value: object) -> None:
    """An int option (or None) must be an int (not a bool)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
        raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")


def type_name(value: object) -> str:
    """``str`` for a built-in type, ``numpy.bool`` for another (whose bare name can read
    like a built-in's)."""
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"


def check_flag(name: str, value: object) -> None:
    """A bool option must be a bool (a string would be truthy)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a Python bool, got {type_name(value)}")


def check_option_types(*, sm_scale: object, logit_cap: object, head_dim_v: object, window_left: object,
                       num_kv_splits: object) -> None:  # fmt: skip
    """The types of decode_attention's options (their values are checked with the shapes);
    what torch.compile checks while tracing, with the eager call's messages."""
    if sm_scale is not None:
        check_real_type("sm_scale", sm_scale)
    check_real_type("logit_cap", logit_cap)
    check_int_type("head_dim_v", head_dim_v)
    check_int_type("window_left", window_left)
    check_int_type("num_kv_splits", num_kv_splits)


def _check_scalar(name: str, value: object, *, allow_zero: bool) -> float:
    """A float option the kernels use in float32: finite and non-negative there (and
    > 0 unless ``allow_zero``), so it can neither overflow to inf nor flush to 0."""
    check_real_type(name, value)
    value = float(value)
    rule = ">= 0" if allow_zero else "> 0"
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be finite and {rule}, got {value}")
    if value > FLOAT32_MAX:
        raise ValueError(f"{name} must be finite and {rule} in float32, got {value}")
    if 0 < value < FLOAT32_TINY and not allow_zero:  # subnormal in float32: flushed to 0 in places
        raise ValueError(f"{name} must be finite and {rule} in float32 (at least {FLOAT32_TINY:.4g}), got {value}")
    return value


def _check_cache_dtype(name: str, dtype: str, q_dtype: str, q_name: str = "q") -> None:
    if dtype in FP8_DTYPES:
        return
    _check_float_dtype(name, dtype)
    if dtype != q_dtype:
        raise TypeError(
            f"{name} dtype ({dtype}) must equal {q_name} dtype ({q_dtype}) or be one of {', '.join(FP8_DTYPES)}"
        )


def is_float_scalar(name: str, value: object, *, scalar_ok: bool) -> bool:
    """Whether a scale / sinks operand is a real scalar (Python or NumPy, not bool),
    which both frontends turn into a float32 array; arrays are judged by their shape
    and dtype.  Sinks (``scalar_ok=False``) have one value per head: a scalar is refused."""
    if isinstance(value, bool) or (isinstance(value, numbers.Number) and not isinstance(value, numbers.Real)):
        raise TypeError(f"{name} must be a float or an array, got {type(value).__name__}")
    if not isinstance(value, numbers.Real):
        return False
    if not scalar_ok:
        raise TypeError(f"{name} must be an array of shape (num_heads,), got a {type(value).__name__}")
    return True


ANY_ARRAY = "an array (jax.Array or NumPy)"


def check_arrays(
    named: dict, *, optional: tuple[str, ...] = (), array_type: type | None = None, array_kind: str = ANY_ARRAY
) -> None:
    """TypeError naming an operand that is missing (None where required) or not an array
    (a list, a scalar); with ``array_type``, one not of that type (torch's frontend,
    whose ``array_kind`` is "a torch.Tensor")."""
    for name, value in named.items():
        if value is None:
            if name not in optional:
                raise TypeError(f"{name} must be an array, got None")
        elif array_type is not None and not isinstance(value, array_type):
            raise TypeError(f"{name} must be {array_kind}, got {type(value).__name__}")
        elif not (hasattr(value, "shape") and hasattr(value, "dtype")):
            raise TypeError(f"{name} must be {array_kind}, got {type(value).__name__}")


def check_scale_value(name: str, value: float) -> None:
    """A scale given as a number: finite and > 0 in float32 (a NaN, 0 or negative scale
    would silently turn every output into NaN, zeros or garbage)."""
    _check_scalar(name, value, allow_zero=False)


def check_scale(name: str, spec: tuple | None, num_kv_heads: int) -> int:
    """SCALE_* mode of a dequantisation scale given as (shape, dtype), or None."""
    if spec is None:
        return SCALE_NONE
    shape, dtype = tuple(spec[0]), dtype_name(spec[1])
    _check_float_dtype(name, dtype)
    if shape in ((), (1,)):
        return SCALE_PER_TENSOR
    if shape == (num_kv_heads,):
        return SCALE_PER_KV_HEAD
    raise ValueError(f"{name} must have shape () or (1,) (per tensor) or ({num_kv_heads},) (per KV head), got {shape}")


def check_window_left(window_left: object) -> int:
    """-1 for no window (None or -1), else the window's extent to the left (>= 0)."""
    if window_left is None:
        return -1
    check_int_type("window_left", window_left)
    if not -1 <= window_left <= INT32_MAX:
        raise ValueError(f"window_left must be in [0, {INT32_MAX}] (or -1 / None for no window), got {window_left}")
    return int(window_left)


def check_num_kv_splits(num_kv_splits: object, *, optional: bool = True) -> int | None:
    """``optional=False``: a signature where None is no choice (vLLM's, sized scratch)."""
    if num_kv_splits is None and optional:
        return None
    check_int_type("num_kv_splits", num_kv_splits)
    if not 1 <= num_kv_splits <= MAX_KV_SPLITS:
        or_none = " or None" if optional else ""
        raise ValueError(f"num_kv_splits must be in [1, {MAX_KV_SPLITS}]{or_none}, got {num_kv_splits}")
    return int(num_kv_splits)


def check_decode_args(
    operands: DecodeOperands,
    *,
    head_dim_v: int | None,
    sm_scale: float | None,
    logit_cap: float,
    window_left: object = None,
    names: DecodeOperands | None = None,
) -> DecodeProblem:
    """Validate the arguments of ``decode_attention``; return the static problem.

    ``operands`` holds each array's :class:`~jax_decode.operands.Spec` (shape and
    dtype), None where absent; ``names`` the operands' public names for the messages
    (default: decode_attention's; vLLM's drop-in calls K ``k_buffer``).
    """
    n = names or DecodeOperands("q", "k_cache", "v_cache", "page_table", "seq_lens", "k_scale", "v_scale", "sinks")
    q_shape, q_dtype = operands.q
    k_shape, k_dtype = operands.k_cache
    v_shape, v_dtype = (None, None) if operands.v_cache is None else operands.v_cache
    page_table_shape, page_table_dtype = operands.page_table
    seq_lens_shape, seq_lens_dtype = operands.seq_lens
    k_scale, v_scale, sinks = operands.k_scale, operands.v_scale, operands.sinks
    if len(q_shape) not in (3, 4):
        raise ValueError(
            f"{n.q} must be 3-D [batch, num_heads, head_dim_qk] or 4-D [batch, q_len, num_heads, head_dim_qk], "
            f"got shape {tuple(q_shape)}"
        )
    _check_rank(n.k_cache, k_shape, 4, "[num_pages, page_size, num_kv_heads, head_dim_qk]")
    if v_shape is not None:
        _check_rank(n.v_cache, v_shape, 4, "[num_pages, page_size, num_kv_heads, head_dim_v]")
    _check_rank(n.page_table, page_table_shape, 2, "[batch, max_pages]")
    _check_rank(n.seq_lens, seq_lens_shape, 1, "[batch]")

    q_dt, k_dt = dtype_name(q_dtype), dtype_name(k_dtype)
    _check_float_dtype(n.q, q_dt)
    _check_cache_dtype(n.k_cache, k_dt, q_dt, n.q)
    if v_shape is not None:
        v_dt = dtype_name(v_dtype)
        if v_dt != k_dt:
            raise TypeError(f"{n.v_cache} dtype ({v_dt}) must equal {n.k_cache} dtype ({k_dt})")
    _check_index_dtype(n.page_table, dtype_name(page_table_dtype))
    _check_index_dtype(n.seq_lens, dtype_name(seq_lens_dtype))

    token_axis = len(q_shape) == 4
    batch, q_len, num_heads, head_dim_qk = q_shape if token_axis else (q_shape[0], 1, *q_shape[1:])
    num_pages, page_size, num_kv_heads, k_head_dim = k_shape
    if batch > MAX_BATCH:
        raise ValueError(f"{n.q} batch ({batch}) must be at most {MAX_BATCH}; split the batch into several calls")
    if page_table_shape[0] != batch:
        raise ValueError(f"{n.page_table} batch ({page_table_shape[0]}) must equal {n.q} batch ({batch})")
    if seq_lens_shape[0] != batch:
        raise ValueError(f"{n.seq_lens} batch ({seq_lens_shape[0]}) must equal {n.q} batch ({batch})")
    if page_table_shape[1] * k_shape[1] > MAX_TOKENS_PER_ROW:
        raise ValueError(
            f"{n.page_table} width ({page_table_shape[1]}) x page_size ({k_shape[1]}) = "
            f"{page_table_shape[1] * k_shape[1]} tokens per row must be at most 2**30"
        )
    if num_pages < 1 or page_size < 1:
        raise ValueError(f"{n.k_cache} must hold at least one page of at least one slot, got shape {tuple(k_shape)}")
    if num_pages > INT32_MAX:
        raise ValueError(
            f"{n.k_cache} num_pages ({num_pages}) must be at most {INT32_MAX}: page ids are int32 "
            f"(got shape {tuple(k_shape)})"
        )
    if not 1 <= q_len <= MAX_Q_LEN:
        raise ValueError(f"{n.q} q_len ({q_len}) must be in [1, {MAX_Q_LEN}] (query tokens per row)")
    if num_heads < 1 or num_kv_heads < 1:
        raise ValueError(f"num_heads ({num_heads}) and num_kv_heads ({num_kv_heads}) must be >= 1")
    if num_heads > MAX_GRID_AXIS:
        raise ValueError(f"num_heads ({num_heads}) must be at most {MAX_GRID_AXIS} (a CUDA grid axis)")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if k_head_dim != head_dim_qk:
        raise ValueError(f"{n.k_cache} head_dim ({k_head_dim}) must equal {n.q} head_dim_qk ({head_dim_qk})")
    if not 1 <= head_dim_qk <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim_qk ({head_dim_qk}) must be in [1, {MAX_HEAD_DIM}]")

    check_int_type("head_dim_v", head_dim_v)
    if v_shape is None:
        if head_dim_v is None:
            raise ValueError(f"{n.v_cache}=None needs head_dim_v: V is then {n.k_cache}[..., :head_dim_v] (MLA)")
        if not 1 <= head_dim_v <= head_dim_qk:
            raise ValueError(
                f"head_dim_v ({head_dim_v}) must be in [1, head_dim_qk ({head_dim_qk})] when {n.v_cache} is None"
            )
    else:
        if tuple(v_shape[:3]) != tuple(k_shape[:3]):
            raise ValueError(
                f"{n.v_cache} shape {tuple(v_shape)} must match {n.k_cache} shape {tuple(k_shape)} "
                "in [num_pages, page_size, num_kv_heads]"
            )
        if head_dim_v is not None and head_dim_v != v_shape[3]:
            raise ValueError(f"head_dim_v ({head_dim_v}) must equal {n.v_cache} head_dim_v ({v_shape[3]}) or be None")
        head_dim_v = v_shape[3]
        if not 1 <= head_dim_v <= MAX_HEAD_DIM:
            raise ValueError(f"head_dim_v ({head_dim_v}) must be in [1, {MAX_HEAD_DIM}]")

    scale = default_sm_scale(head_dim_qk) if sm_scale is None else _check_scalar("sm_scale", sm_scale, allow_zero=False)
    cap = _check_scalar("logit_cap", logit_cap, allow_zero=True)
    if v_shape is None and v_scale is not None:
        raise ValueError(
            f"{n.v_scale} must be None when {n.v_cache} is None: V is {n.k_cache}'s latent, dequantised by {n.k_scale}"
        )
    k_scale_mode = check_scale(n.k_scale, k_scale, num_kv_heads)
    v_scale_mode = check_scale(n.v_scale, v_scale, num_kv_heads)
    if sinks is not None:
        _check_float_dtype(n.sinks, dtype_name(sinks[1]))
        if tuple(sinks[0]) != (num_heads,):
            raise ValueError(f"{n.sinks} must have shape (num_heads,) = ({num_heads},), got {tuple(sinks[0])}")
    return DecodeProblem(
        batch=int(batch),
        num_heads=int(num_heads),
        num_kv_heads=int(num_kv_heads),
        head_dim_qk=int(head_dim_qk),
        head_dim_v=int(head_dim_v),
        num_pages=int(num_pages),
        page_size=int(page_size),
        max_pages=int(page_table_shape[1]),
        dtype=q_dt,
        v_from_k=v_shape is None,
        sm_scale=scale,
        logit_cap=cap,
        kv_dtype=k_dt if k_dt != q_dt else None,
        k_scale=k_scale_mode,
        # MLA: V is K's latent, so it takes K's scale.
        v_scale=k_scale_mode if v_shape is None else v_scale_mode,
        window_left=check_window_left(window_left),
        has_sinks=sinks is not None,
        q_len=int(q_len),
        token_axis=token_axis,
    )


class BadIndexValues(ValueError):
    """A ``page_table`` / ``seq_lens`` value that ``check_inputs=True`` refuses."""


def check_index_values(
    page_table, seq_lens, *, num_pages: int, page_size: int, window_left: int = -1, q_len: int = 1
) -> None:
    """The checked mode's run-time rule, on host (NumPy) copies of the index arrays.

    Every ``seq_lens[b]`` must be in ``[0, max_pages * page_size]`` (``[q_len, ...]``
    with more than one query token per row), and every page
    that a row's attended tokens live on (``page_table[b, :ceil(seq_lens[b] / page_size)]``;
    with a window only the pages holding its last ``window_left + 1`` tokens) must be in
    ``[0, num_pages)``.  Entries past a row's length, or wholly before its window, are
    never read and may hold anything (-1 padding, stale or freed ids).  Raises
    :class:`BadIndexValues` (a ValueError) naming the first offender.
    """
    import numpy as np

    page_table, seq_lens = np.asarray(page_table), np.asarray(seq_lens)
    capacity = page_table.shape[1] * page_size
    for row in np.flatnonzero((seq_lens < 0) | (seq_lens > capacity))[:1]:
        raise BadIndexValues(
            f"seq_lens[{row}] = {seq_lens[row]} is outside [0, {capacity}] "
            f"(max_pages {page_table.shape[1]} * page_size {page_size})"
        )
    # (With one query token a row of length 0 is allowed: an empty row, e.g. padding.)
    for row in np.flatnonzero(seq_lens < q_len)[:1] if q_len > 1 else ():
        raise BadIndexValues(
            f"seq_lens[{row}] = {seq_lens[row]} is shorter than q_len ({q_len}): the row's {q_len} query tokens "
            "are its last positions, already in the cache"
        )
    lengths = seq_lens.astype(np.int64)
    pages_used = -(-lengths // page_size)  # [batch]
    # The first query token's window starts earliest.
    first = lengths - q_len - window_left
    first_page = np.zeros_like(lengths) if window_left < 0 else np.maximum(first, 0) // page_size
    columns = np.arange(page_table.shape[1])[None, :]
    used = (columns < pages_used[:, None]) & (columns >= first_page[:, None])
    bad = used & ((page_table < 0) | (page_table >= num_pages))
    for row, col in np.argwhere(bad)[:1]:
        raise BadIndexValues(
            f"page_table[{row}, {col}] = {page_table[row, col]} is outside [0, num_pages = {num_pages}) "
            f"but holds tokens of row {row} (seq_lens[{row}] = {seq_lens[row]})"
        )


def check_write_kv_args(k: WriteOperands, v: WriteOperands | None) -> tuple[WriteProblem, WriteProblem | None]:
    """Validate ``write_kv``'s arguments, each operand given as its :class:`Spec`.

    ``k`` is the K cache's operands, ``v`` the V cache's (None for MLA's single latent
    cache).  Returns each cache's :class:`WriteProblem`.  The cache layout is
    decode_attention's (fp8 included); new rows are ``[num_tokens, num_kv_heads,
    head_dim]`` in any supported float dtype (divided by the scale, cast to the cache's).
    """
    slot_mapping = k.slot_mapping
    _check_rank("slot_mapping", slot_mapping[0], 1, "[num_tokens]")
    _check_index_dtype("slot_mapping", dtype_name(slot_mapping[1]))
    num_tokens = slot_mapping[0][0]
    for cache_name, new_name, ops in (("k_cache", "k_new", k), ("v_cache", "v_new", v)):
        if ops is None:
            continue
        cache, new = ops.cache, ops.new
        _check_rank(cache_name, cache[0], 4, "[num_pages, page_size, num_kv_heads, head_dim]")
        _check_rank(new_name, new[0], 3, "[num_tokens, num_kv_heads, head_dim]")
        if dtype_name(cache[1]) not in FP8_DTYPES:
            _check_float_dtype(cache_name, dtype_name(cache[1]))
        _check_float_dtype(new_name, dtype_name(new[1]))
        if tuple(new[0][1:]) != tuple(cache[0][2:]):
            raise ValueError(
                f"{new_name} shape {tuple(new[0])} must be [num_tokens, num_kv_heads, head_dim] = "
                f"[{num_tokens}, {cache[0][2]}, {cache[0][3]}] to match {cache_name} {tuple(cache[0])}"
            )
        if new[0][0] != num_tokens:
            raise ValueError(f"{new_name} has {new[0][0]} tokens but slot_mapping has {num_tokens}")
    if v is not None and tuple(v.cache[0][:3]) != tuple(k.cache[0][:3]):
        raise ValueError(f"v_cache shape {tuple(v.cache[0])} must match k_cache shape {tuple(k.cache[0])} in its pages")
    num_pages, page_size, num_kv_heads, head_dim = k.cache[0]
    if num_pages * page_size > INT32_MAX:
        raise ValueError(
            f"k_cache holds num_pages * page_size = {num_pages * page_size} slots, more than slot_mapping's int32 "
            f"can address (at most {INT32_MAX}); got shape {tuple(k.cache[0])}"
        )
    if num_kv_heads > MAX_GRID_AXIS or num_tokens > INT32_MAX:
        raise ValueError(
            f"num_kv_heads ({num_kv_heads}) must be at most {MAX_GRID_AXIS} and num_tokens ({num_tokens}) at most "
            f"{INT32_MAX} (the write kernel's grid)"
        )
    problems = []
    for name, ops in (("k_scale", k), ("v_scale", v)):
        if ops is None:
            problems.append(None)
            continue
        mode = check_scale(name, ops.scale, num_kv_heads)
        problems.append(
            WriteProblem(
                num_tokens=int(num_tokens),
                num_kv_heads=int(num_kv_heads),
                head_dim=int(ops.cache[0][3]),
                page_size=int(page_size),
                num_pages=int(num_pages),
                cache_dtype=dtype_name(ops.cache[1]),
                scale=mode,
            )
        )
    return problems[0], problems[1]
