"""From a call's arguments to what the kernels take: one path for every entry point.

Every entry point -- JAX's ``decode_attention`` and ``write_kv``, torch's eager calls,
the bodies of torch's custom ops under ``torch.compile``, and the vLLM drop-in --
runs :func:`prepare_decode` / :func:`prepare_write` on the arguments as given.  They
check them (types, the framework's own rules, shapes, dtypes, scalars), turn scales
given as numbers into arrays, and return the static problem with the operands as the
kernels read them (scales and sinks float32 and 1-D; MLA's V dropped, since V is then
K's latent and takes K's scale).  So one input gets one answer, whichever way it
arrives, and a rule lives here once.

Framework-free: what differs between JAX and torch (making a float32 array of a
number, casting, torch's device / stride / autograd rules) comes in a
:class:`Frontend`.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, Protocol

from jax_decode.launch import DecodeProblem, WriteProblem
from jax_decode.operands import DecodeOperands, WriteOperands, specs
from jax_decode.validation import (
    check_arrays,
    check_decode_args,
    check_num_kv_splits,
    check_scale_value,
    check_write_kv_args,
    is_float_scalar,
)


class DecodeOptions(NamedTuple):
    """decode_attention's static options, as given."""

    head_dim_v: int | None = None
    sm_scale: float | None = None
    logit_cap: float = 0.0
    window_left: int | None = None
    num_kv_splits: int | None = None


# The public name of each operand, for messages: decode_attention's (both frontends)
# and vLLM's decode_attention_fwd's.
DECODE_NAMES = DecodeOperands("q", "k_cache", "v_cache", "page_table", "seq_lens", "k_scale", "v_scale", "sinks")
VLLM_NAMES = DecodeOperands("q", "k_buffer", "v_buffer", "req_to_token", "b_seq_len", "k_scale", "v_scale", "sinks")
_OPTIONAL = ("v_cache", "k_scale", "v_scale", "sinks")


class Frontend(Protocol):
    """What a framework supplies to :func:`prepare_decode` and :func:`prepare_write`."""

    array_type: type | None  # arrays must be of this type (None: anything with shape and dtype)
    array_kind: str  # how messages call such an array, e.g. "a torch.Tensor"

    def scalar(self, value: float, like: Any) -> Any:
        """A float32 array holding ``value``, on ``like``'s device."""

    def float32(self, x: Any) -> Any:
        """``x`` as float32, 1-D (a scale of shape () becomes [1])."""

    def check(self, named: dict[str, Any]) -> None:
        """The framework's own rules for these arrays (all present), e.g. one device."""


def float_input(name: str, value: Any, frontend: Frontend, like: Any, *, scalar_ok: bool = True) -> Any:
    """A scale (or sinks) argument: None, an array (judged later by the shape checks),
    or -- where ``scalar_ok`` -- a real number, checked and made a float32 array."""
    if value is None:
        return None
    if is_float_scalar(name, value, scalar_ok=scalar_ok):
        check_scale_value(name, value)
        return frontend.scalar(float(value), like)
    if not _is_array(value, frontend):
        kinds = f"{frontend.array_kind}, a float or None" if scalar_ok else f"{frontend.array_kind} or None"
        raise TypeError(f"{name} must be {kinds}, got {type(value).__name__}")
    return value


def _is_array(value: Any, frontend: Frontend) -> bool:
    if frontend.array_type is not None:
        return isinstance(value, frontend.array_type)
    return hasattr(value, "shape") and hasattr(value, "dtype")


def _cached(fn):
    """``fn`` memoised on its (hashable) arguments: checks and plans are pure functions of
    shapes, dtypes and options, so a call with the same ones pays a dict lookup.  Typed,
    as True == 1 == 1.0 for a dict but not for the checks."""
    cached = functools.lru_cache(maxsize=4096, typed=True)(fn)

    @functools.wraps(fn)
    def call(*args):
        try:
            return cached(*args)
        except TypeError as error:  # an unhashable option: let the checks name it
            if "unhashable" not in str(error):
                raise
            return fn(*args)

    return call


def decode_problem(operand_specs: DecodeOperands, options: DecodeOptions, names: DecodeOperands) -> DecodeProblem:
    """The checked problem of these operand specs and options (cached)."""
    # The options flat, so that the cache tells their types apart (True is not 1 here).
    return _decode_problem(operand_specs, names, *options)


