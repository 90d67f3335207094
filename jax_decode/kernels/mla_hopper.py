"""Stage 1 of MLA decode attention for Hopper (sm_90), written in Gluon.

Imports only ``triton``.  Dimension names as in :mod:`jax_decode.kernels.decode`::

    batch, num_heads, head_dim_qk (576 = 512 latent + 64 rope), head_dim_v (512),
    num_pages, page_size, max_pages, num_kv_splits

DeepSeek-V3 MLA decode is compute-bound: 128 query heads share one latent KV head,
so every K tile read from memory feeds 2 * 128 * (576 + 512) FLOPs per token.  The
portable ``tl.dot`` kernel cannot keep a [64, 512] fp32 accumulator and a pipeline in
registers at once; this kernel states the schedule explicitly.

Design (one program = 64 query heads x one KV split of one batch row; 8 warps = two
warpgroups; grid ``(cdiv(num_heads, 64), batch, num_kv_splits)``):

* shared memory: Q ``[64, 576]`` bf16 loaded once by TMA; a ring of 2 K tiles
  ``[64 tokens, 576]`` (one page of 64 tokens, or 64 contiguous tokens of a larger
  page), each stage with its own mbarrier; P ``[64, 64]`` bf16.  72 + 144 + 8 KB
  (229,912 bytes with the barriers: a third stage does not fit).  Block shapes must
  be powers of two, so Q and K each come through two descriptors over the same
  576-wide rows: blocks ``[64, 512]`` at column 0 (the latent) and ``[64, 64]`` at
  column 512 (the rope part).
* page ids are read from the page table an iteration before their TMA is issued, so
  no dependent global load sits on the loop's critical path.
* S = Q K^T by ``warpgroup_mma`` with the warps laid out [4, 2]: warpgroup w computes
  the scores of tokens 32w..32w+31 of the tile (M=64, N=32, K=512 + 64).  The row
  maximum of the online softmax is the only cross-warpgroup reduction per tile; row
  sums are kept per element and reduced once at the end.
* P = exp2(S - m) goes to shared memory in bf16 (fence + barrier), then
  O = O * alpha + P V with the same [4, 2] warps: warpgroup w owns output columns
  256w..256w+255 (M=64, N=256, K=64; 128 fp32 registers a thread).  V is the first
  512 columns of the K tile already in shared memory (no second read, no copy).
* ``PIPELINE=1`` (the default) issues tile i + 1's Q K^T right behind tile i's P V
  (all asynchronous), retires P V alone and refills its stage by TMA while the scores
  still run, so the tensor cores run the products back to back and each copy has
  almost two iterations to land.  ``PIPELINE=0`` waits for each product in turn (the
  plain reference schedule; the stage is refilled once its P V has retired).

Where it stands (triton 3.6, benchmarks/mla_hopper.py): 236 registers a thread in the
one-split launch, 254 with fp32 partials, no spills.  On the H100, b64 ctx4k 171 us
(FlashMLA 132 in the same run), b128 ctx1k 106 us (FlashMLA 77).  Nsight Compute: the
tensor pipe ~51% busy, DRAM ~48%; the warps mostly wait on their own MMAs, copies and
barriers.  Both warpgroups run the same phases in lock step (products, then softmax,
then the P barrier), so the tensor cores idle during each softmax.  Overlapping them
needs a third K stage (no room) or FlashMLA's "seesaw" (one warpgroup's softmax
against the other's products, warp-specialised, with K released chunk by chunk).
Copying each tile in 64/128/256-column chunks on their own barriers, with the scores
issued chunk by chunk, was measured 5-15% slower (docs/experiments.md).

``_mla_stage1_hopper_seesaw`` (below) is that seesaw, and what the launch config runs
(``_mla_stage1_hopper_seesaw_scheduled`` under the device-side schedule); the kernel
above is the baseline the tests and benchmarks hold it against
(``LaunchConfig.hopper_seesaw=False``).  The two warpgroups take alternate tiles and
split the output columns; each K tile arrives in three parts (rope, left and right
half of the latent), each refilled for the tile two ahead as soon as the last product
that reads it has retired (``_seesaw_partition`` has the schedule).  Its rows are
(token, head) pairs as below, so several query tokens run on it too.  Under the
schedule a program starts its next chunk's copies as soon as both warpgroups are done
with the current chunk's tiles, and a row the schedule gives one chunk is written to
``out`` and ``lse`` directly.  231,468 bytes of shared memory (231,484 scheduled), 255
registers, no spills (triton 3.6).  On
the H100, b64 ctx4k 150.7 us against 178.7 for the kernel above and 131.5 for FlashMLA
in the same run; b128 ctx1k 109.4 against 120.4 and 77.2 (docs/performance.md).

An e4m3 latent (``KV_FP8``, the seesaw kernels of this module; planned wherever the
cache is e4m3): the
same buffers and schedule, but each K part is copied as fp8 into the upper half of its
own (16-bit) buffer and widened there to float16 by the warpgroup that scores the tile,
as the part lands (``_widen_part``: the low columns first, the rest after a warpgroup
barrier; invalid rows zeroed on the way), and Q, landed as bfloat16, is rewritten as
float16, so the products run in float16 (e4m3 values are exact in it) with P in float16.
The scales multiply the scores (K) and the finished output (V).  It compiles for sm_90
(under triton 3.9: 231,596 bytes of shared memory, 128 more than bf16's, 255 registers,
8-16 bytes of stack with fixed splits and 232 scheduled, where the bf16 build has none
and 184).  On an H100 its GPU tests pass and its fixed-split and one-pass sanitizer
cases ran clean under memcheck (docs/performance.md, fp8).

Output: exactly what ``_decode_stage1`` writes, so ``_decode_stage2`` merges it
unchanged: ``mid_o`` f32 ``[batch, num_heads, num_kv_splits, 512]`` normalised per
split and ``mid_lse`` f32 ``[batch, num_heads, num_kv_splits]`` (natural log); a split
with no valid token writes zeros and ``-inf``.

Safety rules (as in :mod:`jax_decode.kernels.common`): ``seq_len`` is clamped to
``[0, CAPACITY]``; a tile whose page id lies outside ``[0, num_pages)`` is loaded from
page 0 and masked out entirely; the rows of a tile past ``seq_len`` (and the rows of
an invalid page) are zeroed in shared memory before the products, so garbage (even
NaN) in unused cache slots cannot leak through ``0 * NaN``.  Addresses of K rows are
formed by the TMA unit from the descriptor (64-bit base and strides); the page id
times page size is a 32-bit TMA coordinate, valid for caches of up to 2**31 token
rows.  Batch indices are widened to int64 before they multiply strides.

With one split, stage 1 alone is the whole decode: given the final ``out``
(``[batch, num_heads, 512]``, any float dtype: the output is cast to it) and ``lse``
(f32 ``[batch, num_heads]``) with split strides 0, it writes exactly what stage 2
would (its merge of one split is the identity), and stage 2 is skipped.

Splits: ``seq_len`` is cut into ``NUM_KV_SPLITS`` contiguous parts of whole 64-token
tiles (the ``split_bounds`` rule with ``BLOCK_N = 64``); stage 2 needs only each
split's normalised output and LSE.

Several query tokens (``Q_LEN > 1``, fixed splits only): a program's 64 rows are
(query token, head) pairs, token-major as q lays them out, each masked to its own
causal limit ``seq_len - Q_LEN + token + 1``; the K tiles are shared by all of them.

``_mla_stage1_hopper_scheduled`` runs the same chunk code (``_attend_chunk``) under the
device-side schedule of :mod:`jax_decode.kernels.schedule`: about one wave of programs
per head block, each attending in turn to the chunks of its share of the batch's work
and writing them by slot for ``_schedule_merge``.  The shared memory is allocated once per
program; the barriers are set up and retired per chunk.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

# Triton 3.6 calls the TMA load async_copy_global_to_shared; later versions async_load.
_tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
# Triton 3.6 calls the CTA barrier thread_barrier; later versions barrier.
_cta_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
# Triton 3.6 calls a shared-memory view's reinterpret _reinterpret.
_PUBLIC_REINTERPRET = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))

LOG2E = gl.constexpr(1.4426950408889634)
LN2 = gl.constexpr(0.6931471805599453)
# Rope columns start here: every descriptor spans whole 576-wide rows, so one buffer
# (what JAX's custom call hands a descriptor) serves the latent and the rope part.
ROPE_COL = gl.constexpr(512)

BLOCK_H = 64  # query heads per program (wgmma M)
BLOCK_N = 64  # tokens per K tile
HEAD_DIM_QK = 576
HEAD_DIM_V = 512
NUM_WARPS = 8


@gluon.jit
def _zero_invalid_rows(k_tile, tile_start, end, page_ok, layout: gl.constexpr):
    """Zero the rows of a landed K tile that are past ``end`` (or all, for a bad page)."""
    for c in gl.static_range(k_tile.shape[1] // 64):
        chunk = k_tile.slice(c * 64, 64, dim=1)
        chunk.store(_zero_rows_past(chunk.load(layout), tile_start, end, page_ok, False, layout))


@gluon.jit
def _tile_page(page_row_ptr, tile_start, num_pages, PAGE_SIZE: gl.constexpr):
    """TMA row of a tile's first token (page 0 when the page id is invalid) and validity."""
    page = gl.load(page_row_ptr + tile_start // PAGE_SIZE)
    page_ok = (page >= 0) & (page < num_pages)
    page = gl.where(page_ok, page, 0)
    return page * PAGE_SIZE + tile_start % PAGE_SIZE, page_ok


@gluon.jit
def _wait_tile(k_lat, k_rope, bar, phase, tile_start, end, page_ok, pred, layout: gl.constexpr):
    """Wait for a K tile to land; zero its rows past ``end`` (all rows for a bad page)."""
    mbarrier.wait(bar, phase, pred=pred)
    if pred & ((tile_start + k_lat.shape[0] > end) | (~page_ok)):
        _zero_invalid_rows(k_lat, tile_start, end, page_ok, layout)
        _zero_invalid_rows(k_rope, tile_start, end, page_ok, layout)
        fence_async_shared()
        _cta_barrier()


@gluon.jit
def _load_tile(k_desc, kr_desc, k_lat, k_rope, bar, row, pred):
    """Start the TMA copies of one K tile (latent and rope parts) into one ring stage."""
    mbarrier.expect(bar, k_desc.block_type.nbytes + kr_desc.block_type.nbytes, pred=pred)
    _tma_load(k_desc, [row, 0], bar, k_lat, pred=pred)
    _tma_load(kr_desc, [row, ROPE_COL], bar, k_rope, pred=pred)


@gluon.jit
def _page_of(page_row_ptr, start, tile, num_tiles, num_pages, BLOCK_N: gl.constexpr, PAGE_SIZE: gl.constexpr):
    """TMA row and validity of a split's tile (any in-bounds answer for tiles past the split)."""
    tile_start = gl.where(tile < num_tiles, start + tile * BLOCK_N, 0)
    return _tile_page(page_row_ptr, tile_start, num_pages, PAGE_SIZE)


@gluon.jit
def _mask_scores(s, tile_start, end, tile_ok, offs_n, row_limit, Q_LEN: gl.constexpr):
    """Scores of a tile's positions past ``end`` (all of them where not ``tile_ok``) to
    -inf; with Q_LEN > 1 also those past each row's causal limit."""
    valid = ((tile_start + offs_n) < end) & tile_ok
    if Q_LEN > 1:
        return gl.where(valid[None, :] & ((tile_start + offs_n)[None, :] < row_limit[:, None]), s, float("-inf"))
    return gl.where(valid[None, :], s, float("-inf"))


@gluon.jit
def _row_limits(first_row, seq_len, end, BLOCK_H: gl.constexpr, layout: gl.constexpr, NUM_HEADS: gl.constexpr,
                Q_LEN: gl.constexpr):  # fmt: skip
    """Where the positions a block's rows (from ``first_row`` on) attend to end: ``end``,
    or with Q_LEN > 1 per (token, head) row, as query token t of the batch row's last
    Q_LEN sees the positions before its own and itself."""
    if Q_LEN > 1:
        tokens = (first_row + gl.arange(0, BLOCK_H, layout=layout)) // NUM_HEADS
        limits = gl.minimum(seq_len - Q_LEN + tokens + 1, end)
    else:
        limits = end
    return limits


@gluon.jit
def _row_offsets(rows, STRIDE_T, STRIDE_H, NUM_HEADS: gl.constexpr, Q_LEN: gl.constexpr):
    """Offsets of a block's output rows: heads, or with Q_LEN > 1 (token, head) pairs,
    token-major."""
    if Q_LEN > 1:
        return (rows // NUM_HEADS) * STRIDE_T + (rows % NUM_HEADS) * STRIDE_H
    return rows * STRIDE_H


@gluon.jit
def _softmax_tile(s, tile_start, end, page_ok, m_i, l_acc, qk_scale, offs_n, row_limit, Q_LEN: gl.constexpr):
    """Online-softmax step of one tile's raw scores: P (f32, on the new running max),
    the factor ``alpha`` that rescales what came before, the new max and row sums.
    Positions past ``end`` (all, for a bad page; with Q_LEN > 1 past a row's causal
    limit) get probability 0."""
    s = _mask_scores(s * qk_scale, tile_start, end, page_ok, offs_n, row_limit, Q_LEN)
    m_new = gl.maximum(m_i, gl.max(s, 1))
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_safe)
    p = gl.exp2(s - m_safe[:, None])
    return p, alpha, m_new, l_acc * alpha[:, None] + p


@gluon.jit
def _attend_chunk(
    q_desc,
    qr_desc,
    k_desc,
    kr_desc,
    q_lat,
    q_rope,
    k_lat,
    k_rope,
    p_smem,
    q_bar,
    k_bars,
    page_row_ptr,  # this batch row's page-table row
    num_pages,
    q_row,  # TMA row of the first of this program's 64 query rows
    start,  # first token (a multiple of 64)
    end,  # one past the last token
    first_row,  # with Q_LEN > 1: the first of the program's rows (token * NUM_HEADS + head)
    seq_len,  # with Q_LEN > 1: the batch row's length, for the causal limits
    SM_SCALE: gl.constexpr,
    PAGE_SIZE: gl.constexpr,
    NUM_STAGES: gl.constexpr,
    PIPELINE: gl.constexpr,
    Q_LEN: gl.constexpr,  # query tokens per batch row: rows are (token, head) pairs
    NUM_HEADS: gl.constexpr,
):
    """Attention of 64 query heads over tokens ``[start, end)`` of one batch row: the
    normalised output ([64, 512] f32, in the P V accumulator's layout) and the LSE
    ([64], natural log; -inf with no token).  The barriers are set up here and retired
    at the end, so a program may attend to several chunks in turn with the same
    shared memory."""
    BLOCK_H: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM_V: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    # Scores: warpgroup w holds tokens 32w..32w+31; output: warpgroup w holds columns 256w...
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 32, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16])
    zero_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)

    num_tiles = gl.cdiv(gl.maximum(end - start, 0), BLOCK_N)
    mbarrier.init(q_bar, count=1)
    for st in gl.static_range(NUM_STAGES):
        mbarrier.init(k_bars.index(st), count=1)
    fence_async_shared()

    # Q rows of this head block (rows past this batch row's heads are other rows'
    # queries, or zeros past the end: computed, never stored).
    mbarrier.expect(q_bar, q_desc.block_type.nbytes + qr_desc.block_type.nbytes)
    _tma_load(q_desc, [q_row, 0], q_bar, q_lat)
    _tma_load(qr_desc, [q_row, ROPE_COL], q_bar, q_rope)
    # Page ids are read one iteration before their TMA is issued (and validity two
    # before it masks), so no page-table load sits on the loop's critical path.
    row0, ok0 = _page_of(page_row_ptr, start, 0, num_tiles, num_pages, BLOCK_N, PAGE_SIZE)
    row1, ok1 = _page_of(page_row_ptr, start, 1, num_tiles, num_pages, BLOCK_N, PAGE_SIZE)
    _load_tile(k_desc, kr_desc, k_lat.index(0), k_rope.index(0), k_bars.index(0), row0, 0 < num_tiles)
    _load_tile(k_desc, kr_desc, k_lat.index(1), k_rope.index(1), k_bars.index(1), row1, 1 < num_tiles)
    row_pf, ok_pf = _page_of(page_row_ptr, start, 2, num_tiles, num_pages, BLOCK_N, PAGE_SIZE)
    ok_cur = ok0
    ok_nxt = ok1

    qk_scale = SM_SCALE * LOG2E
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=s_rows)
    l_acc = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_layout)
    acc = gl.zeros([BLOCK_H, HEAD_DIM_V], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_layout)
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    row_limit = _row_limits(first_row, seq_len, end, BLOCK_H, s_rows, NUM_HEADS, Q_LEN)

    mbarrier.wait(q_bar, 0)
    if PIPELINE:
        # Scores of tile 0 ahead of the loop; each iteration issues tile i + 1's right
        # behind tile i's P V, so the tensor cores run the two back to back.
        _wait_tile(k_lat.index(0), k_rope.index(0), k_bars.index(0), 0, start, end, ok_cur, num_tiles > 0, zero_layout)
        s_next = warpgroup_mma(q_lat, k_lat.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s_next = warpgroup_mma(q_rope, k_rope.index(0).permute((1, 0)), s_next, is_async=True)
        s_next = warpgroup_mma_wait(0, deps=(s_next,))
    for i in range(num_tiles):
        stage = i % 2
        tile_start = start + i * BLOCK_N
        row_pf2, ok_pf2 = _page_of(page_row_ptr, start, i + 3, num_tiles, num_pages, BLOCK_N, PAGE_SIZE)
        if PIPELINE:
            s = s_next
        else:
            _wait_tile(k_lat.index(stage), k_rope.index(stage), k_bars.index(stage), (i // 2) & 1, tile_start, end,
                       ok_cur, True, zero_layout)  # fmt: skip
            s = warpgroup_mma(q_lat, k_lat.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma(q_rope, k_rope.index(stage).permute((1, 0)), s, is_async=True)
            s = warpgroup_mma_wait(0, deps=(s,))

        p, alpha, m_i, l_acc = _softmax_tile(s, tile_start, end, ok_cur, m_i, l_acc, qk_scale, offs_n, row_limit, Q_LEN)
        p_smem.store(p.to(gl.bfloat16))
        fence_async_shared()
        _cta_barrier()
        acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
        acc = warpgroup_mma(p_smem, k_lat.index(stage), acc, is_async=True)
        if PIPELINE:
            nstage = (i + 1) % 2
            _wait_tile(k_lat.index(nstage), k_rope.index(nstage), k_bars.index(nstage), ((i + 1) // 2) & 1,
                       tile_start + BLOCK_N, end, ok_nxt, i + 1 < num_tiles, zero_layout)  # fmt: skip
            # With no next tile this multiplies a stale stage; the result is dropped.
            s_next = warpgroup_mma(q_lat, k_lat.index(nstage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s_next = warpgroup_mma(q_rope, k_rope.index(nstage).permute((1, 0)), s_next, is_async=True)
            # Retire P V alone (the oldest of three groups): its stage is refilled below
            # while the next scores still run, a whole Q K^T before waiting for both would.
            acc = warpgroup_mma_wait(2, deps=(acc,))
        else:
            acc = warpgroup_mma_wait(0, deps=(acc,))
        # Both warpgroups are done with this stage (and with P) before it is refilled.
        _cta_barrier()
        _load_tile(k_desc, kr_desc, k_lat.index(stage), k_rope.index(stage), k_bars.index(stage), row_pf,
                   i + 2 < num_tiles)  # fmt: skip
        if PIPELINE:
            s_next = warpgroup_mma_wait(0, deps=(s_next,))
        ok_cur = ok_nxt
        ok_nxt = ok_pf
        row_pf = row_pf2
        ok_pf = ok_pf2

    # Every thread is past its last wait (the loop's last barrier, or the Q wait with no
    # tile), and no copy is in flight: the barriers can be retired (and set up anew for
    # the next chunk), and Q, K and P overwritten.
    _cta_barrier()
    mbarrier.invalidate(q_bar)
    for st in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(k_bars.index(st))

    l_i = gl.sum(l_acc, 1)
    has_tokens = l_i > 0
    l_safe = gl.where(has_tokens, l_i, 1.0)
    lse = gl.where(has_tokens, (m_i + gl.log2(l_safe)) * LN2, float("-inf"))
    return acc / gl.convert_layout(l_safe, o_rows)[:, None], lse


@gluon.jit
def _store_chunk(o, lse, mid_o_ptr, mid_lse_ptr, o_base, lse_base, head_block, STRIDE_MOH, STRIDE_MLH,
                 NUM_HEADS: gl.constexpr, Q_LEN: gl.constexpr = 1, STRIDE_MOT=0, STRIDE_MLT=0):  # fmt: skip
    """Store one chunk's output rows (cast to the output's dtype) and LSE for the real
    rows: heads, or with Q_LEN > 1 (token, head) pairs, token-major."""
    BLOCK_H: gl.constexpr = o.shape[0]
    heads_o = head_block * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, o.type.layout))
    cols = gl.arange(0, o.shape[1], layout=gl.SliceLayout(0, o.type.layout))
    heads_s = head_block * BLOCK_H + gl.arange(0, BLOCK_H, layout=lse.type.layout)
    o = o.to(mid_o_ptr.dtype.element_ty)
    rows_o = o_base + _row_offsets(heads_o.to(gl.int64), STRIDE_MOT, STRIDE_MOH, NUM_HEADS, Q_LEN)
    gl.store(mid_o_ptr + rows_o[:, None] + cols[None, :], o, mask=(heads_o < Q_LEN * NUM_HEADS)[:, None])
    rows_s = lse_base + _row_offsets(heads_s, STRIDE_MLT, STRIDE_MLH, NUM_HEADS, Q_LEN)
    gl.store(mid_lse_ptr + rows_s, lse, mask=heads_s < Q_LEN * NUM_HEADS)


@gluon.jit
def _chunk_buffers(q_desc, qr_desc, k_desc, kr_desc, NUM_STAGES: gl.constexpr):
    """Shared memory of one program: Q, the K ring, P and the barriers."""
    BLOCK_H: gl.constexpr = q_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    q_lat = gl.allocate_shared_memory(q_desc.dtype, q_desc.block_type.shape, q_desc.layout)
    q_rope = gl.allocate_shared_memory(qr_desc.dtype, qr_desc.block_type.shape, qr_desc.layout)
    k_lat = gl.allocate_shared_memory(k_desc.dtype, [NUM_STAGES, BLOCK_N, k_desc.block_type.shape[1]], k_desc.layout)
    k_rope = gl.allocate_shared_memory(
        kr_desc.dtype, [NUM_STAGES, BLOCK_N, kr_desc.block_type.shape[1]], kr_desc.layout
    )
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], gl.bfloat16)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, BLOCK_N], p_layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    return q_lat, q_rope, k_lat, k_rope, p_smem, q_bar, k_bars


@gluon.jit
def _check_shapes(q_desc, qr_desc, k_desc, PAGE_SIZE: gl.constexpr, NUM_STAGES: gl.constexpr):
    gl.static_assert(q_desc.block_type.shape[0] == 64, "one wgmma M block of heads")
    gl.static_assert(k_desc.block_type.shape[0] == 64, "64-token K tiles")
    gl.static_assert(q_desc.block_type.shape[1] == 512, "MLA latent width")
    gl.static_assert(qr_desc.block_type.shape[1] == 64, "MLA rope width")
    gl.static_assert(PAGE_SIZE % 64 == 0, "a K tile must lie inside one page")
    gl.static_assert(gl.num_warps() == 8, "two warpgroups")
    gl.static_assert(NUM_STAGES == 2, "the page-id prefetch is written for a 2-stage ring")


@gluon.jit
def _mla_stage1_hopper(
    q_desc,  # TMA over q viewed as [batch * num_heads, 576], block [64, 512] (the latent)
    qr_desc,  # TMA over the same rows, block [64, 64] read at column 512 (the rope part)
    k_desc,  # TMA over the cache viewed as [num_pages * page_size, 576] (row stride: the slot's), block [64, 512]
    kr_desc,  # TMA over the same rows, block [64, 64] read at column 512
    page_table_ptr,  # int32 [batch, max_pages]
    seq_lens_ptr,  # int32 [batch]
    k_scale_ptr,  # unused (a bfloat16 cache; the seesaw kernels take fp8 ones)
    v_scale_ptr,  # unused
    num_pages,  # int: pages in the cache; ids outside [0, num_pages) are masked
    mid_o_ptr,  # f32 [batch, (q_len,) num_heads, num_kv_splits, head_dim_v] (or the final out, see below)
    mid_lse_ptr,  # f32 [batch, (q_len,) num_heads, num_kv_splits] (or the final lse)
    STRIDE_PTB: gl.constexpr,
    STRIDE_MOB: gl.constexpr,
    STRIDE_MOT: gl.constexpr,  # the token axis (Q_LEN > 1)
    STRIDE_MOH: gl.constexpr,
    STRIDE_MOS: gl.constexpr,
    STRIDE_MLB: gl.constexpr,
    STRIDE_MLT: gl.constexpr,
    STRIDE_MLH: gl.constexpr,
    STRIDE_MLS: gl.constexpr,
    SM_SCALE: gl.constexpr,
    NUM_HEADS: gl.constexpr,
    PAGE_SIZE: gl.constexpr,
    CAPACITY: gl.constexpr,
    NUM_KV_SPLITS: gl.constexpr,
    NUM_STAGES: gl.constexpr,  # K tiles in the TMA ring: 2 (what shared memory holds)
    PIPELINE: gl.constexpr,  # 1: the next tile's Q K^T is issued right behind this tile's P V
    Q_LEN: gl.constexpr = 1,  # query tokens per batch row; rows are (token, head) pairs
):
    """Fixed splits: one program per (block of 64 rows, batch row, split); a row is a
    query head, or with Q_LEN > 1 a (query token, head) pair, token-major as q lays
    them out."""
    _check_shapes(q_desc, qr_desc, k_desc, PAGE_SIZE, NUM_STAGES)
    head_block = gl.program_id(0)
    batch_idx = gl.program_id(1).to(gl.int64)
    split_idx = gl.program_id(2)

    seq_len = gl.load(seq_lens_ptr + batch_idx)
    seq_len = gl.minimum(gl.maximum(seq_len, 0), CAPACITY)
    per_split = gl.cdiv(gl.cdiv(seq_len, NUM_KV_SPLITS), 64) * 64
    start = split_idx * per_split
    end = gl.minimum(start + per_split, seq_len)

    q_lat, q_rope, k_lat, k_rope, p_smem, q_bar, k_bars = _chunk_buffers(q_desc, qr_desc, k_desc, kr_desc, NUM_STAGES)
    q_row = (batch_idx * (Q_LEN * NUM_HEADS)).to(gl.int32) + head_block * 64
    o, lse = _attend_chunk(
        q_desc, qr_desc, k_desc, kr_desc, q_lat, q_rope, k_lat, k_rope, p_smem, q_bar, k_bars,
        page_table_ptr + batch_idx * STRIDE_PTB, num_pages, q_row, start, end, head_block * 64, seq_len,
        SM_SCALE, PAGE_SIZE, NUM_STAGES, PIPELINE, Q_LEN, NUM_HEADS,
    )  # fmt: skip
    o_base = batch_idx * STRIDE_MOB + split_idx * STRIDE_MOS
    lse_base = batch_idx * STRIDE_MLB + split_idx * STRIDE_MLS
    _store_chunk(o, lse, mid_o_ptr, mid_lse_ptr, o_base, lse_base, head_block, STRIDE_MOH, STRIDE_MLH, NUM_HEADS,
                 Q_LEN, STRIDE_MOT, STRIDE_MLT)  # fmt: skip


@gluon.jit
def _program_positions(schedule_ptr, program, NUM_PROGRAMS: gl.constexpr):
    """jax_decode.kernels.schedule.program_positions in Gluon: the positions ``[lo,
    hi)`` of the schedule that ``program`` takes."""
    total = gl.load(schedule_ptr).to(gl.int64)
    active = gl.maximum(gl.minimum(total, NUM_PROGRAMS), 1)  # the programs that take positions
    lo = (gl.minimum(program.to(gl.int64), active) * total) // active
    hi = (gl.minimum(program.to(gl.int64) + 1, active) * total) // active
    return lo.to(gl.int32), hi.to(gl.int32)


@gluon.jit
def _mla_stage1_hopper_scheduled(
    q_desc,  # as _mla_stage1_hopper's
    qr_desc,
    k_desc,
    kr_desc,
    page_table_ptr,  # int32 [batch, max_pages]
    seq_lens_ptr,  # int32 [batch]
    k_scale_ptr,  # unused (as _mla_stage1_hopper's)
    v_scale_ptr,
    schedule_ptr,  # int32: jax_decode.kernels.schedule._work_schedule's
    num_pages,  # int
    batch,  # int
    mid_o_ptr,  # f32 [batch + NUM_PROGRAMS, num_heads, head_dim_v], contiguous: partials by slot
    mid_lse_ptr,  # f32 [batch + NUM_PROGRAMS, num_heads], contiguous
    STRIDE_PTB: gl.constexpr,
    SM_SCALE: gl.constexpr,
    NUM_HEADS: gl.constexpr,
    PAGE_SIZE: gl.constexpr,
    CAPACITY: gl.constexpr,
    NUM_PROGRAMS: gl.constexpr,
    CHUNK_COST: gl.constexpr,
    NUM_STAGES: gl.constexpr,
    PIPELINE: gl.constexpr,
):
    """The device-side schedule (jax_decode.kernels.schedule): program ``p`` of a head
    block attends to the chunks of its positions ``[lo_p, lo_{p+1})``, row by row, writing
    chunk ``(p, b)`` to slot ``b + p``; grid ``(cdiv(num_heads, 64), NUM_PROGRAMS)``."""
    _check_shapes(q_desc, qr_desc, k_desc, PAGE_SIZE, NUM_STAGES)
    first_row, num_chunks = _program_chunks(schedule_ptr, NUM_PROGRAMS, True)
    q_lat, q_rope, k_lat, k_rope, p_smem, q_bar, k_bars = _chunk_buffers(q_desc, qr_desc, k_desc, kr_desc, NUM_STAGES)
    # Only the row is carried across chunks (the chunk's own loop needs every register
    # it can get); the program ids and the schedule are read again per chunk.  Still,
    # ptxas (triton 3.6) gives this kernel 255 registers and 32 bytes of spills against
    # the fixed-split kernel's 235 and none: one local reload per tile.
    for c in range(num_chunks):
        seq_len, start, end, _num_tiles, page_row_ptr, q_row, o_base, lse_base = _mla_chunk(
            c, first_row, page_table_ptr, seq_lens_ptr, schedule_ptr, STRIDE_PTB, 0, 0, 0, 0, NUM_HEADS, CAPACITY, 1,
            NUM_PROGRAMS, CHUNK_COST, True, 1,
        )  # fmt: skip
        o, lse = _attend_chunk(
            q_desc, qr_desc, k_desc, kr_desc, q_lat, q_rope, k_lat, k_rope, p_smem, q_bar, k_bars, page_row_ptr,
            num_pages, q_row, start, end, 0, seq_len, SM_SCALE, PAGE_SIZE, NUM_STAGES, PIPELINE, 1, NUM_HEADS,
        )  # fmt: skip
        _store_chunk(o, lse, mid_o_ptr, mid_lse_ptr, o_base, lse_base, gl.program_id(0), 512, 1, NUM_HEADS)


# --------------------------------------------------------------------------------------
# Seesaw schedule (FlashMLA's, see the module docstring): two warp-specialised
# warpgroups, each computing whole-tile scores for alternate tiles, so that one's
# softmax runs while the other's products use the tensor cores.


@gluon.jit
def _safe(m):
    # A row with no valid token yet keeps m = -inf; subtract 0 instead (exp2 gives 0, not NaN).
    return gl.where(m == float("-inf"), 0.0, m)


@gluon.jit
def _barrier(count: gl.constexpr):
    """One mbarrier in an allocation of its own.  Triton's shared-memory barrier analysis
    (membar) tracks whole allocations: barriers that are views of one array count as one
    buffer, and every wait or expect on one of them after an operation on another gets a
    CTA barrier in front of it (an 18-barrier array put two dozen into each pair of tiles)."""
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=count)
    return bar


