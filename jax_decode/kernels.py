"""Triton kernels for split-KV ("flash decoding") attention over a paged KV cache.

This module imports only ``triton``: the JAX frontend (through ``jax_triton``), the
PyTorch frontend and the interpreter backend all launch these very kernel objects,
with the arguments that :mod:`jax_decode.launch` computes.

Dimension names (used in every ``# [shape]`` comment below)::

    batch, num_heads, num_kv_heads, head_dim_qk, head_dim_v,
    num_pages, page_size, max_pages, num_kv_splits

Stage 1 (one program per head block x batch row x KV split) walks its share of the
sequence page by page and writes a partial, already normalised output and its natural
log-sum-exp.  Stage 2 (one program per batch row x head) merges the splits by LSE.

Safety rules every stage-1 kernel follows:

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
outputs in the same slots).  Strides are constexprs: they are fixed by shapes in both
frameworks, and as constexprs they give the compiler the divisibility it needs for
vectorised loads, and give both frameworks byte-for-byte the same compiled kernel.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _tanh(x):
    # tanh through sigmoid: available in every Triton version and in the interpreter.
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _scores_log2(qk, SM_SCALE: tl.constexpr, LOGIT_CAP: tl.constexpr):
    """Scale (and soft-cap) raw q.k products; return them in log2 units for exp2."""
    qk = qk * SM_SCALE
    if LOGIT_CAP > 0:
        qk = LOGIT_CAP * _tanh(qk / LOGIT_CAP)
    return qk * LOG2E


@triton.jit
def _to_f16_clamped(x):
    """float16 of x, saturated to +-65504 (only values beyond that change beyond rounding)."""
    return tl.minimum(tl.maximum(x.to(tl.float32), -65504.0), 65504.0).to(tl.float16)


@triton.jit
def _dot(a, b, DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr):
    """tl.dot with fp32 accumulation.

    DOT_UPCAST multiplies in fp32 instead: products of 16-bit floats are exact in fp32,
    so the result matches a tensor-core dot up to summation order.  The launch config
    sets it for Triton's interpreter, whose tl.dot multiplies bfloat16 bit patterns
    as integers.
    """
    if DOT_UPCAST:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        out = tl.dot(a, b, input_precision=DOT_PRECISION)
    return out


@triton.jit
def _split_bounds(
    seq_lens_ptr,
    batch_idx,
    split_idx,
    NUM_KV_SPLITS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAPACITY: tl.constexpr,
    WINDOW_LEFT: tl.constexpr,
):
    """Token range [start, end) of one KV split; splits are whole BLOCK_N blocks.

    With a sliding window (WINDOW_LEFT >= 0) the splits share only the last
    WINDOW_LEFT + 1 tokens: tokens (and pages) before the window are never read.
    """
    seq_len = tl.load(seq_lens_ptr + batch_idx)
    seq_len = tl.minimum(tl.maximum(seq_len, 0), CAPACITY)
    first = seq_len * 0
    if WINDOW_LEFT >= 0:
        first = tl.maximum(seq_len - 1 - WINDOW_LEFT, 0)
    per_split = tl.cdiv(tl.cdiv(seq_len - first, NUM_KV_SPLITS), BLOCK_N) * BLOCK_N
    start = first + split_idx * per_split
    end = tl.minimum(start + per_split, seq_len)
    return start, end


@triton.jit
def _kv_scale(scale_ptr, kv_head, MODE: tl.constexpr):
    """A cache's dequantisation scale: MODE 1 one per tensor, 2 one per KV head."""
    if MODE == 2:
        scale = tl.load(scale_ptr + kv_head)
    else:
        scale = tl.load(scale_ptr)
    return scale


