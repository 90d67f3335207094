"""Stage 1 of MLA decode (576/512, bf16 or e4m3 cache) for few query rows per latent
head, on Hopper (sm_90), in Gluon: the tokens are the MMAs' rows ("swap AB").  The
planner's choice for at most 32 query rows (``LaunchConfig.hopper_narrow``).

Imports only ``triton``.  Dimension names as in :mod:`jax_decode.kernels.decode`.

Why: a warpgroup MMA has 64 rows.  The seesaw kernels (:mod:`jax_decode.kernels.mla_hopper`)
put the query rows there, so with 16 heads (DeepSeek-V3 under 8-way tensor
parallelism) 48 of a program's 64 rows are padding: four times the products the
answer needs.  The rows are then bound by the tensor cores, not by the bytes of the
latent.  Here the 64 tokens of a K tile are the MMAs' rows and the (query token,
head) rows their N (16 or 32 columns), so the products are those the answer needs:

* S^T [64 tokens, ROWS] = K Q^T: A is the K tile as it lands (K-major), B is Q^T
  (Q's rows in shared memory, K-major), over the tile's three parts (rope, latent
  halves);
* the online softmax runs down each column (a query row) over the tile's tokens;
* O^T [512, ROWS] += V^T P^T: A is the tile's latent halves read transposed (V is the
  latent, its tokens the product's K; a 16-bit operand may be read either way), B is
  P^T from shared memory.  O^T is two [256, ROWS] accumulators.

One program = all query rows (``Q_LEN * num_heads``, at most ``ROWS``) of one KV split
of one batch row, grid ``(1, batch, NUM_KV_SPLITS)`` -- or, under the device-side
schedule of :mod:`jax_decode.kernels.schedule` (``_mla_stage1_hopper_narrow_scheduled``,
grid ``(1, NUM_PROGRAMS, 1)``), the chunks of a program's share of the batch's work in
turn, each written to its slot of the partials for ``_schedule_merge``, or, for a row
of one chunk, to ``out`` and ``lse`` themselves.  A producer warp copies the
tiles into a ring of ``NUM_STAGES`` stages by TMA (the seesaw's descriptors: latent
halves [64, 256] and the rope part [64, 64] of the cache viewed as ``[num_pages *
page_size, 576]``); one consumer warpgroup computes, and releases a stage once its
P V has retired.  Q (read once) is loaded through a pointer, so only the cache needs
TMA-addressable rows.

Output: what ``_decode_stage1`` writes with fixed splits, so ``_decode_stage2`` merges
it: ``mid_o`` f32 ``[batch, (Q_LEN,) num_heads, num_kv_splits, 512]`` normalised per
split, ``mid_lse`` f32 ``[batch, (Q_LEN,) num_heads, num_kv_splits]`` (natural log); a
split (or a row of it) with no valid token writes zeros and ``-inf``.  With one split
it writes ``out`` (cast to its dtype) and ``lse`` themselves, as the seesaw does.
Splits are the seesaw's: whole 64-token tiles (``split_bounds`` with ``BLOCK_N = 64``).

An e4m3 cache (``KV_FP8``) lands as fp8 in the upper half of each part's float16 buffer
and is widened there: by the consumer before its products, or (``WIDENER``) by a third
partition, a warpgroup of its own, which waits for the tile's TMA (``full``), widens it
and hands the stage to the consumer (``widened``) while the consumer computes on the
other stage: the conversions then run beside the products, not in series with them.

Several query tokens (``Q_LEN > 1``): rows are (query token, head) pairs, token-major
as q lays them out, each masked to its causal limit ``seq_len - Q_LEN + token + 1``.

Safety rules as in :mod:`jax_decode.kernels.common`: ``seq_len`` clamped to ``[0,
CAPACITY]``; a page-table entry is read only for a tile holding a token before
``end``; a page id outside ``[0, num_pages)`` is copied from page 0 and its tokens
masked; the latent rows of a tile past ``end`` or on a bad page are zeroed in shared
memory before they meet P, so NaN in unused slots cannot leak through ``0 * NaN``.
TMA coordinates are 32-bit (caches of up to 2**31 token rows); batch indices are
widened to int64 before they multiply strides.
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

from jax_decode.kernels.gqa_hopper import _column_softmax
from jax_decode.kernels.mla_hopper import (
    LN2,
    LOG2E,
    ROPE_COL,
    _as_dtype,
    _cta_barrier,
    _mla_chunk,
    _mla_whole_row,
    _program_chunks,
    _row_offsets,
    _saturate_f16,
    _tma_load,
    _widen_part,
    _zero_invalid_rows,
)

BLOCK_N = gl.constexpr(64)  # tokens per tile: the MMAs' M
HALF = gl.constexpr(256)  # latent columns per TMA box
# Registers a thread of the producer warp keeps (Triton pads it to a warpgroup); the
# consumer warpgroup takes up to 256.  (24 spill the producer's chunk loop under the
# schedule; one program an SM leaves registers to spare.)
PRODUCER_REGISTERS = gl.constexpr(40)
# ... and of the widener warpgroup (an e4m3 cache with WIDENER): a part's 64 fp8 bytes a
# thread in flight, widened to 32 registers of float16 pairs.
WIDENER_REGISTERS = gl.constexpr(96)


@gluon.jit
def _chunk_row(c, first_row, SCHEDULED: gl.constexpr):
    """The batch row (int64) of a program's chunk ``c`` (see
    :func:`~jax_decode.kernels.mla_hopper._mla_chunk`)."""
    if SCHEDULED:
        row = first_row + c
    else:
        row = gl.program_id(1)
    return row.to(gl.int64)


@gluon.jit
def _tile_row(page_row_ptr, tile_start, num_pages, PAGE_SIZE: gl.constexpr):
    """TMA row of a tile's first token (page 0 where the page id is invalid) and whether
    its page is valid (a tile lies inside one page)."""
    page = gl.load(page_row_ptr + tile_start // PAGE_SIZE)
    ok = (page >= 0) & (page < num_pages)
    return gl.where(ok, page, 0) * PAGE_SIZE + tile_start % PAGE_SIZE, ok


@gluon.jit
def _narrow_chunk(c, first_row, page_table_ptr, seq_lens_ptr, schedule_ptr, consts: gl.constexpr):
    """:func:`~jax_decode.kernels.mla_hopper._mla_chunk` of the narrow kernels' ``consts``
    (the producer, widener and consumer walk the same chunks)."""
    return _mla_chunk(c, first_row, page_table_ptr, seq_lens_ptr, schedule_ptr, consts[3], consts[4], consts[7],
                      consts[8], consts[11], consts[13], consts[16], consts[17], consts[20], consts[21], consts[22],
                      consts[14])  # fmt: skip


@gluon.jit
def _producer(args, consts: gl.constexpr):
    """One warp: the TMA copies of the program's tiles (its chunks' in turn) into the
    ring, each stage once the consumer has released it."""
    (k_desc, kr_desc, q_ptr, page_table_ptr, seq_lens_ptr, k_scale_ptr, v_scale_ptr, schedule_ptr, num_pages,
     mid_o_ptr, mid_lse_ptr, out_ptr, lse_ptr, k_l, k_r, k_e, land, full, empty, widened, q_l, q_r, q_e,
     p_smem) = args  # fmt: skip
    PAGE_SIZE: gl.constexpr = consts[15]
    NUM_STAGES: gl.constexpr = consts[19]
    NUM_PROGRAMS: gl.constexpr = consts[20]
    SCHEDULED: gl.constexpr = consts[22]
    KV_FP8: gl.constexpr = consts[29]
    first_row, num_chunks = _program_chunks(schedule_ptr, NUM_PROGRAMS, SCHEDULED)
    done = 0  # tiles of the earlier chunks: the ring's position and phase run on across chunks
    for c in range(num_chunks):
        _seq_len, start, _end, num_tiles, page_row_ptr, _q_row, _o_base, _lse_base = _narrow_chunk(
            c, first_row, page_table_ptr, seq_lens_ptr, schedule_ptr, consts
        )
        for i in range(num_tiles):
            t = done + i
            stage = t % NUM_STAGES
            # The consumer's release of this stage's previous tile.
            mbarrier.wait(empty.index(stage), ((t // NUM_STAGES) & 1) ^ 1, pred=t >= NUM_STAGES)
            row, _page_ok = _tile_row(page_row_ptr, start + i * BLOCK_N, num_pages, PAGE_SIZE)
            bar = full.index(stage)
            mbarrier.expect(bar, 2 * k_desc.block_type.nbytes + kr_desc.block_type.nbytes)
            # (An fp8 cache lands in the upper half of each part's 16-bit bytes.)
            slot = 2 * stage + 1 if KV_FP8 else stage
            _tma_load(kr_desc, [row, ROPE_COL], bar, land[2].index(slot))
            _tma_load(k_desc, [row, 0], bar, land[0].index(slot))
            _tma_load(k_desc, [row, HALF], bar, land[1].index(slot))
        done += num_tiles


@gluon.jit
def _widener(args, consts: gl.constexpr):
    """One warpgroup (an e4m3 cache, ``WIDENER``): each tile's parts, landed as fp8 in
    the upper half of their float16 buffers, widened in place (the invalid rows zeroed)
    while the consumer computes on the other stage; then the stage is the consumer's."""
    (k_desc, kr_desc, q_ptr, page_table_ptr, seq_lens_ptr, k_scale_ptr, v_scale_ptr, schedule_ptr, num_pages,
     mid_o_ptr, mid_lse_ptr, out_ptr, lse_ptr, k_l, k_r, k_e, land, full, empty, widened, q_l, q_r, q_e,
     p_smem) = args  # fmt: skip
    PAGE_SIZE: gl.constexpr = consts[15]
    NUM_STAGES: gl.constexpr = consts[19]
    NUM_PROGRAMS: gl.constexpr = consts[20]
    SCHEDULED: gl.constexpr = consts[22]
    first_row, num_chunks = _program_chunks(schedule_ptr, NUM_PROGRAMS, SCHEDULED)
    done = 0  # the ring's position and phase run on across chunks, as the producer's
    for c in range(num_chunks):
        _seq_len, start, end, num_tiles, page_row_ptr, _q_row, _o_base, _lse_base = _narrow_chunk(
            c, first_row, page_table_ptr, seq_lens_ptr, schedule_ptr, consts
        )
        for i in range(num_tiles):
            t = done + i
            stage = t % NUM_STAGES
            tile_start = start + i * BLOCK_N
            _row, ok = _tile_row(page_row_ptr, tile_start, num_pages, PAGE_SIZE)
            mbarrier.wait(full.index(stage), (t // NUM_STAGES) & 1)
            # (each ends with a fence for the MMAs and a barrier of this warpgroup)
            _widen_part(k_e.index(stage), land[2].index(2 * stage + 1), tile_start, end, ok)
            _widen_part(k_l.index(stage), land[0].index(2 * stage + 1), tile_start, end, ok)
            _widen_part(k_r.index(stage), land[1].index(2 * stage + 1), tile_start, end, ok)
            mbarrier.arrive(widened.index(stage))
        done += num_tiles


@gluon.jit
def _store_q_part(q_ptr, q_rows, part, col: gl.constexpr, R: gl.constexpr, layout: gl.constexpr):
    """Q's columns ``[col, col + part's width)`` of the program's rows into ``part``
    (rows from R on: zeros)."""
    ROWS: gl.constexpr = part.shape[0]
    WIDTH: gl.constexpr = part.shape[1]
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = col + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, layout))
    offsets = gl.convert_layout(q_rows, gl.SliceLayout(1, layout))
    q = gl.load(q_ptr + offsets[:, None] + cols[None, :], mask=(rows < R)[:, None], other=0.0)
    if part.dtype == gl.float16:  # (for an fp8 cache)
        q = _saturate_f16(q)
    part.store(q.to(part.dtype))