@_cached
def _decode_problem(operand_specs, names, head_dim_v, sm_scale, logit_cap, window_left, num_kv_splits):
    check_num_kv_splits(num_kv_splits)
    return check_decode_args(
        operand_specs,
        head_dim_v=head_dim_v,
        sm_scale=sm_scale,
        logit_cap=logit_cap,
        window_left=window_left,
        names=names,
    )


def prepare_decode(
    given: DecodeOperands, options: DecodeOptions, frontend: Frontend, names: DecodeOperands = DECODE_NAMES
) -> tuple[DecodeProblem, DecodeOperands]:
    """Check a decode call; return its problem and the operands the kernels read.

    ``given`` holds the arguments as the caller passed them (scales may be numbers;
    None where absent); ``names`` their public names, for messages.
    """
    check_arrays(
        {names.q: given.q, names.k_cache: given.k_cache, names.page_table: given.page_table,
         names.seq_lens: given.seq_lens, names.v_cache: given.v_cache},
        optional=(names.v_cache,), array_type=frontend.array_type, array_kind=frontend.array_kind,
    )  # fmt: skip
    ops = given._replace(
        k_scale=float_input(names.k_scale, given.k_scale, frontend, given.q),
        v_scale=float_input(names.v_scale, given.v_scale, frontend, given.q),
        sinks=float_input(names.sinks, given.sinks, frontend, given.q, scalar_ok=False),
    )
    frontend.check({name: x for name, x in zip(names, ops, strict=True) if x is not None})
    problem = decode_problem(specs(ops), options, names)
    return problem, kernel_operands(ops, problem, frontend)


def kernel_operands(ops: DecodeOperands, problem: DecodeProblem, frontend: Frontend) -> DecodeOperands:
    """Checked operands (scales as arrays) as the kernels read them: scales and sinks
    float32 and 1-D; no V array where V is K's latent (MLA)."""
    return DecodeOperands(
        ops.q,
        ops.k_cache,
        None if problem.v_from_k else ops.v_cache,
        ops.page_table,
        ops.seq_lens,
        None if ops.k_scale is None else frontend.float32(ops.k_scale),
        None if ops.v_scale is None else frontend.float32(ops.v_scale),
        None if ops.sinks is None else frontend.float32(ops.sinks),
    )


@_cached
def _write_problems(k_specs: WriteOperands, v_specs: WriteOperands | None):
    return check_write_kv_args(k_specs, v_specs)


def prepare_write(
    k_cache, v_cache, k_new, v_new, slot_mapping, k_scale, v_scale, frontend: Frontend
) -> tuple[tuple[WriteOperands, WriteProblem], tuple[WriteOperands, WriteProblem] | None]:
    """Check a write_kv call; return each cache's (kernel operands, problem), V's None
    for MLA's single latent cache."""
    named = dict(k_cache=k_cache, v_cache=v_cache, k_new=k_new, v_new=v_new, slot_mapping=slot_mapping)
    check_arrays(named, optional=("v_cache", "v_new"), array_type=frontend.array_type, array_kind=frontend.array_kind)
    if (v_cache is None) != (v_new is None):
        raise ValueError("v_cache and v_new must both be given or both be None (MLA: one latent cache)")
    if v_cache is None and v_scale is not None:
        raise ValueError("v_scale must be None when v_cache is None (MLA: one latent cache, scaled by k_scale)")
    k_scale = float_input("k_scale", k_scale, frontend, k_new)
    v_scale = float_input("v_scale", v_scale, frontend, k_new)
    named.update(k_scale=k_scale, v_scale=v_scale)
    frontend.check({name: x for name, x in named.items() if x is not None})
    k = WriteOperands(k_cache, k_new, slot_mapping, k_scale)
    v = None if v_cache is None else WriteOperands(v_cache, v_new, slot_mapping, v_scale)
    k_problem, v_problem = _write_problems(specs(k), None if v is None else specs(v))

    def kernel_operands(ops):
        return ops._replace(scale=None if ops.scale is None else frontend.float32(ops.scale))

    return (kernel_operands(k), k_problem), None if v is None else (kernel_operands(v), v_problem)
