"""The launch planner: from a problem and a device to a :class:`LaunchConfig`.

Plain Python on ints, shared by every frontend; nothing here imports a framework or
Triton.
"""

from __future__ import annotations

import math

from jax_decode.launch.config import LaunchConfig, Variant
from jax_decode.launch.problem import DecodeProblem, DeviceInfo, cdiv, itemsize, next_power_of_2, prev_power_of_2

# Upper bound for automatically chosen splits: stage 2 reads every split, and more
# splits than this never pays for itself on current GPUs.
MAX_AUTO_KV_SPLITS = 64
# Explicit num_kv_splits are accepted up to this value.
MAX_KV_SPLITS = 256
# Each automatically chosen split gets at least this many KV blocks of work.
MIN_BLOCKS_PER_SPLIT = 4
# Automatic splits aim at this many stage-1 programs per SM ...
PROGRAMS_PER_SM = 4
# ... and at no program walking more tokens than this.
MAX_TOKENS_PER_SPLIT = 1024
# Grouped programs over wide heads (d256, MLA) resident on one SM: registers and
# shared memory allow two (H200; benchmarks/kernel_resources.py).
WIDE_HEAD_PROGRAMS_PER_SM = 2
# Stage 1 puts the batch on grid axis 1, which CUDA limits to 65535.
MAX_BATCH = 65535
# tl.dot needs at least 16 along each dimension.
MIN_DOT_DIM = 16
# Grouped programs over K heads at least this wide take 3 pipeline stages (and, from a
# 16- or 32-bit cache, 8 warps).
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


def choose_num_kv_splits(
    problem: DecodeProblem,
    device: DeviceInfo,
    programs_per_split: int,
    block_n: int,
    heads_per_program: int,
    wide_heads: bool,
) -> int:
    """Splits that keep every SM busy and no program's walk too long.

    Bandwidth peaks near ``PROGRAMS_PER_SM`` programs per SM, and rows walked by one
    program in long sequential loops lose to shorter splits even when the grid is
    already full (the last wave runs with idle SMs).  The merge in stage 2 bounds the
    useful count.

    Wide heads (d256, MLA's 576) then take, of the counts up to that one, the one the
    :func:`wide_split_cost` model finds cheapest: only two such programs fit an SM, so
    a grid just past a whole wave runs a nearly idle extra wave, and every split's
    partial result (float32 ``[heads, head_dim_v]``, 32 KB for MLA) is written and
    read back once more.
    """
    p = problem
    pps = max(programs_per_split, 1)
    wanted = cdiv(PROGRAMS_PER_SM * device.num_sms, pps)
    short_walks = cdiv(p.max_attended, MAX_TOKENS_PER_SPLIT)
    most_useful = max(1, cdiv(p.max_attended, block_n * MIN_BLOCKS_PER_SPLIT))
    splits = max(1, min(max(wanted, short_walks), most_useful, MAX_AUTO_KV_SPLITS))
    if not wide_heads:
        return splits
    slots = device.num_sms * WIDE_HEAD_PROGRAMS_PER_SM
    return min(range(1, splits + 1), key=lambda s: (wide_split_cost(p, pps, heads_per_program, slots, s), s))


def wide_split_cost(
    problem: DecodeProblem, programs_per_split: int, heads_per_program: int, slots: int, splits: int
) -> float:
    """Relative time of stage 1 + 2 with ``splits`` splits, for programs of which ``slots``
    run at once: whole waves of equal programs, each reading its share of a row's KV
    bytes and writing its partial result, which stage 2 reads back over all slots.

    It overprices a partly filled last wave, whose programs share the bandwidth among
    fewer (it puts 3 splits of MLA b64 ahead of 9).
    """
    p = problem
    token_bytes = (p.head_dim_qk + (0 if p.v_from_k else p.head_dim_v)) * itemsize(p.cache_dtype)
    partial_bytes = heads_per_program * p.head_dim_v * 4
    programs = programs_per_split * splits
    per_program = p.max_attended * token_bytes / splits + partial_bytes
    return cdiv(programs, slots) * per_program + programs * partial_bytes / slots


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


def _wide_heads(block_dmodel: int, block_dpe: int) -> bool:
    """K heads of WIDE_HEAD_DIM or more (MQA d256, MLA's 576): 3 stages, maybe 8 warps."""
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


def make_launch_config(problem: DecodeProblem, device: DeviceInfo, num_kv_splits: int | None = None) -> LaunchConfig:
    """The launch for ``problem`` on ``device``; ``num_kv_splits=None`` picks one."""
    p = problem
    check_cache_dtype_on_device(p.cache_dtype, device)
    if num_kv_splits is not None and not 1 <= num_kv_splits <= MAX_KV_SPLITS:
        raise ValueError(f"num_kv_splits ({num_kv_splits}) must be in [1, {MAX_KV_SPLITS}]")
    block_dmodel, block_dpe = split_head_dim(p.head_dim_qk)
    block_dv = max(MIN_DOT_DIM, next_power_of_2(p.head_dim_v))
    if p.v_from_k and p.head_dim_v == block_dmodel:
        block_dv = block_dmodel

    if p.kv_group == 1:
        variant: Variant = "mha"
        block_h, head_blocks = 1, 1
        # Multiply-and-reduce keeps the [BLOCK_N, D] tiles in registers: 128 tokens
        # while D <= 128, fewer (a power of two, as tl.arange needs) for wider heads.
        block_n = max(16, min(128, prev_power_of_2(16384 // max(block_dmodel + block_dpe, block_dv))))
        num_warps, num_stages = 4, 2
        programs_per_split = p.batch * p.num_heads
        wide = False  # the split rule's wide-head model is the grouped kernel's
    else:
        variant = "grouped"
        # Fit the head block to the group (one KV read serves every head of it), but
        # keep the fp32 accumulator [BLOCK_H, BLOCK_DV] within what registers hold.
        max_block_h = max(MIN_DOT_DIM, 8192 // block_dv)
        block_h = min(max(MIN_DOT_DIM, next_power_of_2(p.kv_group)), max_block_h)
        head_blocks = cdiv(p.kv_group, block_h)
        block_n, num_stages = _grouped_blocks(p, device, block_dmodel, block_dpe, block_dv)
        # Wide K/V heads (d256) from a 16- or 32-bit cache take 8 warps, each holding half
        # of every tile and of the accumulator.  An fp8 tile is half as large and faster
        # with 4, and so is MLA, whose 576-wide latent with many heads per program is
        # dot-bound.
        wide = _wide_heads(block_dmodel, block_dpe)
        num_warps = 8 if wide and not p.v_from_k and itemsize(p.cache_dtype) >= 2 else 4
        programs_per_split = p.batch * p.num_kv_heads * head_blocks

    if num_kv_splits is None:
        heads_per_program = min(block_h, p.kv_group)  # heads whose partials a program writes
        num_kv_splits = choose_num_kv_splits(p, device, programs_per_split, block_n, heads_per_program, wide)

    return LaunchConfig(
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
    )


def default_sm_scale(head_dim_qk: int) -> float:
    return 1.0 / math.sqrt(head_dim_qk)
