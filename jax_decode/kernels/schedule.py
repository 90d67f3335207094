"""A work schedule computed on the device, and the merge that goes with it.

Imports only ``triton``; portable ``tl`` kernels (the interpreter runs them too).

With a fixed number of KV splits every batch row gets the same number of programs,
so one long row in a batch of short ones runs alone on a few SMs while the rest
idle, and the split count the planner picks without seeing the lengths is a hedge
between that batch and a uniform one.  Instead, a stage 1 (the portable
``_decode_stage1`` with ``SCHEDULED``, and the Gluon MLA stage 1) can run
``NUM_PROGRAMS`` programs per head block that share the batch's work equally, cut
from the prefix sum of ``seq_lens`` (FlashMLA's tile scheduler, LeanAttention's
stream-K):

* row ``b`` costs ``CHUNK_COST + tiles_b`` units, ``tiles_b`` the ``BLOCK_N``-token
  tiles of the positions its query tokens attend to (:func:`attended_tiles`: from the
  window's first position, or 0, to ``len_b`` clamped to ``[0, CAPACITY]``); ``CHUNK_COST`` is the fixed cost of
  starting a row (loading Q, filling the pipeline, writing a partial result) in tiles.
  Laid end to end the rows occupy positions ``[S_b, S_b + cost_b)`` of
  ``[0, total)``, ``S_b`` the exclusive prefix sum; the row's tiles are its positions
  from ``S_b + CHUNK_COST`` on.
* the first ``A = min(NUM_PROGRAMS, total)`` programs share the positions (the rest,
  where there are fewer positions than programs, take none): program ``p`` takes
  ``[lo_p, lo_{p+1})``, ``lo_p = min(p, A) * total // A`` (exact shares, not a
  rounded-up width: with ``k`` programs to each of a uniform batch's rows, the shares
  end where the rows do), so position ``x`` is program ``prog(x) = ((x + 1) * A - 1)
  // total``'s.  Row ``b`` goes to
  programs ``first_p(b) = prog(S_b + CHUNK_COST)`` (the one holding its first tile; for
  a row with no tile, the one holding its last position) to ``last_p(b) = prog(S_b +
  cost_b - 1)``: each of them attends to a *chunk* of it, the row's tiles whose
  positions fall in its range.  A program whose range holds only a row's start-up
  units leaves the row to the next, so no chunk is empty but a row's with no tile:
  an empty chunk would cost a start-up for nothing.  Chunk ``(p, b)``'s normalised
  output and LSE go to slot ``b + p`` of the partial buffers (unique: programs take
  rows in order), ``batch + NUM_PROGRAMS`` slots in all.
* :func:`_schedule_merge` merges row ``b``'s slots ``b + first_p(b) .. b + last_p(b)``.
  With ``SKIP_WHOLE`` it leaves alone the rows of one chunk (``first_p(b) ==
  last_p(b)``), which the stage 1 that runs with it wrote to ``out`` and ``lse``
  itself: a uniform batch whose rows fall into the shares whole needs no merge.

:func:`_work_schedule` writes, as int32 (``1 + 2 * NUM_PROGRAMS + 3 * batch`` of them):
``total``; for each program its first row (the number of rows whose last program is
before it); for each program one past its last row (the number of rows whose first
program is at most it); for each row the triple ``S_b``, ``n_b = last_p(b) - first_p(b)
+ 1`` (its number of chunks: one place decides which rows stage 1 writes whole and the
merge skips), ``first_p(b)``.  (A program's loop holds only its row: everything else is
read back per chunk, as registers are what the Gluon kernel has least of.)  The launch
config keeps ``batch * (CHUNK_COST + cdiv(CAPACITY, BLOCK_N))`` below 2**31; products
of positions and program counts are int64.
"""

from __future__ import annotations

import triton
import triton.language as tl

from jax_decode.kernels.common import split_bounds, store_merged


@triton.jit
def attended_tiles(seq_len, BLOCK_N: tl.constexpr, WINDOW_LEFT: tl.constexpr, Q_LEN: tl.constexpr):
    """The first position a row's query tokens attend to and the number of ``BLOCK_N``
    tiles from there to ``seq_len`` (already clamped): one split's bounds."""
    first, end = split_bounds(seq_len, 0, 1, BLOCK_N, WINDOW_LEFT, Q_LEN)
    return first, tl.cdiv(end - first, BLOCK_N)