@gluon.jit
def _seesaw_k_part(k_l, k_r, k_e, stage, part: gl.constexpr):
    """Part ``part`` of a K stage: 0 the rope columns, 1 the latent's left half, 2 its
    right half.  Each part arrives by its own copy on its own barrier."""
    if part == 0:
        return k_e.index(stage)
    elif part == 1:
        return k_l.index(stage)
    else:
        return k_r.index(stage)


@gluon.jit
def _seesaw_q_part(q_l, q_r, q_e, part: gl.constexpr):
    if part == 0:
        return q_e
    elif part == 1:
        return q_l
    else:
        return q_r


@gluon.jit
def _seesaw_load(k_desc, kr_desc, dst, full, stage: gl.constexpr, P0: gl.constexpr, P1: gl.constexpr, row, pred,
                 KV_FP8: gl.constexpr):  # fmt: skip
    """Start the copies of parts [P0, P1) of one K tile into ``stage``, each completing
    its own barrier ``full[stage][part]``.  ``dst``: the (left half, right half, rope)
    buffers the copies land in -- the K parts themselves, or with an fp8 cache their
    landing zones, the upper half of each part's bytes (index ``2 * stage + 1``; see
    :func:`_widen_part`).  All expects come before all copies: the analysis puts a CTA
    barrier between an expect and a copy on the same barrier, so this order needs one,
    not one per part.  (Copies into slices of one allocation get one each as well,
    which is why a half is one copy, not four of 64 columns.)"""
    slot: gl.constexpr = 2 * stage + 1 if KV_FP8 else stage
    for part in gl.static_range(P0, P1):
        if part == 0:
            mbarrier.expect(full[stage][0], kr_desc.block_type.nbytes, pred=pred)
        else:
            mbarrier.expect(full[stage][part], k_desc.block_type.nbytes, pred=pred)
    for part in gl.static_range(P0, P1):
        if part == 0:
            _tma_load(kr_desc, [row, ROPE_COL], full[stage][0], dst[2].index(slot), pred=pred)
        else:
            _tma_load(k_desc, [row, (part - 1) * 256], full[stage][part], dst[part - 1].index(slot), pred=pred)


