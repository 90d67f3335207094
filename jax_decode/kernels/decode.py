"""The split-KV decode-attention kernels: stage 1 per KV split, stage 2 merges the splits.

Imports only ``triton``.  Dimension names (used in every ``# [shape]`` comment)::

    batch, num_heads, num_kv_heads, head_dim_qk, head_dim_v,
    num_pages, page_size, max_pages, num_kv_splits

Stage 1 (one program per head block x batch row x KV split) walks its share of the
sequence page by page and writes a partial, already normalised output and its natural
log-sum-exp.  Stage 2 (one program per batch row x head) merges the splits by LSE.
Under the device-side schedule (``SCHEDULED``, :mod:`jax_decode.kernels.schedule`)
stage 1 instead runs a fixed number of programs per head block, each walking its equal
share of the batch's tiles row by row, and the schedule's merge takes stage 2's place.

Safety rules stage 1 follows (see :mod:`jax_decode.kernels.common`):

* ``seq_len`` is clamped to ``[0, max_pages * page_size]``, so no row reads past its
  page-table row.
* a token whose page id is outside ``[0, num_pages)`` is masked out of the softmax and
  its (clamped-to-0) address is never loaded, so no input makes a kernel touch memory
  outside the cache.
* page and batch indices are widened to int64 before they are multiplied by strides,
  so caches of more than 2**31 elements address correctly.
* a split (or row) with no valid token stores a zero output and LSE ``-inf``; stage 2
  turns an all-empty row into zeros, never ``0/0``.

Features, all constexpr-selected so a plain call compiles to the plain kernel:

* fp8 caches: tiles are widened to q's dtype (exact) and dequantised through the
  scores (``K_SCALE``) and the finished output (``V_SCALE``), never per element.
  (Triton's interpreter flushes float8_e5m2 subnormals when widening to float16; a
  compiled kernel does not.)
* sliding window (``WINDOW_LEFT``): the splits share only the window's tokens.
* sinks (``HAS_SINKS``): stage 2 adds them to each head's denominator.

Parameter order: input pointers, runtime scalars, output pointers, then constexprs
(jax_triton appends output pointers after the inputs; torch passes preallocated
outputs in the same slots; :mod:`jax_decode.operands` builds the list for both).
Strides are constexprs: they are fixed by shapes in both frameworks, and as
constexprs they give the compiler the divisibility it needs for vectorised loads, and
give both frameworks byte-for-byte the same compiled kernel.
"""

from __future__ import annotations

import triton
import triton.language as tl

from jax_decode.kernels.common import (
    cast_rne,
    causal_rows,
    dot,
    kv_scale,
    load_rows,
    online_softmax,
    row_length,
    row_sum,
    scores_log2,
    softmax_result,
    split_bounds,
    store_merged,
    to_f16_clamped,
    token_pages,
)
from jax_decode.kernels.schedule import chunk_bounds


