"""Stage 1 of GQA/MQA/MHA decode attention over an e4m3 cache for Hopper (sm_90), in
Gluon.  Planned where ``make_launch_config(..., hopper_fp8=True)`` is asked (off by
default: on an H100 it is level with the portable fp8 kernel; docs/performance.md).

Imports only ``triton``.  Dimension names as in :mod:`jax_decode.kernels.decode`.

Why: the portable fp8 kernel spends its time on work per byte, not on memory access
(docs/performance.md, "fp8 caches"): every fp8 element is widened, multiplied and
summed by the CUDA cores' instructions, and the tensor cores take V's elements in
pairs of tokens, which in a page are a row apart, so V is read byte by byte.  Here the
bytes go from memory to shared memory by TMA and from there into e4m3 warpgroup MMAs
with tokens as the MMAs' rows ("swap AB": the few query heads of a KV head, up to 8,
are the MMAs' N), so a warpgroup does little per byte and three programs share an SM.

Design (one program = the query heads of one KV head x one KV split of one batch row;
grid ``(num_kv_heads, batch, num_kv_splits)``):

* a producer warp copies tiles of 64 tokens of K and V into a ring of ``NUM_STAGES``
  stages by TMA, from each cache viewed as ``[num_pages * page_size, num_kv_heads *
  head_dim]`` in boxes of ``min(page_size, 64)`` rows at column ``kv_head * head_dim``,
  each stage once the consumer has released it (mbarriers ``full`` / ``empty``);
* a consumer warpgroup computes per tile S^T = K Q^T (M = 64 tokens, N = ROWS query
  heads, K = head_dim), the online softmax down each column, and O^T += V^T P^T
  (M = head_dim, N = ROWS, K = 64 tokens);
* e4m3 MMAs read both operands K-major: Q (bfloat16) is written as the sum of two e4m3
  terms after a power-of-two scale per row (exact for values within 2**10 of the
  row's largest), P as two terms (scaled by 256), and V is transposed in shared memory
  (V^T's K is the tokens).  Each tile's P V is summed in a fresh accumulator and added
  to O^T in f32: an fp8 MMA keeps only about 13 mantissa bits of the accumulator it
  adds to.

Output: what ``_decode_stage1`` writes with fixed splits, so ``_decode_stage2`` merges
it (and adds sinks): ``mid_o`` f32 ``[batch, num_heads, num_kv_splits, head_dim]``
normalised per split, ``mid_lse`` f32 ``[batch, num_heads, num_kv_splits]`` (natural
log); a split with no valid token writes zeros and ``-inf``.  Its splits are cut in
64-token steps (the portable kernel's in its own tile's), so where torch's launcher
falls back to the portable stage 1 (caches TMA cannot address) the same config gives
other bits than here; JAX's arrays always take this kernel.

Safety rules as in :mod:`jax_decode.kernels.common`: ``seq_len`` clamped to
``[0, CAPACITY]``; page-table entries are read only for boxes holding a token before
``end``; a page id outside ``[0, num_pages)`` is copied from page 0 and its tokens
masked; V rows past ``end`` or on a bad page are zeroed before they meet P, so NaN in
unused slots cannot leak through ``0 * NaN``.  TMA coordinates are 32-bit (caches of up
to 2**31 token rows); batch indices are widened to int64 before they multiply strides.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from jax_decode.kernels.mla_hopper import _cta_barrier, _tma_load

LOG2E = gl.constexpr(1.4426950408889634)
LN2 = gl.constexpr(0.6931471805599453)
BLOCK_N = gl.constexpr(64)  # tokens per tile: the MMA's M
Q_LARGEST = gl.constexpr(440.0)  # Q's rows are scaled by a power of two to at most this (e4m3: 448)
P_SCALE = gl.constexpr(256.0)  # P in [0, 1] is scaled into e4m3's normal range
# Registers a thread of the producer partition keeps (Triton pads its one warp to a
# warpgroup); the consumer takes the rest of the program's budget (launched with
# maxnreg 80: 8 warps x 80 registers let three programs share an SM's 64K).  More for
# the producer spills the consumer (triton 3.8: 8 bytes of stack at 40).
PRODUCER_REGISTERS = gl.constexpr(24)


@gluon.jit
def _program_split(page_table_ptr, seq_lens_ptr, STRIDE_PTB: gl.constexpr, CAPACITY: gl.constexpr,
                   NUM_KV_SPLITS: gl.constexpr):  # fmt: skip
    """This program's batch row (int64), the [start, end) of its split (whole 64-token
    tiles), the split's tile count and the row's page-table entries."""
    batch_idx = gl.program_id(1).to(gl.int64)
    seq_len = gl.minimum(gl.maximum(gl.load(seq_lens_ptr + batch_idx), 0), CAPACITY)
    per_split = gl.cdiv(gl.cdiv(seq_len, NUM_KV_SPLITS), BLOCK_N) * BLOCK_N
    start = gl.program_id(2) * per_split
    end = gl.minimum(start + per_split, seq_len)
    num_tiles = gl.cdiv(gl.maximum(end - start, 0), BLOCK_N)
    return batch_idx, start, end, num_tiles, page_table_ptr + batch_idx * STRIDE_PTB


@gluon.jit
def _box_page(page_row_ptr, box_start, end, PAGE_SIZE: gl.constexpr):
    """Page id of a box (read only if the box holds a token before ``end``; -1 if not)."""
    return gl.load(page_row_ptr + box_start // PAGE_SIZE, mask=box_start < end, other=-1)


@gluon.jit
def _tile_pages(page_row_ptr, tile_start, end, PAGE_SIZE: gl.constexpr, BOX: gl.constexpr):
    """The page ids of a tile's (up to four) boxes; -1 for boxes past ``end``."""
    p0 = _box_page(page_row_ptr, tile_start, end, PAGE_SIZE)
    p1 = _box_page(page_row_ptr, tile_start + BOX, end, PAGE_SIZE) if BLOCK_N // BOX > 1 else -1
    p2 = _box_page(page_row_ptr, tile_start + 2 * BOX, end, PAGE_SIZE) if BLOCK_N // BOX > 2 else -1
    p3 = _box_page(page_row_ptr, tile_start + 3 * BOX, end, PAGE_SIZE) if BLOCK_N // BOX > 3 else -1
    return p0, p1, p2, p3