@gluon.jit
def _seesaw_begin(q_desc, qr_desc, k_desc, kr_desc, q_l, q_r, q_e, dst, q_bar, full, q_row, row0, row1, num_tiles,
                  KV_FP8: gl.constexpr):  # fmt: skip
    """Start a chunk's copies: its Q rows and its first two K tiles."""
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes + qr_desc.block_type.nbytes)
    _tma_load(q_desc, [q_row, 0], q_bar, q_l.index(0))
    _tma_load(q_desc, [q_row, 256], q_bar, q_r.index(0))
    _tma_load(qr_desc, [q_row, ROPE_COL], q_bar, q_e.index(0))
    _seesaw_load(k_desc, kr_desc, dst, full, 0, 0, 3, row0, 0 < num_tiles, KV_FP8)
    _seesaw_load(k_desc, kr_desc, dst, full, 1, 0, 3, row1, 1 < num_tiles, KV_FP8)


@gluon.jit
def _landed(land, stage: gl.constexpr, part: gl.constexpr):
    """Where part ``part`` (as :func:`_seesaw_k_part` numbers them) of stage ``stage``'s K
    tile lands as fp8: the upper half of that part's 16-bit buffer."""
    return _seesaw_k_part(land[0], land[1], land[2], 2 * stage + 1, part)