def _stage1_part_body(  # the parameters of _decode_stage1, then the row and its part
    q_ptr, k_ptr, v_ptr, page_table_ptr, seq_lens_ptr, k_scale_ptr, v_scale_ptr, schedule_ptr, num_pages, mid_o_ptr,
    mid_lse_ptr,
    STRIDE_QB: tl.constexpr, STRIDE_QT: tl.constexpr, STRIDE_QH: tl.constexpr, STRIDE_KP: tl.constexpr,
    STRIDE_KS: tl.constexpr, STRIDE_KH: tl.constexpr, STRIDE_VP: tl.constexpr, STRIDE_VS: tl.constexpr,
    STRIDE_VH: tl.constexpr, STRIDE_PTB: tl.constexpr, STRIDE_MOB: tl.constexpr, STRIDE_MOT: tl.constexpr,
    STRIDE_MOH: tl.constexpr, STRIDE_MOS: tl.constexpr, STRIDE_MLB: tl.constexpr, STRIDE_MLT: tl.constexpr,
    STRIDE_MLH: tl.constexpr, STRIDE_MLS: tl.constexpr, SM_SCALE: tl.constexpr, LOGIT_CAP: tl.constexpr,
    K_SCALE: tl.constexpr, V_SCALE: tl.constexpr, WINDOW_LEFT: tl.constexpr, KV_GROUP: tl.constexpr,
    HEAD_DIM_QK: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_DMODEL: tl.constexpr, BLOCK_DPE: tl.constexpr,
    BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_BLOCKS: tl.constexpr,
    V_FROM_K: tl.constexpr, FP8_DOT_F16: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr,
    PAGE_SIZE: tl.constexpr, CAPACITY: tl.constexpr, NUM_KV_SPLITS: tl.constexpr, SCHEDULED: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, CHUNK_COST: tl.constexpr, Q_LEN: tl.constexpr, ROUND_BY_BITS: tl.constexpr,
    batch_idx,  # int64: the batch row
    part,  # its split, or (SCHEDULED) the program whose chunk of the row this is
):  # fmt: skip
    """Stage 1's work for one batch row: one split of it, or under the device-side
    schedule one program's chunk of it (see _decode_stage1)."""
    # Head blocks on the fastest grid axis: the programs that share a KV head (and
    # those of neighbouring KV heads) run together, so a K/V tile fetched for one is
    # served to the others from L2.
    head_block = tl.program_id(0)
    kv_head = head_block // HEAD_BLOCKS

    if BLOCK_H == 1:
        heads = head_block
        row_base = batch_idx * STRIDE_QB
    else:
        offs_r = (head_block % HEAD_BLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)
        mask_h = offs_r < Q_LEN * KV_GROUP
        if Q_LEN == 1:
            heads = kv_head * KV_GROUP + offs_r
            row_base = batch_idx * STRIDE_QB
        else:
            tok = offs_r // KV_GROUP  # query token of each row
            heads = kv_head * KV_GROUP + offs_r % KV_GROUP
            row_base = batch_idx * STRIDE_QB + tok * STRIDE_QT

    offs_d = tl.arange(0, BLOCK_DMODEL)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask_d = offs_d < HEAD_DIM_QK
    mask_dv = offs_dv < HEAD_DIM_V

    # The query rows: fp32 vectors for one head, a [BLOCK_H, D] tile for tl.dot.
    if BLOCK_H == 1:
        q_row = q_ptr + row_base + heads * STRIDE_QH
        q = tl.load(q_row + offs_d, mask=mask_d, other=0.0).to(tl.float32)
        if BLOCK_DPE > 0:
            offs_dpe = BLOCK_DMODEL + tl.arange(0, BLOCK_DPE)
            mask_dpe = offs_dpe < HEAD_DIM_QK
            q_pe = tl.load(q_row + offs_dpe, mask=mask_dpe, other=0.0).to(tl.float32)
    else:
        q_rows = q_ptr + row_base + heads * STRIDE_QH
        q = load_rows(q_rows, offs_d, mask_h, mask_d)
        if FP8_DOT_F16:
            # fp8 widens to float16 in one instruction per pair, to bfloat16 in several:
            # with an fp8 cache the dots run in float16 (q saturated to its range, p in [0, 1]).
            q = to_f16_clamped(q)
        if BLOCK_DPE > 0:
            offs_dpe = BLOCK_DMODEL + tl.arange(0, BLOCK_DPE)
            mask_dpe = offs_dpe < HEAD_DIM_QK
            q_pe = load_rows(q_rows, offs_dpe, mask_h, mask_dpe)
            if FP8_DOT_F16:
                q_pe = to_f16_clamped(q_pe)

    seq_len = row_length(seq_lens_ptr, batch_idx, CAPACITY)
    if SCHEDULED:  # chunk ``part`` of the row, to the partial slot row + program
        start, end = chunk_bounds(schedule_ptr, batch_idx, part, seq_len, NUM_PROGRAMS, CHUNK_COST, BLOCK_N,
                                  WINDOW_LEFT, Q_LEN)  # fmt: skip
        out_idx = batch_idx + part
        split_idx = 0
    else:  # split ``part`` of the row
        start, end = split_bounds(seq_len, part, NUM_KV_SPLITS, BLOCK_N, WINDOW_LEFT, Q_LEN)
        out_idx = batch_idx
        split_idx = part
    page_row_ptr = page_table_ptr + batch_idx * STRIDE_PTB
    k_head_ptr = k_ptr + kv_head * STRIDE_KH
    v_head_ptr = v_ptr + kv_head * STRIDE_VH
    if K_SCALE > 0:
        k_scale = kv_scale(k_scale_ptr, kv_head, K_SCALE)

    if BLOCK_H == 1:
        m_i = float("-inf")
        l_i = 0.0
        acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    else:
        m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        page, slot, valid = token_pages(page_row_ptr, offs_n, end, num_pages, PAGE_SIZE)
        k_rows = k_head_ptr + page * STRIDE_KP + slot * STRIDE_KS
        k = load_rows(k_rows, offs_d, valid, mask_d)
        if BLOCK_H == 1:
            qk = tl.sum(q[None, :] * k.to(tl.float32), 1)
            if BLOCK_DPE > 0:
                k_pe = load_rows(k_rows, offs_dpe, valid, mask_dpe)
                qk += tl.sum(q_pe[None, :] * k_pe.to(tl.float32), 1)
        else:
            # An fp8 cache widens to q's dtype (exactly) for the tensor cores; else a no-op.
            k = k.to(q.dtype)
            qk = dot(q, tl.trans(k), DOT_PRECISION, DOT_UPCAST)
            if BLOCK_DPE > 0:
                k_pe = load_rows(k_rows, offs_dpe, valid, mask_dpe)
                qk += dot(q_pe, tl.trans(k_pe.to(q.dtype)), DOT_PRECISION, DOT_UPCAST)
        if K_SCALE > 0:
            qk = qk * k_scale  # dequantise through the scores: K stays in its dtype
        if BLOCK_H == 1:
            s = tl.where(valid, scores_log2(qk, SM_SCALE, LOGIT_CAP), float("-inf"))
        elif Q_LEN == 1:
            s = tl.where(valid[None, :], scores_log2(qk, SM_SCALE, LOGIT_CAP), float("-inf"))
        else:
            keep = valid[None, :] & causal_rows(offs_n, seq_len, tok, Q_LEN, WINDOW_LEFT)
            s = tl.where(keep, scores_log2(qk, SM_SCALE, LOGIT_CAP), float("-inf"))

        if V_FROM_K:
            v = k
        else:
            v = load_rows(v_head_ptr + page * STRIDE_VP + slot * STRIDE_VS, offs_dv, valid, mask_dv)
            if BLOCK_H > 1:
                v = v.to(q.dtype)

        m_new, alpha, p = online_softmax(m_i, s, BLOCK_H)
        if BLOCK_H == 1:
            acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)
        else:
            # p rounds to v's dtype as the tensor cores take it; DOT_UPCAST is set for the
            # interpreter only, whose own bfloat16 cast would truncate.
            acc = acc * alpha[:, None] + dot(cast_rne(p, v.dtype, DOT_UPCAST), v, DOT_PRECISION, DOT_UPCAST)
        l_i = l_i * alpha + row_sum(p, BLOCK_H)
        m_i = m_new

    o, lse = softmax_result(acc, m_i, l_i, BLOCK_H)
    if V_SCALE > 0:
        o = o * kv_scale(v_scale_ptr, kv_head, V_SCALE)  # one multiply per output, not per token
    mid_rows = out_idx * STRIDE_MOB + heads * STRIDE_MOH + split_idx * STRIDE_MOS
    lse_rows = out_idx * STRIDE_MLB + heads * STRIDE_MLH + split_idx * STRIDE_MLS
    if Q_LEN > 1:
        mid_rows += tok * STRIDE_MOT
        lse_rows += tok * STRIDE_MLT
    o = cast_rne(o, mid_o_ptr.dtype.element_ty, ROUND_BY_BITS)  # (a no-op into fp32 partials)
    if BLOCK_H == 1:
        tl.store(mid_o_ptr + mid_rows + offs_dv, o, mask=mask_dv)
    else:
        tl.store(mid_o_ptr + mid_rows[:, None] + offs_dv[None, :], o, mask=mask_h[:, None] & mask_dv[None, :])
    lse_ptrs = mid_lse_ptr + lse_rows
    if BLOCK_H == 1:
        tl.store(lse_ptrs, lse)
    else:
        tl.store(lse_ptrs, lse, mask=mask_h)


