"""The launch planner: from a problem and a device to a :class:`LaunchConfig`.

Plain Python on ints, shared by every frontend; nothing here imports a framework or
Triton.
"""

from __future__ import annotations

import dataclasses
import math
import operator

from jax_decode.launch.config import (
    GQA_HOPPER_HEAD_DIM,
    GQA_HOPPER_MAX_ROWS,
    GQA_HOPPER_REGISTERS,
    GQA_HOPPER_STAGES,
    GQA_HOPPER_THREADS,
    GQA_HOPPER_TILE,
    HOPPER_MLA_CHUNK_COST,
    HOPPER_MLA_ROWS,
    HOPPER_MLA_TILE,
    HOPPER_NARROW_MAX_ROWS,
    LaunchConfig,
    Variant,
)
from jax_decode.launch.cost import ProgramShape, long_tail_time, programs_per_sm, uniform_time
from jax_decode.launch.problem import (
    SCALE_NONE,
    DecodeProblem,
    DeviceInfo,
    cdiv,
    itemsize,
    next_power_of_2,
    prev_power_of_2,
)

# Upper bound for automatically chosen splits: stage 2 reads every split, and more
# splits than this never pays for itself on current GPUs.
MAX_AUTO_KV_SPLITS = 64
# Explicit num_kv_splits are accepted up to this value.
MAX_KV_SPLITS = 256
# Each automatically chosen split gets at least this many KV blocks of work.
MIN_BLOCKS_PER_SPLIT = 4
# What the device-side schedule adds to a portable launch, in the cost model's units
# (bytes at one SM's share of bandwidth): its one-program kernel and the launch gap
# after it, about 3 us (H100, DeepSeek-V3 b64: the schedule kernel took 2.1 us).
SCHEDULE_OVERHEAD_BYTES = 96 * 1024
# The split counts the planner chooses from: steps of at most 1.5x, few enough that a
# decode loop over growing lengths compiles a handful of kernels.
SPLIT_CHOICES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
# Stage 1 puts the batch on grid axis 1, which CUDA limits to 65535.
MAX_BATCH = 65535
# tl.dot needs at least 16 along each dimension.
MIN_DOT_DIM = 16
# Rows of one warpgroup MMA (sm_90): the head block of the tensor-core path.
WGMMA_ROWS = 64
# Grouped programs over K heads at least this wide take 3 pipeline stages.
WIDE_HEAD_DIM = 256


def split_head_dim(head_dim: int) -> tuple[int, int]:
    """(BLOCK_DMODEL, BLOCK_DPE): cover head_dim with one or two power-of-two blocks.

    576 -> (512, 64) and 288 -> (256, 32) as MLA lays them out; 96 -> (64, 32) and
    192 -> (128, 64) waste no lanes; anything else rounds up to a power of two and
    masks the tail (112 -> (128, 0)).
    """
    main = max(MIN_DOT_DIM, next_power_of_2(head_dim))
    if main == head_dim or head_dim <= MIN_DOT_DIM:
        return main, 0
    main //= 2
    rest = head_dim - main
    if rest >= MIN_DOT_DIM and next_power_of_2(rest) == rest:
        return main, rest
    return 2 * main, 0