@gluon.jit
def _widen_part(k_part, landed, tile_start, end, page_ok):
    """An fp8 cache's K part, landed by TMA in the upper half of ``k_part``'s bytes
    (``landed``), widened to float16 in ``k_part`` (exactly: every e4m3 value is a
    float16), its rows past ``end`` (all rows, for a bad page) zeroed, then fenced for
    the warpgroup MMAs.  The f16 columns below ``landed`` are written first; the rest
    once every thread of the warpgroup holds the fp8 bytes they overwrite.  One
    warpgroup (4 warps) runs it."""
    ROWS: gl.constexpr = landed.shape[0]
    COLS: gl.constexpr = landed.shape[1]
    whole = (tile_start + ROWS <= end) & page_ok  # (the common case: no row to zero)
    if COLS == 256:  # a latent half: two 128-byte column blocks of fp8
        layout: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
        low = landed.slice(0, 128, dim=1).load(layout).to(gl.float16)
        low = _zero_rows_past(low, tile_start, end, page_ok, whole, layout)
        k_part.slice(0, 128, dim=1).store(low)
        high = landed.slice(128, 128, dim=1).load(layout)
        _cta_barrier()  # every thread has read ``landed``: the f16 columns 128.. overwrite it
        high = _zero_rows_past(high.to(gl.float16), tile_start, end, page_ok, whole, layout)
        k_part.slice(128, 128, dim=1).store(high)
    else:  # the rope part: one 64-byte column block of fp8
        layout: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
        x = landed.load(layout)
        _cta_barrier()
        x = _zero_rows_past(x.to(gl.float16), tile_start, end, page_ok, whole, layout)
        k_part.store(x)
    fence_async_shared()
    _cta_barrier()


@gluon.jit
def _zero_rows_past(x, tile_start, end, page_ok, whole, layout: gl.constexpr):
    """``x`` (a tile's rows from ``tile_start`` on) with the rows past ``end`` (all, where
    not ``page_ok``) zeroed; unchanged where the tile is ``whole``."""
    if not whole:
        rows = tile_start + gl.arange(0, x.shape[0], layout=gl.SliceLayout(1, layout))
        x = gl.where(((rows < end) & page_ok)[:, None], x, gl.zeros_like(x))
    return x


@gluon.jit
def _q_to_f16(q_landed, q16):
    """Q rows landed as bfloat16 by TMA (``q_landed``) rewritten in place as float16
    (``q16``, a view of the same bytes) for the float16 products with a widened fp8
    cache, as the portable kernel's fp8 products take q: values beyond +-65504 saturate,
    NaN stays NaN.  (Each thread rewrites the elements it read.)"""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    q16.index(0).store(_saturate_f16(q_landed.index(0).load(layout)))


@gluon.jit
def _saturate_f16(x):
    """``x`` as float16 the way the portable kernel's fp8 products take q: values beyond
    +-65504 saturate, NaN stays NaN."""
    x = x.to(gl.float32)
    return gl.where(x == x, gl.minimum(gl.maximum(x, -65504.0), 65504.0), x).to(gl.float16)