@gluon.jit
def _store_rows(acc_l, acc_r, lse, l_safe, rows, o_ptr, lse_ptr, o_base, lse_base, STRIDE_OT, STRIDE_OH, STRIDE_LT,
                STRIDE_LH, NUM_HEADS: gl.constexpr, Q_LEN: gl.constexpr, layout: gl.constexpr,
                v_scale=1.0):  # fmt: skip
    """Store O^T's halves (divided by ``l_safe``, times ``v_scale``, cast to ``o_ptr``'s
    dtype) and the LSEs of the real rows (fewer than ``Q_LEN * NUM_HEADS``) at their
    (token, head) offsets."""
    R: gl.constexpr = Q_LEN * NUM_HEADS
    dims = gl.arange(0, HALF, layout=gl.SliceLayout(1, layout))
    o_rows = o_base + _row_offsets(rows.to(gl.int64), STRIDE_OT, STRIDE_OH, NUM_HEADS, Q_LEN)
    o_ptrs = o_ptr + o_rows[None, :] + dims[:, None]
    real = (rows < R)[None, :]
    out_type: gl.constexpr = o_ptr.dtype.element_ty
    gl.store(o_ptrs, (acc_l / l_safe[None, :] * v_scale).to(out_type), mask=real)
    gl.store(o_ptrs + HALF, (acc_r / l_safe[None, :] * v_scale).to(out_type), mask=real)
    lse_rows = lse_base + _row_offsets(rows, STRIDE_LT, STRIDE_LH, NUM_HEADS, Q_LEN)
    gl.store(lse_ptr + lse_rows, lse, mask=rows < R)