def program_shape(p: DecodeProblem, device: DeviceInfo, block_h: int, block_n: int, num_warps: int, num_stages: int,
                  block_dmodel: int, block_dpe: int, block_dv: int) -> ProgramShape:  # fmt: skip
    """The cost model's view of one stage-1 program of this launch (with fixed splits or
    under the device-side schedule: the same body, kernel/decode.py).

    Registers and shared memory are estimates of what Triton allocates (checked against
    compiled kernels in tests/test_launch_config.py): the fp32 accumulator and scores,
    and the K/V tile fragments the products hold, over the program's threads.
    """
    threads = 32 * num_warps
    cache_bytes = itemsize(p.cache_dtype)
    k_width, v_width = block_dmodel + block_dpe, (0 if p.v_from_k else block_dv)
    row_bytes = (k_width + v_width) * cache_bytes
    tile_registers = block_n * (k_width + v_width) * max(cache_bytes, 2) // (4 * threads)
    if block_h == 1:  # multiply-and-reduce: the tiles live in registers
        registers, mma = 32 + tile_registers, "fma"
        shared = 0
    else:
        registers = 28 + (block_h * block_dv + 2 * block_h * block_n) // threads + tile_registers
        wgmma = block_h >= 64 and (device.compute_capability or 0) >= 90
        mma = "wgmma" if wgmma else "mma"
        shared = max(1, num_stages - 1) * block_n * row_bytes * 2 // 3 + (block_h * k_width * 2 if wgmma else 0)
    heads = min(block_h, p.rows_per_kv_head)
    return ProgramShape(
        threads=threads,
        registers=registers,
        shared_bytes=shared,
        in_flight_bytes=num_stages * block_n * row_bytes,
        token_bytes=(p.head_dim_qk + (0 if p.v_from_k else p.head_dim_v)) * cache_bytes,
        flops_per_token=2 * heads * (p.head_dim_qk + p.head_dim_v),
        mma=mma,
        partial_bytes=heads * (p.head_dim_v + 1) * 4,
    )


def choose_splits(p: DecodeProblem, device: DeviceInfo, program: ProgramShape, programs_per_row: int,
                  block_n: int) -> int:  # fmt: skip
    """The split count (of :data:`SPLIT_CHOICES`) the cost model
    (:mod:`jax_decode.launch.cost`) finds best for every plausible batch.

    The lengths are device values, so the launch must suit both a uniform batch (every
    row at the page table's capacity) and a long-tailed one (log-normal lengths, the
    longest at capacity): of the candidates, the one whose time is furthest from its
    scenario's best in neither.
    """
    return split_hedge(p, device, program, programs_per_row, block_n)[0]


def split_hedge(p: DecodeProblem, device: DeviceInfo, program: ProgramShape, programs_per_row: int,
                block_n: int) -> tuple[int, float, float]:  # fmt: skip
    """(splits, hedge, schedule) for :func:`choose_splits`' choice: ``hedge`` is how far
    its time is from the best in the worse of the two scenarios (1.0: the best in both);
    ``schedule`` the same for the device-side schedule, which the model takes to reach
    each scenario's best plus :data:`SCHEDULE_OVERHEAD_BYTES`."""
    if p.batch == 0:  # nothing is launched
        return 1, 1.0, 1.0
    per_sm = programs_per_sm(program, sm_shared_bytes(device))
    tokens = max(p.max_attended, 1)
    most = max(1, min(MAX_AUTO_KV_SPLITS, cdiv(tokens, block_n * MIN_BLOCKS_PER_SPLIT)))
    candidates = [s for s in SPLIT_CHOICES if s <= most]
    shape = (programs_per_row, p.batch, tokens)
    machine = (device.num_sms, per_sm)
    uniform = {s: uniform_time(program, *shape, s, *machine) for s in candidates}
    tail = {s: long_tail_time(program, *shape, s, *machine) for s in candidates}
    best_uniform, best_tail = min(uniform.values()), min(tail.values())
    hedge = {s: max(uniform[s] / best_uniform, tail[s] / best_tail) for s in candidates}
    splits = min(candidates, key=lambda s: (hedge[s], s))
    schedule = 1 + SCHEDULE_OVERHEAD_BYTES / min(best_uniform, best_tail)
    return splits, hedge[splits], schedule


def sm_shared_bytes(device: DeviceInfo) -> int:
    """Shared memory of one SM."""
    cc = device.compute_capability or 0
    return 232448 if cc >= 90 else 167936 if cc in (80, 87) else 101376


