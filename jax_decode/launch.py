"""Launch configuration: plain Python on ints, shared by every frontend.

From a :class:`DecodeProblem` (shapes, dtypes, scalars) and a :class:`DeviceInfo` this
module computes everything a launch needs -- kernel variant, block sizes, warps,
stages, number of KV splits, grids and the constexpr arguments -- so that the JAX
frontend, the torch frontend and the interpreter backend launch the very same kernels
with the very same parameters (and so give bit-identical results).

Nothing here imports a framework or Triton; the objects are frozen and hashable, so
they can be ``jax.jit`` static arguments and cache keys.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal, NamedTuple

Variant = Literal["mha", "grouped"]

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

# How a cache's dequantisation scale is given (the kernels' K_SCALE / V_SCALE / SCALE).
SCALE_NONE, SCALE_PER_TENSOR, SCALE_PER_KV_HEAD = 0, 1, 2


class Fp8Format(NamedTuple):
    """An fp8 cache format: quantised writes saturate at ``largest`` (its largest finite
    value) and round to ``mantissa_bits`` with exponent ``bias``."""

    largest: float
    mantissa_bits: int
    bias: int


FP8_FORMATS = {"float8_e4m3fn": Fp8Format(448.0, 3, 7), "float8_e5m2": Fp8Format(57344.0, 2, 15)}
NO_FP8 = Fp8Format(0.0, 0, 0)  # the write kernel's constexprs for a 16/32-bit cache


def itemsize(dtype: str) -> int:
    """Bytes per element of a q or cache dtype name."""
    return 1 if dtype in FP8_FORMATS else 4 if dtype == "float32" else 2


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """What the launch heuristics need to know about the device.

    ``vendor`` is ``"nvidia"``, ``"amd"`` or ``"cpu"`` (Triton's interpreter);
    ``compute_capability`` is e.g. 90 for sm_90 (None on the CPU); ``num_sms`` is the
    number of streaming multiprocessors (compute units; CPU cores for the interpreter).
    """

    vendor: Literal["nvidia", "amd", "cpu"]
    compute_capability: int | None
    num_sms: int

    @classmethod
    def interpreter(cls) -> DeviceInfo:
        # A fixed stand-in, so interpreter launches (and the parity tests built on
        # them) do not depend on the host's core count.
        return cls(vendor="cpu", compute_capability=None, num_sms=4)


@dataclasses.dataclass(frozen=True)
class DecodeProblem:
    """Static description of one decode-attention call (shapes, dtypes, scalars)."""

    batch: int
    num_heads: int
    num_kv_heads: int
    head_dim_qk: int
    head_dim_v: int
    num_pages: int
    page_size: int
    max_pages: int
    dtype: str  # q, cache and output dtype name: "float16", "bfloat16", "float32"
    v_from_k: bool  # V is k_cache[..., :head_dim_v] (MLA): no separate V array
    sm_scale: float
    logit_cap: float
    kv_dtype: str | None = None  # cache dtype when it differs from q's (fp8)
    k_scale: int = SCALE_NONE  # SCALE_* mode of k_scale
    v_scale: int = SCALE_NONE  # SCALE_* mode of v_scale
    window_left: int = -1  # >= 0: attend to the last window_left + 1 tokens only
    has_sinks: bool = False  # per-head sink logits join the softmax denominator

    @property
    def kv_group(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def capacity(self) -> int:
        """Most tokens one row can hold: max_pages * page_size."""
        return self.max_pages * self.page_size

    @property
    def cache_dtype(self) -> str:
        return self.kv_dtype or self.dtype

    @property
    def max_attended(self) -> int:
        """Most tokens one row attends to (and stage 1 reads): the capacity or the window."""
        return self.capacity if self.window_left < 0 else min(self.capacity, self.window_left + 1)


@dataclasses.dataclass(frozen=True)
class KernelStrides:
    """Element strides of every array the kernels address (last dims are contiguous)."""

    q: tuple[int, int]  # batch, head
    k: tuple[int, int, int]  # page, slot, kv head
    v: tuple[int, int, int]  # page, slot, kv head
    page_table: int  # batch
    mid_o: tuple[int, int, int]  # batch, head, split
    mid_lse: tuple[int, int, int]  # batch, head, split
    out: tuple[int, int]  # batch, head
    lse: tuple[int, int]  # batch, head

    @classmethod
    def contiguous(cls, problem: DecodeProblem, num_kv_splits: int) -> KernelStrides:
        """Strides of row-major arrays (every JAX array; default torch tensors)."""
        p = problem
        k_slot = p.num_kv_heads * p.head_dim_qk
        v_width = p.head_dim_qk if p.v_from_k else p.head_dim_v
        v_slot = p.num_kv_heads * v_width
        return cls(
            q=(p.num_heads * p.head_dim_qk, p.head_dim_qk),
            k=(p.page_size * k_slot, k_slot, p.head_dim_qk),
            v=(p.page_size * v_slot, v_slot, v_width),
            page_table=p.max_pages,
            mid_o=(p.num_heads * num_kv_splits * p.head_dim_v, num_kv_splits * p.head_dim_v, p.head_dim_v),
            mid_lse=(p.num_heads * num_kv_splits, num_kv_splits, 1),
            out=(p.num_heads * p.head_dim_v, p.head_dim_v),
            lse=(p.num_heads, 1),
        )


@dataclasses.dataclass(frozen=True)
class KernelLaunch:
    """One kernel launch: which kernel, on which grid, with which compile options."""

    kernel_name: str  # a key of kernels.STAGE1_KERNELS, or "stage2"
    grid: tuple[int, int, int]
    num_warps: int
    num_stages: int
    constexprs: tuple[tuple[str, object], ...]

    def meta(self) -> dict[str, object]:
        return dict(self.constexprs)


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """Everything both stages need, for one problem on one device."""

    problem: DecodeProblem
    device: DeviceInfo
    variant: Variant
    block_n: int
    block_h: int  # query heads per program (1 for "mha")
    head_blocks: int  # programs per KV head along the head axis
    block_dmodel: int
    block_dpe: int  # second part of head_dim_qk (0: none), e.g. 64 for MLA's 576
    block_dv: int
    num_warps: int
    num_stages: int
    num_kv_splits: int
    stage2_num_warps: int

    @property
    def stage1_grid(self) -> tuple[int, int, int]:
        p = self.problem
        if self.variant == "mha":
            return (p.num_heads, p.batch, self.num_kv_splits)
        return (p.num_kv_heads * self.head_blocks, p.batch, self.num_kv_splits)

    @property
    def stage2_grid(self) -> tuple[int, int, int]:
        return (self.problem.batch, self.problem.num_heads, 1)

    @property
    def mid_o_shape(self) -> tuple[int, int, int, int]:
        p = self.problem
        return (p.batch, p.num_heads, self.num_kv_splits, p.head_dim_v)

    @property
    def mid_lse_shape(self) -> tuple[int, int, int]:
        p = self.problem
        return (p.batch, p.num_heads, self.num_kv_splits)

    def contiguous_strides(self) -> KernelStrides:
        return KernelStrides.contiguous(self.problem, self.num_kv_splits)

    def stage1(self, strides: KernelStrides) -> KernelLaunch:
        p = self.problem
        meta: dict[str, object] = dict(
            STRIDE_QB=strides.q[0],
            STRIDE_QH=strides.q[1],
            STRIDE_KP=strides.k[0],
            STRIDE_KS=strides.k[1],
            STRIDE_KH=strides.k[2],
            STRIDE_VP=strides.v[0],
            STRIDE_VS=strides.v[1],
            STRIDE_VH=strides.v[2],
            STRIDE_PTB=strides.page_table,
            STRIDE_MOB=strides.mid_o[0],
            STRIDE_MOH=strides.mid_o[1],
            STRIDE_MOS=strides.mid_o[2],
            STRIDE_MLB=strides.mid_lse[0],
            STRIDE_MLH=strides.mid_lse[1],
            STRIDE_MLS=strides.mid_lse[2],
            SM_SCALE=float(p.sm_scale),
            LOGIT_CAP=float(p.logit_cap),
            K_SCALE=p.k_scale,
            V_SCALE=p.v_scale,
            WINDOW_LEFT=p.window_left,
            KV_GROUP=p.kv_group,
            HEAD_DIM_QK=p.head_dim_qk,
            HEAD_DIM_V=p.head_dim_v,
            BLOCK_DMODEL=self.block_dmodel,
            BLOCK_DPE=self.block_dpe,
            BLOCK_DV=self.block_dv,
            BLOCK_N=self.block_n,
            PAGE_SIZE=p.page_size,
            CAPACITY=p.capacity,
            NUM_KV_SPLITS=self.num_kv_splits,
        )
        if self.variant == "grouped":
            meta.update(
                BLOCK_H=self.block_h,
                HEAD_BLOCKS=self.head_blocks,
                V_FROM_K=self.reuse_k_as_v,
                # bfloat16 q over an fp8 cache: dots in float16 (cheaper fp8 widening).
                FP8_DOT_F16=p.cache_dtype in FP8_FORMATS and p.dtype == "bfloat16",
                # fp32 tl.dot would otherwise round its inputs to tf32.
                DOT_PRECISION="ieee" if p.dtype == "float32" else "tf32",
                DOT_UPCAST=self.device.vendor == "cpu" and p.dtype == "bfloat16",
            )
        return KernelLaunch(self.variant, self.stage1_grid, self.num_warps, self.num_stages, tuple(meta.items()))

    def stage2(self, strides: KernelStrides) -> KernelLaunch:
        meta = dict(
            STRIDE_MOB=strides.mid_o[0],
            STRIDE_MOH=strides.mid_o[1],
            STRIDE_MOS=strides.mid_o[2],
            STRIDE_MLB=strides.mid_lse[0],
            STRIDE_MLH=strides.mid_lse[1],
            STRIDE_MLS=strides.mid_lse[2],
            STRIDE_OB=strides.out[0],
            STRIDE_OH=strides.out[1],
            STRIDE_LB=strides.lse[0],
            STRIDE_LH=strides.lse[1],
            HEAD_DIM_V=self.problem.head_dim_v,
            BLOCK_DV=self.block_dv,
            BLOCK_S=next_power_of_2(self.num_kv_splits),
            NUM_KV_SPLITS=self.num_kv_splits,
            HAS_SINKS=self.problem.has_sinks,
        )
        return KernelLaunch("stage2", self.stage2_grid, self.stage2_num_warps, 1, tuple(meta.items()))

    @property
    def reuse_k_as_v(self) -> bool:
        """MLA: the K tile already loaded holds V, so V is not read a second time."""
        p = self.problem
        return (
            self.variant == "grouped"
            and p.v_from_k
            and p.head_dim_v == self.block_dmodel
            and self.block_dv == self.block_dmodel
        )


def stage1_scales(k_scale, v_scale, placeholder, v_from_k: bool):
    """Stage 1's scale operands, for every frontend: ``placeholder`` (any array of the
    call) where a scale is absent -- the kernel does not read it then -- and K's scale
    for V when V is K's latent (MLA)."""
    if v_from_k:
        v_scale = k_scale
    return (placeholder if k_scale is None else k_scale), (placeholder if v_scale is None else v_scale)