@gluon.jit
def _consumer(args, consts: gl.constexpr):
    """One warpgroup: per chunk, Q's rows into shared memory, then per tile S^T = K Q^T,
    the online softmax down each column, O^T += V^T P^T; the chunk's rows stored."""
    (k_desc, kr_desc, q_ptr, page_table_ptr, seq_lens_ptr, k_scale_ptr, v_scale_ptr, schedule_ptr, num_pages,
     mid_o_ptr, mid_lse_ptr, out_ptr, lse_ptr, k_l, k_r, k_e, land, full, empty, widened, q_l, q_r, q_e,
     p_smem) = args  # fmt: skip
    STRIDE_QB: gl.constexpr = consts[0]
    STRIDE_QT: gl.constexpr = consts[1]
    STRIDE_QH: gl.constexpr = consts[2]
    STRIDE_MOT: gl.constexpr = consts[5]
    STRIDE_MOH: gl.constexpr = consts[6]
    STRIDE_MLT: gl.constexpr = consts[9]
    STRIDE_MLH: gl.constexpr = consts[10]
    SM_SCALE: gl.constexpr = consts[12]
    NUM_HEADS: gl.constexpr = consts[13]
    Q_LEN: gl.constexpr = consts[14]
    PAGE_SIZE: gl.constexpr = consts[15]
    NUM_STAGES: gl.constexpr = consts[19]
    NUM_PROGRAMS: gl.constexpr = consts[20]
    SCHEDULED: gl.constexpr = consts[22]
    STRIDE_OB: gl.constexpr = consts[23]
    STRIDE_OT: gl.constexpr = consts[24]
    STRIDE_OH: gl.constexpr = consts[25]
    STRIDE_LB: gl.constexpr = consts[26]
    STRIDE_LT: gl.constexpr = consts[27]
    STRIDE_LH: gl.constexpr = consts[28]
    KV_FP8: gl.constexpr = consts[29]
    K_SCALE: gl.constexpr = consts[30]
    V_SCALE: gl.constexpr = consts[31]
    WIDENER: gl.constexpr = consts[32]
    ROWS: gl.constexpr = q_l.shape[0]
    R: gl.constexpr = Q_LEN * NUM_HEADS

    # S^T [64 tokens, ROWS] and O^T's halves [256, ROWS]: warpgroup-MMA accumulators (for
    # O^T the warps' 64 rows repeat).
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, ROWS, 16])  # fmt: skip
    tokens_of_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    rows_of_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    load_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    rows = gl.arange(0, ROWS, layout=rows_of_s)
    offs_t = gl.arange(0, BLOCK_N, layout=tokens_of_s)
    s_zero = gl.zeros([BLOCK_N, ROWS], gl.float32, layout=s_layout)
    qk_scale = SM_SCALE * LOG2E
    if K_SCALE > 0:
        qk_scale = qk_scale * gl.load(k_scale_ptr)  # (one KV head: a per-head scale has one value)
    v_scale = 1.0
    if V_SCALE > 0:
        v_scale = gl.load(v_scale_ptr)

    first_row, num_chunks = _program_chunks(schedule_ptr, NUM_PROGRAMS, SCHEDULED)
    done = 0  # tiles of the earlier chunks: the ring's position and phase run on across chunks
    for c in range(num_chunks):
        seq_len, start, end, num_tiles, page_row_ptr, _q_row, o_base, lse_base = _narrow_chunk(
            c, first_row, page_table_ptr, seq_lens_ptr, schedule_ptr, consts
        )
        batch_idx = _chunk_row(c, first_row, SCHEDULED)
        # The row's Q, (token, head) rows token-major, into shared memory (the previous
        # chunk's products are done with it: each tile ends with a warpgroup barrier).
        q_rows = batch_idx * STRIDE_QB + _row_offsets(rows.to(gl.int64), STRIDE_QT, STRIDE_QH, NUM_HEADS, Q_LEN)
        _store_q_part(q_ptr, q_rows, q_l, 0, R, load_layout)
        _store_q_part(q_ptr, q_rows, q_r, HALF, R, load_layout)
        _store_q_part(q_ptr, q_rows, q_e, ROPE_COL, R, load_layout)
        fence_async_shared()
        _cta_barrier()

        # Where each row's positions end: ``end``, or its causal limit among the new tokens.
        if Q_LEN > 1:
            limit = gl.minimum(seq_len - Q_LEN + rows // NUM_HEADS + 1, end)
        else:
            limit = gl.full([ROWS], 0, gl.int32, layout=rows_of_s) + end
        m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=rows_of_s)
        # Column sums are kept per element and reduced once at the end: no cross-warp sum per tile.
        l_acc = gl.zeros([BLOCK_N, ROWS], gl.float32, layout=s_layout)
        acc_l = gl.zeros([HALF, ROWS], gl.float32, layout=s_layout)
        acc_r = gl.zeros([HALF, ROWS], gl.float32, layout=s_layout)
        for i in range(num_tiles):
            t = done + i
            stage = t % NUM_STAGES
            tile_start = start + i * BLOCK_N
            _row, ok = _tile_row(page_row_ptr, tile_start, num_pages, PAGE_SIZE)
            if WIDENER:  # the widener warpgroup's float16 tile (invalid rows zeroed)
                mbarrier.wait(widened.index(stage), (t // NUM_STAGES) & 1)
            else:
                mbarrier.wait(full.index(stage), (t // NUM_STAGES) & 1)
            lat_l = k_l.index(stage)
            lat_r = k_r.index(stage)
            if KV_FP8:  # widened to float16 in place, the invalid rows zeroed on the way
                if not WIDENER:  # (else the widener did it)
                    _widen_part(k_e.index(stage), land[2].index(2 * stage + 1), tile_start, end, ok)
                    _widen_part(lat_l, land[0].index(2 * stage + 1), tile_start, end, ok)
                    _widen_part(lat_r, land[1].index(2 * stage + 1), tile_start, end, ok)
            elif (tile_start + BLOCK_N > end) | (~ok):
                # The latent rows past the end (all, for a bad page) meet P as V: zero them.
                _zero_invalid_rows(lat_l, tile_start, end, ok, load_layout)
                _zero_invalid_rows(lat_r, tile_start, end, ok, load_layout)
                fence_async_shared()
                _cta_barrier()
            s = warpgroup_mma(k_e.index(stage), q_e.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma(lat_l, q_l.permute((1, 0)), s, is_async=True)
            s = warpgroup_mma(lat_r, q_r.permute((1, 0)), s, is_async=True)
            s = warpgroup_mma_wait(0, deps=(s,))

            # Online softmax down each column (a query row) over the tile's tokens.
            pos = tile_start + offs_t
            valid = ((pos < end) & ok)[:, None] & (pos[:, None] < limit[None, :])
            s = gl.where(valid, s * qk_scale, float("-inf"))
            p, alpha, m_i, l_acc = _column_softmax(s, m_i, l_acc)
            p_smem.store(gl.permute(p.to(p_smem.dtype), (1, 0)))
            fence_async_shared()
            _cta_barrier()
            acc_l = acc_l * alpha[None, :]
            acc_r = acc_r * alpha[None, :]
            acc_l = warpgroup_mma(lat_l.permute((1, 0)), p_smem.permute((1, 0)), acc_l, is_async=True)
            acc_r = warpgroup_mma(lat_r.permute((1, 0)), p_smem.permute((1, 0)), acc_r, is_async=True)
            acc_l, acc_r = warpgroup_mma_wait(0, deps=(acc_l, acc_r))
            # Every warp's products are done with the stage, P and Q before any is rewritten.
            _cta_barrier()
            mbarrier.arrive(empty.index(stage))
        done += num_tiles

        l_i = gl.sum(l_acc, 0)
        has_tokens = l_i > 0
        l_safe = gl.where(has_tokens, l_i, 1.0)
        lse = gl.where(has_tokens, (m_i + gl.log2(l_safe)) * LN2, float("-inf"))
        # Under the schedule a row of one chunk goes to out and lse (the merge leaves it
        # alone); every other chunk to its partials (a split's, or the schedule's slot).
        whole: gl.constexpr = False
        if SCHEDULED:
            whole, _row = _mla_whole_row(c, first_row, schedule_ptr, NUM_PROGRAMS)
        if whole:
            _store_rows(acc_l, acc_r, lse, l_safe, rows, out_ptr, lse_ptr, batch_idx * STRIDE_OB, batch_idx * STRIDE_LB,
                        STRIDE_OT, STRIDE_OH, STRIDE_LT, STRIDE_LH, NUM_HEADS, Q_LEN, s_layout, v_scale)  # fmt: skip
        else:
            _store_rows(acc_l, acc_r, lse, l_safe, rows, mid_o_ptr, mid_lse_ptr, o_base, lse_base, STRIDE_MOT,
                        STRIDE_MOH, STRIDE_MLT, STRIDE_MLH, NUM_HEADS, Q_LEN, s_layout, v_scale)  # fmt: skip


@gluon.jit
def _narrow_run(k_desc, kr_desc, q_ptr, page_table_ptr, seq_lens_ptr, k_scale_ptr, v_scale_ptr, schedule_ptr, num_pages,
                mid_o_ptr, mid_lse_ptr, out_ptr, lse_ptr, consts):  # fmt: skip
    """Allocate the ring, Q, P and the barriers, and run the consumer warpgroup and the
    producer warp (and, with ``WIDENER``, the widener warpgroup).  With an fp8 cache
    (``consts[29]``) the ring's parts hold float16, each landing by TMA as fp8 in the
    upper half of its own bytes and widened in place by the consumer, or by the widener
    (the seesaw's :func:`~jax_decode.kernels.mla_hopper._widen_part`), and Q and P are
    float16."""
    PAGE_SIZE: gl.constexpr = consts[15]
    ROWS: gl.constexpr = consts[18]
    NUM_STAGES: gl.constexpr = consts[19]
    KV_FP8: gl.constexpr = consts[29]
    gl.static_assert(gl.num_warps() == 4, "one consumer warpgroup")
    gl.static_assert(k_desc.block_type.shape[0] == BLOCK_N and k_desc.block_type.shape[1] == HALF, "latent halves")
    gl.static_assert(kr_desc.block_type.shape[1] == 64, "the rope part")
    gl.static_assert(PAGE_SIZE % BLOCK_N == 0, "a K tile must lie inside one page")
    gl.static_assert(ROWS == 16 or ROWS == 32, "16 or 32 MMA columns")
    gl.static_assert(consts[13] * consts[14] <= ROWS, "ROWS holds the program's query rows")  # NUM_HEADS * Q_LEN
    if KV_FP8:
        dtype: gl.constexpr = gl.float16
        half_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HALF], gl.float16)
        rope_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, 64], gl.float16)
    else:
        dtype: gl.constexpr = gl.bfloat16
        half_layout: gl.constexpr = k_desc.layout
        rope_layout: gl.constexpr = kr_desc.layout
    k_l = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HALF], half_layout)
    k_r = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HALF], half_layout)
    k_e = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, 64], rope_layout)
    if KV_FP8:
        # Each stage's part as two fp8 buffers of its size: index 2 s + 1 is its upper half.
        # (The descriptors' layouts bound as constexprs: Triton 3.6 hands a descriptor's
        # layout attribute over as a plain object, which it cannot pass on.)
        fp8_half_layout: gl.constexpr = k_desc.layout
        fp8_rope_layout: gl.constexpr = kr_desc.layout
        land = (_as_dtype(k_l, gl.float8e4nv, [2 * NUM_STAGES, BLOCK_N, HALF], fp8_half_layout),
                _as_dtype(k_r, gl.float8e4nv, [2 * NUM_STAGES, BLOCK_N, HALF], fp8_half_layout),
                _as_dtype(k_e, gl.float8e4nv, [2 * NUM_STAGES, BLOCK_N, 64], fp8_rope_layout))  # fmt: skip
    else:
        land = (k_l, k_r, k_e)
    full = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    if consts[32]:  # WIDENER: the widener hands each widened stage to the consumer
        widened = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    else:
        widened = empty  # (unused)
    q_half_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, HALF], dtype)
    q_rope_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, 64], dtype)
    q_l = gl.allocate_shared_memory(dtype, [ROWS, HALF], q_half_layout)
    q_r = gl.allocate_shared_memory(dtype, [ROWS, HALF], q_half_layout)
    q_e = gl.allocate_shared_memory(dtype, [ROWS, 64], q_rope_layout)
    p_smem = gl.allocate_shared_memory(dtype, [ROWS, BLOCK_N], q_rope_layout)
    for st in gl.static_range(NUM_STAGES):
        mbarrier.init(full.index(st), count=1)
        mbarrier.init(empty.index(st), count=1)
        if consts[32]:
            mbarrier.init(widened.index(st), count=1)
    fence_async_shared()
    args = (k_desc, kr_desc, q_ptr, page_table_ptr, seq_lens_ptr, k_scale_ptr, v_scale_ptr, schedule_ptr, num_pages,
            mid_o_ptr, mid_lse_ptr, out_ptr, lse_ptr, k_l, k_r, k_e, land, full, empty, widened, q_l, q_r, q_e,
            p_smem)  # fmt: skip
    if consts[32]:  # WIDENER: an e4m3 cache widened by a warpgroup of its own
        gl.static_assert(KV_FP8, "the widener widens an e4m3 cache")
        gl.warp_specialize([(_consumer, (args, consts)), (_producer, (args, consts)), (_widener, (args, consts))],
                           [1, 4], [PRODUCER_REGISTERS, WIDENER_REGISTERS])  # fmt: skip
    else:
        gl.warp_specialize([(_consumer, (args, consts)), (_producer, (args, consts))], [1], [PRODUCER_REGISTERS])