@gluon.jit
def _as_dtype(buffer, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
    """``buffer``'s bytes seen as ``dtype`` (Triton 3.6 calls this _reinterpret)."""
    if _PUBLIC_REINTERPRET:
        return buffer.reinterpret(dtype, shape, layout)
    else:
        return buffer._reinterpret(dtype, shape, layout)


@gluon.jit
def _seesaw_scores(q_l, q_r, q_e, k_l, k_r, k_e, land, full, stage: gl.constexpr, phase, tile_start, end, page_ok,
                   pred, s_zero, FIRST: gl.constexpr, zero_layout: gl.constexpr, zs, KV_FP8: gl.constexpr):  # fmt: skip
    """S = Q K^T of one tile as three products (rope, left half, right half), each
    issued as soon as its part has landed, starting with part FIRST (the parts in the
    order they were freed for this tile's copy).  A tile that runs past ``end`` or has
    a bad page waits for all its parts and has its invalid rows zeroed first.  With an
    fp8 cache each part is widened (its invalid rows zeroed) as it lands."""
    if not KV_FP8:
        if pred & ((tile_start + 64 > end) | (~page_ok)):
            for part in gl.static_range(3):
                mbarrier.wait(full[stage][part], phase)
            _zero_invalid_rows(k_l.index(stage), tile_start, end, page_ok, zero_layout)
            _zero_invalid_rows(k_r.index(stage), tile_start, end, page_ok, zero_layout)
            _zero_invalid_rows(k_e.index(stage), tile_start, end, page_ok, zero_layout)
            fence_async_shared()
            _cta_barrier()
    s = s_zero
    for i in gl.static_range(3):
        mbarrier.wait(full[stage][(FIRST + i) % 3], phase, pred=pred)
        if KV_FP8:
            if pred:
                _widen_part(_seesaw_k_part(k_l, k_r, k_e, stage, (FIRST + i) % 3),
                            _landed(land, stage, (FIRST + i) % 3), tile_start, end, page_ok)  # fmt: skip
        k_t = _seesaw_k_part(k_l, k_r, k_e, stage + zs, (FIRST + i) % 3).permute((1, 0))
        q_part = _seesaw_q_part(q_l, q_r, q_e, (FIRST + i) % 3).index(zs)
        s = warpgroup_mma(q_part, k_t, s, use_acc=i > 0, is_async=True)
    return warpgroup_mma_wait(0, deps=(s,))


@gluon.jit
def _program_chunks(schedule_ptr, NUM_PROGRAMS: gl.constexpr, SCHEDULED: gl.constexpr):
    """A Gluon MLA program's first batch row and number of chunks: fixed splits, one (its
    split of row ``program_id(1)``); the device-side schedule, its rows in turn."""
    if SCHEDULED:
        first_row = gl.load(schedule_ptr + 1 + gl.program_id(1))
        num_chunks = gl.load(schedule_ptr + 1 + NUM_PROGRAMS + gl.program_id(1)) - first_row
    else:
        first_row = 0
        num_chunks = 1
    return first_row, num_chunks


@gluon.jit
def _mla_chunk(c, first_row, page_table_ptr, seq_lens_ptr, schedule_ptr, STRIDE_PTB: gl.constexpr,
               STRIDE_MOB: gl.constexpr, STRIDE_MOS: gl.constexpr, STRIDE_MLB: gl.constexpr,
               STRIDE_MLS: gl.constexpr, NUM_HEADS: gl.constexpr, CAPACITY: gl.constexpr,
               NUM_KV_SPLITS: gl.constexpr, NUM_PROGRAMS: gl.constexpr, CHUNK_COST: gl.constexpr,
               SCHEDULED: gl.constexpr, Q_LEN: gl.constexpr):  # fmt: skip
    """A Gluon MLA program's chunk ``c`` (the seesaw's and the narrow-group kernel's): its
    positions ``[start, end)`` of a batch row, the row's length, its page-table row, its
    first Q row (the seesaw's TMA row) and where its output and LSE go.  Fixed splits: the
    one chunk of split ``program_id(2)`` of row ``program_id(1)``.  The device-side
    schedule (jax_decode.kernels.schedule): row ``first_row + c``'s chunk of program
    ``program_id(1)``, written to slot ``row + program_id(1)``."""
    if SCHEDULED:
        row = first_row + c
        program = gl.program_id(1)
        seq_len = gl.minimum(gl.maximum(gl.load(seq_lens_ptr + row), 0), CAPACITY)
        tiles = gl.cdiv(seq_len, 64)
        lo, hi = _program_positions(schedule_ptr, program, NUM_PROGRAMS)
        row_tiles = gl.load(schedule_ptr + 1 + 2 * NUM_PROGRAMS + 3 * row) + CHUNK_COST  # S_b + CHUNK_COST
        tile_lo = gl.minimum(gl.maximum(lo - row_tiles, 0), tiles)
        tile_hi = gl.minimum(gl.maximum(hi - row_tiles, 0), tiles)
        start = tile_lo * 64
        end = gl.minimum(tile_hi * 64, seq_len)
        slot = row.to(gl.int64) + program
        o_base = slot * (Q_LEN * NUM_HEADS * 512)
        lse_base = slot * (Q_LEN * NUM_HEADS)
    else:
        row = gl.program_id(1)
        split = gl.program_id(2)
        seq_len = gl.minimum(gl.maximum(gl.load(seq_lens_ptr + row), 0), CAPACITY)
        per_split = gl.cdiv(gl.cdiv(seq_len, NUM_KV_SPLITS), 64) * 64
        start = split * per_split
        end = gl.minimum(start + per_split, seq_len)
        o_base = row.to(gl.int64) * STRIDE_MOB + split * STRIDE_MOS
        lse_base = row.to(gl.int64) * STRIDE_MLB + split * STRIDE_MLS
    num_tiles = gl.cdiv(gl.maximum(end - start, 0), 64)
    page_row_ptr = page_table_ptr + row.to(gl.int64) * STRIDE_PTB
    q_row = row * (Q_LEN * NUM_HEADS) + gl.program_id(0) * 64  # rows: (token, head), token-major
    return seq_len, start, end, num_tiles, page_row_ptr, q_row, o_base, lse_base


@gluon.jit
def _seesaw_store(o, lse, o_ptr, lse_ptr, o_base, lse_base, rows_o, rows_s, cols, STRIDE_OT, STRIDE_OH, STRIDE_LT,
                  STRIDE_LH, NUM_HEADS: gl.constexpr, Q_LEN: gl.constexpr, WG: gl.constexpr):  # fmt: skip
    """Store a warpgroup's half of a block's output rows (cast to ``o_ptr``'s dtype) and,
    from WG 0, their LSE: the real rows only."""
    o_rows = o_base + _row_offsets(rows_o.to(gl.int64), STRIDE_OT, STRIDE_OH, NUM_HEADS, Q_LEN)
    gl.store(o_ptr + o_rows[:, None] + cols[None, :], o.to(o_ptr.dtype.element_ty),
             mask=(rows_o < Q_LEN * NUM_HEADS)[:, None])  # fmt: skip
    if WG == 0:
        lse_rows = lse_base + _row_offsets(rows_s, STRIDE_LT, STRIDE_LH, NUM_HEADS, Q_LEN)
        gl.store(lse_ptr + lse_rows, lse, mask=rows_s < Q_LEN * NUM_HEADS)


@gluon.jit
def _mla_whole_row(c, first_row, schedule_ptr, NUM_PROGRAMS: gl.constexpr):
    """Under the device-side schedule: whether chunk ``c``'s row has no other chunk
    (the schedule's ``n_b == 1``, which the merge skips), and the row."""
    row = first_row + c
    return gl.load(schedule_ptr + 2 + 2 * NUM_PROGRAMS + 3 * row) == 1, row


@gluon.jit
def _seesaw_partition(
    q_desc,
    qr_desc,
    k_desc,
    kr_desc,
    smem,
    page_table_ptr,
    seq_lens_ptr,
    schedule_ptr,
    k_scale_ptr,  # f32: the fp8 cache's scales (read where K_SCALE / V_SCALE)
    v_scale_ptr,
    num_pages,
    mid_o_ptr,
    mid_lse_ptr,
    out_ptr,  # scheduled: rows of one chunk go straight to out and lse
    lse_ptr,
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
    PAGE_SIZE: gl.constexpr,
    CAPACITY: gl.constexpr,
    NUM_KV_SPLITS: gl.constexpr,
    Q_LEN: gl.constexpr,
    NUM_PROGRAMS: gl.constexpr,
    CHUNK_COST: gl.constexpr,
    SCHEDULED: gl.constexpr,
    STRIDE_OB: gl.constexpr,
    STRIDE_OH: gl.constexpr,
    STRIDE_LB: gl.constexpr,
    STRIDE_LH: gl.constexpr,
    KV_FP8: gl.constexpr,  # an e4m3 cache, widened to float16 in shared memory as it lands
    K_SCALE: gl.constexpr,  # 0: none; else k_scale_ptr[0] multiplies the scores
    V_SCALE: gl.constexpr,  # 0: none; else v_scale_ptr[0] multiplies the output
    STRIDE_OT: gl.constexpr,  # scheduled, Q_LEN > 1: out's and lse's token strides
    STRIDE_LT: gl.constexpr,
    WG: gl.constexpr,
):
    """One warpgroup of the seesaw: WG 0 scores even tiles (stage 0) and owns output
    columns 0..255, WG 1 odd tiles (stage 1) and columns 256..511.  Per pair of tiles
    (K0 even, K1 odd), with P0 on m0 and P1 on m1:

        [0] S0 = Q K0^T                       [1] S1 = Q K1^T
        [0] m0 = max(m, S0), publish; P0 -> smem; O_L = O_L * sc0 + P0 V0_L
        [1] m1 = max(m0, S1), publish; O_R = O_R * sc0 + P0 V0_R; P1 -> smem
        [1] O_R = O_R * sc1 + P1 V1_R          [0] O_L = O_L * sc1 + P1 V1_L

    K tiles arrive in three parts (rope, left half, right half), each by one copy on its
    own barrier, and each part is refilled for the tile two ahead as soon as the last
    product that reads it has retired: K0's rope part after S0, its left half after
    P0 V0_L, its right half after P0 V0_R; K1's right half after P1 V1_R, its left half
    and rope part (which holds P1 meanwhile) after P1 V1_L.  The scores take the parts
    in that order.  WG 0 issues the next pair's S0 on the rope part and left half right
    behind P1 V1_L, so the tensor cores have work while K0's right half is in flight.
    P0 has its own buffer, which WG 1 releases (``p0_free``) once P0 V0_R has retired.

    A program attends to its chunks in turn (one with fixed splits; a row's share of
    the batch's work each under the device-side schedule, see :func:`_mla_chunk`):
    once both warpgroups are past a chunk's ``fin`` barrier, WG 0 starts the copies of
    the next chunk's Q and first two K tiles.  Every barrier's phase counts on across
    chunks (``pair_base``: pairs before this chunk; ``odd_base``: odd tiles).

    Two compiler facts shape the code.  Triton's shared-memory analysis puts a CTA
    barrier between operations on one allocation, so every barrier is an allocation of
    its own, all expects come before all copies, and a half is one copy.  And shared
    memory descriptors of loop-invariant buffers are hoisted out of the loop and spilled
    (up to 180 bytes a thread), so the loop indexes Q and K with ``zs``, a zero the
    compiler cannot fold.
    """
    BLOCK_H: gl.constexpr = 64
    BLOCK_N: gl.constexpr = 64
    HALF: gl.constexpr = 256
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    zero_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    qk_scale = SM_SCALE * LOG2E
    if K_SCALE > 0:
        qk_scale = qk_scale * gl.load(k_scale_ptr)  # (one KV head: a per-head scale has one value)
    # q_l, q_r, q_e: Q as the products read it (float16 views of q_in with an fp8 cache);
    # land: where the K copies land (the K parts, or their upper halves as fp8).
    q_l, q_r, q_e, k_l, k_r, k_e, p0_smem, s_m0, s_m1, s_l, q_bar, full, xbars, q_in, land, q_ready = smem
    bar_m0, bar_m1, bar_p0, bar_p1, bar_fin, bar_p0_free = xbars
    s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_layout)
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))

    first_row, num_chunks = _program_chunks(schedule_ptr, NUM_PROGRAMS, SCHEDULED)
    pair_base = 0
    odd_base = 0
    for c in range(num_chunks):
        seq_len, start, end, num_tiles, page_row_ptr, q_row, o_base, lse_base = _mla_chunk(
            c, first_row, page_table_ptr, seq_lens_ptr, schedule_ptr, STRIDE_PTB, STRIDE_MOB, STRIDE_MOS, STRIDE_MLB,
            STRIDE_MLS, NUM_HEADS, CAPACITY, NUM_KV_SPLITS, NUM_PROGRAMS, CHUNK_COST, SCHEDULED, Q_LEN,
        )  # fmt: skip
        row_limit = _row_limits(gl.program_id(0) * BLOCK_H, seq_len, end, BLOCK_H, rows, NUM_HEADS, Q_LEN)
        row0, ok0 = _page_of(page_row_ptr, start, 0, num_tiles, num_pages, BLOCK_N, PAGE_SIZE)
        row1, ok1 = _page_of(page_row_ptr, start, 1, num_tiles, num_pages, BLOCK_N, PAGE_SIZE)
        # A chunk's copies: here for the first (the only one with fixed splits), at the
        # previous chunk's fin barrier for the others.
        if WG == 0:
            if not SCHEDULED:
                _seesaw_begin(q_desc, qr_desc, k_desc, kr_desc, q_in[0], q_in[1], q_in[2], land, q_bar, full, q_row,
                              row0, row1, num_tiles, KV_FP8)  # fmt: skip
            elif c == 0:
                _seesaw_begin(q_desc, qr_desc, k_desc, kr_desc, q_in[0], q_in[1], q_in[2], land, q_bar, full, q_row,
                              row0, row1, num_tiles, KV_FP8)  # fmt: skip
        mbarrier.wait(q_bar, c & 1)
        if KV_FP8:  # Q as float16: WG 0 the left half and the rope part, WG 1 the right half
            if WG == 0:
                _q_to_f16(q_in[0], q_l)
                _q_to_f16(q_in[2], q_e)
            else:
                _q_to_f16(q_in[1], q_r)
            fence_async_shared()
            _cta_barrier()
            mbarrier.arrive(q_ready)
            mbarrier.wait(q_ready, c & 1)
        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=rows)
        l_i = gl.zeros([BLOCK_H], gl.float32, layout=rows)
        acc = gl.zeros([BLOCK_H, HALF], gl.float32, layout=o_layout)
        num_pairs = gl.cdiv(num_tiles, 2)
        s = s_zero
        if WG == 0:  # the first even tile's scores; each pair computes the next pair's
            s = _seesaw_scores(q_l, q_r, q_e, k_l, k_r, k_e, land, full, 0, pair_base & 1, start, end, ok0,
                               num_tiles > 0, s_zero, 0, zero_layout, 0, KV_FP8)  # fmt: skip

        for j in range(num_pairs):
            phase = (pair_base + j) & 1  # the exchanges' and the even tile's
            phase1 = (odd_base + j) & 1  # the odd tile's
            zs = j >> 30  # 0, but not to the compiler: keeps smem descriptors from being hoisted
            t0 = 2 * j
            t1 = 2 * j + 1
            has_t1 = t1 < num_tiles
            # The next pair's pages: their rows for this pair's refills, their validity for
            # the next pair (this pair's came from the previous one, so nothing waits on a
            # page-table load before the scores).
            row0n, ok0n = _page_of(page_row_ptr, start, t0 + 2, num_tiles, num_pages, BLOCK_N, PAGE_SIZE)
            row1n, ok1n = _page_of(page_row_ptr, start, t1 + 2, num_tiles, num_pages, BLOCK_N, PAGE_SIZE)
            has_t0n = t0 + 2 < num_tiles
            has_t1n = t1 + 2 < num_tiles
            if WG == 0:
                # ---- the even tile's scores are in s (from the previous pair, or before the loop)
                ts0 = start + t0 * BLOCK_N
                _cta_barrier()
                _seesaw_load(k_desc, kr_desc, land, full, 0, 0, 1, row0n, has_t0n, KV_FP8)
                s = _mask_scores(s * qk_scale, ts0, end, ok0, offs_n, row_limit, Q_LEN)
                m0 = gl.maximum(m_i, gl.max(s, 1))
                s_m0.store(m0)
                _cta_barrier()
                mbarrier.arrive(bar_m0)
                ms0 = _safe(m0)
                sc0 = gl.exp2(m_i - ms0)
                p = gl.exp2(s - ms0[:, None])
                l_i = l_i * sc0 + gl.sum(p, 1)
                p = p.to(p0_smem.dtype)
                # P0 (on m0) for WG 1's P0 V0_R, once the previous pair's is done with the buffer.
                mbarrier.wait(bar_p0_free, phase ^ 1, pred=pair_base + j > 0)
                p0_smem.store(p)
                fence_async_shared()
                _cta_barrier()
                mbarrier.arrive(bar_p0)
                acc = acc * gl.convert_layout(sc0, o_rows)[:, None]
                p_op = gl.convert_layout(p, a_layout)
                acc = warpgroup_mma(p_op, k_l.index(zs), acc, is_async=True)
                # ---- the odd tile's max
                mbarrier.wait(bar_m1, phase)
                m1 = s_m1.load(rows)
                sc1 = gl.exp2(m0 - _safe(m1))
                acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
                _cta_barrier()
                _seesaw_load(k_desc, kr_desc, land, full, 0, 1, 2, row0n, has_t0n, KV_FP8)
                l_i = l_i * sc1
                m_i = m1
                # ---- P1 V1_L, and behind it the next even tile's scores on the parts that
                # are already here (its rope part and left half were refilled early in this
                # pair; its right half only comes once WG 1's P0 V0_R has retired)
                acc = acc * gl.convert_layout(sc1, o_rows)[:, None]
                mbarrier.wait(bar_p1, phase)
                ts0n = ts0 + 2 * BLOCK_N
                early = has_t0n & (ts0n + BLOCK_N <= end) & ok0n  # a whole valid tile: no zeroing
                if early:
                    # WG 1 waited for K1's copy; this wait (already complete) makes its left
                    # half visible here without relying on that chain alone.
                    mbarrier.wait(full[1][1], phase1)
                    acc = warpgroup_mma(k_e.index(1 + zs), k_l.index(1 + zs), acc, is_async=True)
                    mbarrier.wait(full[0][0], phase ^ 1)
                    if KV_FP8:  # (widened under P1 V1_L)
                        _widen_part(k_e.index(0), _landed(land, 0, 0), ts0n, end, ok0n)
                    s = warpgroup_mma(q_e.index(zs), k_e.index(zs).permute((1, 0)), s_zero, use_acc=False,
                                      is_async=True)  # fmt: skip
                    mbarrier.wait(full[0][1], phase ^ 1)
                    if KV_FP8:
                        _widen_part(k_l.index(0), _landed(land, 0, 1), ts0n, end, ok0n)
                    s = warpgroup_mma(q_l.index(zs), k_l.index(zs).permute((1, 0)), s, is_async=True)
                    acc = warpgroup_mma_wait(2, deps=(acc,))  # P1 V1_L has retired; the scores run on
                    _cta_barrier()
                    _seesaw_load(k_desc, kr_desc, land, full, 1, 0, 2, row1n, has_t1n, KV_FP8)
                    mbarrier.wait(full[0][2], phase ^ 1)
                    if KV_FP8:
                        _widen_part(k_r.index(0), _landed(land, 0, 2), ts0n, end, ok0n)
                    s = warpgroup_mma(q_r.index(zs), k_r.index(zs).permute((1, 0)), s, is_async=True)
                    s = warpgroup_mma_wait(0, deps=(s,))
                else:  # the last pairs, or a next tile to be masked: one after the other
                    if has_t1:
                        mbarrier.wait(full[1][1], phase1)
                        acc = warpgroup_mma(k_e.index(1 + zs), k_l.index(1 + zs), acc, is_async=True)
                        acc = warpgroup_mma_wait(0, deps=(acc,))
                    _cta_barrier()
                    _seesaw_load(k_desc, kr_desc, land, full, 1, 0, 2, row1n, has_t1n, KV_FP8)
                    if has_t0n:
                        s = _seesaw_scores(q_l, q_r, q_e, k_l, k_r, k_e, land, full, 0, phase ^ 1, ts0n, end, ok0n,
                                           True, s_zero, 0, zero_layout, zs, KV_FP8)  # fmt: skip
            else:
                # ---- scores of the odd tile (right half first; none past the end: every score -inf)
                ts1 = start + t1 * BLOCK_N
                s = s_zero
                if has_t1:
                    s = _seesaw_scores(q_l, q_r, q_e, k_l, k_r, k_e, land, full, 1, phase1, ts1, end, ok1, True,
                                       s_zero, 2, zero_layout, zs, KV_FP8)  # fmt: skip
                s = _mask_scores(s * qk_scale, ts1, end, ok1 & has_t1, offs_n, row_limit, Q_LEN)
                mbarrier.wait(bar_m0, phase)
                m0 = s_m0.load(rows)
                ms0 = _safe(m0)
                sc0 = gl.exp2(m_i - ms0)
                m1 = gl.maximum(m0, gl.max(s, 1))
                s_m1.store(m1)
                _cta_barrier()
                mbarrier.arrive(bar_m1)
                # ---- P0 V0_R (P0 on m0) first: K0's right half is then free a P V earlier
                acc = acc * gl.convert_layout(sc0, o_rows)[:, None]
                mbarrier.wait(bar_p0, phase)
                mbarrier.wait(full[0][2], phase)  # K0's right half (see WG 0's P1 V1_L)
                acc = warpgroup_mma(p0_smem, k_r.index(zs), acc, is_async=True)
                ms1 = _safe(m1)
                sc1 = gl.exp2(m0 - ms1)
                p = gl.exp2(s - ms1[:, None])
                l_i = l_i * (sc0 * sc1) + gl.sum(p, 1)
                m_i = m1
                # P1 goes to K1's rope part, which S1 no longer needs.
                p = p.to(p0_smem.dtype)
                k_e.index(1).store(p)
                fence_async_shared()
                _cta_barrier()
                mbarrier.arrive(bar_p1)
                acc = warpgroup_mma_wait(0, deps=(acc,))
                _cta_barrier()
                mbarrier.arrive(bar_p0_free)
                _seesaw_load(k_desc, kr_desc, land, full, 0, 2, 3, row0n, has_t0n, KV_FP8)
                # ---- P1 V1_R
                acc = acc * gl.convert_layout(sc1, o_rows)[:, None]
                if has_t1:
                    p_op = gl.convert_layout(p, a_layout)
                    acc = warpgroup_mma(p_op, k_r.index(1 + zs), acc, is_async=True)
                    acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
                _cta_barrier()
                _seesaw_load(k_desc, kr_desc, land, full, 1, 2, 3, row1n, has_t1n, KV_FP8)
            ok0 = ok0n
            ok1 = ok1n
        pair_base += num_pairs
        odd_base += num_tiles // 2

        # Row sums: each warpgroup summed its own tiles' P (on the same running max).  The
        # buffer alternates by chunk: a warpgroup may store the next chunk's before the
        # other has read this one's.
        sums = s_l.index(c & 1)
        sums.slice(WG * BLOCK_H, BLOCK_H).store(l_i)
        _cta_barrier()
        mbarrier.arrive(bar_fin)
        mbarrier.wait(bar_fin, c & 1)
        if SCHEDULED:
            if WG == 0:
                if c + 1 < num_chunks:
                    # Both warpgroups' products have retired: Q and K are free, and the next
                    # chunk's copies land while this one's output is stored.
                    _, nstart, _, ntiles, npage_row_ptr, nq_row, _, _ = _mla_chunk(
                        c + 1, first_row, page_table_ptr, seq_lens_ptr, schedule_ptr, STRIDE_PTB, STRIDE_MOB,
                        STRIDE_MOS, STRIDE_MLB, STRIDE_MLS, NUM_HEADS, CAPACITY, NUM_KV_SPLITS, NUM_PROGRAMS,
                        CHUNK_COST, SCHEDULED, Q_LEN,
                    )  # fmt: skip
                    nrow0, _ = _page_of(npage_row_ptr, nstart, 0, ntiles, num_pages, BLOCK_N, PAGE_SIZE)
                    nrow1, _ = _page_of(npage_row_ptr, nstart, 1, ntiles, num_pages, BLOCK_N, PAGE_SIZE)
                    _seesaw_begin(q_desc, qr_desc, k_desc, kr_desc, q_in[0], q_in[1], q_in[2], land, q_bar, full,
                                  nq_row, nrow0, nrow1, ntiles, KV_FP8)  # fmt: skip
        l_tot = sums.slice(0, BLOCK_H).load(rows) + sums.slice(BLOCK_H, BLOCK_H).load(rows)
        has_tokens = l_tot > 0
        l_safe = gl.where(has_tokens, l_tot, 1.0)
        o = acc / gl.convert_layout(l_safe, o_rows)[:, None]
        if V_SCALE > 0:
            o = o * gl.load(v_scale_ptr)
        rows_o = gl.program_id(0) * BLOCK_H + gl.arange(0, BLOCK_H, layout=o_rows)
        cols = WG * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(0, o_layout))
        rows_s = gl.program_id(0) * BLOCK_H + gl.arange(0, BLOCK_H, layout=rows)
        lse = gl.where(has_tokens, (m_i + gl.log2(l_safe)) * LN2, float("-inf"))
        whole: gl.constexpr = False  # fixed splits: every chunk is a split, stage 2 merges
        if SCHEDULED:
            # (Read back here rather than kept from _mla_chunk: no register is spare.)
            whole, row = _mla_whole_row(c, first_row, schedule_ptr, NUM_PROGRAMS)
        if whole:  # the row's only chunk: the merge leaves it to this store
            _seesaw_store(o, lse, out_ptr, lse_ptr, row.to(gl.int64) * STRIDE_OB, row.to(gl.int64) * STRIDE_LB,
                          rows_o, rows_s, cols, STRIDE_OT, STRIDE_OH, STRIDE_LT, STRIDE_LH, NUM_HEADS, Q_LEN,
                          WG)  # fmt: skip
        else:
            _seesaw_store(o, lse, mid_o_ptr, mid_lse_ptr, o_base, lse_base, rows_o, rows_s, cols, STRIDE_MOT,
                          STRIDE_MOH, STRIDE_MLT, STRIDE_MLH, NUM_HEADS, Q_LEN, WG)  # fmt: skip