@triton.jit
def program_positions(schedule_ptr, program, NUM_PROGRAMS: tl.constexpr):
    """Positions ``[lo, hi)`` of the schedule that ``program`` takes (int32)."""
    total = tl.load(schedule_ptr).to(tl.int64)
    active = tl.maximum(tl.minimum(total, NUM_PROGRAMS), 1)  # the programs that take positions
    lo = (tl.minimum(program.to(tl.int64), active) * total) // active
    hi = (tl.minimum(program.to(tl.int64) + 1, active) * total) // active
    return lo.to(tl.int32), hi.to(tl.int32)


@triton.jit
def chunk_bounds(schedule_ptr, row, program, seq_len, NUM_PROGRAMS: tl.constexpr, CHUNK_COST: tl.constexpr,
                 BLOCK_N: tl.constexpr, WINDOW_LEFT: tl.constexpr, Q_LEN: tl.constexpr):  # fmt: skip
    """Positions ``[start, end)`` of ``row`` (its length ``seq_len``, clamped) that
    ``program``'s share of the work holds: the tiles whose positions fall in its
    range, after the row's start-up units."""
    first, tiles = attended_tiles(seq_len, BLOCK_N, WINDOW_LEFT, Q_LEN)
    lo, hi = program_positions(schedule_ptr, program, NUM_PROGRAMS)
    row_tiles = tl.load(schedule_ptr + 1 + 2 * NUM_PROGRAMS + 3 * row) + CHUNK_COST  # S_b + CHUNK_COST
    tile_lo = tl.minimum(tl.maximum(lo - row_tiles, 0), tiles)
    tile_hi = tl.minimum(tl.maximum(hi - row_tiles, 0), tiles)
    return first + tile_lo * BLOCK_N, tl.minimum(first + tile_hi * BLOCK_N, seq_len)


