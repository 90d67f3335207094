"""Compile a benchmark run's kernels in parallel before it times them.

A suite with a split sweep launches hundreds of kernel variants (each split count is
a constexpr of both stages), and Triton compiles each on one core the first time it
is launched.  Worker processes compile them on every core first, into Triton's
on-disk cache, where the timed process then finds them.  Our kernels are compiled
with ``JITFunction.warmup`` on dtypes alone (no memory, no launch), specialised as the
run's tensors will be; vLLM's through a call on tiny inputs with the run's strides.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os


class SpecArrays:
    """An :class:`~jax_decode.synthetic.ArrayFactory` of shapes and dtypes only: the
    problem the benchmark would build, without its data."""

    def normal(self, rng, shape, dtype):
        return _Spec(tuple(shape), dtype)

    def from_numpy(self, array):
        return _Spec(array.shape, array.dtype.name)

    def to_numpy(self, array):
        raise TypeError("a SpecArrays problem holds no values")

    def quantise(self, cache, scale, dtype):
        return _Spec(cache.shape, dtype)


class _Spec:
    def __init__(self, shape, dtype: str):
        self.shape, self.dtype = tuple(shape), dtype

    def __getitem__(self, index):  # only what make_paged_problem reads
        raise TypeError("a SpecArrays problem holds no values")


def _torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def _warm_ours(row, splits_list) -> int:
    """Compile stage 1 and stage 2 of ``row`` at each split count (None: the chosen)."""
    import torch

    from benchmarks.bench import _problem_for, row_problem
    from jax_decode import operands
    from jax_decode.kernels import KERNELS
    from jax_decode.launch import DeviceInfo, make_launch_config
    from jax_decode.operands import DecodeOperands

    problem = _problem_for(row, SpecArrays())
    arrays = DecodeOperands(*problem.arrays, problem.k_scale, problem.v_scale, problem.sinks)
    checked = row_problem(row)
    props = torch.cuda.get_device_properties(0)
    device = DeviceInfo("nvidia", props.major * 10 + props.minor, props.multi_processor_count)
    dtypes = DecodeOperands(*(None if a is None else _torch_dtype(a.dtype) for a in arrays))
    if dtypes.k_scale is not None:
        dtypes = dtypes._replace(k_scale=torch.float32, v_scale=None if row.mla else torch.float32)
    if dtypes.sinks is not None:
        dtypes = dtypes._replace(sinks=torch.float32)
    compiled = 0
    for splits in splits_list:
        config = make_launch_config(checked, device, splits)
        strides = config.contiguous_strides()
        f32 = torch.float32
        stage1 = config.stage1(strides)
        stage2 = config.stage2(strides)
        for launch, args in (
            (stage1, (*operands.stage1_inputs(dtypes, checked), f32, f32)),
            (stage2, (*operands.stage2_inputs(dtypes, f32, f32), dtypes.q, f32)),
        ):
            KERNELS[launch.kernel_name].warmup(
                *args, grid=launch.grid, num_warps=launch.num_warps, num_stages=launch.num_stages, **launch.meta()
            )
            compiled += 1
    return compiled


def _warm_vllm(row, splits_list) -> int:
    """vLLM's kernels at each split count, from a call on a one-row, one-page problem
    with the run's head layout and page-table width (its strides, so its specialisation)."""
    import torch
    from vllm.attention.ops.triton_decode_attention import decode_attention_fwd

    dtype = _torch_dtype(row.dtype)
    max_pages = -(-max(row.context, int(row.seq_lens().max())) // row.page_size)
    q = torch.zeros(1, row.num_heads, row.head_dim_qk, device="cuda", dtype=dtype)
    k = torch.zeros(1, row.page_size, row.num_kv_heads, row.head_dim_qk, device="cuda", dtype=dtype)
    v = k[..., : row.head_dim_v] if row.mla else torch.zeros(1, row.page_size, row.num_kv_heads, row.head_dim_v,
                                                             device="cuda", dtype=dtype)  # fmt: skip
    table = torch.zeros(1, max_pages, device="cuda", dtype=torch.int32)
    lens = torch.ones(1, device="cuda", dtype=torch.int32)
    out = torch.empty(1, row.num_heads, row.head_dim_v, device="cuda", dtype=dtype)
    for splits in splits_list:
        logits = torch.empty(1, row.num_heads, splits, row.head_dim_v + 1, device="cuda")
        decode_attention_fwd(q, k, v, out, table, lens, logits, splits, row.head_dim_qk**-0.5, row.page_size,
                             row.logit_cap)  # fmt: skip
    torch.cuda.synchronize()
    return 2 * len(splits_list)


def _job(kind, row, splits_list):
    try:
        return (_warm_ours if kind == "ours" else _warm_vllm)(row, splits_list), None
    except Exception as error:  # the timed run will compile it (and report what fails)
        return (
            0,
            f"{kind} {row.label}: {type(error).__name__}: {str(error).splitlines()[0][:100] if str(error) else ''}",
        )


def precompile(jobs: list[tuple[str, object, tuple]], workers: int | None = None) -> tuple[int, list[str]]:
    """Run ``(kind, row, splits)`` jobs ("ours" or "vllm") in worker processes;
    returns (kernels compiled, errors)."""
    workers = workers or max(1, min(16, (os.cpu_count() or 2) - 1))
    context = multiprocessing.get_context("spawn")
    total, errors = 0, []
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        for count, error in pool.map(_job, *zip(*jobs, strict=True)):
            total += count
            if error:
                errors.append(error)
    return total, errors