_stage1_part = triton.jit(_stage1_part_body)
# The scheduled kernel's loop over rows calls the same body as a function of its own:
# inlined, the values it hoists out of that loop stay live across the tile loop (sm_90,
# GQA d128: 148 registers against 118 without the loop, three programs per SM, not four).
_stage1_chunk = triton.jit(_stage1_part_body, noinline=True)


@triton.jit
def _decode_stage1(
    q_ptr,  # [batch, q_len, num_heads, head_dim_qk] (q_len 1: [batch, num_heads, head_dim_qk])
    k_ptr,  # [num_pages, page_size, num_kv_heads, head_dim_qk]
    v_ptr,  # [num_pages, page_size, num_kv_heads, head_dim_v]; may alias k_ptr (MLA)
    page_table_ptr,  # int32 [batch, max_pages]
    seq_lens_ptr,  # int32 [batch]
    k_scale_ptr,  # f32 [1] or [num_kv_heads]: K dequantisation scale (read if K_SCALE)
    v_scale_ptr,  # f32 [1] or [num_kv_heads]: V dequantisation scale (read if V_SCALE)
    schedule_ptr,  # int32: jax_decode.kernels.schedule._work_schedule's (read if SCHEDULED)
    num_pages,  # int: pages in the cache; ids outside [0, num_pages) are masked
    mid_o_ptr,  # f32 [batch, q_len, num_heads, num_kv_splits, head_dim_v] (or the final out, see below)
    mid_lse_ptr,  # f32 [batch, q_len, num_heads, num_kv_splits] (or the final lse)
    STRIDE_QB: tl.constexpr,
    STRIDE_QT: tl.constexpr,
    STRIDE_QH: tl.constexpr,
    STRIDE_KP: tl.constexpr,
    STRIDE_KS: tl.constexpr,
    STRIDE_KH: tl.constexpr,
    STRIDE_VP: tl.constexpr,
    STRIDE_VS: tl.constexpr,
    STRIDE_VH: tl.constexpr,
    STRIDE_PTB: tl.constexpr,
    STRIDE_MOB: tl.constexpr,
    STRIDE_MOT: tl.constexpr,
    STRIDE_MOH: tl.constexpr,
    STRIDE_MOS: tl.constexpr,
    STRIDE_MLB: tl.constexpr,
    STRIDE_MLT: tl.constexpr,
    STRIDE_MLH: tl.constexpr,
    STRIDE_MLS: tl.constexpr,
    SM_SCALE: tl.constexpr,
    LOGIT_CAP: tl.constexpr,
    K_SCALE: tl.constexpr,  # 0: none; 1: one per tensor; 2: one per KV head
    V_SCALE: tl.constexpr,
    WINDOW_LEFT: tl.constexpr,  # -1: no window; else attend to the last WINDOW_LEFT + 1 tokens
    KV_GROUP: tl.constexpr,
    HEAD_DIM_QK: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_DMODEL: tl.constexpr,
    BLOCK_DPE: tl.constexpr,  # > 0: head_dim_qk's second power-of-two block (MLA's rope part)
    BLOCK_DV: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,  # query rows per program: 1 (MHA, one token), else >= 16
    HEAD_BLOCKS: tl.constexpr,  # programs per KV head along grid axis 0
    V_FROM_K: tl.constexpr,  # V is the loaded K tile itself (MLA's shared latent)
    FP8_DOT_F16: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    CAPACITY: tl.constexpr,
    NUM_KV_SPLITS: tl.constexpr,
    SCHEDULED: tl.constexpr,  # the device-side schedule's chunks instead of fixed splits
    NUM_PROGRAMS: tl.constexpr,  # (with SCHEDULED) programs per head block
    CHUNK_COST: tl.constexpr,  # (with SCHEDULED) the schedule's start-up cost of a chunk, in tiles
    Q_LEN: tl.constexpr,  # query tokens per row: its last Q_LEN positions, causal among themselves
    ROUND_BY_BITS: tl.constexpr,  # the interpreter, whose float32 -> bfloat16 cast truncates
):
    """Attention of a row's query tokens over one KV split, for one head or a block of
    query rows; under the device-side schedule (grid ``(heads programs, NUM_PROGRAMS)``)
    over the chunks of its rows that program ``program_id(1)``'s share holds, each to
    partial slot ``row + program_id(1)`` (``mid_o`` ``[batch + NUM_PROGRAMS, (q_len,)
    num_heads, head_dim_v]``, split strides 0).

    With one split (and no sinks) it may be given the final ``out`` (q's dtype) and
    ``lse`` with split strides 0: it writes exactly what stage 2 would, rounded to
    nearest even, and stage 2 is skipped.

    ``BLOCK_H == 1`` (MHA, one token): one query head per program, q.k and p.v by
    multiply-and-reduce in fp32 (no tensor cores needed).  ``BLOCK_H >= 16``: the
    query rows sharing one KV head -- (token, head) pairs, the heads fastest -- q.k and
    p.v with ``tl.dot``; each K (and V) tile is read once for the whole block (GQA,
    MQA, MLA, and every query token of a row).  With V_FROM_K (MLA: V is the first
    head_dim_v columns of K) the loaded K tile is reused as V, so the latent is read
    from memory once.
    """
    tl.static_assert(
        BLOCK_H >= 16 or (BLOCK_H == 1 and KV_GROUP == 1 and HEAD_BLOCKS == 1 and Q_LEN == 1), "tl.dot needs 16 rows"
    )
    tl.static_assert(not V_FROM_K or (BLOCK_H > 1 and BLOCK_DV == BLOCK_DMODEL and HEAD_DIM_V == BLOCK_DMODEL))
    if SCHEDULED:
        # The device-side schedule (jax_decode.kernels.schedule): program ``program_id(1)``
        # attends to a chunk of each of its rows in turn, each written to its own slot.
        program = tl.program_id(1)
        first_row = tl.load(schedule_ptr + 1 + program)
        end_row = tl.load(schedule_ptr + 1 + NUM_PROGRAMS + program)
        for i in range(0, end_row - first_row):  # (rows as offsets: the interpreter's loop counter is an int)
            row = first_row + i
            _stage1_chunk(
                q_ptr, k_ptr, v_ptr, page_table_ptr, seq_lens_ptr, k_scale_ptr, v_scale_ptr, schedule_ptr, num_pages,
                mid_o_ptr, mid_lse_ptr, STRIDE_QB, STRIDE_QT, STRIDE_QH, STRIDE_KP, STRIDE_KS, STRIDE_KH, STRIDE_VP,
                STRIDE_VS, STRIDE_VH, STRIDE_PTB, STRIDE_MOB, STRIDE_MOT, STRIDE_MOH, STRIDE_MOS, STRIDE_MLB,
                STRIDE_MLT, STRIDE_MLH, STRIDE_MLS, SM_SCALE, LOGIT_CAP, K_SCALE, V_SCALE, WINDOW_LEFT, KV_GROUP,
                HEAD_DIM_QK, HEAD_DIM_V, BLOCK_DMODEL, BLOCK_DPE, BLOCK_DV, BLOCK_N, BLOCK_H, HEAD_BLOCKS, V_FROM_K,
                FP8_DOT_F16, DOT_PRECISION, DOT_UPCAST, PAGE_SIZE, CAPACITY, NUM_KV_SPLITS, SCHEDULED, NUM_PROGRAMS,
                CHUNK_COST, Q_LEN, ROUND_BY_BITS,
                row.to(tl.int64), program,
            )  # fmt: skip
    else:  # (the same call: one row, one split)
        _stage1_part(
            q_ptr, k_ptr, v_ptr, page_table_ptr, seq_lens_ptr, k_scale_ptr, v_scale_ptr, schedule_ptr, num_pages,
            mid_o_ptr, mid_lse_ptr, STRIDE_QB, STRIDE_QT, STRIDE_QH, STRIDE_KP, STRIDE_KS, STRIDE_KH, STRIDE_VP,
            STRIDE_VS, STRIDE_VH, STRIDE_PTB, STRIDE_MOB, STRIDE_MOT, STRIDE_MOH, STRIDE_MOS, STRIDE_MLB,
            STRIDE_MLT, STRIDE_MLH, STRIDE_MLS, SM_SCALE, LOGIT_CAP, K_SCALE, V_SCALE, WINDOW_LEFT, KV_GROUP,
            HEAD_DIM_QK, HEAD_DIM_V, BLOCK_DMODEL, BLOCK_DPE, BLOCK_DV, BLOCK_N, BLOCK_H, HEAD_BLOCKS, V_FROM_K,
            FP8_DOT_F16, DOT_PRECISION, DOT_UPCAST, PAGE_SIZE, CAPACITY, NUM_KV_SPLITS, SCHEDULED, NUM_PROGRAMS,
            CHUNK_COST, Q_LEN, ROUND_BY_BITS,
            tl.program_id(1).to(tl.int64), tl.program_id(2),
        )  # fmt: skip


