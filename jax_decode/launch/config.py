"""The launch config: kernel, grid, warps, stages and constexprs of every launch.

A :class:`LaunchConfig` is what :func:`jax_decode.launch.make_launch_config` plans for
one problem on one device; both frontends turn it into the same launches (and so give
bit-identical results).  Plain Python, frozen and hashable.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from jax_decode.launch.cost import PROGRAM_OVERHEAD_BYTES
from jax_decode.launch.problem import (
    FP8_FORMATS,
    NO_FP8,
    SCALE_NONE,
    DecodeProblem,
    DeviceInfo,
    cdiv,
    itemsize,
    next_power_of_2,
)

# Query heads per program of the Gluon MLA stage 1 (one warpgroup MMA's rows), and
# tokens per K tile.
HOPPER_MLA_ROWS = 64
HOPPER_MLA_TILE = 64
# The Gluon fp8 GQA stage 1 (jax_decode.kernels.gqa_hopper): tokens per tile (its MMAs'
# M), the head dim it takes, query heads per KV head at most (its MMAs' N: 16 spill
# at the register cap under triton 3.8), ring stages,
# threads (4 consumer warps and a producer warp, which Triton pads to a warpgroup) and
# the register cap it is built with (80 a thread lets three programs share an SM, which
# their 60 KB of shared memory also allow).
GQA_HOPPER_TILE = 64
GQA_HOPPER_HEAD_DIM = 128
# The narrow-group MLA stage 1 (jax_decode.kernels.mla_narrow): query rows per program
# at most (its MMAs' N, 16 or 32) and its ring stages (two 72 KB K tiles).
HOPPER_NARROW_MAX_ROWS = 32
HOPPER_NARROW_STAGES = 2
GQA_HOPPER_MAX_ROWS = 8
GQA_HOPPER_STAGES = 3
GQA_HOPPER_THREADS = 256
GQA_HOPPER_REGISTERS = 80
# The device-side schedule's fixed cost of starting a row's chunk (loading Q, filling
# the pipeline, writing a partial result), in 64-token tiles; FlashMLA uses 5 too.
HOPPER_MLA_CHUNK_COST = 5
# Heads per program of the schedule's merge, at most: enough programs to read many rows'
# chunks in parallel, few enough that a uniform batch's merge, which only finds that
# stage 1 wrote every row itself, ends soon (H100, DeepSeek-V3: 4 heads per program took
# DP b64's merge from 9.3 us at one head to 2.3; 16 heads cost DP b16, whose rows all
# merge, 7 us).  Fewer where the grid would be small: a program's chunk loads are one
# SM's, and at 4 heads of 512 DeepSeek-V3 TP8 b16's 64 programs took 5.6 us to merge
# what fixed splits' 256 merge in 1.6.
SCHEDULE_MERGE_HEADS = 4
# ... fewer heads per program, down to one, while the grid stays within this many
# programs per SM.
SCHEDULE_MERGE_PROGRAMS_PER_SM = 4
# Chunks the schedule's merge loads at once (most rows of a long-tailed batch have two or
# three): their partials arrive in one round of loads instead of one per chunk.
SCHEDULE_MERGE_CHUNKS = 4
_POINTER = {"bfloat16": "*bf16", "float16": "*fp16", "float32": "*fp32"}

Variant = Literal["mha", "grouped"]


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
    # The token axis (several query tokens per row) of q, mid_o, mid_lse, out and lse;
    # unused (0) with one token.
    tokens: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)

    @classmethod
    def contiguous(cls, problem: DecodeProblem, num_kv_splits: int) -> KernelStrides:
        """Strides of row-major arrays (every JAX array; default torch tensors), with the
        token axis after the batch where there are several query tokens."""
        p = problem
        k_slot = p.num_kv_heads * p.head_dim_qk
        v_width = p.head_dim_qk if p.v_from_k else p.head_dim_v
        v_slot = p.num_kv_heads * v_width
        q_token = p.num_heads * p.head_dim_qk
        out_token = p.num_heads * p.head_dim_v
        mid_head = num_kv_splits * p.head_dim_v
        mid_token, lse_token = p.num_heads * mid_head, p.num_heads * num_kv_splits
        return cls(
            q=(p.q_len * q_token, p.head_dim_qk),
            k=(p.page_size * k_slot, k_slot, p.head_dim_qk),
            v=(p.page_size * v_slot, v_slot, v_width),
            page_table=p.max_pages,
            mid_o=(p.q_len * mid_token, mid_head, p.head_dim_v),
            mid_lse=(p.q_len * lse_token, num_kv_splits, 1),
            out=(p.q_len * out_token, p.head_dim_v),
            lse=(p.q_len * p.num_heads, 1),
            tokens=(q_token, mid_token, lse_token, out_token, p.num_heads) if p.q_len > 1 else (0, 0, 0, 0, 0),
        )


def _stage1_out_strides(strides: KernelStrides, final: bool) -> dict[str, int]:
    """Stage 1's output strides as the kernels name them (and stage 2's input ones), in
    their parameter order: the partial results', or with ``final`` (one pass) those of
    ``out`` and ``lse``, whose split stride is 0."""
    if final:
        o, lse, tokens = (*strides.out, 0), (*strides.lse, 0), strides.tokens[3:5]
    else:
        o, lse, tokens = strides.mid_o, strides.mid_lse, strides.tokens[1:3]
    return dict(
        STRIDE_MOB=o[0],
        STRIDE_MOT=tokens[0],
        STRIDE_MOH=o[1],
        STRIDE_MOS=o[2],
        STRIDE_MLB=lse[0],
        STRIDE_MLT=tokens[1],
        STRIDE_MLH=lse[1],
        STRIDE_MLS=lse[2],
    )


def _scheduled_stage1_out_strides(p: DecodeProblem) -> dict[str, int]:
    """The scheduled stage 1's partial results' strides (:attr:`LaunchConfig.mid_o_shape`,
    contiguous, chunk slots in place of batch rows, no split axis), named as
    :func:`_stage1_out_strides` names them."""
    several = p.q_len > 1
    return dict(
        STRIDE_MOB=p.q_len * p.num_heads * p.head_dim_v,
        STRIDE_MOT=p.num_heads * p.head_dim_v if several else 0,
        STRIDE_MOH=p.head_dim_v,
        STRIDE_MOS=0,
        STRIDE_MLB=p.q_len * p.num_heads,
        STRIDE_MLT=p.num_heads if several else 0,
        STRIDE_MLH=1,
        STRIDE_MLS=0,
    )


@dataclasses.dataclass(frozen=True)
class TmaView:
    """A TMA descriptor argument of a Gluon kernel: ``rows`` x ``cols`` elements of one
    operand (row stride ``row_stride``, last dimension contiguous), read in ``block``s."""

    operand: str  # "q", "k_cache" or "v_cache"
    rows: int
    cols: int
    row_stride: int
    block: tuple[int, int]
    dtype: str = "bf16"  # Triton's name of the element type: "bf16" or "fp8e4nv"


@dataclasses.dataclass(frozen=True)
class KernelLaunch:
    """One kernel launch: which kernel, on which grid, with which compile options.

    A Gluon kernel (compiled ahead of its launch by :mod:`jax_decode.kernels.gluon_compile`,
    not specialised by Triton's JIT) also names the types of its runtime parameters
    (``"tma"`` for a descriptor, the i-th taking ``tma[i]``; ``"*bf16"``-style pointers,
    16-byte aligned; ``"i32"``)."""

    kernel_name: str  # a key of jax_decode.kernels.KERNELS
    grid: tuple[int, int, int]
    num_warps: int
    num_stages: int
    constexprs: tuple[tuple[str, object], ...]
    param_types: tuple[tuple[str, str], ...] = ()  # Gluon: (name, type) of each runtime parameter
    tma: tuple[TmaView, ...] = ()  # Gluon: the descriptor parameters, in order
    max_registers: int = 0  # Gluon: a cap on registers a thread (ptxas's maxnreg; 0: none)

    def meta(self) -> dict[str, object]:
        return dict(self.constexprs)


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """Everything both stages need, for one problem on one device."""

    problem: DecodeProblem
    device: DeviceInfo
    variant: Variant  # "mha": one head per program; "grouped": a head block with tl.dot
    block_n: int
    block_h: int  # query heads per program (1 for "mha")
    head_blocks: int  # programs per KV head along the head axis
    block_dmodel: int
    block_dpe: int  # second part of head_dim_qk (0: none), e.g. 64 for MLA's 576
    block_dv: int
    num_warps: int
    num_stages: int
    num_kv_splits: int  # splits in stage 1's grid
    stage2_num_warps: int
    # Stage 1 is the Gluon sm_90 MLA kernel (jax_decode.kernels.mla_hopper) wherever the
    # operands allow its TMA copies (see tma_ready); the fields above then describe the
    # portable kernel that takes its place elsewhere, with the same splits and scratch.
    hopper_mla: bool = False
    # Stage 1 is the Gluon sm_90 fp8 GQA kernel (jax_decode.kernels.gqa_hopper) wherever
    # the caches allow its TMA copies, as for hopper_mla; it writes partial results only
    # (no one-pass launch).
    hopper_gqa: bool = False
    # > 0: stage 1 runs this many programs per head block under the device-side
    # schedule (jax_decode.kernels.schedule) instead of fixed splits -- the Gluon stage 1
    # with hopper_mla (num_kv_splits then describes only the portable stand-in), else the
    # portable one -- and the schedule's merge takes stage 2's place.
    schedule_programs: int = 0
    # With hopper_mla: the warp-specialised seesaw kernels (any q_len, fixed splits or the
    # schedule); False: the two-warpgroup kernel, the benchmarks' and tests' baseline
    # (its schedule takes one query token).
    hopper_seesaw: bool = True
    # With hopper_mla and at most HOPPER_NARROW_MAX_ROWS query rows (q_len x heads): the
    # narrow-group kernels (jax_decode.kernels.mla_narrow, tokens as the MMAs' rows; fixed
    # splits or the schedule) instead of the seesaw (the planner's choice; see its
    # hopper_narrow option).
    hopper_narrow: bool = False
    # With hopper_narrow and an e4m3 cache: the tiles widened to float16 by a warpgroup of
    # their own (the narrow kernels' WIDENER), not by the consumer between its products.
    # Opt-in until run and timed on a GPU.
    hopper_widener: bool = False

    @property
    def scheduled_rows_direct(self) -> bool:
        """Under the device-side schedule, the Gluon MLA stage 1 writes a row of one chunk
        to out and lse itself, and the merge skips it (the seesaw and narrow-group kernels)."""
        return self.hopper_mla and (self.hopper_seesaw or self.hopper_narrow)

    @property
    def portable_scheduled(self) -> bool:
        """The portable stage 1 runs under the device-side schedule."""
        return self.schedule_programs > 0 and not self.hopper_mla

    @property
    def stage1_grid(self) -> tuple[int, int, int]:
        p = self.problem
        if self.portable_scheduled:
            return (p.num_kv_heads * self.head_blocks, self.schedule_programs, 1)
        return (p.num_kv_heads * self.head_blocks, p.batch, self.num_kv_splits)

    @property
    def schedule_tile(self) -> int:
        """Tokens per unit of the device-side schedule: the scheduled stage 1's tile."""
        return HOPPER_MLA_TILE if self.hopper_mla else self.block_n

    @property
    def schedule_chunk_cost(self) -> int:
        """The schedule's fixed cost of starting a chunk, in tiles (at least 1: every row
        holds a position, so some program writes its partial): FlashMLA's 5 for the
        Gluon MLA stage 1; for the portable one the cost model's fixed cost of a program
        and the partial result it writes, in tiles' bytes."""
        if self.hopper_mla:
            return HOPPER_MLA_CHUNK_COST
        p = self.problem
        token_bytes = (p.head_dim_qk + (0 if p.v_from_k else p.head_dim_v)) * itemsize(p.cache_dtype)
        partial_bytes = min(self.block_h, p.rows_per_kv_head) * (p.head_dim_v + 1) * 4
        return max(1, cdiv(PROGRAM_OVERHEAD_BYTES + partial_bytes, self.block_n * token_bytes))

    @property
    def stage2_grid(self) -> tuple[int, int, int]:
        return (self.problem.batch, self.problem.num_heads, self.problem.q_len)

    @property
    def mid_o_shape(self) -> tuple[int, ...]:
        """Stage 1's partial outputs: [batch, (q_len,) num_heads, num_kv_splits, head_dim_v],
        the token axis where there are several query tokens; under the device-side
        schedule [batch + schedule_programs, (q_len,) num_heads, head_dim_v], by chunk
        slot."""
        p = self.problem
        if self.schedule_programs:
            return (p.batch + self.schedule_programs, *((p.q_len,) if p.q_len > 1 else ()), p.num_heads, p.head_dim_v)
        return (p.batch, *((p.q_len,) if p.q_len > 1 else ()), p.num_heads, self.num_kv_splits, p.head_dim_v)

    @property
    def mid_lse_shape(self) -> tuple[int, ...]:
        return self.mid_o_shape[:-1]

    def contiguous_strides(self) -> KernelStrides:
        return KernelStrides.contiguous(self.problem, self.num_kv_splits)

    def stage1(self, strides: KernelStrides, partials: bool = False) -> KernelLaunch:
        """The portable stage 1; with :attr:`one_pass` it writes ``out`` and ``lse``
        (``strides.out``/``strides.lse``), else (or with ``partials``: the two-stage
        form one pass stands for, which tests compare it with) the partial results."""
        p = self.problem
        meta: dict[str, object] = dict(
            STRIDE_QB=strides.q[0],
            STRIDE_QT=strides.tokens[0],
            STRIDE_QH=strides.q[1],
            STRIDE_KP=strides.k[0],
            STRIDE_KS=strides.k[1],
            STRIDE_KH=strides.k[2],
            STRIDE_VP=strides.v[0],
            STRIDE_VS=strides.v[1],
            STRIDE_VH=strides.v[2],
            STRIDE_PTB=strides.page_table,
            **(
                _scheduled_stage1_out_strides(p)
                if self.portable_scheduled
                else _stage1_out_strides(strides, final=self.one_pass and not partials)
            ),
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
            BLOCK_H=self.block_h,
            HEAD_BLOCKS=self.head_blocks,
            V_FROM_K=self.reuse_k_as_v,
            # bfloat16 q over an fp8 cache: dots in float16 (cheaper fp8 widening).
            FP8_DOT_F16=p.cache_dtype in FP8_FORMATS and p.dtype == "bfloat16",
            # fp32 tl.dot would otherwise round its inputs to tf32.
            DOT_PRECISION="ieee" if p.dtype == "float32" else "tf32",
            DOT_UPCAST=self.device.vendor == "cpu" and p.dtype == "bfloat16",
            PAGE_SIZE=p.page_size,
            CAPACITY=p.capacity,
            NUM_KV_SPLITS=self.num_kv_splits,
            SCHEDULED=self.portable_scheduled,
            NUM_PROGRAMS=self.schedule_programs if self.portable_scheduled else 0,
            CHUNK_COST=self.schedule_chunk_cost if self.portable_scheduled else 0,
            Q_LEN=p.q_len,
            ROUND_BY_BITS=self.device.vendor == "cpu",
        )
        return KernelLaunch("stage1", self.stage1_grid, self.num_warps, self.num_stages, tuple(meta.items()))

    def stage2(self, strides: KernelStrides) -> KernelLaunch:
        meta = dict(
            **_stage1_out_strides(strides, final=False),
            STRIDE_OB=strides.out[0],
            STRIDE_OT=strides.tokens[3],
            STRIDE_OH=strides.out[1],
            STRIDE_LB=strides.lse[0],
            STRIDE_LT=strides.tokens[4],
            STRIDE_LH=strides.lse[1],
            HEAD_DIM_V=self.problem.head_dim_v,
            BLOCK_DV=self.block_dv,
            BLOCK_S=next_power_of_2(self.num_kv_splits),
            NUM_KV_SPLITS=self.num_kv_splits,
            HAS_SINKS=self.problem.has_sinks,
            ROUND_BY_BITS=self.device.vendor == "cpu",
        )
        return KernelLaunch("stage2", self.stage2_grid, self.stage2_num_warps, 1, tuple(meta.items()))

    @property
    def one_pass(self) -> bool:
        """Stage 1 with one split writes ``out`` and ``lse`` itself and stage 2 is not
        launched: stage 2's merge of one split is the identity, bit for bit (weight
        exp(0) = 1, denominator 1, LSE + log 1), except that it adds sinks -- and that
        its ``0 + o`` turns a -0.0 into +0.0, which only a negative ``v_scale`` (a
        meaningless one, unchecked in a tensor) produces.  torch_bridge takes two stages
        where the caller's ``out`` shares memory with an input."""
        return (
            not self.schedule_programs
            and self.num_kv_splits == 1
            and not self.problem.has_sinks
            and not self.hopper_gqa
        )

    @property
    def schedule_shape(self) -> tuple[int]:
        """The int32 schedule :func:`~jax_decode.kernels.schedule._work_schedule` writes."""
        return (1 + 2 * self.schedule_programs + 3 * self.problem.batch,)

    def schedule(self) -> KernelLaunch:
        """The device-side schedule's kernel (one program): inputs seq_lens and batch."""
        meta = dict(
            CAPACITY=self.problem.capacity,
            BLOCK_N=self.schedule_tile,
            CHUNK_COST=self.schedule_chunk_cost,
            NUM_PROGRAMS=self.schedule_programs,
            WINDOW_LEFT=self.problem.window_left,
            Q_LEN=self.problem.q_len,
            # One step for batches up to 1024 rows: the kernel is a chain of dependent
            # loads and scans on one SM, and its latency is the cost.
            BLOCK_B=min(1024, next_power_of_2(self.problem.batch)),
            BLOCK_P=next_power_of_2(self.schedule_programs + 2),
        )
        return KernelLaunch("work_schedule", (1, 1, 1), 4, 1, tuple(meta.items()))

    def schedule_merge(self, strides: KernelStrides) -> KernelLaunch:
        """The merge of the scheduled chunks into ``out`` and ``lse`` (whose strides are
        ``strides``'; the partials are contiguous): one program per (batch row, block
        of up to ``SCHEDULE_MERGE_HEADS`` heads, query token)."""
        p = self.problem
        block_hm = min(SCHEDULE_MERGE_HEADS, next_power_of_2(p.num_heads))
        most = SCHEDULE_MERGE_PROGRAMS_PER_SM * self.device.num_sms
        while block_hm > 1 and p.batch * cdiv(p.num_heads, block_hm // 2) * p.q_len <= most:
            block_hm //= 2
        partials = _scheduled_stage1_out_strides(p)
        meta = dict(
            STRIDE_MOS=partials["STRIDE_MOB"],
            STRIDE_MOT=partials["STRIDE_MOT"],
            STRIDE_MOH=partials["STRIDE_MOH"],
            STRIDE_MLS=partials["STRIDE_MLB"],
            STRIDE_MLT=partials["STRIDE_MLT"],
            STRIDE_MLH=partials["STRIDE_MLH"],
            STRIDE_OB=strides.out[0],
            STRIDE_OT=strides.tokens[3],
            STRIDE_OH=strides.out[1],
            STRIDE_LB=strides.lse[0],
            STRIDE_LT=strides.tokens[4],
            STRIDE_LH=strides.lse[1],
            NUM_HEADS=p.num_heads,
            HEAD_DIM_V=p.head_dim_v,
            BLOCK_HM=block_hm,
            BLOCK_DV=self.block_dv,
            NUM_PROGRAMS=self.schedule_programs,
            HAS_SINKS=p.has_sinks,
            ROUND_BY_BITS=self.device.vendor == "cpu",
            # The seesaw writes rows of one chunk to out itself (and the portable
            # stand-in of a scheduled Gluon config runs fixed splits, never this merge).
            SKIP_WHOLE=self.scheduled_rows_direct,
            BLOCK_C=SCHEDULE_MERGE_CHUNKS,
        )
        grid = (p.batch, cdiv(p.num_heads, block_hm), p.q_len)
        return KernelLaunch("schedule_merge", grid, self.stage2_num_warps, 1, tuple(meta.items()))

    def tma_ready(self, strides: KernelStrides) -> bool:
        """Whether q and the cache are row views a TMA descriptor can address (the cache
        alone where the kernel reads q through a pointer): q's rows (batch, token, head)
        and the cache's rows (page, slot) each one row stride apart,
        every row stride a multiple of 16 bytes and at least a row wide (a broadcast or
        overlapping view is not a TMA row view).  (Base addresses must be 16-byte aligned
        too; JAX's always are, torch's launcher checks.)"""
        p = self.problem
        if self.hopper_gqa:  # (q is read through a pointer) each cache's rows: (page, slot)
            row = p.num_kv_heads * p.head_dim_qk  # a slot's KV heads side by side, in bytes
            return all(s[0] == p.page_size * s[1] and s[2] == p.head_dim_qk and s[1] >= row and s[1] % 16 == 0
                       for s in (strides.k, strides.v))  # fmt: skip
        cache_ok = (
            strides.k[0] == p.page_size * strides.k[1]
            and strides.k[1] * itemsize(p.cache_dtype) % 16 == 0
            and strides.k[1] >= p.head_dim_qk
        )
        if self.hopper_narrow:  # (q is read through a pointer)
            return cache_ok
        tokens_ok = p.q_len == 1 or strides.tokens[0] == p.num_heads * strides.q[1]
        return (
            cache_ok
            and strides.q[0] == p.q_len * p.num_heads * strides.q[1]
            and tokens_ok
            and strides.q[1] % 8 == 0  # (bfloat16 q: 16-byte rows)
            and strides.q[1] >= p.head_dim_qk
        )

    def hopper_stage1(self, strides: KernelStrides) -> KernelLaunch:
        """The Gluon MLA stage 1 (``hopper_mla`` configs, operands ``tma_ready``): under the
        device-side schedule ``schedule_programs`` programs per 64 query heads writing
        chunk partials (merged by :meth:`schedule_merge`; the seesaw writes a row of one
        chunk to ``out`` and ``lse`` itself, after the partials); with fixed splits one program
        per 64 query heads x split x batch row, writing stage 2's mid_o / mid_lse, or with
        one split ``out`` and ``lse`` themselves."""
        if self.hopper_gqa:
            return self._hopper_gqa_stage1(strides)
        if self.hopper_narrow:
            if not self.hopper_seesaw:
                raise ValueError("hopper_seesaw=False asks for the two-warpgroup kernel: set hopper_narrow=False too")
            return self._hopper_narrow_stage1(strides)
        assert self.hopper_mla and self.tma_ready(strides)
        p = self.problem
        # The seesaw kernels: warp-specialised, 4 + 4 warps, latent blocks are halves.
        # Rows are (token, head) pairs in both kernels.
        seesaw = self.hopper_seesaw
        tma = self._mla_tma_views(strides, halves=seesaw)
        descriptors = (("q_desc", "tma"), ("qr_desc", "tma"), ("k_desc", "tma"), ("kr_desc", "tma"))
        if not (seesaw or p.cache_dtype == "bfloat16"):
            raise ValueError("the two-warpgroup kernel takes a bfloat16 cache: an fp8 cache runs the seesaw kernels")
        scales = (("k_scale_ptr", "*fp32"), ("v_scale_ptr", "*fp32"))
        fp8_meta = self._mla_fp8_meta() if seesaw else {}
        if self.schedule_programs:
            meta = dict(
                STRIDE_PTB=strides.page_table,
                SM_SCALE=float(p.sm_scale),
                NUM_HEADS=p.num_heads,
                PAGE_SIZE=p.page_size,
                CAPACITY=p.capacity,
                NUM_PROGRAMS=self.schedule_programs,
                CHUNK_COST=HOPPER_MLA_CHUNK_COST,
            )
            if p.q_len > 1 and not seesaw:
                raise ValueError("the two-warpgroup kernel's device-side schedule takes one query token")
            params = (
                *descriptors, ("page_table_ptr", "*i32"), ("seq_lens_ptr", "*i32"), *scales, ("schedule_ptr", "*i32"),
                ("num_pages", "i32"), ("batch", "i32"), ("mid_o_ptr", "*fp32"), ("mid_lse_ptr", "*fp32"),
            )  # fmt: skip
            if seesaw:  # rows of one chunk go straight to out and lse
                params += (("out_ptr", _POINTER[p.dtype]), ("lse_ptr", "*fp32"))
                meta.update(STRIDE_OB=strides.out[0], STRIDE_OH=strides.out[1], STRIDE_LB=strides.lse[0],
                            STRIDE_LH=strides.lse[1], **fp8_meta, Q_LEN=p.q_len, STRIDE_OT=strides.tokens[3],
                            STRIDE_LT=strides.tokens[4])  # fmt: skip
            else:
                meta.update(NUM_STAGES=2, PIPELINE=1)
            grid = (cdiv(p.q_len * p.num_heads, HOPPER_MLA_ROWS), self.schedule_programs, 1)
            name, warps = ("mla_hopper_seesaw_scheduled", 4) if seesaw else ("mla_hopper_scheduled", 8)
            return KernelLaunch(name, grid, warps, 1, tuple(meta.items()), params, tma)
        out_type = _POINTER[p.dtype] if self.one_pass else "*fp32"
        params = (
            *descriptors, ("page_table_ptr", "*i32"), ("seq_lens_ptr", "*i32"), *scales, ("num_pages", "i32"),
            ("mid_o_ptr", out_type), ("mid_lse_ptr", "*fp32"),
        )  # fmt: skip
        # In the kernel's parameter order (torch's launcher passes them by position).
        meta = dict(
            STRIDE_PTB=strides.page_table,
            **_stage1_out_strides(strides, final=self.one_pass),
            SM_SCALE=float(p.sm_scale),
            NUM_HEADS=p.num_heads,
            PAGE_SIZE=p.page_size,
            CAPACITY=p.capacity,
            NUM_KV_SPLITS=self.num_kv_splits,
        )
        if not seesaw:
            meta.update(NUM_STAGES=2, PIPELINE=1)
        meta.update(Q_LEN=p.q_len, **fp8_meta)
        grid = (cdiv(p.q_len * p.num_heads, HOPPER_MLA_ROWS), p.batch, self.num_kv_splits)
        name, warps = ("mla_hopper_seesaw", 4) if seesaw else ("mla_hopper", 8)
        return KernelLaunch(name, grid, warps, 1, tuple(meta.items()), params, tma)

    def _mla_tma_views(self, strides: KernelStrides, halves: bool) -> tuple[TmaView, ...]:
        """The Gluon MLA kernels' TMA views: q's and the cache's latent and rope blocks
        (64 rows each; with ``halves`` the latent in halves, as the seesaw and
        narrow-group kernels copy it)."""
        p = self.problem
        latent = (HOPPER_MLA_ROWS, p.head_dim_v // 2 if halves else p.head_dim_v)
        rope = (HOPPER_MLA_ROWS, p.head_dim_qk - p.head_dim_v)
        q_rows, k_rows = p.batch * p.q_len * p.num_heads, p.num_pages * p.page_size
        k_type = "fp8e4nv" if p.cache_dtype == "float8_e4m3fn" else "bf16"  # (widened in shared memory)
        return (
            TmaView("q", q_rows, p.head_dim_qk, strides.q[1], latent),
            TmaView("q", q_rows, p.head_dim_qk, strides.q[1], rope),
            TmaView("k_cache", k_rows, p.head_dim_qk, strides.k[1], latent, k_type),
            TmaView("k_cache", k_rows, p.head_dim_qk, strides.k[1], rope, k_type),
        )

    def _mla_fp8_meta(self) -> dict:
        """The Gluon MLA kernels' cache constexprs: an e4m3 cache and its scales' kinds."""
        p = self.problem
        return dict(KV_FP8=p.cache_dtype == "float8_e4m3fn", K_SCALE=p.k_scale, V_SCALE=p.v_scale)

    @property
    def hopper_q_pointer(self) -> bool:
        """The Gluon stage 1 reads q through a pointer (the GQA and narrow-group kernels),
        not by TMA: :func:`jax_decode.operands.hopper_stage1_inputs` then passes it."""
        return self.hopper_gqa or self.hopper_narrow

    def _hopper_narrow_stage1(self, strides: KernelStrides) -> KernelLaunch:
        """The narrow-group MLA stage 1 (``hopper_narrow``): with fixed splits one program
        per batch row x split, writing stage 2's mid_o / mid_lse, or with one split
        ``out`` and ``lse``; under the device-side schedule ``schedule_programs``
        programs writing chunk partials (merged by :meth:`schedule_merge`) and the rows
        of one chunk to ``out`` and ``lse``."""
        p = self.problem
        rows = p.q_len * p.num_heads
        if not (self.hopper_mla and rows <= HOPPER_NARROW_MAX_ROWS):
            raise ValueError(
                f"the narrow-group MLA kernel takes at most {HOPPER_NARROW_MAX_ROWS} query rows (q_len x heads), "
                f"got {rows}"
            )
        assert self.tma_ready(strides)
        tma = self._mla_tma_views(strides, halves=True)[2:]  # the cache's (q comes through a pointer)
        fp8_meta = self._mla_fp8_meta()
        inputs = (
            ("k_desc", "tma"), ("kr_desc", "tma"), ("q_ptr", _POINTER[p.dtype]), ("page_table_ptr", "*i32"),
            ("seq_lens_ptr", "*i32"), ("k_scale_ptr", "*fp32"), ("v_scale_ptr", "*fp32"),
        )  # fmt: skip
        # The constexprs both kernels take (in their parameter order, around their own).
        q_meta = dict(STRIDE_QB=strides.q[0], STRIDE_QT=strides.tokens[0], STRIDE_QH=strides.q[1],
                      STRIDE_PTB=strides.page_table)  # fmt: skip
        row_meta = dict(SM_SCALE=float(p.sm_scale), NUM_HEADS=p.num_heads, Q_LEN=p.q_len, PAGE_SIZE=p.page_size,
                        CAPACITY=p.capacity)  # fmt: skip
        tile_meta = dict(ROWS=16 if rows <= 16 else 32, NUM_STAGES=HOPPER_NARROW_STAGES)
        fp8_meta["WIDENER"] = self.hopper_widener and p.cache_dtype == "float8_e4m3fn"
        if self.schedule_programs:
            params = (
                *inputs, ("schedule_ptr", "*i32"), ("num_pages", "i32"), ("batch", "i32"), ("mid_o_ptr", "*fp32"),
                ("mid_lse_ptr", "*fp32"), ("out_ptr", _POINTER[p.dtype]), ("lse_ptr", "*fp32"),
            )  # fmt: skip
            out_meta = dict(
                STRIDE_OB=strides.out[0], STRIDE_OT=strides.tokens[3], STRIDE_OH=strides.out[1],
                STRIDE_LB=strides.lse[0], STRIDE_LT=strides.tokens[4], STRIDE_LH=strides.lse[1],
            )  # fmt: skip
            meta = dict(**q_meta, **row_meta, **tile_meta, NUM_PROGRAMS=self.schedule_programs,
                        CHUNK_COST=HOPPER_MLA_CHUNK_COST, **out_meta, **fp8_meta)  # fmt: skip
            grid = (1, self.schedule_programs, 1)
            return KernelLaunch("mla_hopper_narrow_scheduled", grid, 4, 1, tuple(meta.items()), params, tma)
        out_type = _POINTER[p.dtype] if self.one_pass else "*fp32"
        params = (*inputs, ("num_pages", "i32"), ("mid_o_ptr", out_type), ("mid_lse_ptr", "*fp32"))
        meta = dict(**q_meta, **_stage1_out_strides(strides, final=self.one_pass), **row_meta,
                    NUM_KV_SPLITS=self.num_kv_splits, **tile_meta, **fp8_meta)  # fmt: skip
        return KernelLaunch("mla_hopper_narrow", (1, p.batch, self.num_kv_splits), 4, 1, tuple(meta.items()), params,
                            tma)  # fmt: skip

    def _hopper_gqa_stage1(self, strides: KernelStrides) -> KernelLaunch:
        """The Gluon fp8 GQA stage 1 (``hopper_gqa`` configs, caches ``tma_ready``): one
        program per KV head x batch row x split, writing stage 2's mid_o / mid_lse."""
        assert self.hopper_gqa and self.tma_ready(strides)
        p = self.problem
        rows, row = p.num_pages * p.page_size, p.num_kv_heads * p.head_dim_qk
        block = (min(p.page_size, GQA_HOPPER_TILE), p.head_dim_qk)  # (a box inside one page)
        tma = (
            TmaView("k_cache", rows, row, strides.k[1], block, "fp8e4nv"),
            TmaView("v_cache", rows, row, strides.v[1], block, "fp8e4nv"),
        )
        params = (
            ("k_desc", "tma"), ("v_desc", "tma"), ("q_ptr", _POINTER[p.dtype]), ("page_table_ptr", "*i32"),
            ("seq_lens_ptr", "*i32"), ("k_scale_ptr", "*fp32"), ("v_scale_ptr", "*fp32"), ("num_pages", "i32"),
            ("mid_o_ptr", "*fp32"), ("mid_lse_ptr", "*fp32"),
        )  # fmt: skip
        # (One query token: no token strides.)
        out = {name: stride for name, stride in _stage1_out_strides(strides, final=False).items() if name[-1] != "T"}
        meta = dict(
            STRIDE_QB=strides.q[0],
            STRIDE_QH=strides.q[1],
            STRIDE_PTB=strides.page_table,
            **out,
            SM_SCALE=float(p.sm_scale),
            NUM_HEADS=p.num_heads,
            NUM_KV_HEADS=p.num_kv_heads,
            ROWS=GQA_HOPPER_MAX_ROWS,  # the MMAs' N: the group, padded
            PAGE_SIZE=p.page_size,
            CAPACITY=p.capacity,
            NUM_KV_SPLITS=self.num_kv_splits,
            NUM_STAGES=GQA_HOPPER_STAGES,
            K_SCALE=p.k_scale,
            V_SCALE=p.v_scale,
        )
        grid = (p.num_kv_heads, p.batch, self.num_kv_splits)
        return KernelLaunch("gqa_hopper_fp8", grid, 4, 1, tuple(meta.items()), params, tma, GQA_HOPPER_REGISTERS)

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


@dataclasses.dataclass(frozen=True)
class WriteProblem:
    """Static description of one cache's paged KV write."""

    num_tokens: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    num_pages: int
    cache_dtype: str
    scale: int = SCALE_NONE  # SCALE_* mode of the scale rows are divided by

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    def contiguous_strides(self) -> tuple[tuple[int, int], tuple[int, int, int]]:
        """(new rows' strides, cache strides) of row-major arrays."""
        row = self.num_kv_heads * self.head_dim
        return (row, self.head_dim), (self.page_size * row, row, self.head_dim)


def write_cache_launch(
    problem: WriteProblem, new_strides: tuple[int, int], cache_strides: tuple[int, int, int], *, interpreted: bool
) -> KernelLaunch:
    """The paged KV write: one program per (token, KV head) copies one row.

    Rows are divided by the scale and, for an fp8 cache, saturated to its finite range
    before the cast (a NaN stays NaN).  ``interpreted``: for Triton's interpreter, which
    then rounds to bfloat16 by bits (its own cast truncates).
    """
    p = problem
    block_d = next_power_of_2(p.head_dim)
    fp8 = FP8_FORMATS.get(p.cache_dtype, NO_FP8)
    meta = dict(
        STRIDE_NT=new_strides[0],
        STRIDE_NH=new_strides[1],
        STRIDE_CP=cache_strides[0],
        STRIDE_CS=cache_strides[1],
        STRIDE_CH=cache_strides[2],
        HEAD_DIM=p.head_dim,
        BLOCK_D=block_d,
        PAGE_SIZE=p.page_size,
        SCALE=p.scale,
        SATURATE=fp8.largest,
        FP8_MAN_BITS=fp8.mantissa_bits,
        FP8_BIAS=fp8.bias,
        FP8_NAN_BITS=fp8.nan_bits,
        ROUND_BY_BITS=interpreted,
    )
    num_warps = 1 if block_d <= 128 else 2
    return KernelLaunch("write_cache", (p.num_tokens, p.num_kv_heads, 1), num_warps, 1, tuple(meta.items()))