@triton.jit
def _token_pages(page_row_ptr, offs_n, end, num_pages, PAGE_SIZE: tl.constexpr):
    """Page (int64, clamped to 0 where invalid), slot and validity of tokens offs_n."""
    in_range = offs_n < end
    page = tl.load(page_row_ptr + offs_n // PAGE_SIZE, mask=in_range, other=0)
    valid = in_range & (page >= 0) & (page < num_pages)
    page = tl.where(valid, page, 0).to(tl.int64)
    return page, offs_n % PAGE_SIZE, valid


@triton.jit
def _decode_stage1_mha(
    q_ptr,  # [batch, num_heads, head_dim_qk]
    k_ptr,  # [num_pages, page_size, num_kv_heads, head_dim_qk]
    v_ptr,  # [num_pages, page_size, num_kv_heads, head_dim_v]; may alias k_ptr (MLA)
    page_table_ptr,  # int32 [batch, max_pages]
    seq_lens_ptr,  # int32 [batch]
    k_scale_ptr,  # f32 [1] or [num_kv_heads]: K dequantisation scale (read if K_SCALE)
    v_scale_ptr,  # f32 [1] or [num_kv_heads]: V dequantisation scale (read if V_SCALE)
    num_pages,  # int: pages in the cache; ids outside [0, num_pages) are masked
    mid_o_ptr,  # f32 [batch, num_heads, num_kv_splits, head_dim_v]
    mid_lse_ptr,  # f32 [batch, num_heads, num_kv_splits]
    STRIDE_QB: tl.constexpr,
    STRIDE_QH: tl.constexpr,
    STRIDE_KP: tl.constexpr,
    STRIDE_KS: tl.constexpr,
    STRIDE_KH: tl.constexpr,
    STRIDE_VP: tl.constexpr,
    STRIDE_VS: tl.constexpr,
    STRIDE_VH: tl.constexpr,
    STRIDE_PTB: tl.constexpr,
    STRIDE_MOB: tl.constexpr,
    STRIDE_MOH: tl.constexpr,
    STRIDE_MOS: tl.constexpr,
    STRIDE_MLB: tl.constexpr,
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
    BLOCK_DPE: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    CAPACITY: tl.constexpr,
    NUM_KV_SPLITS: tl.constexpr,
):
    """One query head per program: q.k by multiply-and-reduce (no tensor cores needed)."""
    # Heads on the fastest grid axis: programs launched together read neighbouring
    # heads of the same tokens (contiguous rows of the cache).
    head = tl.program_id(0)
    batch_idx = tl.program_id(1).to(tl.int64)
    split_idx = tl.program_id(2)
    kv_head = head // KV_GROUP

    offs_d = tl.arange(0, BLOCK_DMODEL)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask_d = offs_d < HEAD_DIM_QK
    mask_dv = offs_dv < HEAD_DIM_V

    q_row = q_ptr + batch_idx * STRIDE_QB + head * STRIDE_QH
    q = tl.load(q_row + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    if BLOCK_DPE > 0:
        offs_dpe = BLOCK_DMODEL + tl.arange(0, BLOCK_DPE)
        mask_dpe = offs_dpe < HEAD_DIM_QK
        q_pe = tl.load(q_row + offs_dpe, mask=mask_dpe, other=0.0).to(tl.float32)

    start, end = _split_bounds(seq_lens_ptr, batch_idx, split_idx, NUM_KV_SPLITS, BLOCK_N, CAPACITY, WINDOW_LEFT)
    page_row_ptr = page_table_ptr + batch_idx * STRIDE_PTB
    k_head_ptr = k_ptr + kv_head * STRIDE_KH
    v_head_ptr = v_ptr + kv_head * STRIDE_VH

    if K_SCALE > 0:
        k_scale = _kv_scale(k_scale_ptr, kv_head, K_SCALE)

    m_i = float("-inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        page, slot, valid = _token_pages(page_row_ptr, offs_n, end, num_pages, PAGE_SIZE)
        k_rows = k_head_ptr + page * STRIDE_KP + slot * STRIDE_KS
        k = tl.load(k_rows[:, None] + offs_d[None, :], mask=valid[:, None] & mask_d[None, :], other=0.0)
        qk = tl.sum(q[None, :] * k.to(tl.float32), 1)
        if BLOCK_DPE > 0:
            k_pe = tl.load(k_rows[:, None] + offs_dpe[None, :], mask=valid[:, None] & mask_dpe[None, :], other=0.0)
            qk += tl.sum(q_pe[None, :] * k_pe.to(tl.float32), 1)
        if K_SCALE > 0:
            qk = qk * k_scale  # dequantise through the scores: K stays in its dtype
        s = tl.where(valid, _scores_log2(qk, SM_SCALE, LOGIT_CAP), float("-inf"))

        v_rows = v_head_ptr + page * STRIDE_VP + slot * STRIDE_VS
        v = tl.load(v_rows[:, None] + offs_dv[None, :], mask=valid[:, None] & mask_dv[None, :], other=0.0)

        m_new = tl.maximum(m_i, tl.max(s, 0))
        # A block whose tokens are all masked leaves m at -inf: subtract 0 instead so
        # exp2 gives 0, not exp2(-inf - -inf) = NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new

    has_tokens = l_i > 0
    l_safe = tl.where(has_tokens, l_i, 1.0)
    lse = tl.where(has_tokens, (m_i + tl.log2(l_safe)) * LN2, float("-inf"))
    o = acc / l_safe
    if V_SCALE > 0:
        o = o * _kv_scale(v_scale_ptr, kv_head, V_SCALE)  # one multiply per output, not per token
    mid_row = batch_idx * STRIDE_MOB + head * STRIDE_MOH + split_idx * STRIDE_MOS
    tl.store(mid_o_ptr + mid_row + offs_dv, o, mask=mask_dv)
    tl.store(mid_lse_ptr + batch_idx * STRIDE_MLB + head * STRIDE_MLH + split_idx * STRIDE_MLS, lse)


@triton.jit
def _decode_stage1_grouped(
    q_ptr,  # [batch, num_heads, head_dim_qk]
    k_ptr,  # [num_pages, page_size, num_kv_heads, head_dim_qk]
    v_ptr,  # [num_pages, page_size, num_kv_heads, head_dim_v]; may alias k_ptr (MLA)
    page_table_ptr,  # int32 [batch, max_pages]
    seq_lens_ptr,  # int32 [batch]
    k_scale_ptr,  # f32 [1] or [num_kv_heads]: K dequantisation scale (read if K_SCALE)
    v_scale_ptr,  # f32 [1] or [num_kv_heads]: V dequantisation scale (read if V_SCALE)
    num_pages,  # int: pages in the cache; ids outside [0, num_pages) are masked
    mid_o_ptr,  # f32 [batch, num_heads, num_kv_splits, head_dim_v]
    mid_lse_ptr,  # f32 [batch, num_heads, num_kv_splits]
    STRIDE_QB: tl.constexpr,
    STRIDE_QH: tl.constexpr,
    STRIDE_KP: tl.constexpr,
    STRIDE_KS: tl.constexpr,
    STRIDE_KH: tl.constexpr,
    STRIDE_VP: tl.constexpr,
    STRIDE_VS: tl.constexpr,
    STRIDE_VH: tl.constexpr,
    STRIDE_PTB: tl.constexpr,
    STRIDE_MOB: tl.constexpr,
    STRIDE_MOH: tl.constexpr,
    STRIDE_MOS: tl.constexpr,
    STRIDE_MLB: tl.constexpr,
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
    BLOCK_DPE: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_BLOCKS: tl.constexpr,
    V_FROM_K: tl.constexpr,
    FP8_DOT_F16: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    CAPACITY: tl.constexpr,
    NUM_KV_SPLITS: tl.constexpr,
):
    """BLOCK_H query heads sharing one KV head per program: q.k and p.v with tl.dot.

    Each K (and V) tile is read once for the whole head block (GQA, MQA, MLA).  With
    V_FROM_K (MLA: V is the first head_dim_v columns of K) the loaded K tile is reused
    as V, so the latent is read from memory once.
    """
    tl.static_assert(BLOCK_H >= 16, "tl.dot needs at least 16 rows")
    tl.static_assert(not V_FROM_K or (BLOCK_DV == BLOCK_DMODEL and HEAD_DIM_V == BLOCK_DMODEL))
    # Head blocks on the fastest grid axis: the HEAD_BLOCKS programs that share a KV
    # head (and the programs of neighbouring KV heads) run together, so a K/V tile
    # fetched for one is served to the others from L2.
    head_block = tl.program_id(0)
    batch_idx = tl.program_id(1).to(tl.int64)
    split_idx = tl.program_id(2)
    kv_head = head_block // HEAD_BLOCKS

    offs_g = (head_block % HEAD_BLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_g < KV_GROUP
    heads = kv_head * KV_GROUP + offs_g

    offs_d = tl.arange(0, BLOCK_DMODEL)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask_d = offs_d < HEAD_DIM_QK
    mask_dv = offs_dv < HEAD_DIM_V

    q_rows = q_ptr + batch_idx * STRIDE_QB + heads * STRIDE_QH
    q = tl.load(q_rows[:, None] + offs_d[None, :], mask=mask_h[:, None] & mask_d[None, :], other=0.0)
    if FP8_DOT_F16:
        # fp8 widens to float16 in one instruction per pair, to bfloat16 in several: with
        # an fp8 cache the dots run in float16 (q saturated to its range, p in [0, 1]).
        q = _to_f16_clamped(q)
    if BLOCK_DPE > 0:
        offs_dpe = BLOCK_DMODEL + tl.arange(0, BLOCK_DPE)
        mask_dpe = offs_dpe < HEAD_DIM_QK
        q_pe = tl.load(q_rows[:, None] + offs_dpe[None, :], mask=mask_h[:, None] & mask_dpe[None, :], other=0.0)
        if FP8_DOT_F16:
            q_pe = _to_f16_clamped(q_pe)

    start, end = _split_bounds(seq_lens_ptr, batch_idx, split_idx, NUM_KV_SPLITS, BLOCK_N, CAPACITY, WINDOW_LEFT)
    page_row_ptr = page_table_ptr + batch_idx * STRIDE_PTB
    k_head_ptr = k_ptr + kv_head * STRIDE_KH
    v_head_ptr = v_ptr + kv_head * STRIDE_VH

    if K_SCALE > 0:
        k_scale = _kv_scale(k_scale_ptr, kv_head, K_SCALE)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        page, slot, valid = _token_pages(page_row_ptr, offs_n, end, num_pages, PAGE_SIZE)
        k_rows = k_head_ptr + page * STRIDE_KP + slot * STRIDE_KS
        k = tl.load(k_rows[:, None] + offs_d[None, :], mask=valid[:, None] & mask_d[None, :], other=0.0)
        # An fp8 cache widens to q's dtype (exactly) for the tensor cores; else a no-op.
        k = k.to(q.dtype)
        qk = _dot(q, tl.trans(k), DOT_PRECISION, DOT_UPCAST)
        if BLOCK_DPE > 0:
            k_pe = tl.load(k_rows[:, None] + offs_dpe[None, :], mask=valid[:, None] & mask_dpe[None, :], other=0.0)
            qk += _dot(q_pe, tl.trans(k_pe.to(q.dtype)), DOT_PRECISION, DOT_UPCAST)
        if K_SCALE > 0:
            qk = qk * k_scale  # dequantise through the scores: K stays in its dtype
        s = tl.where(valid[None, :], _scores_log2(qk, SM_SCALE, LOGIT_CAP), float("-inf"))

        if V_FROM_K:
            v = k
        else:
            v_rows = v_head_ptr + page * STRIDE_VP + slot * STRIDE_VS
            v = tl.load(v_rows[:, None] + offs_dv[None, :], mask=valid[:, None] & mask_dv[None, :], other=0.0)
            v = v.to(q.dtype)

        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # see _decode_stage1_mha
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, DOT_PRECISION, DOT_UPCAST)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new

    has_tokens = l_i > 0
    l_safe = tl.where(has_tokens, l_i, 1.0)
    lse = tl.where(has_tokens, (m_i + tl.log2(l_safe)) * LN2, float("-inf"))
    o = acc / l_safe[:, None]
    if V_SCALE > 0:
        o = o * _kv_scale(v_scale_ptr, kv_head, V_SCALE)  # one multiply per output, not per token
    mid_rows = batch_idx * STRIDE_MOB + heads * STRIDE_MOH + split_idx * STRIDE_MOS
    tl.store(
        mid_o_ptr + mid_rows[:, None] + offs_dv[None, :],
        o,
        mask=mask_h[:, None] & mask_dv[None, :],
    )
    lse_ptrs = mid_lse_ptr + batch_idx * STRIDE_MLB + heads * STRIDE_MLH + split_idx * STRIDE_MLS
    tl.store(lse_ptrs, lse, mask=mask_h)


@triton.jit
def _decode_stage2(
    mid_o_ptr,  # f32 [batch, num_heads, num_kv_splits, head_dim_v]
    mid_lse_ptr,  # f32 [batch, num_heads, num_kv_splits]
    sinks_ptr,  # f32 [num_heads]: per-head sink logits (read if HAS_SINKS)
    out_ptr,  # [batch, num_heads, head_dim_v], q's dtype
    lse_ptr,  # f32 [batch, num_heads], natural log
    STRIDE_MOB: tl.constexpr,
    STRIDE_MOH: tl.constexpr,
    STRIDE_MOS: tl.constexpr,
    STRIDE_MLB: tl.constexpr,
    STRIDE_MLH: tl.constexpr,
    STRIDE_MLS: tl.constexpr,
    STRIDE_OB: tl.constexpr,
    STRIDE_OH: tl.constexpr,
    STRIDE_LB: tl.constexpr,
    STRIDE_LH: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_S: tl.constexpr,
    NUM_KV_SPLITS: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    """Merge the splits of one (batch row, head) by log-sum-exp; empty splits weigh 0.

    A sink (gpt-oss) is one more logit in the softmax's denominator with a zero value:
    it joins the merge as a split whose output is 0 and whose LSE is the sink.
    """
    batch_idx = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask_dv = offs_dv < HEAD_DIM_V

    lse_row = mid_lse_ptr + batch_idx * STRIDE_MLB + head * STRIDE_MLH
    split_lse = tl.load(lse_row + offs_s * STRIDE_MLS, mask=offs_s < NUM_KV_SPLITS, other=float("-inf"))
    m = tl.max(split_lse, 0)
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head)
        m = tl.maximum(m, sink)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    denom = tl.sum(tl.exp(split_lse - m_safe), 0)
    if HAS_SINKS:
        denom += tl.exp(sink - m_safe)

    o_row = mid_o_ptr + batch_idx * STRIDE_MOB + head * STRIDE_MOH
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    for split_idx in range(NUM_KV_SPLITS):
        weight = tl.exp(tl.load(lse_row + split_idx * STRIDE_MLS) - m_safe)
        acc += weight * tl.load(o_row + split_idx * STRIDE_MOS + offs_dv, mask=mask_dv, other=0.0)

    has_tokens = denom > 0
    out = acc / tl.where(has_tokens, denom, 1.0)
    out_ptrs = out_ptr + batch_idx * STRIDE_OB + head * STRIDE_OH + offs_dv
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask_dv)
    lse = tl.where(has_tokens, m_safe + tl.log(tl.where(has_tokens, denom, 1.0)), float("-inf"))
    tl.store(lse_ptr + batch_idx * STRIDE_LB + head * STRIDE_LH, lse)


@triton.jit
def _fp8_bits(x, MAN_BITS: tl.constexpr, BIAS: tl.constexpr):
    """Bits of float32 ``x`` (finite, within the format's range) rounded to nearest-even
    in an fp8 format with MAN_BITS mantissa bits and exponent bias BIAS.

    By integer arithmetic rather than ``x.to(float8)``, so that compiled kernels and
    Triton's interpreter (whose float8 casts round wrongly) store the same bits.
    """
    SHIFT: tl.constexpr = 23 - MAN_BITS
    bits = x.to(tl.uint32, bitcast=True)
    magnitude = bits & 0x7FFFFFFF
    # Normal numbers: round the fp32 mantissa to MAN_BITS (ties to even), re-bias.
    rounded = (magnitude + ((1 << (SHIFT - 1)) - 1) + ((magnitude >> SHIFT) & 1)) >> SHIFT
    normal = rounded - ((127 - BIAS) << MAN_BITS)
    # Subnormals: adding 2**(SHIFT + 1 - BIAS), whose fp32 ulp is the fp8 subnormal
    # step 2**(1 - BIAS - MAN_BITS), makes the FPU round to that step (ties to even);
    # the sum's low bits are then the fp8 subnormal's bits.
    MAGIC_BITS: tl.constexpr = (127 - BIAS + SHIFT + 1) << 23
    magic = tl.full(x.shape, MAGIC_BITS, tl.uint32).to(tl.float32, bitcast=True)
    subnormal = (tl.abs(x) + magic).to(tl.uint32, bitcast=True) - MAGIC_BITS
    MIN_NORMAL_BITS: tl.constexpr = (127 + 1 - BIAS) << 23
    out = tl.where(magnitude < MIN_NORMAL_BITS, subnormal, normal) | ((bits >> 31) << 7)
    return out.to(tl.uint8)


@triton.jit
def _write_cache(
    new_ptr,  # [num_tokens, num_kv_heads, head_dim]: this step's keys (or values)
    slots_ptr,  # int32 [num_tokens]: page * page_size + slot; outside [0, num_slots) skipped
    scale_ptr,  # f32 [1] or [num_kv_heads]: rows are divided by it (read if SCALE)
    num_slots,  # int: num_pages * page_size
    cache_in_ptr,  # the cache as an input; jax_triton aliases it to cache_ptr (unused)
    cache_ptr,  # [num_pages, page_size, num_kv_heads, head_dim], written in place
    STRIDE_NT: tl.constexpr,
    STRIDE_NH: tl.constexpr,
    STRIDE_CP: tl.constexpr,
    STRIDE_CS: tl.constexpr,
    STRIDE_CH: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    SCALE: tl.constexpr,  # 0: none; 1: one per tensor; 2: one per KV head
    SATURATE: tl.constexpr,  # an fp8 cache's largest finite value
    FP8_MAN_BITS: tl.constexpr,  # > 0: the cache is fp8 with this many mantissa bits ...
    FP8_BIAS: tl.constexpr,  # ... and this exponent bias
):
    """Scatter one token's row for one KV head into its cache slot (paged KV write).

    For an fp8 cache the row is quantised: divided by the scale and clamped to the
    format's finite range (no inf or NaN from a large value), then rounded to nearest
    even.
    """
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs = tl.arange(0, BLOCK_D)
    # The slot broadcast over the row, so every mask is a block (as the interpreter needs).
    slot = tl.load(slots_ptr + token + tl.zeros([BLOCK_D], tl.int32)).to(tl.int64)
    valid = (slot >= 0) & (slot < num_slots)
    slot = tl.where(valid, slot, 0)  # never form an address outside the cache
    mask = offs < HEAD_DIM
    row = tl.load(new_ptr + token * STRIDE_NT + head * STRIDE_NH + offs, mask=mask, other=0.0)
    if SCALE > 0:
        row = row.to(tl.float32) / _kv_scale(scale_ptr, head, SCALE)
    if FP8_MAN_BITS > 0:  # quantise: saturate to the finite range, round to nearest even
        row = tl.minimum(tl.maximum(row.to(tl.float32), -SATURATE), SATURATE)
        row = _fp8_bits(row, FP8_MAN_BITS, FP8_BIAS).to(cache_ptr.dtype.element_ty, bitcast=True)
    dst = cache_ptr + (slot // PAGE_SIZE) * STRIDE_CP + (slot % PAGE_SIZE) * STRIDE_CS + head * STRIDE_CH
    tl.store(dst + offs, row.to(cache_ptr.dtype.element_ty), mask=mask & valid)


# Kernel objects by the variant name the launch config chooses.
STAGE1_KERNELS = {"mha": _decode_stage1_mha, "grouped": _decode_stage1_grouped}
STAGE2_KERNEL = _decode_stage2
WRITE_CACHE_KERNEL = _write_cache