@triton.jit
def _decode_stage2(
    mid_o_ptr,  # f32 [batch, q_len, num_heads, num_kv_splits, head_dim_v]
    mid_lse_ptr,  # f32 [batch, q_len, num_heads, num_kv_splits]
    sinks_ptr,  # f32 [num_heads]: per-head sink logits (read if HAS_SINKS)
    out_ptr,  # [batch, (q_len,) num_heads, head_dim_v], q's dtype
    lse_ptr,  # f32 [batch, (q_len,) num_heads], natural log
    STRIDE_MOB: tl.constexpr,
    STRIDE_MOT: tl.constexpr,
    STRIDE_MOH: tl.constexpr,
    STRIDE_MOS: tl.constexpr,
    STRIDE_MLB: tl.constexpr,
    STRIDE_MLT: tl.constexpr,
    STRIDE_MLH: tl.constexpr,
    STRIDE_MLS: tl.constexpr,
    STRIDE_OB: tl.constexpr,
    STRIDE_OT: tl.constexpr,
    STRIDE_OH: tl.constexpr,
    STRIDE_LB: tl.constexpr,
    STRIDE_LT: tl.constexpr,
    STRIDE_LH: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_S: tl.constexpr,
    NUM_KV_SPLITS: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    ROUND_BY_BITS: tl.constexpr,  # the interpreter, whose float32 -> bfloat16 cast truncates
):
    """Merge the splits of one (batch row, head, query token) by log-sum-exp; empty splits weigh 0.

    A sink (gpt-oss) is one more logit in the softmax's denominator with a zero value:
    it joins the merge as a split whose output is 0 and whose LSE is the sink.
    """
    batch_idx = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    tok = tl.program_id(2)  # (the token strides are 0 with one query token)
    offs_s = tl.arange(0, BLOCK_S)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask_dv = offs_dv < HEAD_DIM_V

    lse_row = mid_lse_ptr + batch_idx * STRIDE_MLB + tok * STRIDE_MLT + head * STRIDE_MLH
    split_lse = tl.load(lse_row + offs_s * STRIDE_MLS, mask=offs_s < NUM_KV_SPLITS, other=float("-inf"))
    m = tl.max(split_lse, 0)
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head)
        m = tl.maximum(m, sink)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    denom = tl.sum(tl.exp(split_lse - m_safe), 0)
    if HAS_SINKS:
        denom += tl.exp(sink - m_safe)

    o_row = mid_o_ptr + batch_idx * STRIDE_MOB + tok * STRIDE_MOT + head * STRIDE_MOH
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    for split_idx in range(NUM_KV_SPLITS):
        weight = tl.exp(tl.load(lse_row + split_idx * STRIDE_MLS) - m_safe)
        acc += weight * tl.load(o_row + split_idx * STRIDE_MOS + offs_dv, mask=mask_dv, other=0.0)

    out_ptrs = out_ptr + batch_idx * STRIDE_OB + tok * STRIDE_OT + head * STRIDE_OH + offs_dv
    lse_ptrs = lse_ptr + batch_idx * STRIDE_LB + tok * STRIDE_LT + head * STRIDE_LH
    # Rounded to nearest even: by the GPU's cvt.rn, in the interpreter by bits.
    store_merged(acc, denom, m_safe, out_ptrs, lse_ptrs, mask_dv, ROUND_BY_BITS)
