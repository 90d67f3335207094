"""The Gluon fp8 GQA stage 1 (jax_decode/kernels/gqa_hopper.py, planned with
``make_launch_config(..., hopper_fp8=True)``): what the planner gives it, that every
planned launch compiles for sm_90 without a GPU and lowers from JAX, and on an H100/H200
that its results, merged by our stage 2, match the float64 oracle on awkward input,
through torch_bridge's launcher and through JAX bit for bit."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from test_mla_hopper import H200, SM90_SHARED_LIMIT, _gluon_hopper_missing, _needs_hopper_path

# Rows of every kind a tile can hold: empty, one token, a partial tile, tiles that end
# inside a page or at a page's end, and a row at the page table's capacity.
LENGTHS = (0, 1, 63, 65, 777, 1280, 64 * 20 - 1, 64 * 20)


def _gqa(batch=64, num_heads=32, num_kv_heads=8, page_size=16, max_pages=256, **changes):
    from jax_decode.launch import DecodeProblem
    from jax_decode.launch.problem import SCALE_PER_KV_HEAD

    fields = dict(
        batch=batch, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim_qk=128, head_dim_v=128,
        num_pages=batch * max_pages, page_size=page_size, max_pages=max_pages, dtype="bfloat16", v_from_k=False,
        sm_scale=1 / math.sqrt(128), logit_cap=0.0, kv_dtype="float8_e4m3fn", k_scale=SCALE_PER_KV_HEAD,
        v_scale=SCALE_PER_KV_HEAD,
    )  # fmt: skip
    fields.update(changes)
    return DecodeProblem(**fields)


def _plan(problem, num_kv_splits=None, hopper_fp8=True, hopper_kernels=True, **device):
    from jax_decode.launch import DeviceInfo, make_launch_config

    device = DeviceInfo(**{**H200, **device}, hopper_kernels=hopper_kernels)
    return make_launch_config(problem, device, num_kv_splits, hopper_fp8=hopper_fp8)


# ----------------------------------------------------------------------------- planning (CPU)


def test_planner_chooses_the_gqa_kernel_only_for_what_it_computes():
    from jax_decode.launch.problem import SCALE_NONE, SCALE_PER_TENSOR

    for problem in (
        _gqa(),
        _gqa(num_heads=28, num_kv_heads=4),  # Qwen2.5-7B: 7 heads a group, padded to 8 MMA columns
        _gqa(num_heads=64, num_kv_heads=8, page_size=64),
        _gqa(num_heads=8, num_kv_heads=1, page_size=32),  # 8 heads share one KV head
        _gqa(num_heads=8, num_kv_heads=8, page_size=128),  # MHA
        _gqa(k_scale=SCALE_PER_TENSOR, v_scale=SCALE_NONE),
        _gqa(has_sinks=True),  # (stage 2 adds them)
    ):
        config = _plan(problem)
        assert config.hopper_gqa and not config.hopper_mla, problem
        assert not config.one_pass and not config.schedule_programs  # it writes partials, fixed splits
        assert not _plan(problem, hopper_fp8=False).hopper_gqa  # opt-in (docs/performance.md, fp8)
        assert not _plan(problem, hopper_kernels=False).hopper_gqa
        assert not _plan(problem, compute_capability=100).hopper_gqa  # (sm_90 only)
    for unsupported in (
        _gqa(kv_dtype=None, k_scale=SCALE_NONE, v_scale=SCALE_NONE),  # bf16: the portable kernel is at the roofline
        _gqa(kv_dtype="float8_e5m2"),
        _gqa(dtype="float16"),  # (q must split exactly into two e4m3 terms)
        _gqa(head_dim_qk=64, head_dim_v=64),
        _gqa(num_heads=16, num_kv_heads=1),  # 16 heads a group: 16 MMA columns spill at the register cap
        _gqa(page_size=8),
        _gqa(page_size=48),
        _gqa(logit_cap=30.0),
        _gqa(window_left=127),
        _gqa(q_len=2, token_axis=True),
        _gqa(max_pages=0, num_pages=0),
    ):
        assert not _plan(unsupported).hopper_gqa, unsupported


def test_gqa_splits_fill_the_gpu_and_hedge_long_tails():
    """The cost model's splits for this kernel's programs (three per SM): a small batch
    is cut to fill the SMs, a large one is not cut to nothing."""
    b1 = _plan(_gqa(batch=1, max_pages=2048))  # Llama-3.1-8B b1 ctx32k: 8 programs a split
    b64 = _plan(_gqa(batch=64, max_pages=256))  # b64 ctx4k: 512 programs a split
    assert b1.num_kv_splits >= 16
    assert 1 <= b64.num_kv_splits <= 8


def test_tma_ready_needs_slot_rows():
    """Each cache is read as rows of (page, slot) holding its KV heads side by side."""
    config = _plan(_gqa(batch=2, max_pages=4))
    strides = config.contiguous_strides()
    assert config.tma_ready(strides)
    row = 8 * 128
    assert config.tma_ready(dataclasses.replace(strides, v=(16 * 2 * row, 2 * row, 128)))  # padded slots
    assert not config.tma_ready(dataclasses.replace(strides, k=(16 * 128, 128, 16 * 128)))  # head-major pages
    assert not config.tma_ready(dataclasses.replace(strides, v=(2 * 16 * row, row, 128)))  # every other page
    assert not config.tma_ready(dataclasses.replace(strides, k=(16 * (row + 8), row + 8, 128)))  # rows 1032 B apart


def test_gqa_constexprs_follow_the_kernel_parameters():
    """torch's launcher passes a Gluon launch's arguments by position."""
    import inspect

    from jax_decode.kernels.gluon_compile import gluon_kernel

    if _gluon_hopper_missing():
        pytest.skip(_gluon_hopper_missing())
    config = _plan(_gqa(batch=4))
    launch = config.hopper_stage1(config.contiguous_strides())
    assert launch.kernel_name == "gqa_hopper_fp8" and launch.max_registers > 0
    names = list(inspect.signature(gluon_kernel(launch.kernel_name).fn).parameters)
    assert names == [name for name, _ in launch.param_types] + [name for name, _ in launch.constexprs]
    assert [view.operand for view in launch.tma] == ["k_cache", "v_cache"]


def test_gqa_stage1_inputs_take_q_by_pointer():
    from jax_decode.operands import DecodeOperands, hopper_stage1_inputs

    problem = _gqa()
    config = _plan(problem)
    assert config.hopper_gqa and config.hopper_q_pointer
    ops = DecodeOperands("q", "k", "v", "page_table", "seq_lens", "k_scale", "v_scale")
    inputs = hopper_stage1_inputs(ops, problem, q_pointer=config.hopper_q_pointer)
    assert inputs == ("q", "page_table", "seq_lens", "k_scale", "v_scale", problem.num_pages)


# ----------------------------------------------------------------------------- compiling and lowering (CPU)


def _check_product_compile(heads: int, kv_heads: int, page_size: int, num_kv_splits: int, scales: str) -> None:
    from jax_decode.kernels.gluon_compile import compile_launch
    from jax_decode.launch.config import GQA_HOPPER_REGISTERS, GQA_HOPPER_THREADS
    from jax_decode.launch.planner import gqa_hopper_program
    from jax_decode.launch.problem import SCALE_NONE, SCALE_PER_KV_HEAD, SCALE_PER_TENSOR

    mode = dict(none=SCALE_NONE, tensor=SCALE_PER_TENSOR, head=SCALE_PER_KV_HEAD)[scales]
    problem = _gqa(batch=3, num_heads=heads, num_kv_heads=kv_heads, page_size=page_size, max_pages=4096 // page_size,
                   k_scale=mode, v_scale=mode)  # fmt: skip
    config = _plan(problem, num_kv_splits)
    launch = config.hopper_stage1(config.contiguous_strides())
    kernel = compile_launch(launch, 90)
    ptx = kernel.asm["ptx"]
    shared = kernel.metadata.shared
    # What the planner's model states of a program, three of which share an SM.
    assert abs(shared - gqa_hopper_program(problem).shared_bytes) <= 512, shared
    assert 3 * shared <= SM90_SHARED_LIMIT, shared
    assert 32 * kernel.metadata.num_warps == GQA_HOPPER_THREADS
    assert f".maxnreg {GQA_HOPPER_REGISTERS}" in ptx
    assert "wgmma.mma_async.sync.aligned.m64n" in ptx and ".e4m3.e4m3" in ptx, "e4m3 tensor-core products"
    assert "cp.async.bulk.tensor" in ptx, "K and V arrive by TMA"
    # No e4m3 -> f16 unpack: ptxas 12.8/12.9 compiled the ones _split_e4m3 had to read
    # another register (wrong scores on an H100).
    assert "cvt.rn.f16x2.e4m3x2" not in ptx
    assert len(kernel.metadata.tensordesc_meta) == 2
    usage = _resource_usage(kernel.asm["cubin"])
    assert (usage["STACK"], usage["LOCAL"]) == (0, 0), f"spills: {usage}"
    assert usage["REG"] <= GQA_HOPPER_REGISTERS, usage


def _resource_usage(cubin: bytes) -> dict[str, int]:
    import os
    import tempfile

    from benchmarks.kernel_resources import resource_usage

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "stage1.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        return resource_usage(path)


@pytest.mark.parametrize(
    "heads, kv_heads, page_size, num_kv_splits, scales",
    # Llama-3.1-8B (pages of 16: four boxes a tile), Qwen2.5-7B (7 heads a group), 8 heads
    # on one KV head (the widest group), MHA on pages of 128 (two tiles a page), pages of 32
    [(32, 8, 16, 4, "head"), (28, 4, 16, 1, "tensor"), (8, 1, 64, 3, "none"), (8, 8, 128, 2, "head"),
     (16, 2, 32, 8, "tensor")],
)  # fmt: skip
def test_product_launch_compiles_for_sm90(heads, kv_heads, page_size, num_kv_splits, scales):
    missing = _gluon_hopper_missing()
    if missing:
        pytest.skip(missing)
    _run_isolated("_check_product_compile", heads, kv_heads, page_size, num_kv_splits, scales)


def _run_isolated(name: str, *args) -> None:
    from support import run_isolated

    run_isolated(__file__, name, *args)


def _check_jax_lowering() -> None:
    import jax
    import jax.numpy as jnp

    import jax_decode
    from jax_decode.backends import triton as triton_backend
    from jax_decode.operands import DecodeOperands

    batch, num_pages, page_size, max_pages = 4, 64, 16, 16
    problem = _gqa(batch=batch, num_pages=num_pages, max_pages=max_pages)
    config = _plan(problem, num_kv_splits=2)
    assert config.hopper_gqa
    sds = jax.ShapeDtypeStruct
    cache = sds((num_pages, page_size, 8, 128), jnp.float8_e4m3fn)
    args = (sds((batch, 32, 128), jnp.bfloat16), cache, cache, sds((batch, max_pages), jnp.int32),
            sds((batch,), jnp.int32), sds((8,), jnp.float32), sds((8,), jnp.float32))  # fmt: skip

    def step(q, k, v, pt, sl, k_scale, v_scale):
        return triton_backend.decode_attention(DecodeOperands(q, k, v, pt, sl, k_scale, v_scale), config)

    with jax_decode.compile_target(jax_decode.DeviceInfo(**H200, hopper_kernels=True)):
        text = jax.jit(step).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    calls = [line for line in text.splitlines() if "custom_call @triton_kernel_call" in line]
    assert len(calls) == 2, calls  # the Gluon stage 1, then stage 2
    # Descriptors over K and V, then q through a pointer, the page table, lengths and scales.
    assert "(%arg1, %arg2, %arg0, %arg3, %arg4, %arg5, %arg6" in calls[0], calls[0]


def test_jax_lowers_the_gqa_stage1_for_sm90():
    from jax_decode.backends.gluon_call import jaxlib_tma_missing
    from jax_decode.backends.triton import jax_triton_import_error

    for missing in (_gluon_hopper_missing(), jax_triton_import_error(), jaxlib_tma_missing()):
        if missing:
            pytest.skip(missing)
    _run_isolated("_check_jax_lowering")


# ----------------------------------------------------------------------------- on the GPU


def _nan_unread_slots(problem, torch) -> None:
    """e4m3 NaN in every cache slot no row reads (the spare pages and the slots past each
    row's length): none may reach an output (``0 * NaN``)."""
    page_table = problem.page_table.cpu().numpy()
    seq_lens = problem.seq_lens.cpu().numpy()
    page_size = problem.k_cache.shape[1]
    read = np.zeros(problem.k_cache.shape[:2], bool)
    for row, length in enumerate(seq_lens):
        for position in range(int(length)):
            read[page_table[row, position // page_size], position % page_size] = True
    unread = torch.from_numpy(~read).to(problem.k_cache.device)
    for cache in (problem.k_cache, problem.v_cache):
        cache.view(torch.uint8)[unread] = 0x7F


def _check_planned_launch(heads, kv_heads, page_size, num_kv_splits, scales, sinks=False, compact=False,
                          fused=False):  # fmt: skip
    """Plan the Gluon stage 1 for an e4m3 problem, launch it through torch_bridge's
    launcher (outputs and scratch NaN first) and through the JAX backend with the same
    config: against the float64 oracle, and bit-identical to each other.  ``fused``: K
    and V are views of one ``[pages, slots, 2 * kv_heads, 128]`` tensor and the scratch
    a view of one vLLM-style ``attn_logits`` (``[..., splits, 129]``): strided operands
    the Gluon stage 1 takes too."""
    torch = _needs_hopper_path()
    import jax
    from support import assert_matches_oracle

    import torch_bridge
    from benchmarks.inputs import TorchArrays
    from jax_decode.backends import triton as triton_backend
    from jax_decode.backends.triton import hopper_kernels_launchable
    from jax_decode.launch import make_launch_config
    from jax_decode.launch.problem import SCALE_NONE, SCALE_PER_KV_HEAD, SCALE_PER_TENSOR
    from jax_decode.operands import DecodeOperands
    from jax_decode.reference import FP8_MMA_LSE_TOLERANCE
    from jax_decode.synthetic import make_paged_problem
    from torch_bridge.launcher import launch_decode, scratch
    from torch_bridge.ops import device_info

    problem = make_paged_problem(
        batch=len(LENGTHS), num_heads=heads, num_kv_heads=kv_heads, head_dim_qk=128, page_size=page_size,
        seq_lens=LENGTHS, dtype="bfloat16", max_pages=64 * 20 // page_size, spare_pages=4, kv_dtype="float8_e4m3fn",
        kv_scales=scales, sinks=sinks, compact=compact, arrays=TorchArrays("cuda"), seed=heads + page_size,
    )  # fmt: skip
    _nan_unread_slots(problem, torch)
    if fused:
        kv = torch.cat([problem.k_cache, problem.v_cache], dim=2)
        problem.k_cache, problem.v_cache = kv[:, :, :kv_heads], kv[:, :, kv_heads:]
    q, k_cache, v_cache, page_table, seq_lens = problem.arrays
    extras = problem.extras
    ops = DecodeOperands(q, k_cache, v_cache, page_table, seq_lens, extras.get("k_scale"), extras.get("v_scale"),
                         extras.get("sinks"))  # fmt: skip
    mode = dict(none=SCALE_NONE, tensor=SCALE_PER_TENSOR, head=SCALE_PER_KV_HEAD)[scales]
    decode = _gqa(batch=len(LENGTHS), num_heads=heads, num_kv_heads=kv_heads, page_size=page_size,
                  num_pages=k_cache.shape[0], max_pages=page_table.shape[1], k_scale=mode, v_scale=mode,
                  has_sinks=sinks)  # fmt: skip
    config = make_launch_config(decode, device_info(q.device), num_kv_splits, hopper_fp8=True)
    assert config.hopper_gqa
    out = torch.full(decode.out_shape, float("nan"), dtype=q.dtype, device=q.device)
    lse = torch.full(decode.lse_shape, float("nan"), dtype=torch.float32, device=q.device)
    if fused:
        logits = torch.full((*config.mid_lse_shape, 129), float("nan"), device=q.device)
        mid_o, mid_lse = logits[..., :128], logits[..., 128]
    else:
        mid_o, mid_lse = scratch(config, out)
        mid_o.fill_(float("nan"))
        mid_lse.fill_(float("nan"))
    run = launch_decode(config, ops, mid_o, mid_lse, out, lse)
    assert run.gluon is not None
    # The same call again, counting the Gluon stage 1's launches: the call took it (not
    # the portable stand-in), and gives the same bits.
    first = out.clone(), lse.clone()
    launches, gluon = [], run.gluon
    run.gluon = lambda *args: (launches.append(args), gluon(*args))
    for buffer in (out, lse, mid_o, mid_lse):
        buffer.fill_(float("nan"))
    launch_decode(config, ops, mid_o, mid_lse, out, lse)
    torch.cuda.synchronize()
    run.gluon = gluon
    assert len(launches) == 1
    assert torch.equal(out.view(torch.int16), first[0].view(torch.int16)) and torch.equal(lse, first[1])
    host = problem.host_rows(list(range(len(LENGTHS))))
    assert_matches_oracle(host, out.float().cpu().numpy().astype(np.float64), lse.cpu().numpy().astype(np.float64),
                          lse_tol=FP8_MMA_LSE_TOLERANCE)  # fmt: skip
    if not hopper_kernels_launchable():
        pytest.skip("jaxlib passes no TMA descriptors here")
    arrays = [None if a is None else torch_bridge.to_jax(a.contiguous()) for a in ops]
    present = [a is not None for a in ops]

    def step(*given):
        values = iter(given)
        return triton_backend.decode_attention(DecodeOperands(*(next(values) if p else None for p in present)), config)

    jax_out, jax_lse = jax.jit(step)(*(a for a in arrays if a is not None))
    np.testing.assert_array_equal(np.asarray(jax_out.view(jax.numpy.uint16)), out.view(torch.int16).cpu().numpy()
                                  .view(np.uint16))  # fmt: skip
    np.testing.assert_array_equal(np.asarray(jax_lse), lse.cpu().numpy())


@pytest.mark.gpu
@pytest.mark.parametrize(
    "heads, kv_heads, page_size, num_kv_splits, scales",
    [(32, 8, 16, None, "head"), (32, 8, 16, 1, "tensor"), (28, 4, 16, 3, "none"), (64, 8, 64, 2, "head"),
     (16, 2, 32, 5, "tensor"), (8, 8, 128, 8, "head"), (8, 1, 16, 2, "head")],
)  # fmt: skip
def test_matches_oracle_and_jax_equals_torch(heads, kv_heads, page_size, num_kv_splits, scales):
    _check_planned_launch(heads, kv_heads, page_size, num_kv_splits, scales)


@pytest.mark.gpu
def test_sinks_and_compact_page_tables():
    """Sinks (stage 2's) and page-table rows padded with -1 past each row's pages."""
    _check_planned_launch(32, 8, 16, 4, "head", sinks=True, compact=True)


@pytest.mark.gpu
def test_strided_caches_and_caller_scratch():
    """K and V as views of one tensor (their slots 2 KB apart) and the vLLM drop-in's
    ``attn_logits`` as scratch (split stride 129): the Gluon stage 1 reads and writes them."""
    _check_planned_launch(32, 8, 16, 3, "tensor", fused=True)