@gluon.jit
def _copy_box(k_desc, v_desc, k_buf, v_buf, bar, page, box_start, num_pages, col, j: gl.constexpr,
              PAGE_SIZE: gl.constexpr, BOX: gl.constexpr):  # fmt: skip
    page = gl.where((page >= 0) & (page < num_pages), page, 0)  # (a bad or absent page: page 0, masked)
    row = page * PAGE_SIZE + box_start % PAGE_SIZE
    _tma_load(k_desc, [row, col], bar, k_buf.slice(j * BOX, BOX, dim=0))
    _tma_load(v_desc, [row, col], bar, v_buf.slice(j * BOX, BOX, dim=0))


@gluon.jit
def _producer(args, consts: gl.constexpr):
    """One warp: the TMA copies of the program's tiles into the ring, each stage once
    the consumer has released it; a tile's page ids are read while waiting for its stage."""
    (k_desc, v_desc, q_ptr, page_table_ptr, seq_lens_ptr, k_scale_ptr, v_scale_ptr, num_pages, mid_o_ptr, mid_lse_ptr,
     k_ring, v_ring, full, empty, q_hi, q_lo, p_hi, p_lo, vt) = args  # fmt: skip
    STRIDE_PTB: gl.constexpr = consts[2]
    PAGE_SIZE: gl.constexpr = consts[13]
    CAPACITY: gl.constexpr = consts[14]
    NUM_KV_SPLITS: gl.constexpr = consts[15]
    NUM_STAGES: gl.constexpr = consts[16]
    HEAD_DIM: gl.constexpr = k_desc.block_type.shape[1]
    BOX: gl.constexpr = k_desc.block_type.shape[0]
    _, start, end, num_tiles, page_row_ptr = _program_split(page_table_ptr, seq_lens_ptr, STRIDE_PTB, CAPACITY,
                                                            NUM_KV_SPLITS)  # fmt: skip
    col = gl.program_id(0) * HEAD_DIM
    p0, p1, p2, p3 = _tile_pages(page_row_ptr, start, end, PAGE_SIZE, BOX)
    for i in range(num_tiles):
        stage = i % NUM_STAGES
        tile_start = start + i * BLOCK_N
        # The consumer's release of this stage's previous tile.
        mbarrier.wait(empty.index(stage), ((i // NUM_STAGES) & 1) ^ 1, pred=i >= NUM_STAGES)
        bar = full.index(stage)
        k_buf = k_ring.index(stage)
        v_buf = v_ring.index(stage)
        mbarrier.expect(bar, 2 * BLOCK_N * HEAD_DIM)
        _copy_box(k_desc, v_desc, k_buf, v_buf, bar, p0, tile_start, num_pages, col, 0, PAGE_SIZE, BOX)
        if BLOCK_N // BOX > 1:
            _copy_box(k_desc, v_desc, k_buf, v_buf, bar, p1, tile_start + BOX, num_pages, col, 1, PAGE_SIZE, BOX)
        if BLOCK_N // BOX > 2:
            _copy_box(k_desc, v_desc, k_buf, v_buf, bar, p2, tile_start + 2 * BOX, num_pages, col, 2, PAGE_SIZE, BOX)
            _copy_box(k_desc, v_desc, k_buf, v_buf, bar, p3, tile_start + 3 * BOX, num_pages, col, 3, PAGE_SIZE, BOX)
        p0, p1, p2, p3 = _tile_pages(page_row_ptr, tile_start + BLOCK_N, end, PAGE_SIZE, BOX)


@gluon.jit
def _ok(page, num_pages):
    return (page >= 0) & (page < num_pages)


@gluon.jit
def _load_q(q_ptr, q_base, STRIDE_QH, G: gl.constexpr, ROWS: gl.constexpr, HEAD_DIM: gl.constexpr,
            layout: gl.constexpr):  # fmt: skip
    """This program's query rows [ROWS, HEAD_DIM] in f32 (rows past G: zeros)."""
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
    ptrs = q_ptr + q_base + rows[:, None] * STRIDE_QH + cols[None, :]
    return gl.load(ptrs, mask=(rows < G)[:, None], other=0.0).to(gl.float32)


@gluon.jit
def _split_e4m3(x):
    """(hi, lo), both e4m3, with hi + lo = x to 8 significant bits, for |x| <= 464 (above,
    hi would round to 480, past e4m3's 448; the callers' Q is at most Q_LARGEST, P * P_SCALE
    at most 256).

    hi is x rounded to e4m3's grid (4 significant bits, at most 2**-9 apart) by f32
    arithmetic -- the same value as ``x.to(float8e4nv)`` -- so that lo = x - hi needs no
    e4m3 -> f16 conversion: ptxas 12.8 and 12.9 (Triton 3.6's and 3.9's) miscompile the
    unpacks of packed e4m3 pairs here, reading another register (seen on an H100 as
    wrong lo terms; ptxas 13.0 compiles the same PTX correctly)."""
    biased = gl.maximum((x.to(gl.int32, bitcast=True) >> 23) & 0xFF, 121)  # exponent, >= e4m3's smallest normal
    grid = ((biased - 3) << 23).to(gl.float32, bitcast=True)  # 2**(exponent - 3)
    inverse = ((257 - biased) << 23).to(gl.float32, bitcast=True)
    hi = ((x * inverse + 12582912.0) - 12582912.0) * grid  # (1.5 * 2**23: round to the nearest even integer)
    return hi.to(gl.float8e4nv), (x - hi).to(gl.float8e4nv)


@gluon.jit
def _chunk_scores(k_tile, q_hi, q_lo, s_zero, c: gl.constexpr):
    """The products of K's and Q's 32 columns from ``32 c`` (one MMA's K) with Q's two
    e4m3 terms, each in a fresh accumulator (asynchronous: wait on both)."""
    k_c = k_tile.slice(32 * c, 32, dim=1)
    hi = warpgroup_mma(k_c, q_hi.slice(32 * c, 32, dim=1).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    lo = warpgroup_mma(k_c, q_lo.slice(32 * c, 32, dim=1).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    return hi, lo


@gluon.jit
def _transpose_v(v_tile, vt, valid_rows, whole):
    """V^T (tokens contiguous) from a landed V tile [64 tokens, 128], rows of invalid
    tokens zeroed (unless ``whole``).  Each thread reads 4 tokens x 16 bytes and writes
    16 head-dim rows x 4 tokens (the permuted load layout itself: no exchange between threads)."""
    load_layout: gl.constexpr = gl.BlockedLayout([4, 16], [4, 8], [4, 1], [1, 0])
    store_layout: gl.constexpr = gl.BlockedLayout([16, 4], [8, 4], [1, 4], [0, 1])
    v = v_tile.load(load_layout)
    if not whole:
        ok = gl.convert_layout(valid_rows, gl.SliceLayout(1, load_layout))
        v = gl.where(ok[:, None], v, gl.zeros_like(v))
    vt.store(gl.convert_layout(gl.permute(v, (1, 0)), store_layout))


@gluon.jit
def _column_softmax(s, m_i, l_acc):
    """One tile's online-softmax step down each column of S^T (base-2 scores; a column is
    a query row): its P on the new running maximum, the factor that rescales what came
    before, the new maximum and the per-element column sums.  A column with no valid
    score yet keeps maximum -inf and P 0 (no exp of inf)."""
    m_new = gl.maximum(m_i, gl.max(s, 0))
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_safe)
    p = gl.exp2(s - m_safe[None, :])
    return p, alpha, m_new, l_acc * alpha[None, :] + p


@gluon.jit
def _consumer(args, consts: gl.constexpr):
    """One warpgroup: per tile S^T = K Q^T, the online softmax down each column, O^T += V^T P^T."""
    (k_desc, v_desc, q_ptr, page_table_ptr, seq_lens_ptr, k_scale_ptr, v_scale_ptr, num_pages, mid_o_ptr, mid_lse_ptr,
     k_ring, v_ring, full, empty, q_hi, q_lo, p_hi, p_lo, vt) = args  # fmt: skip
    STRIDE_QB: gl.constexpr = consts[0]
    STRIDE_QH: gl.constexpr = consts[1]
    STRIDE_PTB: gl.constexpr = consts[2]
    STRIDE_MOB: gl.constexpr = consts[3]
    STRIDE_MOH: gl.constexpr = consts[4]
    STRIDE_MOS: gl.constexpr = consts[5]
    STRIDE_MLB: gl.constexpr = consts[6]
    STRIDE_MLH: gl.constexpr = consts[7]
    STRIDE_MLS: gl.constexpr = consts[8]
    SM_SCALE: gl.constexpr = consts[9]
    NUM_HEADS: gl.constexpr = consts[10]
    NUM_KV_HEADS: gl.constexpr = consts[11]
    PAGE_SIZE: gl.constexpr = consts[13]
    CAPACITY: gl.constexpr = consts[14]
    NUM_KV_SPLITS: gl.constexpr = consts[15]
    NUM_STAGES: gl.constexpr = consts[16]
    K_SCALE: gl.constexpr = consts[17]
    V_SCALE: gl.constexpr = consts[18]
    HEAD_DIM: gl.constexpr = k_desc.block_type.shape[1]
    BOX: gl.constexpr = k_desc.block_type.shape[0]
    G: gl.constexpr = NUM_HEADS // NUM_KV_HEADS
    ROWS: gl.constexpr = q_hi.shape[0]

    kv_head = gl.program_id(0)
    split_idx = gl.program_id(2)
    batch_idx, start, end, num_tiles, page_row_ptr = _program_split(page_table_ptr, seq_lens_ptr, STRIDE_PTB,
                                                                    CAPACITY, NUM_KV_SPLITS)  # fmt: skip

    # S^T [64 tokens, ROWS] and O^T [HEAD_DIM, ROWS]: warpgroup-MMA accumulators.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, ROWS, 32])  # fmt: skip
    o_layout: gl.constexpr = s_layout  # (M = HEAD_DIM: the warps' 64 rows repeat)
    tokens_of_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    rows_of_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 * 8 // HEAD_DIM, HEAD_DIM // 8], [4, 1], [1, 0])

    # Q scaled per row by a power of two into e4m3's range, as two e4m3 terms.
    q = _load_q(q_ptr, batch_idx * STRIDE_QB + (kv_head * G) * STRIDE_QH, STRIDE_QH, G, ROWS, HEAD_DIM, q_layout)
    qk_scale = SM_SCALE * LOG2E
    if K_SCALE == 1:
        qk_scale = qk_scale * gl.load(k_scale_ptr)
    elif K_SCALE == 2:
        qk_scale = qk_scale * gl.load(k_scale_ptr + kv_head)
    amax = gl.max(gl.abs(q), 1)
    exponent = gl.where(amax > 0, gl.floor(gl.log2(Q_LARGEST / gl.maximum(amax, 1e-30))), 0.0)
    exponent = gl.minimum(gl.maximum(exponent, -120.0), 120.0)
    q_terms = _split_e4m3(q * gl.exp2(exponent)[:, None])
    q_hi.store(q_terms[0])
    q_lo.store(q_terms[1])
    col_scale = qk_scale * gl.exp2(-gl.convert_layout(exponent, rows_of_s))
    fence_async_shared()
    _cta_barrier()

    m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=rows_of_s)
    # Column sums are kept per element and reduced once at the end: no cross-warp sum per tile.
    l_acc = gl.zeros([BLOCK_N, ROWS], gl.float32, layout=s_layout)
    acc = gl.zeros([HEAD_DIM, ROWS], gl.float32, layout=o_layout)
    o_zero = gl.zeros([HEAD_DIM, ROWS], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_N, ROWS], gl.float32, layout=s_layout)
    offs_t = gl.arange(0, BLOCK_N, layout=tokens_of_s)
    p0, p1, p2, p3 = _tile_pages(page_row_ptr, start, end, PAGE_SIZE, BOX)
    for i in range(num_tiles):
        stage = i % NUM_STAGES
        tile_start = start + i * BLOCK_N
        whole = tile_start + BLOCK_N <= end
        whole = whole & _ok(p0, num_pages) & (_ok(p1, num_pages) | (BLOCK_N // BOX < 2))
        whole = whole & ((_ok(p2, num_pages) & _ok(p3, num_pages)) | (BLOCK_N // BOX < 4))
        p0, p1, p2, p3 = _tile_pages(page_row_ptr, tile_start + BLOCK_N, end, PAGE_SIZE, BOX)
        valid = offs_t < BLOCK_N
        if not whole:
            pos = tile_start + offs_t
            page = gl.load(page_row_ptr + pos // PAGE_SIZE, mask=pos < end, other=-1)
            valid = (pos < end) & _ok(page, num_pages)
        mbarrier.wait(full.index(stage), (i // NUM_STAGES) & 1)
        k_tile = k_ring.index(stage)
        # S^T by 32-column chunk of K and Q term, each product in a fresh accumulator
        # (one MMA), summed in f32: an fp8 MMA keeps about 13 mantissa bits of the
        # accumulator it adds to.  Two chunks at a time (four accumulators live); V^T is
        # made while the first two run.
        h0, l0 = _chunk_scores(k_tile, q_hi, q_lo, s_zero, 0)
        h1, l1 = _chunk_scores(k_tile, q_hi, q_lo, s_zero, 1)
        _transpose_v(v_ring.index(stage), vt, valid, whole)
        h0, l0, h1, l1 = warpgroup_mma_wait(0, deps=(h0, l0, h1, l1))
        s = (h0 + l0) + (h1 + l1)
        h2, l2 = _chunk_scores(k_tile, q_hi, q_lo, s_zero, 2)
        h3, l3 = _chunk_scores(k_tile, q_hi, q_lo, s_zero, 3)
        h2, l2, h3, l3 = warpgroup_mma_wait(0, deps=(h2, l2, h3, l3))
        s = s + ((h2 + l2) + (h3 + l3))

        # Online softmax down each column (a query head) over the tile's tokens.
        s = s * col_scale[None, :]
        if not whole:
            s = gl.where(valid[:, None], s, float("-inf"))
        p, alpha, m_i, l_acc = _column_softmax(s, m_i, l_acc)
        p_terms = _split_e4m3(p * P_SCALE)
        p_hi.store(gl.permute(p_terms[0], (1, 0)))
        p_lo.store(gl.permute(p_terms[1], (1, 0)))
        fence_async_shared()
        _cta_barrier()
        mbarrier.arrive(empty.index(stage))  # K and V of this stage are read: the producer may refill it
        # The tile's P V in a fresh accumulator, added to O^T in f32: an fp8 MMA keeps only
        # about 13 mantissa bits of the accumulator it adds to, so a running O^T inside
        # the MMAs would lose precision with every tile.
        pv = warpgroup_mma(vt, p_hi.permute((1, 0)), o_zero, use_acc=False, is_async=True)
        pv = warpgroup_mma(vt, p_lo.permute((1, 0)), pv, is_async=True)
        pv = warpgroup_mma_wait(0, deps=(pv,))
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(0, o_layout))[None, :] + pv
        _cta_barrier()  # every warp's products are done with V^T and P before they are rewritten

    l_i = gl.sum(l_acc, 0)
    has_tokens = l_i > 0
    l_safe = gl.where(has_tokens, l_i, 1.0)
    lse = gl.where(has_tokens, (m_i + gl.log2(l_safe)) * LN2, float("-inf"))
    out_scale = 1.0 / (l_safe * P_SCALE)
    if V_SCALE == 1:
        out_scale = out_scale * gl.load(v_scale_ptr)
    elif V_SCALE == 2:
        out_scale = out_scale * gl.load(v_scale_ptr + kv_head)
    o = acc * gl.convert_layout(out_scale, gl.SliceLayout(0, o_layout))[None, :]
    dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(1, o_layout))
    rows_o = gl.arange(0, ROWS, layout=gl.SliceLayout(0, o_layout))
    heads_o = (kv_head * G + rows_o).to(gl.int64)
    o_ptrs = mid_o_ptr + batch_idx * STRIDE_MOB + split_idx * STRIDE_MOS + heads_o[None, :] * STRIDE_MOH + dims[:, None]
    gl.store(o_ptrs, o, mask=(rows_o < G)[None, :])
    rows_s = gl.arange(0, ROWS, layout=rows_of_s)
    lse_ptrs = mid_lse_ptr + batch_idx * STRIDE_MLB + split_idx * STRIDE_MLS + (kv_head * G + rows_s) * STRIDE_MLH
    gl.store(lse_ptrs, lse, mask=rows_s < G)


@gluon.jit
def _gqa_stage1_hopper_fp8(
    k_desc,  # TMA over the K cache as [num_pages * page_size, num_kv_heads * head_dim] e4m3, block [BOX, head_dim]
    v_desc,  # the same over the V cache
    q_ptr,  # bf16 [batch, num_heads, head_dim]
    page_table_ptr,  # int32 [batch, max_pages]
    seq_lens_ptr,  # int32 [batch]
    k_scale_ptr,  # f32 (read if K_SCALE: 1 per tensor, 2 per KV head)
    v_scale_ptr,  # f32 (read if V_SCALE)
    num_pages,  # int
    mid_o_ptr,  # f32 [batch, num_heads, num_kv_splits, head_dim]
    mid_lse_ptr,  # f32 [batch, num_heads, num_kv_splits]
    STRIDE_QB: gl.constexpr,
    STRIDE_QH: gl.constexpr,
    STRIDE_PTB: gl.constexpr,
    STRIDE_MOB: gl.constexpr,
    STRIDE_MOH: gl.constexpr,
    STRIDE_MOS: gl.constexpr,
    STRIDE_MLB: gl.constexpr,
    STRIDE_MLH: gl.constexpr,
    STRIDE_MLS: gl.constexpr,
    SM_SCALE: gl.constexpr,
    NUM_HEADS: gl.constexpr,
    NUM_KV_HEADS: gl.constexpr,
    ROWS: gl.constexpr,  # the MMA's N: query heads per KV head, padded to 8, 16, 32 or 64
    PAGE_SIZE: gl.constexpr,  # a multiple of 16
    CAPACITY: gl.constexpr,
    NUM_KV_SPLITS: gl.constexpr,
    NUM_STAGES: gl.constexpr,
    K_SCALE: gl.constexpr,
    V_SCALE: gl.constexpr,
):
    HEAD_DIM: gl.constexpr = k_desc.block_type.shape[1]
    BOX: gl.constexpr = k_desc.block_type.shape[0]
    gl.static_assert(gl.num_warps() == 4, "one warpgroup")
    gl.static_assert(BOX == 16 or BOX == 32 or BOX == 64, "boxes of 16, 32 or 64 rows")
    gl.static_assert(BOX == PAGE_SIZE or PAGE_SIZE % BLOCK_N == 0, "a box inside one page")
    gl.static_assert(HEAD_DIM == 128, "head_dim 128")
    gl.static_assert(NUM_HEADS // NUM_KV_HEADS <= ROWS, "ROWS holds the group")
    gl.static_assert(ROWS == 8, "8 MMA columns: wider ones spill at the register cap")
    ring_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], gl.float8e4nv)
    k_ring = gl.allocate_shared_memory(gl.float8e4nv, [NUM_STAGES, BLOCK_N, HEAD_DIM], ring_layout)
    v_ring = gl.allocate_shared_memory(gl.float8e4nv, [NUM_STAGES, BLOCK_N, HEAD_DIM], ring_layout)
    full = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, HEAD_DIM], gl.float8e4nv)
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, BLOCK_N], gl.float8e4nv)
    vt_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HEAD_DIM, BLOCK_N], gl.float8e4nv)
    q_hi = gl.allocate_shared_memory(gl.float8e4nv, [ROWS, HEAD_DIM], q_layout)
    q_lo = gl.allocate_shared_memory(gl.float8e4nv, [ROWS, HEAD_DIM], q_layout)
    p_hi = gl.allocate_shared_memory(gl.float8e4nv, [ROWS, BLOCK_N], p_layout)
    p_lo = gl.allocate_shared_memory(gl.float8e4nv, [ROWS, BLOCK_N], p_layout)
    vt = gl.allocate_shared_memory(gl.float8e4nv, [HEAD_DIM, BLOCK_N], vt_layout)
    for st in gl.static_range(NUM_STAGES):
        mbarrier.init(full.index(st), count=1)
        mbarrier.init(empty.index(st), count=1)
    fence_async_shared()
    args = (k_desc, v_desc, q_ptr, page_table_ptr, seq_lens_ptr, k_scale_ptr, v_scale_ptr, num_pages, mid_o_ptr,
            mid_lse_ptr, k_ring, v_ring, full, empty, q_hi, q_lo, p_hi, p_lo, vt)  # fmt: skip
    consts: gl.constexpr = (STRIDE_QB, STRIDE_QH, STRIDE_PTB, STRIDE_MOB, STRIDE_MOH, STRIDE_MOS, STRIDE_MLB,
                            STRIDE_MLH, STRIDE_MLS, SM_SCALE, NUM_HEADS, NUM_KV_HEADS, ROWS, PAGE_SIZE, CAPACITY,
                            NUM_KV_SPLITS, NUM_STAGES, K_SCALE, V_SCALE)  # fmt: skip
    gl.warp_specialize([(_consumer, (args, consts)), (_producer, (args, consts))], [1], [PRODUCER_REGISTERS])