def write_cache_launch(
    num_tokens: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    new_strides: tuple[int, int],
    cache_strides: tuple[int, int, int],
    cache_dtype: str,
    scale: int = SCALE_NONE,
) -> KernelLaunch:
    """The paged KV write: one program per (token, KV head) copies one row.

    Rows are divided by the scale (``scale`` a SCALE_* mode) and, for an fp8 cache,
    saturated to its finite range before the cast.
    """
    block_d = next_power_of_2(head_dim)
    fp8 = FP8_FORMATS.get(cache_dtype, NO_FP8)
    meta = dict(
        STRIDE_NT=new_strides[0],
        STRIDE_NH=new_strides[1],
        STRIDE_CP=cache_strides[0],
        STRIDE_CS=cache_strides[1],
        STRIDE_CH=cache_strides[2],
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        PAGE_SIZE=page_size,
        SCALE=scale,
        SATURATE=fp8.largest,
        FP8_MAN_BITS=fp8.mantissa_bits,
        FP8_BIAS=fp8.bias,
    )
    num_warps = 1 if block_d <= 128 else 2
    return KernelLaunch("write_cache", (num_tokens, num_kv_heads, 1), num_warps, 1, tuple(meta.items()))


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

    Measured on an H200 (docs/performance.md): bandwidth peaks near
    ``PROGRAMS_PER_SM`` programs per SM, and rows walked by one program in long
    sequential loops lose to shorter splits even when the grid is already full (the
    last wave runs with idle SMs).  The merge in stage 2 bounds the useful count.

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

    On the H200 its cheapest count was the fastest measured for each MLA shape timed
    (b64 ctx4k: 4 splits 101.1 us, 8 splits 106.6, 9 splits 108.7, 3 splits 120.9, 5
    splits 137.6; b32 ctx8k: 8 splits 97.8, 17 splits 107.0, 9 splits 122.4; more in
    tests/test_launch_config.py).  It overprices a partly filled last wave, whose
    programs share the bandwidth among fewer (it puts 3 splits of b64 ahead of 9).
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
    """(BLOCK_N, num_stages) of the grouped kernel: 64 tokens and 2 stages, which the
    H200 sweep found best for GQA, and 3 stages for wide heads (MQA d256, MLA), where
    it found them best -- as far as the K/V tiles fit the shared-memory budget.
    (MLA's 3 x 64 tokens x 1152 bytes just fit sm_90's 216 KB: 117 -> 107 us.)

    An fp8 cache with heads up to 128 wide takes 128 tokens and 3 stages (the fp8
    sweep's best on all three GQA d128 shapes, +7 to +30% over 64 / 2): a tile holds
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
        # (the H200 sweep's best) while D <= 128, fewer for wider heads.
        block_n = max(16, min(128, 16384 // max(block_dmodel + block_dpe, block_dv)))
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
        # Wide K/V heads (d256) from a 16- or 32-bit cache take 8 warps, each holding half of
        # every tile and of the accumulator (H200: 1-4% faster).  An fp8 tile is half
        # as large and faster with 4 (d256: 19 vs 27 us), and so is MLA, whose 576-wide
        # latent with many heads per program is dot-bound (128 heads: 329 vs 474 us).
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
