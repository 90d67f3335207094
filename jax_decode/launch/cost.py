"""A model of the GPU for choosing launches: how long a grid of stage-1 programs takes.

Plain Python on ints.  The model, for ``N`` equal programs on a GPU of ``S`` SMs of
which each holds ``P`` programs at once (by registers, shared memory and threads):

* Programs are dealt to SMs in rounds of up to ``S * P``; an SM with ``k`` programs
  shares its throughput among them.
* An SM's memory throughput grows with the bytes it has in flight (Little's law): with
  ``k`` programs each keeping ``f`` bytes of K/V tiles in flight it reaches
  ``k f / (k f + SATURATION_BYTES)`` of what one SM can pull (``SM_BURST`` times its
  share of DRAM bandwidth when others leave some idle); all SMs together never pass
  the DRAM bandwidth.
* A program also costs a fixed time (its prologue, its partial result, the block
  scheduler), and its dots cost ``FLOPs / tensor throughput``, which is what bounds
  MLA with many heads.
* Stage 2 reads every split's partial result once.

Times are in units of "bytes at one SM's share of DRAM bandwidth" (divide by
``bandwidth / S`` for seconds), so the model needs no absolute bandwidth.  Its four
constants were measured on an H200 from one sweep of one GQA shape (Qwen2.5-7B, batch
16, 8k tokens; ``benchmarks/sweep.py``) and checked on the other shapes of the model
suite (``docs/performance.md``).
"""

from __future__ import annotations

import dataclasses
import math
import statistics

from jax_decode.launch.problem import cdiv

# Bytes in flight an SM needs to reach its full memory throughput (H200: a GQA d128
# program keeps 64 KB of tiles in flight and one alone gets half the throughput of four).
SATURATION_BYTES = 128 * 1024
# What one SM pulls when the others leave DRAM bandwidth idle, in multiples of its share.
SM_BURST = 1.4
# Fixed cost of one program, in bytes at an SM's share of bandwidth (H200: ~0.4 us).
PROGRAM_OVERHEAD_BYTES = 13 * 1024
# Tensor-core FLOPs per byte of an SM's DRAM share: bf16 warpgroup MMA (sm_90) reaches
# about 680 TFLOP/s on the H200 against 4.25 TB/s of copy; mma.sync with 16-row blocks a
# quarter of that.
FLOPS_PER_BYTE = {"wgmma": 160.0, "mma": 40.0, "fma": 4.0}
# Per-SM limits (NVIDIA sm_80 / sm_90).
SM_REGISTERS, SM_THREADS, SM_PROGRAMS = 65536, 2048, 32


@dataclasses.dataclass(frozen=True)
class ProgramShape:
    """What the model needs to know of one stage-1 program."""

    threads: int
    registers: int  # per thread (estimated)
    shared_bytes: int
    in_flight_bytes: int  # K/V tile bytes a program keeps in flight (pipeline depth)
    token_bytes: int  # K/V bytes per token it reads
    flops_per_token: int
    mma: str  # a key of FLOPS_PER_BYTE
    partial_bytes: int  # its partial result (written, then read by stage 2)


def programs_per_sm(program: ProgramShape, sm_shared_bytes: int) -> int:
    """Programs one SM holds at once: registers (allocated in units of 8 per thread),
    shared memory and threads."""
    registers = min(255, cdiv(program.registers, 8) * 8)
    by_registers = SM_REGISTERS // (registers * program.threads)
    by_shared = sm_shared_bytes // max(program.shared_bytes, 1)
    return max(1, min(by_registers, by_shared, SM_THREADS // program.threads, SM_PROGRAMS))


def _round_time(program: ProgramShape, programs: int, num_sms: int, work_bytes: float, flops: float) -> float:
    """Time of one round of ``programs`` equal programs (at most ``P`` per SM)."""
    per_sm = cdiv(programs, num_sms)
    in_flight = per_sm * program.in_flight_bytes
    throughput = SM_BURST * in_flight / (in_flight + SATURATION_BYTES)  # of an SM's share
    memory = per_sm * work_bytes / throughput
    dram = programs * work_bytes / num_sms  # all SMs together: the DRAM bandwidth
    compute = per_sm * flops / FLOPS_PER_BYTE[program.mma]
    return max(memory, dram, compute) + per_sm * PROGRAM_OVERHEAD_BYTES


def grid_time(program: ProgramShape, programs: int, tokens_per_program: float, num_sms: int, per_sm: int) -> float:
    """Time of ``programs`` equal stage-1 programs each reading ``tokens_per_program``."""
    work = tokens_per_program * program.token_bytes + program.partial_bytes
    flops = tokens_per_program * program.flops_per_token
    slots = num_sms * per_sm
    full_rounds, tail = divmod(programs, slots)
    time = full_rounds * _round_time(program, slots, num_sms, work, flops)
    if tail:
        time += _round_time(program, tail, num_sms, work, flops)
    return time


def split_time(program: ProgramShape, programs_per_split: int, tokens: float, splits: int, num_sms: int,
               per_sm: int) -> float:  # fmt: skip
    """Stage 1 and stage 2 for rows of ``tokens`` tokens in ``splits`` splits."""
    stage1 = grid_time(program, programs_per_split * splits, tokens / splits, num_sms, per_sm)
    stage2 = programs_per_split * splits * program.partial_bytes / num_sms  # the merge reads every partial
    return stage1 + stage2


# The long-tailed batch the planner also plans for: log-normal lengths of this sigma
# (a serving batch mixing short and long requests), the longest at the page table's
# capacity.
TAIL_SIGMA = 1.0


def tail_mean_fraction(rows: int) -> float:
    """Mean length over the longest of ``rows`` log-normal lengths (TAIL_SIGMA): about
    0.77 for 2 rows, 0.28 for 16, 0.14 for 64."""
    if rows <= 1:
        return 1.0
    z = statistics.NormalDist().inv_cdf(1 - 1 / (rows + 1))  # the longest row's quantile
    return min(1.0, math.exp(TAIL_SIGMA**2 / 2 - TAIL_SIGMA * z))


def uniform_time(program: ProgramShape, programs_per_row: int, rows: int, tokens: int, splits: int, num_sms: int,
                 per_sm: int) -> float:  # fmt: skip
    """Every row ``tokens`` long, cut into ``splits`` splits."""
    return split_time(program, programs_per_row * rows, tokens, splits, num_sms, per_sm)


def long_tail_time(program: ProgramShape, programs_per_row: int, rows: int, tokens: int, splits: int, num_sms: int,
                   per_sm: int) -> float:  # fmt: skip
    """Log-normal lengths whose longest is ``tokens`` (:func:`tail_mean_fraction`).

    Every row is cut into ``splits`` splits, so the long row's are the longest programs;
    scheduled as SMs free up, the grid ends about one such program after all the work
    would have (list scheduling).
    """
    if rows == 1:  # one row has no tail
        return uniform_time(program, programs_per_row, rows, tokens, splits, num_sms, per_sm)
    total = tokens * rows * tail_mean_fraction(rows)
    everything = split_time(program, programs_per_row * rows, total / rows, splits, num_sms, per_sm)
    per_sm_now = min(per_sm, cdiv(programs_per_row * rows * splits, num_sms))
    in_flight = per_sm_now * program.in_flight_bytes
    throughput = SM_BURST * in_flight / (in_flight + SATURATION_BYTES)
    longest = tokens / splits * program.token_bytes * per_sm_now / throughput
    return everything + longest