def shared_memory_budget(device: DeviceInfo) -> int:
    """Bytes of shared memory a program may plan on for its pipelined K/V tiles."""
    cc = device.compute_capability or 0
    if device.vendor != "nvidia":
        return 64 * 1024
    if cc >= 90:  # 227 KB per SM on sm_90; Triton's buffers stay well below this estimate
        return 216 * 1024
    if cc in (80, 87):  # 163 KB on A100 / Orin
        return 144 * 1024
    return 88 * 1024  # 99 KB on sm_86 / sm_89; 96+ KB on older parts


def _tensor_core_blocks(p: DecodeProblem, device: DeviceInfo) -> bool:
    """64-head blocks on warpgroup MMA: sm_90, a group of 64 heads or more, 16-bit q."""
    return (
        device.vendor == "nvidia"
        and (device.compute_capability or 0) >= 90
        and p.rows_per_kv_head >= WGMMA_ROWS
        and p.dtype in ("float16", "bfloat16")
    )


def _hopper_mla(p: DecodeProblem, device: DeviceInfo, multi_token: bool) -> bool:
    """What the Gluon sm_90 MLA stage 1 computes: one latent KV head of 576 = 512 + 64
    with V its first 512 columns, bfloat16 q, a bfloat16 cache (or an e4m3 one with any
    scales), no soft-cap, window or sinks, pages of whole 64-token tiles, and
    TMA's 32-bit row coordinates; one query token, or several where ``multi_token``."""
    bf16_cache = p.cache_dtype == "bfloat16" and p.k_scale == p.v_scale == SCALE_NONE
    return (
        device.hopper_kernels
        and device.vendor == "nvidia"
        and device.compute_capability == 90
        and p.v_from_k
        and p.num_kv_heads == 1
        and (p.head_dim_qk, p.head_dim_v) == (576, 512)
        and p.dtype == "bfloat16"
        and (bf16_cache or p.cache_dtype == "float8_e4m3fn")
        and (p.q_len == 1 or multi_token)
        and p.logit_cap == 0
        and p.window_left < 0
        and not p.has_sinks
        and p.page_size % HOPPER_MLA_TILE == 0
        and p.capacity > 0  # its page walk reads a row's first page-table entry unmasked
        and 0 < p.num_pages * p.page_size <= 2**31 - 1
        and p.batch * p.q_len * p.num_heads <= 2**31 - 1
    )


def _hopper_gqa(p: DecodeProblem, device: DeviceInfo, fp8: bool) -> bool:
    """What the Gluon sm_90 fp8 GQA stage 1 (jax_decode.kernels.gqa_hopper) computes, where
    ``fp8``: an e4m3 cache of separate K and V with head_dim 128 (any scales), bfloat16 q,
    one query token, at most 8 query heads per KV head, no soft-cap or window (sinks
    are stage 2's), pages of 16, 32 or a multiple of 64 tokens, and TMA's 32-bit row
    coordinates."""
    return (
        fp8
        and device.hopper_kernels
        and device.vendor == "nvidia"
        and device.compute_capability == 90
        and not p.v_from_k
        and p.head_dim_qk == p.head_dim_v == GQA_HOPPER_HEAD_DIM
        and p.dtype == "bfloat16"
        and p.cache_dtype == "float8_e4m3fn"
        and p.q_len == 1
        and p.rows_per_kv_head <= GQA_HOPPER_MAX_ROWS
        and p.logit_cap == 0
        and p.window_left < 0
        and (p.page_size in (16, 32) or p.page_size % GQA_HOPPER_TILE == 0)
        and p.capacity > 0
        and 0 < p.num_pages * p.page_size <= 2**31 - 1
    )