@gluon.jit
def _seesaw_worker(args, consts: gl.constexpr):
    _seesaw_call(args, consts, 1)


@gluon.jit
def _seesaw_default(args, consts: gl.constexpr):
    _seesaw_call(args, consts, 0)


@gluon.jit
def _seesaw_call(args, consts: gl.constexpr, WG: gl.constexpr):
    # The constexprs travel apart from the tensors: inside a partition's argument tuple
    # they would arrive as runtime values.
    (q_desc, qr_desc, k_desc, kr_desc, smem, page_table_ptr, seq_lens_ptr, schedule_ptr, k_scale_ptr, v_scale_ptr,
     num_pages, mid_o_ptr, mid_lse_ptr, out_ptr, lse_ptr) = args  # fmt: skip
    _seesaw_partition(
        q_desc, qr_desc, k_desc, kr_desc, smem, page_table_ptr, seq_lens_ptr, schedule_ptr, k_scale_ptr, v_scale_ptr,
        num_pages, mid_o_ptr, mid_lse_ptr, out_ptr, lse_ptr, consts[0], consts[1], consts[2], consts[3], consts[4],
        consts[5], consts[6], consts[7], consts[8], consts[9], consts[10], consts[11], consts[12], consts[13],
        consts[14], consts[15], consts[16], consts[17], consts[18], consts[19], consts[20], consts[21], consts[22],
        consts[23], consts[24], consts[25], consts[26], WG,
    )  # fmt: skip