@triton.jit
def _program_of(position, total, active):
    """The program whose positions hold ``position`` (< total, both int64), of the first
    ``active`` that share them."""
    return (((position.to(tl.int64) + 1) * active - 1) // total).to(tl.int32)


@triton.jit
def _row_costs(seq_lens_ptr, rows, batch, CAPACITY: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK_COST: tl.constexpr,
               WINDOW_LEFT: tl.constexpr, Q_LEN: tl.constexpr):  # fmt: skip
    """Units of work of ``rows`` (0 past the batch)."""
    lens = tl.load(seq_lens_ptr + rows, mask=rows < batch, other=0)
    _, tiles = attended_tiles(tl.minimum(tl.maximum(lens, 0), CAPACITY), BLOCK_N, WINDOW_LEFT, Q_LEN)
    return tl.where(rows < batch, CHUNK_COST + tiles, 0)


@triton.jit
def _work_schedule(
    seq_lens_ptr,  # int32 [batch]
    batch,  # int
    schedule_ptr,  # int32 [1 + 2 * NUM_PROGRAMS + 3 * batch], written
    CAPACITY: tl.constexpr,  # max_pages * page_size
    BLOCK_N: tl.constexpr,  # tokens per tile
    CHUNK_COST: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
    WINDOW_LEFT: tl.constexpr,  # as stage 1's: the tiles a row's query tokens attend to
    Q_LEN: tl.constexpr,
    BLOCK_B: tl.constexpr,  # rows per step (the whole batch in one step, up to 1024 rows)
    BLOCK_P: tl.constexpr,  # next_power_of_2(NUM_PROGRAMS + 2): the histograms' bins
):
    """The schedule of the module docstring; one program."""
    offs_b = tl.arange(0, BLOCK_B)
    row_info = schedule_ptr + 1 + 2 * NUM_PROGRAMS  # (S_b, n_b, first_p(b)) triples
    total = tl.sum(tl.zeros([BLOCK_B], dtype=tl.int32), 0)
    for b0 in range(0, batch, BLOCK_B):
        rows = b0 + offs_b
        cost = _row_costs(seq_lens_ptr, rows, batch, CAPACITY, BLOCK_N, CHUNK_COST, WINDOW_LEFT, Q_LEN)
        tl.store(row_info + 3 * rows, total + tl.cumsum(cost, 0) - cost, mask=rows < batch)
        total += tl.sum(cost, 0)
    tl.store(schedule_ptr, total)
    total64 = tl.maximum(total, 1).to(tl.int64)
    # With fewer positions than programs, a program past them would take an empty share
    # and, between a row's first and last programs, an empty chunk.
    active = tl.minimum(total64, NUM_PROGRAMS)

    # Each program's rows: from the first whose last program is not before it to the
    # last whose first program is not after it, so the counts are prefix sums of two
    # histograms over programs.  (The row starts are recomputed rather than read back:
    # other threads wrote them.)
    starts = tl.sum(tl.zeros([BLOCK_B], dtype=tl.int32), 0)
    ended = tl.zeros([BLOCK_P], dtype=tl.int32)
    started = tl.zeros([BLOCK_P], dtype=tl.int32)
    for b0 in range(0, batch, BLOCK_B):
        rows = b0 + offs_b
        in_batch = rows < batch
        cost = _row_costs(seq_lens_ptr, rows, batch, CAPACITY, BLOCK_N, CHUNK_COST, WINDOW_LEFT, Q_LEN)
        row_start = starts + tl.cumsum(cost, 0) - cost
        first_p = _program_of(row_start + tl.minimum(cost - 1, CHUNK_COST), total64, active)
        last_p = _program_of(row_start + cost - 1, total64, active)
        tl.store(row_info + 3 * rows + 1, last_p - first_p + 1, mask=in_batch)
        tl.store(row_info + 3 * rows + 2, first_p, mask=in_batch)
        # Bins run to NUM_PROGRAMS; rows past the batch go to the last bin, past it.
        ended += tl.histogram(tl.where(in_batch, last_p + 1, BLOCK_P - 1), BLOCK_P)
        started += tl.histogram(tl.where(in_batch, first_p, BLOCK_P - 1), BLOCK_P)
        starts += tl.sum(cost, 0)
    offs_p = tl.arange(0, BLOCK_P)
    mask_p = offs_p < NUM_PROGRAMS
    tl.store(schedule_ptr + 1 + offs_p, tl.cumsum(ended, 0), mask=mask_p)
    tl.store(schedule_ptr + 1 + NUM_PROGRAMS + offs_p, tl.cumsum(started, 0), mask=mask_p)


@triton.jit
def _schedule_merge(
    mid_o_ptr,  # f32 [batch + NUM_PROGRAMS, (q_len,) num_heads, head_dim_v]: chunk partials by slot
    mid_lse_ptr,  # f32 [batch + NUM_PROGRAMS, (q_len,) num_heads]
    schedule_ptr,  # int32, from _work_schedule
    sinks_ptr,  # f32 [num_heads]: per-head sink logits (read if HAS_SINKS)
    out_in_ptr,  # out and lse as inputs (see jax_decode.operands.schedule_merge_inputs): never read
    lse_in_ptr,
    out_ptr,  # [batch, (q_len,) num_heads, head_dim_v], q's dtype
    lse_ptr,  # f32 [batch, (q_len,) num_heads], natural log
    STRIDE_MOS: tl.constexpr,
    STRIDE_MOT: tl.constexpr,
    STRIDE_MOH: tl.constexpr,
    STRIDE_MLS: tl.constexpr,
    STRIDE_MLT: tl.constexpr,
    STRIDE_MLH: tl.constexpr,
    STRIDE_OB: tl.constexpr,
    STRIDE_OT: tl.constexpr,
    STRIDE_OH: tl.constexpr,
    STRIDE_LB: tl.constexpr,
    STRIDE_LT: tl.constexpr,
    STRIDE_LH: tl.constexpr,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_HM: tl.constexpr,  # heads per program
    BLOCK_DV: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    ROUND_BY_BITS: tl.constexpr,
    SKIP_WHOLE: tl.constexpr,  # rows of one chunk are stage 1's to write
    BLOCK_C: tl.constexpr,  # chunks loaded at once
):
    """Merge the chunks of one batch row's block of ``BLOCK_HM`` heads of query token
    ``program_id(2)`` by log-sum-exp, as ``_decode_stage2`` merges splits (sinks
    included); chunks with no token weigh 0, a row with none gets zeros and -inf (or
    its sink's LSE).  (A block of heads per program, not one head: with ``SKIP_WHOLE``
    most programs of a uniform batch find only that there is nothing to do, and fewer
    programs find it sooner.)

    The chunks come ``BLOCK_C`` at a time, their LSEs and outputs in one round of loads,
    merged online (the running maximum rescales what is merged so far): a row may have
    as many chunks as there are programs, but most have two or three, and for those the
    merge is one round trip to memory, not one per chunk and pass."""
    batch_idx = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_HM + tl.arange(0, BLOCK_HM)
    tok = tl.program_id(2)  # (the token strides are 0 with one query token)
    mask_h = heads < NUM_HEADS
    row_info = schedule_ptr + 1 + 2 * NUM_PROGRAMS + 3 * batch_idx
    count = tl.load(row_info + 1)
    merges = count > 0  # every row has a chunk
    if SKIP_WHOLE:
        merges = count > 1
    if merges:
        slot = batch_idx + tl.load(row_info + 2)  # b + first_p(b)
        offs_c = tl.arange(0, BLOCK_C)
        offs_dv = tl.arange(0, BLOCK_DV)
        mask_dv = offs_dv < HEAD_DIM_V
        lse_rows = mid_lse_ptr + slot * STRIDE_MLS + tok * STRIDE_MLT + heads * STRIDE_MLH  # [BLOCK_HM]
        o_rows = mid_o_ptr + slot * STRIDE_MOS + tok * STRIDE_MOT + heads[:, None] * STRIDE_MOH + offs_dv[None, :]
        mask_o = mask_h[:, None] & mask_dv[None, :]
        if HAS_SINKS:
            m = tl.load(sinks_ptr + heads, mask=mask_h, other=float("-inf"))
            denom = tl.where(m == float("-inf"), 0.0, 1.0)  # the sink's weight exp(sink - m)
        else:
            m = tl.full([BLOCK_HM], float("-inf"), dtype=tl.float32)
            denom = tl.zeros([BLOCK_HM], dtype=tl.float32)
        acc = tl.zeros([BLOCK_HM, BLOCK_DV], dtype=tl.float32)
        for c0 in range(0, count, BLOCK_C):
            mask_c = (c0 + offs_c) < count
            lse = tl.load(lse_rows[None, :] + (c0 + offs_c)[:, None] * STRIDE_MLS,
                          mask=mask_c[:, None] & mask_h[None, :], other=float("-inf"))  # fmt: skip
            o = tl.load(o_rows[None, :, :] + (c0 + offs_c)[:, None, None] * STRIDE_MOS,
                        mask=mask_c[:, None, None] & mask_o[None, :, :], other=0.0)  # fmt: skip
            m_new = tl.maximum(m, tl.max(lse, 0))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            # What is merged so far is 0 while m is -inf: scale it by 0, not exp(inf).
            rescale = tl.where(m == float("-inf"), 0.0, tl.exp(m - m_safe))
            weight = tl.exp(lse - m_safe[None, :])  # [BLOCK_C, BLOCK_HM]; 0 for empty chunks
            denom = denom * rescale + tl.sum(weight, 0)
            acc = acc * rescale[:, None] + tl.sum(weight[:, :, None] * o, 0)
            m = m_new
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        out_ptrs = out_ptr + batch_idx * STRIDE_OB + tok * STRIDE_OT + heads[:, None] * STRIDE_OH + offs_dv[None, :]
        lse_ptrs = lse_ptr + batch_idx * STRIDE_LB + tok * STRIDE_LT + heads[:, None] * STRIDE_LH
        store_merged(acc, denom[:, None], m_safe[:, None], out_ptrs, lse_ptrs, mask_dv[None, :], ROUND_BY_BITS,
                     mask_h[:, None])  # fmt: skip