def gqa_hopper_program(p: DecodeProblem) -> ProgramShape:
    """The cost model's view of one program of the Gluon fp8 GQA stage 1: a 4-warp
    consumer and a 1-warp producer, a ring of 64-token tiles."""
    rows = p.rows_per_kv_head  # (padded to GQA_HOPPER_MAX_ROWS, the MMAs' N)
    tile_bytes = GQA_HOPPER_TILE * (p.head_dim_qk + p.head_dim_v)  # (one byte an element)
    # The ring, V^T, Q and P as two e4m3 terms each, and the barriers and reduction scratch.
    shared = GQA_HOPPER_STAGES * tile_bytes + GQA_HOPPER_TILE * p.head_dim_v
    shared += 2 * GQA_HOPPER_MAX_ROWS * (p.head_dim_qk + GQA_HOPPER_TILE) + 256
    return ProgramShape(
        threads=GQA_HOPPER_THREADS,
        registers=GQA_HOPPER_REGISTERS,
        shared_bytes=shared,
        in_flight_bytes=GQA_HOPPER_STAGES * tile_bytes,
        token_bytes=p.head_dim_qk + p.head_dim_v,
        flops_per_token=2 * rows * (p.head_dim_qk + p.head_dim_v),
        mma="wgmma",
        partial_bytes=rows * (p.head_dim_v + 1) * 4,
    )


def hopper_gqa_splits(p: DecodeProblem, device: DeviceInfo) -> int:
    """Fixed splits of the Gluon fp8 GQA stage 1: the cost model's hedge (:func:`choose_splits`)."""
    return choose_splits(p, device, gqa_hopper_program(p), p.num_kv_heads, GQA_HOPPER_TILE)


# The Gluon MLA stage 1's programs (jax_decode/kernels/mla_hopper.py, as compiled by
# triton 3.6 for sm_90), by launch name: threads, registers and shared memory (Q and a
# 2-stage ring of 64-token K tiles).  One program per SM, whichever runs.
HOPPER_MLA_PROGRAMS = {
    "mla_hopper": (256, 235, 229912),  # two warpgroups in lock step (the baseline)
    "mla_hopper_scheduled": (256, 235, 229912),  # the same under the device-side schedule
    "mla_hopper_seesaw": (256, 255, 231468),  # warp-specialised (fixed splits)
    "mla_hopper_seesaw_scheduled": (256, 255, 231484),  # (the device-side schedule)
}


def hopper_mla_program(p: DecodeProblem) -> ProgramShape:
    """The cost model's view of one program of the Gluon MLA stage 1."""
    heads = min(HOPPER_MLA_ROWS, p.rows_per_kv_head)
    threads, registers, shared = HOPPER_MLA_PROGRAMS["mla_hopper_seesaw"]
    return ProgramShape(
        threads=threads,
        registers=registers,
        shared_bytes=shared,
        in_flight_bytes=2 * HOPPER_MLA_TILE * p.head_dim_qk * itemsize(p.cache_dtype),
        token_bytes=p.head_dim_qk * itemsize(p.cache_dtype),
        flops_per_token=2 * heads * (p.head_dim_qk + p.head_dim_v),
        mma="wgmma",
        partial_bytes=heads * (p.head_dim_v + 1) * 4,
    )


def hopper_mla_splits(p: DecodeProblem, device: DeviceInfo) -> int:
    """Fixed splits of the Gluon MLA stage 1: the cost model's hedge between a uniform
    and a long-tailed batch (:func:`choose_splits`), as for the portable kernels.  For a
    uniform batch alone the model's best is one wave of programs, which is the measured
    best split count of DeepSeek-V3's b1 ctx32k, b8 ctx16k, b64 ctx4k and b128 ctx1k at
    128 heads and of b64 ctx4k at 16 on the H200; one wave alone left a long-tailed
    batch's longest row to one or two programs (DeepSeek-V3 TP8 b64 with mean length
    2048: 208 us on the H100, vLLM 131)."""
    return choose_splits(p, device, hopper_mla_program(p), cdiv(p.rows_per_kv_head, HOPPER_MLA_ROWS), HOPPER_MLA_TILE)


# The device-side schedule takes a few programs fewer than a wave, down to this share of
# it, where that many divide the batch or are a multiple of it (see schedule_programs).
ALIGNED_PROGRAMS_SHARE = 0.9