@gluon.jit
def _seesaw_run(q_desc, qr_desc, k_desc, kr_desc, page_table_ptr, seq_lens_ptr, schedule_ptr, k_scale_ptr,
                v_scale_ptr, num_pages, mid_o_ptr, mid_lse_ptr, out_ptr, lse_ptr, consts):  # fmt: skip
    """Allocate the seesaw's shared memory and barriers and run its two warpgroups
    (warpgroup 0 the kernel's own 4 warps, warpgroup 1 a 4-warp worker partition).

    With an fp8 cache (``consts[22]``) the K parts hold float16, each landing by TMA as
    fp8 in the upper half of its own bytes and widened in place (:func:`_widen_part`),
    and Q lands as bfloat16 and is rewritten as float16: the same buffers as bfloat16's,
    so the same shared memory."""
    BLOCK_H: gl.constexpr = 64
    BLOCK_N: gl.constexpr = 64
    KV_FP8: gl.constexpr = consts[22]
    gl.static_assert(q_desc.block_type.shape[1] == 256, "latent halves")
    gl.static_assert(consts[11] % BLOCK_N == 0, "a K tile must lie inside one page")  # PAGE_SIZE
    # 16-bit tiles: Q's layouts (the cache's are fp8's with an fp8 cache).
    half_layout: gl.constexpr = q_desc.layout
    rope_layout: gl.constexpr = qr_desc.layout
    if KV_FP8:
        k_dtype: gl.constexpr = gl.float16
    else:
        k_dtype: gl.constexpr = gl.bfloat16
    # Q as arrays of one, so that the loop can index them with a value the compiler
    # cannot fold (see _seesaw_partition).
    q_l = gl.allocate_shared_memory(gl.bfloat16, [1, BLOCK_H, 256], half_layout)
    q_r = gl.allocate_shared_memory(gl.bfloat16, [1, BLOCK_H, 256], half_layout)
    q_e = gl.allocate_shared_memory(gl.bfloat16, [1, BLOCK_H, 64], rope_layout)
    k_l = gl.allocate_shared_memory(k_dtype, [2, BLOCK_N, 256], half_layout)
    k_r = gl.allocate_shared_memory(k_dtype, [2, BLOCK_N, 256], half_layout)
    k_e = gl.allocate_shared_memory(k_dtype, [2, BLOCK_N, 64], rope_layout)
    vec_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    s_m0 = gl.allocate_shared_memory(gl.float32, [BLOCK_H], vec_layout)
    s_m1 = gl.allocate_shared_memory(gl.float32, [BLOCK_H], vec_layout)
    s_l = gl.allocate_shared_memory(gl.float32, [2, 2 * BLOCK_H], vec_layout)
    p0_smem = gl.allocate_shared_memory(k_dtype, [BLOCK_H, BLOCK_N], rope_layout)
    q_bar = _barrier(1)
    # full[s][p]: part p (0 rope, 1 left half, 2 right half) of stage s's K tile.
    full = ((_barrier(1), _barrier(1), _barrier(1)), (_barrier(1), _barrier(1), _barrier(1)))
    # exchanges: m0, m1, P0, P1 once a pair; a chunk's end (both warpgroups); P0's
    # buffer free again.
    xbars = (_barrier(1), _barrier(1), _barrier(1), _barrier(1), _barrier(2), _barrier(1))
    if KV_FP8:
        q_views = (_as_dtype(q_l, gl.float16, [1, BLOCK_H, 256], half_layout),
                   _as_dtype(q_r, gl.float16, [1, BLOCK_H, 256], half_layout),
                   _as_dtype(q_e, gl.float16, [1, BLOCK_H, 64], rope_layout))  # fmt: skip
        # Each K stage's part as two fp8 buffers of its size: index 2 s + 1 is its upper half.
        # The cache descriptors' layouts bound as constexprs: Triton 3.6 hands a
        # descriptor's layout attribute over as a plain object, which it cannot pass on.
        fp8_half_layout: gl.constexpr = k_desc.layout
        fp8_rope_layout: gl.constexpr = kr_desc.layout
        land = (_as_dtype(k_l, gl.float8e4nv, [4, BLOCK_N, 256], fp8_half_layout),
                _as_dtype(k_r, gl.float8e4nv, [4, BLOCK_N, 256], fp8_half_layout),
                _as_dtype(k_e, gl.float8e4nv, [4, BLOCK_N, 64], fp8_rope_layout))  # fmt: skip
        q_ready = _barrier(2)  # both warpgroups' share of Q rewritten
    else:
        q_views = (q_l, q_r, q_e)
        land = (k_l, k_r, k_e)
        q_ready = q_bar  # (unused)
    fence_async_shared()
    smem = (q_views[0], q_views[1], q_views[2], k_l, k_r, k_e, p0_smem, s_m0, s_m1, s_l, q_bar, full, xbars,
            (q_l, q_r, q_e), land, q_ready)  # fmt: skip
    args = (q_desc, qr_desc, k_desc, kr_desc, smem, page_table_ptr, seq_lens_ptr, schedule_ptr, k_scale_ptr,
            v_scale_ptr, num_pages, mid_o_ptr, mid_lse_ptr, out_ptr, lse_ptr)  # fmt: skip
    gl.warp_specialize([(_seesaw_default, (args, consts)), (_seesaw_worker, (args, consts))], [4], [248])


