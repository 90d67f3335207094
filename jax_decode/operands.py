"""The operands of decode attention and of the paged KV write, described once.

:class:`DecodeOperands` is what every frontend and backend passes around (JAX arrays,
torch tensors, or their ``(shape, dtype)`` specs for the argument checks), and the
``*_inputs`` functions put them in each kernel's parameter order -- with a placeholder
array where an optional operand is absent -- for jax_triton and torch alike.  A new
operand is added here, in the kernel, in the launch config and in the checks.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from jax_decode.launch import DecodeProblem, WriteProblem


class DecodeOperands(NamedTuple):
    """decode_attention's array operands (None: not given)."""

    q: Any  # [batch, num_heads, head_dim_qk]
    k_cache: Any  # [num_pages, page_size, num_kv_heads, head_dim_qk]
    v_cache: Any | None  # [num_pages, page_size, num_kv_heads, head_dim_v]; None: V is K's latent (MLA)
    page_table: Any  # int32 [batch, max_pages]
    seq_lens: Any  # int32 [batch]
    k_scale: Any | None = None  # float32 [1] or [num_kv_heads] (as the kernels read it)
    v_scale: Any | None = None
    sinks: Any | None = None  # float32 [num_heads]


# The operands with one entry per batch row: a jax.vmap axis folds into their batch.
ROW_OPERANDS = ("q", "page_table", "seq_lens")


class Spec(NamedTuple):
    """What the argument checks read of an array: its shape and dtype."""

    shape: tuple[int, ...]
    dtype: Any


def spec(x) -> Spec | None:
    return None if x is None else Spec(tuple(x.shape), x.dtype)


def specs(operands: NamedTuple):
    """The same NamedTuple with each array replaced by its :class:`Spec`."""
    return type(operands)(*map(spec, operands))


def stage1_inputs(ops: DecodeOperands, problem: DecodeProblem, schedule=None) -> tuple:
    """The stage-1 kernel's inputs in parameter order (its two outputs follow).

    MLA (``problem.v_from_k``): V is read through K's pointer and takes K's scale.  An
    absent scale, or an absent ``schedule`` (the device-side schedule's, for a config
    with ``schedule_programs``), is replaced by ``seq_lens``, which the kernel then does
    not read.
    """
    v_cache = ops.k_cache if problem.v_from_k else ops.v_cache
    return (
        ops.q,
        ops.k_cache,
        v_cache,
        ops.page_table,
        ops.seq_lens,
        *_scale_inputs(ops, problem),
        ops.seq_lens if schedule is None else schedule,
        problem.num_pages,
    )


def _scale_inputs(ops: DecodeOperands, problem: DecodeProblem) -> tuple:
    """A stage 1's K and V scale pointers: MLA's V (K's first columns) takes K's scale;
    ``seq_lens`` stands in for an absent scale, which the kernel then does not read."""
    v_scale = ops.k_scale if problem.v_from_k else ops.v_scale
    return tuple(ops.seq_lens if scale is None else scale for scale in (ops.k_scale, v_scale))


def hopper_stage1_inputs(ops: DecodeOperands, problem: DecodeProblem, schedule=None, q_pointer: bool = False) -> tuple:
    """A Gluon stage 1's inputs after its TMA descriptors (which ``launch.tma`` builds over
    the operands it names); its two outputs follow.  The MLA seesaw kernels take q by
    TMA; with ``q_pointer`` (``LaunchConfig.hopper_q_pointer``: the GQA kernel and the
    narrow-group MLA kernel) it comes through a pointer.  ``schedule``: the device-side
    schedule's (for a config with ``schedule_programs``)."""
    inputs = (*((ops.q,) if q_pointer else ()), ops.page_table, ops.seq_lens, *_scale_inputs(ops, problem))
    if schedule is None:
        return (*inputs, problem.num_pages)
    return (*inputs, schedule, problem.num_pages, problem.batch)


def schedule_inputs(ops: DecodeOperands, problem: DecodeProblem) -> tuple:
    """The device-side schedule kernel's inputs (the int32 schedule follows)."""
    return (ops.seq_lens, problem.batch)


def schedule_merge_inputs(ops: DecodeOperands, mid_o, mid_lse, schedule, out_in, lse_in) -> tuple:
    """The scheduled chunks' merge's inputs (``out`` and ``lse`` follow).  ``out_in``,
    ``lse_in``: ``out`` and ``lse`` as stage 1 left them (the rows it wrote itself; the
    same buffers, which jax_triton 0.3 aliases to the outputs), or any array where the
    frontend passes ``out`` and ``lse`` in place; the kernel never reads them.
    ``mid_lse`` stands in for absent sinks."""
    return (mid_o, mid_lse, schedule, mid_lse if ops.sinks is None else ops.sinks, out_in, lse_in)


def stage2_inputs(ops: DecodeOperands, mid_o, mid_lse) -> tuple:
    """The stage-2 kernel's inputs (``out`` and ``lse`` follow); ``mid_lse`` stands in
    for absent sinks."""
    return (mid_o, mid_lse, mid_lse if ops.sinks is None else ops.sinks)


class WriteOperands(NamedTuple):
    """One cache's write_kv operands."""

    cache: Any  # [num_pages, page_size, num_kv_heads, head_dim]
    new: Any  # [num_tokens, num_kv_heads, head_dim]
    slot_mapping: Any  # int32 [num_tokens]
    scale: Any | None = None  # float32 [1] or [num_kv_heads]


def write_inputs(ops: WriteOperands, problem: WriteProblem, *caches) -> tuple:
    """The write kernel's inputs in parameter order: new rows, slots, scale (``slots``
    when absent), the slot count, then ``caches``: the cache as an input (which
    jax_triton 0.3 aliases to the output, and the kernel never reads) and, where the
    caller passes it rather than receiving it as an output, the cache written."""
    scale = ops.slot_mapping if ops.scale is None else ops.scale
    return (ops.new, ops.slot_mapping, scale, problem.num_slots, *caches)