@gluon.jit
def _mla_stage1_hopper_narrow(
    k_desc,  # TMA over the cache as [num_pages * page_size, 576] (bf16 or e4m3), block [64, 256] (latent halves)
    kr_desc,  # the same, block [64, 64] (the rope part, at column 512)
    q_ptr,  # bf16 [batch, (Q_LEN,) num_heads, 576]
    page_table_ptr,  # int32 [batch, max_pages]
    seq_lens_ptr,  # int32 [batch]
    k_scale_ptr,  # f32 [1]: an fp8 cache's K scale (read if K_SCALE)
    v_scale_ptr,  # f32 [1]: its V scale (read if V_SCALE)
    num_pages,  # int: pages in the cache; ids outside [0, num_pages) are masked
    mid_o_ptr,  # f32 [batch, (Q_LEN,) num_heads, num_kv_splits, 512] (or the final out)
    mid_lse_ptr,  # f32 [batch, (Q_LEN,) num_heads, num_kv_splits] (or the final lse)
    STRIDE_QB: gl.constexpr,
    STRIDE_QT: gl.constexpr,
    STRIDE_QH: gl.constexpr,
    STRIDE_PTB: gl.constexpr,
    STRIDE_MOB: gl.constexpr,
    STRIDE_MOT: gl.constexpr,
    STRIDE_MOH: gl.constexpr,
    STRIDE_MOS: gl.constexpr,
    STRIDE_MLB: gl.constexpr,
    STRIDE_MLT: gl.constexpr,
    STRIDE_MLH: gl.constexpr,
    STRIDE_MLS: gl.constexpr,
    SM_SCALE: gl.constexpr,
    NUM_HEADS: gl.constexpr,
    Q_LEN: gl.constexpr,
    PAGE_SIZE: gl.constexpr,  # a multiple of 64
    CAPACITY: gl.constexpr,
    NUM_KV_SPLITS: gl.constexpr,
    ROWS: gl.constexpr,  # the MMAs' N: Q_LEN * NUM_HEADS padded to 16 or 32
    NUM_STAGES: gl.constexpr,
    KV_FP8: gl.constexpr,  # an e4m3 cache (widened to float16 in shared memory)
    K_SCALE: gl.constexpr,  # 0: none; else k_scale_ptr[0] multiplies the scores
    V_SCALE: gl.constexpr,  # 0: none; else v_scale_ptr[0] multiplies the output
    WIDENER: gl.constexpr,  # (KV_FP8) widen in a warpgroup of its own, not the consumer's
):
    """Fixed splits: compile with num_warps=4 (the consumer; the compiled kernel has 8 or,
    with ``WIDENER``, 12 warps: launch with its own count), grid ``(1, batch,
    NUM_KV_SPLITS)`` (the module docstring)."""
    consts: gl.constexpr = (STRIDE_QB, STRIDE_QT, STRIDE_QH, STRIDE_PTB, STRIDE_MOB, STRIDE_MOT, STRIDE_MOH,
                            STRIDE_MOS, STRIDE_MLB, STRIDE_MLT, STRIDE_MLH, STRIDE_MLS, SM_SCALE, NUM_HEADS, Q_LEN,
                            PAGE_SIZE, CAPACITY, NUM_KV_SPLITS, ROWS, NUM_STAGES, 1, 0, False, 0, 0, 0, 0, 0, 0,
                            KV_FP8, K_SCALE, V_SCALE, WIDENER)  # fmt: skip
    _narrow_run(k_desc, kr_desc, q_ptr, page_table_ptr, seq_lens_ptr, k_scale_ptr, v_scale_ptr, seq_lens_ptr,
                num_pages, mid_o_ptr, mid_lse_ptr, mid_o_ptr, mid_lse_ptr, consts)  # fmt: skip