@gluon.jit
def _mla_stage1_hopper_seesaw(
    q_desc,  # as _mla_stage1_hopper's, block [64, 256] (latent halves)
    qr_desc,  # as _mla_stage1_hopper's
    k_desc,  # as _mla_stage1_hopper's, block [64, 256] (bf16, or e4m3 with KV_FP8)
    kr_desc,  # as _mla_stage1_hopper's
    page_table_ptr,  # int32 [batch, max_pages]
    seq_lens_ptr,  # int32 [batch]
    k_scale_ptr,  # f32 [1]: the fp8 cache's K scale (read if K_SCALE)
    v_scale_ptr,  # f32 [1]: its V scale (read if V_SCALE)
    num_pages,  # int: pages in the cache; ids outside [0, num_pages) are masked
    mid_o_ptr,  # f32 [batch, num_heads, num_kv_splits, head_dim_v] (or the final out)
    mid_lse_ptr,  # f32 [batch, num_heads, num_kv_splits] (or the final lse)
    STRIDE_PTB: gl.constexpr,
    STRIDE_MOB: gl.constexpr,
    STRIDE_MOT: gl.constexpr,  # the token axis (Q_LEN > 1)
    STRIDE_MOH: gl.constexpr,
    STRIDE_MOS: gl.constexpr,
    STRIDE_MLB: gl.constexpr,
    STRIDE_MLT: gl.constexpr,
    STRIDE_MLH: gl.constexpr,
    STRIDE_MLS: gl.constexpr,
    SM_SCALE: gl.constexpr,
    NUM_HEADS: gl.constexpr,
    PAGE_SIZE: gl.constexpr,
    CAPACITY: gl.constexpr,
    NUM_KV_SPLITS: gl.constexpr,
    Q_LEN: gl.constexpr,  # query tokens per batch row; rows are (token, head) pairs
    KV_FP8: gl.constexpr,  # an e4m3 cache (widened to float16 in shared memory)
    K_SCALE: gl.constexpr,  # 0: none; else k_scale_ptr[0] multiplies the scores
    V_SCALE: gl.constexpr,  # 0: none; else v_scale_ptr[0] multiplies the output
):
    """The seesaw schedule with fixed splits (see the module docstring): launch with
    num_warps=4, grid ``(cdiv(Q_LEN * num_heads, 64), batch, NUM_KV_SPLITS)``.  Same
    outputs as _mla_stage1_hopper; its descriptors with [64, 256] latent blocks."""
    consts: gl.constexpr = (STRIDE_PTB, STRIDE_MOB, STRIDE_MOT, STRIDE_MOH, STRIDE_MOS, STRIDE_MLB, STRIDE_MLT,
                            STRIDE_MLH, STRIDE_MLS, SM_SCALE, NUM_HEADS, PAGE_SIZE, CAPACITY, NUM_KV_SPLITS, Q_LEN, 1,
                            0, False, 0, 0, 0, 0, KV_FP8, K_SCALE, V_SCALE, 0, 0)  # fmt: skip
    _seesaw_run(q_desc, qr_desc, k_desc, kr_desc, page_table_ptr, seq_lens_ptr, seq_lens_ptr, k_scale_ptr,
                v_scale_ptr, num_pages, mid_o_ptr, mid_lse_ptr, mid_o_ptr, mid_lse_ptr, consts)  # fmt: skip


@gluon.jit
def _mla_stage1_hopper_seesaw_scheduled(
    q_desc,
    qr_desc,
    k_desc,
    kr_desc,
    page_table_ptr,  # int32 [batch, max_pages]
    seq_lens_ptr,  # int32 [batch]
    k_scale_ptr,  # f32 [1] (read if K_SCALE)
    v_scale_ptr,  # f32 [1] (read if V_SCALE)
    schedule_ptr,  # int32: jax_decode.kernels.schedule._work_schedule's
    num_pages,  # int
    batch,  # int (the schedule's; unused here)
    mid_o_ptr,  # f32 [batch + NUM_PROGRAMS, (Q_LEN,) num_heads, head_dim_v], contiguous: partials by slot
    mid_lse_ptr,  # f32 [batch + NUM_PROGRAMS, (Q_LEN,) num_heads], contiguous
    out_ptr,  # [batch, (Q_LEN,) num_heads, head_dim_v], q's dtype: the rows of one chunk
    lse_ptr,  # f32 [batch, (Q_LEN,) num_heads]
    STRIDE_PTB: gl.constexpr,
    SM_SCALE: gl.constexpr,
    NUM_HEADS: gl.constexpr,
    PAGE_SIZE: gl.constexpr,
    CAPACITY: gl.constexpr,
    NUM_PROGRAMS: gl.constexpr,
    CHUNK_COST: gl.constexpr,
    STRIDE_OB: gl.constexpr,
    STRIDE_OH: gl.constexpr,
    STRIDE_LB: gl.constexpr,
    STRIDE_LH: gl.constexpr,
    KV_FP8: gl.constexpr,
    K_SCALE: gl.constexpr,
    V_SCALE: gl.constexpr,
    Q_LEN: gl.constexpr,  # query tokens per batch row; rows are (token, head) pairs
    STRIDE_OT: gl.constexpr,  # out's and lse's token strides (Q_LEN > 1)
    STRIDE_LT: gl.constexpr,
):
    """The seesaw under the device-side schedule: _mla_stage1_hopper_scheduled's
    contract (grid ``(cdiv(Q_LEN * num_heads, 64), NUM_PROGRAMS)``, chunk ``(p, b)`` to
    slot ``b + p``, a slot holding ``[Q_LEN, num_heads, 512]``), launched with
    num_warps=4 and [64, 256] latent blocks -- except that a row the schedule gives one
    chunk goes straight to ``out`` and ``lse``, normalised (the merge, run with
    ``SKIP_WHOLE``, leaves those rows alone)."""
    consts: gl.constexpr = (STRIDE_PTB, 0, NUM_HEADS * 512, 512, 0, 0, NUM_HEADS, 1, 0, SM_SCALE, NUM_HEADS,
                            PAGE_SIZE, CAPACITY, 1, Q_LEN, NUM_PROGRAMS, CHUNK_COST, True, STRIDE_OB, STRIDE_OH,
                            STRIDE_LB, STRIDE_LH, KV_FP8, K_SCALE, V_SCALE, STRIDE_OT, STRIDE_LT)  # fmt: skip
    _seesaw_run(q_desc, qr_desc, k_desc, kr_desc, page_table_ptr, seq_lens_ptr, schedule_ptr, k_scale_ptr,
                v_scale_ptr, num_pages, mid_o_ptr, mid_lse_ptr, out_ptr, lse_ptr, consts)  # fmt: skip