def hopper_mla_schedule_programs(p: DecodeProblem, device: DeviceInfo) -> int:
    """Programs per head block of the Gluon MLA stage 1 under the device-side schedule
    (0: fixed splits): :func:`schedule_programs` for one program per SM.  (64 of 66
    for 16, 64 or 128 rows at 128 heads; 128 of 132 for 16, 64 or 128 rows at 16.)  A
    block's rows are (query token, head) pairs."""
    wave = max(1, device.num_sms // cdiv(p.q_len * p.num_heads, HOPPER_MLA_ROWS))
    return schedule_programs(p, wave, HOPPER_MLA_TILE, HOPPER_MLA_CHUNK_COST)


def schedule_programs(p: DecodeProblem, wave: int, tile: int, chunk_cost: int) -> int:
    """Programs per head block under the device-side schedule (0: fixed splits), for
    ``wave`` of them resident at once: one wave -- or a few fewer where that many
    programs divide the batch or are a multiple of it (down to
    :data:`ALIGNED_PROGRAMS_SHARE` of the wave).  A uniform batch is then cut as fixed
    splits would cut it: ``k`` programs to a row each attend to one ``k``-th of it, or
    one program to ``k`` rows to those whole rows, instead of shares that straddle rows
    and start a second chunk (on an H100 four fixed splits' stage 1 took 74.6 us at
    DeepSeek-V3 DP b16 ctx8k against 80.4 under the schedule's 66 programs).  A batch of one row has no tail to
    balance, so its fixed splits do the same work without the schedule's two extra
    launches; the schedule's int32 positions must not overflow."""
    if p.batch <= 1:
        return 0
    aligned = max(d for d in range(1, wave + 1) if p.batch % d == 0 or d % p.batch == 0)
    programs = aligned if aligned >= ALIGNED_PROGRAMS_SHARE * wave else wave
    # The schedule's positions are int32 (their products with program counts int64).
    if p.batch * (chunk_cost + cdiv(p.capacity, tile)) >= 2**31:
        return 0
    return programs


def _wide_heads(block_dmodel: int, block_dpe: int) -> bool:
    """K heads of WIDE_HEAD_DIM or more (MQA d256, MLA's 576): 3 stages."""
    return block_dmodel + block_dpe >= WIDE_HEAD_DIM


def _grouped_blocks(p: DecodeProblem, device: DeviceInfo, block_dmodel: int, block_dpe: int, block_dv: int):
    """(BLOCK_N, num_stages) of the grouped kernel: 64 tokens and 2 stages for GQA, and 3
    stages for wide heads (MQA d256, MLA) -- as far as the K/V tiles fit the
    shared-memory budget.

    An fp8 cache with heads up to 128 wide takes 128 tokens and 3 stages: a tile holds
    half the bytes, and the per-token work, not memory, is then what limits.
    """
    cache_itemsize = itemsize(p.cache_dtype)
    row_bytes = (block_dmodel + block_dpe + (0 if p.v_from_k else block_dv)) * cache_itemsize
    block_n, stages = 64, (3 if _wide_heads(block_dmodel, block_dpe) else 2)
    if cache_itemsize == 1 and block_dmodel + block_dpe <= 128:
        block_n, stages = 128, 3
    budget = shared_memory_budget(device)
    while stages * block_n * row_bytes > budget and (stages > 2 or block_n > 16):
        if stages > 2:
            stages -= 1
        else:
            block_n //= 2
    return block_n, stages


def check_cache_dtype_on_device(cache_dtype: str, device: DeviceInfo | None) -> None:
    """Triton has float8_e4m3fn ("fp8e4nv") only from sm_89 (Ada, Hopper) on."""
    if (
        cache_dtype == "float8_e4m3fn"
        and device is not None
        and device.vendor == "nvidia"
        and (device.compute_capability or 0) < 89
    ):
        raise ValueError(
            f"a float8_e4m3fn cache needs an NVIDIA GPU of compute capability >= 8.9, this one is "
            f"sm_{device.compute_capability}; use float8_e5m2 there"
        )


def make_launch_config(
    problem: DecodeProblem,
    device: DeviceInfo,
    num_kv_splits: int | None = None,
    *,
    device_schedule: bool = True,
    hopper_multi_token: bool = True,
    portable_schedule: bool = False,
    hopper_fp8: bool = False,
    hopper_narrow: bool = True,
) -> LaunchConfig:
    """The launch for ``problem`` on ``device``; ``num_kv_splits=None`` picks one.

    ``device_schedule``: where the planner picks the splits (on an NVIDIA GPU), run
    stage 1 under the device-side schedule instead (:func:`schedule_programs`), unless
    the fixed splits would be one: that launch writes the output itself (or leaves
    stage 2 a single split to merge), while the schedule always merges fp32 partials
    (measured on the H200: DeepSeek-V3 b128 ctx 1k 102.5 us in one pass, 132.3
    scheduled; every other multi-row DeepSeek-V3 row faster scheduled,
    docs/performance.md).  False: fixed splits (benchmarks compare).
    ``hopper_multi_token``: let the Gluon MLA stage 1 take several query tokens per row
    (its rows (token, head) pairs); False keeps them on the portable kernel.
    ``portable_schedule``: let ``device_schedule`` apply to the portable stage 1 too,
    where the cost model finds the fixed splits' hedge dearer than the schedule.  Off
    by default: on an H100 the schedule beat every fixed split on long-tailed batches
    (3-7%) but ranged from 4% faster to 8% slower than the hedge on uniform ones, which
    this rule does not yet tell apart (docs/performance.md).
    ``hopper_fp8``: let the Gluon fp8 GQA stage 1 take an e4m3 cache
    (:mod:`jax_decode.kernels.gqa_hopper`, e4m3 tensor-core products).  Off by default:
    on an H100 it is level with the portable fp8 kernel (docs/performance.md, fp8).  (The
    Gluon MLA kernels take an e4m3 latent without it, widening it to float16 in shared
    memory: on an H100 1.4-3.8x faster than the portable fp8 kernel.)
    ``hopper_narrow``: give the Gluon MLA stage 1 of at most ``HOPPER_NARROW_MAX_ROWS``
    query rows (q_len x heads: DeepSeek-V3 at TP8) to the narrow-group kernels
    (:mod:`jax_decode.kernels.mla_narrow`), not the seesaw, which pads them to 64; False
    keeps the seesaw (benchmarks compare).
    """
    p = problem
    check_cache_dtype_on_device(p.cache_dtype, device)
    if num_kv_splits is not None:
        num_kv_splits = operator.index(num_kv_splits)  # a NumPy integer too
        if not 1 <= num_kv_splits <= MAX_KV_SPLITS:
            raise ValueError(f"num_kv_splits ({num_kv_splits}) must be in [1, {MAX_KV_SPLITS}]")
    block_dmodel, block_dpe = split_head_dim(p.head_dim_qk)
    block_dv = max(MIN_DOT_DIM, next_power_of_2(p.head_dim_v))
    if p.v_from_k and p.head_dim_v == block_dmodel:
        block_dv = block_dmodel

    if p.rows_per_kv_head == 1:
        variant: Variant = "mha"
        block_h, head_blocks = 1, 1
        # Multiply-and-reduce keeps the [BLOCK_N, D] tiles in registers: 128 tokens
        # while D <= 128, fewer (a power of two, as tl.arange needs) for wider heads.
        block_n = max(16, min(128, prev_power_of_2(16384 // max(block_dmodel + block_dpe, block_dv))))
        num_warps, num_stages = 4, 2
    elif _tensor_core_blocks(p, device):
        # Many heads per KV head (MLA's 128): the dots are the cost.  64-head blocks make
        # them Hopper's warpgroup MMA (64 rows), the latent is read by two programs, not
        # eight, and 8 warps (two warpgroups) hold the 64 x head_dim_v accumulator.
        variant = "grouped"
        block_h, num_warps = WGMMA_ROWS, 8
        head_blocks = cdiv(p.rows_per_kv_head, block_h)
        block_n, num_stages = 32, (3 if itemsize(p.cache_dtype) == 1 else 2)
    else:
        variant = "grouped"
        # Fit the head block to the group (one KV read serves every head of it), but
        # keep the fp32 accumulator [BLOCK_H, BLOCK_DV] within what registers hold.
        max_block_h = max(MIN_DOT_DIM, 8192 // block_dv)
        block_h = min(max(MIN_DOT_DIM, next_power_of_2(p.rows_per_kv_head)), max_block_h)
        head_blocks = cdiv(p.rows_per_kv_head, block_h)
        block_n, num_stages = _grouped_blocks(p, device, block_dmodel, block_dpe, block_dv)
        # 4 warps for every width.  Wide heads (d256) once took 8, which won by 3% on one
        # latency-bound shape (MQA b8) and lost 4-10% wherever the grid fills the GPU
        # (Gemma-2's d256 at batch 64-128 on the H200): with the SMs busy, two warpgroups
        # per program only add issue slots the memory system cannot feed.
        num_warps = 4

    hopper_mla = _hopper_mla(p, device, hopper_multi_token)
    hopper_gqa = _hopper_gqa(p, device, hopper_fp8)
    programs, wave = 0, 0
    if num_kv_splits is None and hopper_gqa:
        num_kv_splits = hopper_gqa_splits(p, device)
    elif num_kv_splits is None and hopper_mla:
        num_kv_splits = hopper_mla_splits(p, device)
        # (Several query tokens keep their fixed splits until the seesaw's schedule of
        # them has been timed against them on a GPU; hopper_mla_schedule_programs plans
        # it for tests and benchmarks.)
        if device_schedule and num_kv_splits > 1 and p.q_len == 1:
            programs = hopper_mla_schedule_programs(p, device)
    elif num_kv_splits is None:
        program = program_shape(p, device, block_h, block_n, num_warps, num_stages, block_dmodel, block_dpe, block_dv)
        programs_per_row = p.num_kv_heads * head_blocks
        num_kv_splits, hedge, schedule = split_hedge(p, device, program, programs_per_row, block_n)
        asked = portable_schedule and device_schedule and device.vendor == "nvidia"
        if asked and num_kv_splits > 1 and schedule < hedge:
            # The splits are a hedge between a uniform and a long-tailed batch; the
            # schedule fits the work to the lengths instead (one wave of programs),
            # where the model finds the hedge costs more than the schedule's launch
            # (and a wave holds more than one program per head block).
            resident = device.num_sms * programs_per_sm(program, sm_shared_bytes(device)) // programs_per_row
            wave = resident if resident > 1 else 0

    config = LaunchConfig(
        problem=p,
        device=device,
        variant=variant,
        block_n=block_n,
        block_h=block_h,
        head_blocks=head_blocks,
        block_dmodel=block_dmodel,
        block_dpe=block_dpe,
        block_dv=block_dv,
        num_warps=num_warps,
        num_stages=num_stages,
        num_kv_splits=num_kv_splits,
        stage2_num_warps=4 if block_dv >= 256 else 2,
        hopper_mla=hopper_mla,
        hopper_gqa=hopper_gqa,
        schedule_programs=programs,
        hopper_narrow=hopper_narrow and hopper_mla and p.q_len * p.num_heads <= HOPPER_NARROW_MAX_ROWS,
    )
    if wave:  # the portable stage 1 under the schedule
        programs = schedule_programs(p, wave, block_n, config.schedule_chunk_cost)
        config = dataclasses.replace(config, schedule_programs=programs)
    return config


def default_sm_scale(head_dim_qk: int) -> float:
    return 1.0 / math.sqrt(head_dim_qk)