@gluon.jit
def _mla_stage1_hopper_narrow_scheduled(
    k_desc,
    kr_desc,
    q_ptr,
    page_table_ptr,  # int32 [batch, max_pages]
    seq_lens_ptr,  # int32 [batch]
    k_scale_ptr,  # f32 [1] (read if K_SCALE)
    v_scale_ptr,  # f32 [1] (read if V_SCALE)
    schedule_ptr,  # int32: jax_decode.kernels.schedule._work_schedule's
    num_pages,  # int
    batch,  # int (the schedule's; unused here)
    mid_o_ptr,  # f32 [batch + NUM_PROGRAMS, (Q_LEN,) num_heads, 512], contiguous: partials by slot
    mid_lse_ptr,  # f32 [batch + NUM_PROGRAMS, (Q_LEN,) num_heads], contiguous
    out_ptr,  # [batch, (Q_LEN,) num_heads, 512], q's dtype: the rows of one chunk
    lse_ptr,  # f32 [batch, (Q_LEN,) num_heads]
    STRIDE_QB: gl.constexpr,
    STRIDE_QT: gl.constexpr,
    STRIDE_QH: gl.constexpr,
    STRIDE_PTB: gl.constexpr,
    SM_SCALE: gl.constexpr,
    NUM_HEADS: gl.constexpr,
    Q_LEN: gl.constexpr,
    PAGE_SIZE: gl.constexpr,
    CAPACITY: gl.constexpr,
    ROWS: gl.constexpr,
    NUM_STAGES: gl.constexpr,
    NUM_PROGRAMS: gl.constexpr,
    CHUNK_COST: gl.constexpr,
    STRIDE_OB: gl.constexpr,
    STRIDE_OT: gl.constexpr,
    STRIDE_OH: gl.constexpr,
    STRIDE_LB: gl.constexpr,
    STRIDE_LT: gl.constexpr,
    STRIDE_LH: gl.constexpr,
    KV_FP8: gl.constexpr,
    K_SCALE: gl.constexpr,
    V_SCALE: gl.constexpr,
    WIDENER: gl.constexpr,
):
    """The device-side schedule (jax_decode.kernels.schedule): compile with num_warps=4
    (launch with the compiled kernel's count, as above),
    grid ``(1, NUM_PROGRAMS, 1)``; chunk ``(p, b)`` to slot ``b + p`` of the partials,
    except that a row the schedule gives one chunk goes straight to ``out`` and ``lse``
    (the merge, run with ``SKIP_WHOLE``, leaves those rows alone)."""
    # (Partials by slot, [slot, Q_LEN, NUM_HEADS, 512] and [slot, Q_LEN, NUM_HEADS], from
    # the bases _mla_chunk gives.)
    consts: gl.constexpr = (STRIDE_QB, STRIDE_QT, STRIDE_QH, STRIDE_PTB, 0, NUM_HEADS * 512, 512, 0, 0, NUM_HEADS, 1, 0,
                            SM_SCALE, NUM_HEADS, Q_LEN, PAGE_SIZE, CAPACITY, 1, ROWS, NUM_STAGES, NUM_PROGRAMS,
                            CHUNK_COST, True, STRIDE_OB, STRIDE_OT, STRIDE_OH, STRIDE_LB, STRIDE_LT, STRIDE_LH, KV_FP8,
                            K_SCALE, V_SCALE, WIDENER)  # fmt: skip
    _narrow_run(k_desc, kr_desc, q_ptr, page_table_ptr, seq_lens_ptr, k_scale_ptr, v_scale_ptr, schedule_ptr,
                num_pages, mid_o_ptr, mid_lse_ptr, out_ptr, lse_ptr, consts)  # fmt: skip
