"""The Gluon Hopper MLA stage 1: it compiles for sm_90 without a GPU, and on an H100/H200
its results, merged by our stage 2, match the float64 oracle on awkward input."""

from __future__ import annotations

import math

import pytest

from benchmarks.mla_hopper import SEESAW  # the pipeline number of the seesaw kernel

SM90_SHARED_LIMIT = 232448  # bytes of shared memory one block may use on sm_90
IMAGE_TRITON = "3.6"  # the GPU machines' Triton: the builds that run


def _gluon_hopper_missing() -> str | None:
    from jax_decode.kernels.gluon_compile import gluon_hopper_missing

    return gluon_hopper_missing()


def compile_for_sm90(pipeline: int, num_heads: int = 128, num_kv_splits: int = 4):
    """The kernel compiled for sm_90 (no GPU needed); ``pipeline`` SEESAW is the seesaw kernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    from jax_decode.kernels.mla_hopper import _mla_stage1_hopper, _mla_stage1_hopper_seesaw

    block = 256 if pipeline == SEESAW else 512
    layout = gl.NVMMASharedLayout.get_default_for([64, block], gl.bfloat16)
    latent, rope = f"tensordesc<bf16[64, {block}],{layout!r}>", f"tensordesc<bf16[64, 64],{layout!r}>"
    signature = dict(
        q_desc=latent,
        qr_desc=rope,
        k_desc=latent,
        kr_desc=rope,
        page_table_ptr="*i32",
        seq_lens_ptr="*i32",
        k_scale_ptr="*fp32",
        v_scale_ptr="*fp32",
        num_pages="i32",
        mid_o_ptr="*fp32",
        mid_lse_ptr="*fp32",
    )
    s = num_kv_splits
    constexprs = dict(
        STRIDE_PTB=64,
        STRIDE_MOB=num_heads * s * 512,
        STRIDE_MOH=s * 512,
        STRIDE_MOS=512,
        STRIDE_MLB=num_heads * s,
        STRIDE_MLH=s,
        STRIDE_MLS=1,
        SM_SCALE=1 / math.sqrt(576),
        NUM_HEADS=num_heads,
        PAGE_SIZE=64,
        CAPACITY=4096,
        NUM_KV_SPLITS=s,
        NUM_STAGES=2,
        PIPELINE=pipeline,
        STRIDE_MOT=0,  # one query token: no token axis
        STRIDE_MLT=0,
        Q_LEN=1,
    )
    kernel, num_warps = _mla_stage1_hopper, 8
    if pipeline == SEESAW:
        del constexprs["NUM_STAGES"], constexprs["PIPELINE"]
        constexprs.update(KV_FP8=False, K_SCALE=0, V_SCALE=0)
        kernel, num_warps = _mla_stage1_hopper_seesaw, 4
    signature.update({name: "constexpr" for name in constexprs})
    source = GluonASTSource(kernel, signature, constexprs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps))


def _check_compile(pipeline: int) -> None:
    kernel = compile_for_sm90(pipeline)
    ptx = kernel.asm["ptx"]
    assert kernel.metadata.shared <= SM90_SHARED_LIMIT, kernel.metadata.shared
    assert "wgmma.mma_async" in ptx, "the products must be warpgroup MMAs"
    assert "cp.async.bulk.tensor" in ptx, "K tiles must arrive by TMA"
    assert ".local" not in ptx, "nothing may live in local memory"


def _check_oracle(pipeline: int, num_kv_splits: int) -> None:
    import torch

    from benchmarks.mla_hopper import HEAD_DIM_V, MlaHopper, edge_case, oracle_check

    q, k_cache, page_table, seq_lens = edge_case(seed=num_kv_splits)
    batch, num_heads = q.shape[:2]
    sm_scale = 1 / math.sqrt(576)
    run = MlaHopper(batch, num_heads, k_cache.shape[0], page_table.shape[1], sm_scale, num_kv_splits, pipeline)
    out = torch.full((batch, num_heads, HEAD_DIM_V), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((batch, num_heads), float("nan"), dtype=torch.float32, device="cuda")
    run.mid_o.fill_(float("nan"))
    run(q, k_cache, page_table, seq_lens, out, lse)
    torch.cuda.synchronize()
    err = oracle_check(
        q, k_cache, page_table, seq_lens, out, lse, sm_scale, list(range(batch)), list(range(0, num_heads, 7))
    )
    assert not err["nan"], err
    assert err["tol_excess"] <= 0, err
    assert err["lse_ok"], err


def _run_isolated(name: str, *args) -> None:
    from support import run_isolated

    run_isolated(__file__, name, *args)


@pytest.mark.parametrize("pipeline", [0, 1, SEESAW], ids=lambda p: f"{p=}")
def test_compiles_for_sm90(pipeline):
    missing = _gluon_hopper_missing()
    if missing:
        pytest.skip(missing)
    _run_isolated("_check_compile", pipeline)


@pytest.mark.gpu
@pytest.mark.parametrize("pipeline", [0, 1, SEESAW], ids=lambda p: f"{p=}")
@pytest.mark.parametrize("num_kv_splits", [1, 3, 8], ids=lambda s: f"{s=}")
def test_matches_oracle_on_awkward_input(pipeline, num_kv_splits):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs a Hopper (sm_90) GPU visible to torch")
    missing = _gluon_hopper_missing()
    if missing:
        pytest.skip(missing)
    _run_isolated("_check_oracle", pipeline, num_kv_splits)


# ----------------------------------------------------------------------------- the product path
# DeepSeek-style MLA in bfloat16 with pages of whole 64-token tiles: on sm_90 the launch
# config chooses the Gluon stage 1 for both frontends.

LENGTHS = (0, 1, 63, 65, 777, 1280, 64 * 20 - 1, 64 * 20)


def _hopper_mla_problem(page_size: int, num_heads: int, q_len: int | None = None, fp8: bool = False):
    """``fp8``: an e4m3 latent cache with a K and a V scale."""
    from benchmarks.inputs import TorchArrays
    from jax_decode.synthetic import make_paged_problem

    quantised = dict(kv_dtype="float8_e4m3fn", kv_scales="tensor") if fp8 else {}
    return make_paged_problem(
        batch=len(LENGTHS), num_heads=num_heads, num_kv_heads=1, head_dim_qk=576, head_dim_v=512,
        page_size=page_size, seq_lens=LENGTHS, dtype="bfloat16", mla=True, max_pages=64 * 20 // page_size,
        spare_pages=5, arrays=TorchArrays("cuda"), seed=page_size + num_heads, q_len=q_len, **quantised,
    )  # fmt: skip


def _needs_hopper_path():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU visible to torch")
    from jax_decode.kernels.gluon_compile import hopper_kernels_usable

    if not hopper_kernels_usable():
        pytest.skip("the Gluon Hopper kernels are not usable with this Triton")
    return torch


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [64, 128])
@pytest.mark.parametrize("num_heads", [128, 16])
@pytest.mark.parametrize("num_kv_splits", [None, 1, 3, 8], ids=lambda s: f"splits={s}")
def test_product_path_matches_oracle_and_jax_equals_torch(page_size, num_heads, num_kv_splits):
    """torch_bridge and jitted JAX on the Gluon stage 1: both against the float64 oracle,
    and bit-identical to each other."""
    torch = _needs_hopper_path()
    import jax
    import numpy as np
    from support import assert_matches_oracle

    import jax_decode
    import torch_bridge
    from jax_decode.backends.triton import hopper_kernels_launchable

    problem = _hopper_mla_problem(page_size, num_heads)
    q, k_cache, _, page_table, seq_lens = problem.arrays
    options = dict(head_dim_v=512, num_kv_splits=num_kv_splits)
    out, lse = torch_bridge.decode_attention(q, k_cache, None, page_table, seq_lens, return_lse=True, **options)
    torch.cuda.synchronize()
    from torch_bridge.launcher import _DECODE_LAUNCHERS

    def ours(run):
        return run.gluon is not None and (run.config.problem.num_heads, run.config.problem.page_size) == (
            num_heads,
            page_size,
        )

    runs = [run for run in _DECODE_LAUNCHERS.values() if ours(run)]
    assert runs, "Gluon ran"
    assert all(run.scheduled == bool(run.config.schedule_programs) for run in runs)

    rows = list(range(len(LENGTHS)))
    host = problem.host_rows(rows)
    got_out = out.float().cpu().numpy().astype(np.float64)
    got_lse = lse.cpu().numpy().astype(np.float64)
    assert_matches_oracle(host, got_out, got_lse, mla=True)

    if not hopper_kernels_launchable():
        pytest.skip("jaxlib passes no TMA descriptors here: JAX runs the portable kernels")
    arrays = [torch_bridge.to_jax(a) for a in (q, k_cache, page_table, seq_lens)]
    step = jax.jit(lambda q, k, pt, sl: jax_decode.decode_attention(q, k, None, pt, sl, return_lse=True, **options))
    jax_out, jax_lse = step(*arrays)
    np.testing.assert_array_equal(np.asarray(jax_out.view(jax.numpy.uint16)), out.view(torch.int16).cpu().numpy()
                                  .view(np.uint16))  # fmt: skip
    np.testing.assert_array_equal(np.asarray(jax_lse), lse.cpu().numpy())


def _check_planned_launch(num_heads: int, q_len: int | None, num_kv_splits, schedule: bool | int = False,
                          seesaw: bool = True, fp8: bool = False, narrow: bool = False,
                          widener: bool = False):  # fmt: skip
    """Plan the Gluon stage 1 (with ``schedule``, under the device-side schedule even
    where the planner would take one fixed split; without ``seesaw``, the two-warpgroup
    kernel; with ``fp8``, over an e4m3 cache with scales; with ``narrow``, the
    narrow-group kernel at fixed splits; ``widener``, its e4m3 tiles widened by a
    warpgroup of their own), launch it through torch_bridge's
    launcher and through the JAX backend with that one config: against the float64
    oracle, and bit-identical to each other.  Returns the config."""
    import dataclasses

    torch = _needs_hopper_path()
    import jax
    import numpy as np
    from support import assert_matches_oracle

    import torch_bridge
    from jax_decode.backends import triton as triton_backend
    from jax_decode.backends.triton import hopper_kernels_launchable
    from jax_decode.launch import make_launch_config
    from jax_decode.launch.problem import SCALE_PER_TENSOR
    from jax_decode.operands import DecodeOperands
    from torch_bridge.launcher import _DECODE_LAUNCHERS, launch_decode
    from torch_bridge.ops import device_info

    problem = _hopper_mla_problem(64, num_heads, q_len, fp8)
    q, k_cache, _, page_table, seq_lens = problem.arrays
    scales = (problem.extras["k_scale"], None) if fp8 else (None, None)  # (MLA: V takes K's scale)
    quantised = dict(kv_dtype="float8_e4m3fn", k_scale=SCALE_PER_TENSOR, v_scale=SCALE_PER_TENSOR) if fp8 else {}
    mla = _mla(batch=len(LENGTHS), num_heads=num_heads, max_pages=page_table.shape[1], num_pages=k_cache.shape[0],
               q_len=q_len or 1, token_axis=q_len is not None, **quantised)  # fmt: skip
    device = device_info(q.device)
    config = make_launch_config(mla, device, num_kv_splits, hopper_narrow=False)  # (narrow: set below)
    if narrow:
        config = dataclasses.replace(config, hopper_narrow=True, schedule_programs=0, hopper_widener=widener)
    if schedule:  # True: the planner's programs; a number: that many
        from jax_decode.launch.planner import hopper_mla_schedule_programs

        programs = hopper_mla_schedule_programs(mla, device) if schedule is True else schedule
        config = dataclasses.replace(config, schedule_programs=programs)
    if not seesaw and mla.q_len > 1:  # (the two-warpgroup kernel's schedule takes one token)
        config = dataclasses.replace(config, schedule_programs=0)
    config = dataclasses.replace(config, hopper_seesaw=seesaw)
    assert config.hopper_mla
    out = torch.empty(mla.out_shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(mla.lse_shape, dtype=torch.float32, device=q.device)
    launch_decode(config, DecodeOperands(q, k_cache, None, page_table, seq_lens, *scales), None, None, out, lse)
    torch.cuda.synchronize()
    run = next(run for run in _DECODE_LAUNCHERS.values() if run.config == config)
    assert run.gluon is not None and run.scheduled == bool(config.schedule_programs)
    host = problem.host_rows(list(range(len(LENGTHS))))
    assert_matches_oracle(host, out.float().cpu().numpy().astype(np.float64),
                          lse.cpu().numpy().astype(np.float64), mla=True)  # fmt: skip
    if config.schedule_programs:  # the schedule made once and handed in (decode_schedule's): the same bits
        from torch_bridge.launcher import launch_schedule

        ops = DecodeOperands(q, k_cache, None, page_table, seq_lens, *scales)
        again, again_lse = torch.full_like(out, float("nan")), torch.full_like(lse, float("nan"))
        launch_decode(config, ops, None, None, again, again_lse, schedule=launch_schedule(config, ops))
        assert torch.equal(again.view(torch.int16), out.view(torch.int16)) and torch.equal(again_lse, lse)
    if not hopper_kernels_launchable():
        pytest.skip("jaxlib passes no TMA descriptors here")
    arrays = [torch_bridge.to_jax(a) for a in (q, k_cache, page_table, seq_lens, *scales) if a is not None]
    step = jax.jit(lambda q, k, pt, sl, *scales: triton_backend.decode_attention(
        DecodeOperands(q, k, None, pt, sl, *scales), config))  # fmt: skip
    jax_out, jax_lse = step(*arrays)
    np.testing.assert_array_equal(np.asarray(jax_out.view(jax.numpy.uint16)), out.view(torch.int16).cpu().numpy()
                                  .view(np.uint16))  # fmt: skip
    np.testing.assert_array_equal(np.asarray(jax_lse), lse.cpu().numpy())
    return config


@pytest.mark.gpu
@pytest.mark.parametrize("num_heads", [128, 16])
def test_device_schedule_matches_oracle_and_jax_equals_torch(num_heads):
    """The Gluon stage 1 under the device-side schedule (its schedule kernel, chunks and
    merge) on long-tailed lengths."""
    config = _check_planned_launch(num_heads, None, None, schedule=True)
    assert config.schedule_programs > 0


@pytest.mark.gpu
@pytest.mark.parametrize("num_heads", [128, 16])
@pytest.mark.parametrize(
    "q_len, num_kv_splits, schedule",
    [(None, 1, False), (None, 3, False), (None, None, True), (2, 2, False), (2, None, True)],
)
def test_fp8_cache_on_the_seesaw_matches_oracle_and_jax_equals_torch(num_heads, q_len, num_kv_splits, schedule):
    """An e4m3 latent with K and V scales on the seesaw kernels: each K
    part widened to float16 in shared memory as it lands, Q rewritten as float16; one
    pass, fixed splits, the device-side schedule and two query tokens (fixed splits and
    the schedule)."""
    config = _check_planned_launch(num_heads, q_len, num_kv_splits, schedule=schedule, fp8=True)
    assert config.problem.cache_dtype == "float8_e4m3fn" and config.hopper_mla


@pytest.mark.gpu
@pytest.mark.parametrize("seesaw", [True, False], ids=["seesaw", "two_warpgroups"])
@pytest.mark.parametrize("num_heads", [128, 16])
def test_device_schedule_of_few_programs_matches_oracle_and_jax_equals_torch(num_heads, seesaw):
    """Four programs per head block, so most rows fall in one program's share: the seesaw
    writes those to out itself and the merge leaves them alone (the two-warpgroup kernel
    merges every row)."""
    from jax_decode.launch.config import HOPPER_MLA_CHUNK_COST

    lengths = [min(max(n, 0), 64 * 20) for n in LENGTHS]
    costs = [HOPPER_MLA_CHUNK_COST + math.ceil(n / 64) for n in lengths]
    starts = [sum(costs[:b]) for b in range(len(costs))]

    def program(position):  # of four (jax_decode.kernels.schedule)
        return ((position + 1) * 4 - 1) // sum(costs)

    whole = [program(s + min(HOPPER_MLA_CHUNK_COST, c - 1)) == program(s + c - 1)
             for s, c in zip(starts, costs, strict=True)]  # fmt: skip
    assert 2 <= sum(whole) < len(lengths)  # rows of one chunk and rows of several
    config = _check_planned_launch(num_heads, None, None, schedule=4, seesaw=seesaw)
    assert config.schedule_programs == 4


@pytest.mark.gpu
@pytest.mark.parametrize("num_heads, q_len", [(16, None), (8, None), (16, 2), (10, 3)])
@pytest.mark.parametrize("num_kv_splits, schedule", [(1, False), (3, False), (None, False), (None, True), (None, 4)])
@pytest.mark.parametrize("fp8", [False, True, "widener"], ids=["bf16", "e4m3", "e4m3-widener"])
def test_narrow_group_kernel_matches_oracle_and_jax_equals_torch(num_heads, q_len, num_kv_splits, schedule, fp8):
    """The narrow-group kernels (tokens as the MMAs' rows; 16 or 32 query rows, padding
    included): one pass, fixed splits and the device-side schedule (a wave of programs;
    four, so that rows of one chunk go to out), several query tokens, on awkward lengths;
    a bf16 cache, or e4m3 with scales widened in shared memory (by the consumer, or by a
    warpgroup of its own)."""
    config = _check_planned_launch(num_heads, q_len, num_kv_splits, schedule=schedule, fp8=bool(fp8), narrow=True,
                                   widener=fp8 == "widener")  # fmt: skip
    name = config.hopper_stage1(config.contiguous_strides()).kernel_name
    assert config.hopper_narrow and name == ("mla_hopper_narrow_scheduled" if schedule else "mla_hopper_narrow")


@pytest.mark.gpu
@pytest.mark.parametrize("seesaw", [True, False], ids=["seesaw", "two_warpgroups"])
@pytest.mark.parametrize(
    "num_heads, q_len, num_kv_splits, schedule",
    [(16, 2, None, False), (16, 4, 1, False), (128, 2, 3, False), (100, 3, None, False), (16, 2, None, True),
     (100, 3, None, True)],
)  # fmt: skip
def test_multi_token_rows_match_oracle_and_jax_equals_torch(num_heads, q_len, num_kv_splits, schedule, seesaw):
    """The Gluon stage 1 with (query token, head) rows, causal among the new tokens, rows
    shorter than q_len included: fixed splits, and on the seesaw the device-side schedule."""
    if schedule and not seesaw:
        pytest.skip("the two-warpgroup kernel's schedule takes one query token")
    _check_planned_launch(num_heads, q_len, num_kv_splits, schedule=schedule, seesaw=seesaw)


@pytest.mark.gpu
def test_strided_q_falls_back_to_the_portable_stage1():
    """A q whose rows are not one stride apart is not TMA-addressable: the portable stage 1
    runs with the same splits, and the result still matches the oracle."""
    torch = _needs_hopper_path()
    import numpy as np
    from support import assert_matches_oracle

    import torch_bridge

    problem = _hopper_mla_problem(64, 128)
    q, k_cache, _, page_table, seq_lens = problem.arrays
    wide = torch.zeros(q.shape[0], q.shape[1], 640, dtype=q.dtype, device=q.device)
    wide[..., :576] = q
    strided = wide[..., :576]
    out, lse = torch_bridge.decode_attention(strided, k_cache, None, page_table, seq_lens, head_dim_v=512,
                                             return_lse=True)  # fmt: skip
    host = problem.host_rows(list(range(len(LENGTHS))))
    assert_matches_oracle(host, out.float().cpu().numpy().astype(np.float64),
                          lse.cpu().numpy().astype(np.float64), mla=True)  # fmt: skip


# ----------------------------------------------------------------------------- planning and lowering (CPU)

H200 = dict(vendor="nvidia", compute_capability=90, num_sms=132)


def _mla(batch=64, num_heads=128, page_size=64, max_pages=64, **changes):
    from jax_decode.launch import DecodeProblem

    fields = dict(
        batch=batch, num_heads=num_heads, num_kv_heads=1, head_dim_qk=576, head_dim_v=512,
        num_pages=batch * max_pages, page_size=page_size, max_pages=max_pages, dtype="bfloat16", v_from_k=True,
        sm_scale=1 / math.sqrt(576), logit_cap=0.0,
    )  # fmt: skip
    fields.update(changes)
    return DecodeProblem(**fields)


def _plan(problem, hopper_kernels=True, num_kv_splits=None, device_schedule=True, hopper_narrow=True, **device):
    from jax_decode.launch import DeviceInfo, make_launch_config

    device = DeviceInfo(**{**H200, **device}, hopper_kernels=hopper_kernels)
    return make_launch_config(problem, device, num_kv_splits, device_schedule=device_schedule,
                              hopper_multi_token=problem.q_len > 1, hopper_narrow=hopper_narrow)  # fmt: skip


def test_planner_chooses_the_gluon_stage1_only_for_what_it_computes():
    assert _plan(_mla()).hopper_mla
    assert _plan(_mla(page_size=128, max_pages=32)).hopper_mla
    assert _plan(_mla(num_heads=16)).hopper_mla
    assert not _plan(_mla(), hopper_kernels=False).hopper_mla  # the frontend cannot launch it
    assert not _plan(_mla(), compute_capability=80).hopper_mla
    assert not _plan(_mla(), compute_capability=100).hopper_mla
    for changes in (
        dict(page_size=16, max_pages=256),  # a 64-token tile would span pages
        dict(page_size=1, max_pages=4096),
        dict(max_pages=0),  # no page-table entry to read
        dict(dtype="float16"),
        dict(logit_cap=30.0),
        dict(window_left=1000),
        dict(has_sinks=True),
        dict(head_dim_qk=288, head_dim_v=256),
        dict(v_from_k=False),
    ):
        assert not _plan(_mla(**changes)).hopper_mla, changes
    # An e4m3 latent with or without scales; e5m2 and a bfloat16 cache with scales never.
    from jax_decode.launch.problem import SCALE_NONE, SCALE_PER_KV_HEAD, SCALE_PER_TENSOR

    for scale in (SCALE_NONE, SCALE_PER_TENSOR, SCALE_PER_KV_HEAD):
        assert _plan(_mla(kv_dtype="float8_e4m3fn", k_scale=scale, v_scale=scale)).hopper_mla, scale
    assert not _plan(_mla(kv_dtype="float8_e5m2")).hopper_mla
    assert not _plan(_mla(k_scale=SCALE_PER_TENSOR, v_scale=SCALE_PER_TENSOR)).hopper_mla
    assert not _plan(_mla(dtype="float16", kv_dtype="float8_e4m3fn")).hopper_mla
    # At most 32 query rows (q_len x heads) go to the narrow-group kernels, bf16 or e4m3,
    # unless the seesaw is asked for; more to the seesaw.
    for changes in (dict(num_heads=16), dict(num_heads=16, q_len=2, token_axis=True), dict(num_heads=32),
                    dict(num_heads=16, kv_dtype="float8_e4m3fn"), dict(num_heads=1)):  # fmt: skip
        assert _plan(_mla(**changes)).hopper_narrow, changes
        assert not _plan(_mla(**changes), hopper_narrow=False).hopper_narrow, changes
    for changes in (dict(), dict(num_heads=33), dict(num_heads=16, q_len=3, token_axis=True), dict(num_heads=64)):
        assert _plan(_mla(**changes)).hopper_mla and not _plan(_mla(**changes)).hopper_narrow, changes
    assert not _plan(_mla(num_heads=16), hopper_kernels=False).hopper_narrow


@pytest.mark.parametrize(
    "batch, num_heads, max_pages, best",
    # The measured best split counts of the H200 rows (docs/mla_hopper_h200.json; 66 -> 64).
    [(1, 128, 512, 64), (8, 128, 256, 8), (64, 128, 64, 1), (128, 128, 16, 1), (64, 16, 64, 2)],
)
def test_gluon_splits_hedge_around_the_measured_best(batch, num_heads, max_pages, best):
    """The cost model's best for a uniform batch is the measured best split count; the
    planner takes the hedge between that and a long-tailed batch, never fewer splits."""
    import dataclasses

    from jax_decode.launch.cost import programs_per_sm, uniform_time
    from jax_decode.launch.planner import SPLIT_CHOICES, choose_splits, hopper_mla_program

    problem = _mla(batch=batch, num_heads=num_heads, max_pages=max_pages)
    program, head_blocks = hopper_mla_program(problem), math.ceil(num_heads / 64)
    per_sm = programs_per_sm(program, 232448)
    assert per_sm == 1
    ctx = max_pages * 64
    uniform = {s: uniform_time(program, head_blocks, batch, ctx, s, 132, per_sm) for s in SPLIT_CHOICES}
    assert min(uniform, key=uniform.get) == best
    config = _plan(problem)
    device = config.device
    assert config.num_kv_splits == choose_splits(problem, device, program, head_blocks, 64) >= best
    if batch == 1:
        assert config.num_kv_splits == best

    assert not _plan(problem, device_schedule=False).schedule_programs
    # Several rows: the device-side schedule, one wave of programs, unless one fixed
    # split writes the output in one pass; the fixed splits remain what the portable
    # stand-in (and a batch of one row) runs.
    # One wave, or the most programs within it that divide the batch or are a multiple
    # of it (b8 and b64 at 128 heads: 64 of 66; b64 at 16: 128 of 132).
    wave = {(8, 2): 64, (64, 2): 64, (64, 1): 128}.get((batch, head_blocks), 132 // head_blocks)
    assert config.schedule_programs == (0 if batch == 1 or config.num_kv_splits == 1 else wave)
    if config.schedule_programs:
        launch = config.hopper_stage1(config.contiguous_strides())
        assert launch.grid == (head_blocks, wave, 1)
        assert config.mid_o_shape == (batch + wave, num_heads, 512)
        config = dataclasses.replace(config, schedule_programs=0)
    splits = config.num_kv_splits
    assert config.one_pass == (splits == 1)
    launch = config.hopper_stage1(config.contiguous_strides())
    assert launch.grid == (head_blocks, batch, splits)
    # (16 heads: the narrow-group kernel, q through a pointer)
    q_views = [] if config.hopper_narrow else ["q", "q"]
    assert [view.operand for view in launch.tma] == [*q_views, "k_cache", "k_cache"]


def test_multi_token_rows_on_the_gluon_kernel_unless_told_not_to():
    import dataclasses

    from jax_decode.launch import DeviceInfo, make_launch_config

    device = DeviceInfo(**H200, hopper_kernels=True)
    two = _mla(batch=8, num_heads=16, q_len=2, token_axis=True)
    assert not make_launch_config(two, device, hopper_multi_token=False).hopper_mla
    assert make_launch_config(two, device).hopper_narrow  # 32 rows: planned narrow; the seesaw below
    from jax_decode.launch.planner import hopper_mla_schedule_programs

    # Planned with fixed splits (until the schedule of several tokens is timed on a GPU),
    # but the seesaw's schedule takes them: one 32-row block a program (a wave of 132,
    # 128 of them: 16 a row of the 8).
    assert not make_launch_config(two, device).schedule_programs
    programs = hopper_mla_schedule_programs(two, device)
    assert programs == 128
    scheduled = dataclasses.replace(make_launch_config(two, device, hopper_narrow=False), schedule_programs=programs)
    launch = scheduled.hopper_stage1(scheduled.contiguous_strides())
    assert launch.kernel_name == "mla_hopper_seesaw_scheduled" and launch.grid == (1, 128, 1)
    assert dict(launch.constexprs)["Q_LEN"] == 2 and dict(launch.constexprs)["STRIDE_OT"] == 16 * 512
    with pytest.raises(ValueError, match="two-warpgroup kernel's device-side schedule takes one query token"):
        dataclasses.replace(scheduled, hopper_seesaw=False).hopper_stage1(scheduled.contiguous_strides())
    config = make_launch_config(two, device, device_schedule=False, hopper_narrow=False)
    assert config.hopper_mla and not config.schedule_programs
    strides = config.contiguous_strides()
    launch = config.hopper_stage1(strides)
    # 2 tokens x 16 heads = 32 rows: one 64-row block reads the latent once.
    assert launch.kernel_name == "mla_hopper_seesaw" and launch.num_warps == 4
    assert launch.grid == (1, 8, config.num_kv_splits)
    assert launch.tma[0].rows == 8 * 2 * 16 and launch.tma[0].block == (64, 256)
    assert dict(launch.constexprs)["Q_LEN"] == 2
    baseline = dataclasses.replace(config, hopper_seesaw=False).hopper_stage1(strides)
    assert baseline.kernel_name == "mla_hopper" and baseline.num_warps == 8 and baseline.tma[0].block == (64, 512)
    assert dict(baseline.constexprs)["Q_LEN"] == 2 and baseline.grid == launch.grid
    # Rows must be one stride apart across tokens too.
    assert config.tma_ready(strides)
    assert not config.tma_ready(dataclasses.replace(strides, tokens=(16 * 640, *strides.tokens[1:])))
    big = make_launch_config(_mla(batch=8, num_heads=128, q_len=3, token_axis=True), device, hopper_multi_token=True)
    assert big.hopper_stage1(big.contiguous_strides()).grid[0] == 6
    assert hopper_mla_schedule_programs(big.problem, device) == H200["num_sms"] // 6  # a wave over six head blocks


def test_narrow_group_launch():
    """The narrow-group kernel's launch: one program per row and split, the MMAs' N the
    rows padded to 16 or 32, q through a pointer; what it does not take is refused."""
    import dataclasses

    from jax_decode.launch.problem import SCALE_PER_TENSOR
    from jax_decode.operands import DecodeOperands, hopper_stage1_inputs

    for heads, q_len, rows in ((16, 1, 16), (8, 1, 16), (16, 2, 32), (10, 3, 32)):
        problem = _mla(batch=6, num_heads=heads, q_len=q_len, token_axis=q_len > 1)
        config = dataclasses.replace(_plan(problem, num_kv_splits=3), hopper_narrow=True)
        assert config.hopper_q_pointer and not config.schedule_programs
        launch = config.hopper_stage1(config.contiguous_strides())
        meta = launch.meta()
        assert launch.kernel_name == "mla_hopper_narrow" and launch.grid == (1, 6, 3) and launch.num_warps == 4
        assert (meta["ROWS"], meta["Q_LEN"], meta["NUM_HEADS"]) == (rows, q_len, heads)
        assert [view.block for view in launch.tma] == [(64, 256), (64, 64)]
        assert [view.operand for view in launch.tma] == ["k_cache", "k_cache"]
    ops = DecodeOperands("q", "k", None, "page_table", "seq_lens")
    assert hopper_stage1_inputs(ops, problem, q_pointer=True)[:3] == ("q", "page_table", "seq_lens")
    # q comes through a pointer: a q view TMA could not address still runs it, a cache view not.
    strides = config.contiguous_strides()
    odd_q = dataclasses.replace(strides, q=(strides.q[0] + 8, strides.q[1]))
    assert config.tma_ready(odd_q) and not dataclasses.replace(config, hopper_narrow=False).tma_ready(odd_q)
    assert not config.tma_ready(dataclasses.replace(strides, k=(strides.k[0] * 2, *strides.k[1:])))
    one_pass = dataclasses.replace(_plan(_mla(batch=6, num_heads=16), num_kv_splits=1), hopper_narrow=True)
    assert dict(one_pass.hopper_stage1(one_pass.contiguous_strides()).param_types)["mid_o_ptr"] == "*bf16"
    refused = (
        (_plan(_mla(batch=6, num_heads=64), num_kv_splits=2), "at most 32 query rows"),
        (_plan(_mla(batch=6, num_heads=16, q_len=3, token_axis=True), num_kv_splits=2), "at most 32 query rows"),
    )  # fmt: skip
    for config, message in refused:
        assert config.hopper_mla
        with pytest.raises(ValueError, match=message):
            dataclasses.replace(config, hopper_narrow=True).hopper_stage1(config.contiguous_strides())
    # The two-warpgroup kernel asked for (hopper_seesaw=False) over a narrow plan: refused, not ignored.
    narrow = _plan(_mla(batch=6, num_heads=16), num_kv_splits=2)
    with pytest.raises(ValueError, match="two-warpgroup kernel: set hopper_narrow=False"):
        dataclasses.replace(narrow, hopper_seesaw=False).hopper_stage1(narrow.contiguous_strides())
    e4m3 = _plan(_mla(batch=6, kv_dtype="float8_e4m3fn"), num_kv_splits=2)  # (128 heads: the seesaw)
    with pytest.raises(ValueError, match="two-warpgroup kernel takes a bfloat16 cache"):
        dataclasses.replace(e4m3, hopper_seesaw=False).hopper_stage1(e4m3.contiguous_strides())
    # An e4m3 cache: fp8 descriptors, the scales' flags.
    fp8 = _mla(batch=6, num_heads=16, kv_dtype="float8_e4m3fn", k_scale=SCALE_PER_TENSOR, v_scale=SCALE_PER_TENSOR)
    config = _plan(fp8, num_kv_splits=2)
    assert config.hopper_narrow
    launch = config.hopper_stage1(config.contiguous_strides())
    assert [view.dtype for view in launch.tma] == ["fp8e4nv", "fp8e4nv"]
    assert (launch.meta()["KV_FP8"], launch.meta()["K_SCALE"], launch.meta()["V_SCALE"]) == (True, 1, 1)
    # The widener (opt-in) widens e4m3 tiles only.
    assert not launch.meta()["WIDENER"]
    widened = dataclasses.replace(config, hopper_widener=True)
    assert widened.hopper_stage1(widened.contiguous_strides()).meta()["WIDENER"]
    bf16 = dataclasses.replace(_plan(_mla(batch=6, num_heads=16), num_kv_splits=2), hopper_widener=True)
    assert not bf16.hopper_stage1(bf16.contiguous_strides()).meta()["WIDENER"]
    # Under the device-side schedule: a wave of programs, the rows of one chunk to out.
    scheduled = dataclasses.replace(_plan(_mla(batch=6, num_heads=16, q_len=2, token_axis=True)), hopper_narrow=True)
    scheduled = dataclasses.replace(scheduled, schedule_programs=132)
    assert scheduled.scheduled_rows_direct
    assert scheduled.schedule_merge(scheduled.contiguous_strides()).meta()["SKIP_WHOLE"]
    launch = scheduled.hopper_stage1(scheduled.contiguous_strides())
    assert launch.kernel_name == "mla_hopper_narrow_scheduled" and launch.grid == (1, 132, 1)
    assert (launch.meta()["ROWS"], launch.meta()["NUM_PROGRAMS"], launch.meta()["STRIDE_OT"]) == (32, 132, 16 * 512)
    assert [name for name, _ in launch.param_types][-4:] == ["mid_o_ptr", "mid_lse_ptr", "out_ptr", "lse_ptr"]
    inputs = hopper_stage1_inputs(ops, scheduled.problem, "schedule", q_pointer=True)
    assert inputs == ("q", "page_table", "seq_lens", "seq_lens", "seq_lens", "schedule", scheduled.problem.num_pages, 6)


def _check_narrow_compile(num_heads, q_len, num_kv_splits, fp8=False, widener=False) -> None:
    """``num_kv_splits`` None: under the device-side schedule; ``widener``: an e4m3 cache
    widened by a warpgroup of its own (``hopper_widener``)."""
    import dataclasses

    from jax_decode.kernels.gluon_compile import compile_launch
    from jax_decode.launch.planner import hopper_mla_schedule_programs
    from jax_decode.launch.problem import SCALE_PER_TENSOR

    quantised = dict(kv_dtype="float8_e4m3fn", k_scale=SCALE_PER_TENSOR, v_scale=SCALE_PER_TENSOR) if fp8 else {}
    problem = _mla(batch=3, num_heads=num_heads, max_pages=32, q_len=q_len, token_axis=q_len > 1, **quantised)
    config = dataclasses.replace(_plan(problem, num_kv_splits=num_kv_splits or 2), hopper_widener=widener)
    assert config.hopper_narrow
    if num_kv_splits is None:
        config = dataclasses.replace(config, schedule_programs=hopper_mla_schedule_programs(problem, config.device))
    launch = config.hopper_stage1(config.contiguous_strides())
    assert launch.kernel_name == ("mla_hopper_narrow_scheduled" if num_kv_splits is None else "mla_hopper_narrow")
    assert launch.meta()["WIDENER"] == widener
    kernel = compile_launch(launch, 90)
    # the consumer warpgroup, the producer warp (padded to four) and, with the widener, its warpgroup
    assert kernel.metadata.num_warps == (12 if widener else 8)
    ptx = kernel.asm["ptx"]
    assert kernel.metadata.shared <= SM90_SHARED_LIMIT, kernel.metadata.shared
    rows = 16 if q_len * num_heads <= 16 else 32
    # Only the products the answer needs: 64 tokens x the padded rows, 36 for the scores
    # (576 / 16) and 32 for P V (512 / 64 rows x 64 tokens / 16).
    kind = "f16.f16" if fp8 else "bf16.bf16"
    assert ptx.count(f"wgmma.mma_async.sync.aligned.m64n{rows}k16.f32.{kind}") == 36 + 32
    if fp8:
        assert "cvt.rn.f16x2.e4m3x2" in ptx  # the widening, one instruction per pair
    import triton

    from benchmarks.kernel_resources import resource_usage, tools_available

    # ptxas's spills show in the cubin, not the PTX.  Checked for the build the GPU
    # machines run (their image's Triton, scripts/test_image_triton.sh): newer Tritons
    # spill some of these builds a little.
    if tools_available() and triton.__version__.startswith(IMAGE_TRITON):
        import tempfile

        with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
            cubin.write(kernel.asm["cubin"])
            cubin.flush()
            stack = resource_usage(cubin.name)["STACK"]
        # (Under the schedule 30 rows keep a few values of a chunk on the stack, outside
        # the tile loop; docs/performance.md.)
        assert stack == 0 or (num_kv_splits is None and q_len * num_heads > 16), stack
    assert "cp.async.bulk.tensor" in ptx and ".local" not in ptx
    assert len(kernel.metadata.tensordesc_meta) == 2


@pytest.mark.parametrize(
    "num_heads, q_len, num_kv_splits, fp8, widener",
    [(16, 1, 1, False, False), (16, 1, 3, False, False), (16, 2, 2, False, False), (10, 3, 1, False, False),
     (16, 1, None, False, False), (10, 3, None, False, False), (16, 1, 3, True, False), (16, 2, None, True, False),
     (16, 1, 3, True, True), (16, 1, None, True, True), (16, 2, None, True, True)],
)  # fmt: skip
def test_narrow_launch_compiles_for_sm90(num_heads, q_len, num_kv_splits, fp8, widener):
    missing = _gluon_hopper_missing()
    if missing:
        pytest.skip(missing)
    _run_isolated("_check_narrow_compile", num_heads, q_len, num_kv_splits, fp8, widener)


def test_gluon_constexprs_follow_the_kernel_parameters():
    """torch's launcher passes a Gluon launch's constexprs by position: the launch config
    must state them in the kernel's parameter order."""
    import inspect

    from jax_decode.kernels.gluon_compile import gluon_kernel

    if _gluon_hopper_missing():
        pytest.skip(_gluon_hopper_missing())
    import dataclasses

    configs = (
        _plan(_mla(batch=1)),
        _plan(_mla(batch=4, num_heads=16), hopper_narrow=False),
        _plan(_mla(batch=4, num_heads=16), num_kv_splits=1, hopper_narrow=False),
        _plan(_mla(batch=4, num_heads=16, q_len=2, token_axis=True), hopper_narrow=False),
        dataclasses.replace(
            _plan(_mla(batch=4, num_heads=16, q_len=2, token_axis=True), device_schedule=False, hopper_narrow=False),
            hopper_seesaw=False,
        ),
        dataclasses.replace(_plan(_mla(batch=4)), hopper_seesaw=False),
        _plan(_mla(batch=4, num_heads=16), device_schedule=False),
        _plan(_mla(batch=4, num_heads=16)),  # (the schedule)
    )
    # the seesaw (fixed, scheduled), the two-warpgroup kernel (fixed, scheduled), the narrow (fixed, scheduled)
    kernels = ["mla_hopper_seesaw", "mla_hopper_seesaw_scheduled", "mla_hopper_seesaw", "mla_hopper_seesaw",
               "mla_hopper", "mla_hopper_scheduled", "mla_hopper_narrow", "mla_hopper_narrow_scheduled"]  # fmt: skip
    for config, kernel in zip(configs, kernels, strict=True):
        launch = config.hopper_stage1(config.contiguous_strides())
        assert launch.kernel_name == kernel
        names = list(inspect.signature(gluon_kernel(launch.kernel_name).fn).parameters)
        runtime = [name for name, _ in launch.param_types]
        assert names == runtime + [name for name, _ in launch.constexprs], launch.kernel_name


@pytest.mark.parametrize(
    "batch, num_heads, programs",
    # 64 and 128 rows take 64 programs of 66 (whole rows each), 16 rows 64 (a quarter of
    # a row each, as 4 fixed splits); 100 rows a whole wave (50 would idle a quarter of
    # the SMs), 40 too (neither 40 nor 20 is close to 66), 3 rows all 66 (22 each); at 16
    # heads 16, 64 and 128 rows take 128 of 132.
    [(64, 128, 64), (128, 128, 64), (16, 128, 64), (100, 128, 66), (60, 128, 60), (40, 128, 66), (3, 128, 66),
     (128, 16, 128), (64, 16, 128), (16, 16, 128)],
)  # fmt: skip
def test_schedule_programs_divide_the_batch_where_few_sms_idle(batch, num_heads, programs):
    from jax_decode.launch import DeviceInfo
    from jax_decode.launch.planner import hopper_mla_schedule_programs

    device = DeviceInfo(**H200, hopper_kernels=True)
    assert hopper_mla_schedule_programs(_mla(batch=batch, num_heads=num_heads), device) == programs


def test_schedule_stays_within_int32_positions():
    # batch * (chunk cost + tiles of the capacity) must stay below 2**31.
    fits = _plan(_mla(batch=4096, num_heads=16, max_pages=2**13, num_pages=1000))
    assert fits.hopper_mla and fits.schedule_programs
    too_many = _plan(_mla(batch=4096, num_heads=16, max_pages=2**19, num_pages=1000))
    assert too_many.hopper_mla and not too_many.schedule_programs
    # Just below 2**31 positions, and at it (the kernels' products of positions and
    # program counts are int64).
    edge = _plan(_mla(batch=128, num_heads=128, page_size=640, max_pages=1677721, num_pages=1000))
    assert 128 * (5 + math.ceil(640 * 1677721 / 64)) == 2**31 - 128
    assert edge.hopper_mla and edge.schedule_programs
    over = _plan(_mla(batch=128, num_heads=128, page_size=640, max_pages=1677722, num_pages=1000))
    assert over.hopper_mla and not over.schedule_programs


def test_tma_ready_needs_row_views():
    import dataclasses

    config = _plan(_mla(batch=2, num_heads=128, max_pages=4))
    strides = config.contiguous_strides()
    assert config.tma_ready(strides)
    assert not config.tma_ready(dataclasses.replace(strides, q=(128 * 640, 640 + 4)))  # rows 1288 bytes apart
    assert not config.tma_ready(dataclasses.replace(strides, q=(128 * 640 + 8, 640)))  # batch gap
    assert not config.tma_ready(dataclasses.replace(strides, k=(64 * 576 * 2, 576, 576)))  # every other page
    assert not config.tma_ready(dataclasses.replace(strides, q=(0, 0)))  # a broadcast q
    assert not config.tma_ready(dataclasses.replace(strides, q=(128 * 8, 8)))  # overlapping rows
    # An e4m3 cache: its row stride must be 16 bytes, not 16-bit elements, apart.
    from jax_decode.launch.problem import SCALE_PER_TENSOR

    e4m3 = _mla(batch=2, num_heads=128, max_pages=4, kv_dtype="float8_e4m3fn", k_scale=SCALE_PER_TENSOR,
                v_scale=SCALE_PER_TENSOR)  # fmt: skip
    fp8 = _plan(e4m3)
    assert fp8.tma_ready(dataclasses.replace(strides, k=(64 * 592, 592, 592)))
    assert not fp8.tma_ready(dataclasses.replace(strides, k=(64 * 584, 584, 584)))  # rows 584 bytes apart


def test_mla_v_takes_k_scale_in_the_gluon_stage1_inputs():
    """MLA's V is K's first 512 columns: the Gluon stage 1's V scale pointer is K's (as
    the portable stage 1's), never the placeholder it would dequantise with."""
    from jax_decode.launch.problem import SCALE_PER_TENSOR
    from jax_decode.operands import DecodeOperands, hopper_stage1_inputs

    problem = _mla(kv_dtype="float8_e4m3fn", k_scale=SCALE_PER_TENSOR, v_scale=SCALE_PER_TENSOR)
    ops = DecodeOperands("q", "k", None, "page_table", "seq_lens", "k_scale", None)
    assert hopper_stage1_inputs(ops, problem)[:4] == ("page_table", "seq_lens", "k_scale", "k_scale")
    assert hopper_stage1_inputs(ops, problem, "schedule")[2:5] == ("k_scale", "k_scale", "schedule")
    unscaled = DecodeOperands("q", "k", None, "page_table", "seq_lens")
    assert hopper_stage1_inputs(unscaled, _mla())[2:4] == ("seq_lens", "seq_lens")  # placeholders, unread


def _check_product_compile(batch, num_heads, page_size, num_kv_splits, q_len=1, seesaw=True, fp8=False) -> None:
    import dataclasses

    from jax_decode.kernels.gluon_compile import compile_launch
    from jax_decode.launch.problem import SCALE_PER_TENSOR

    quantised = dict(kv_dtype="float8_e4m3fn", k_scale=SCALE_PER_TENSOR, v_scale=SCALE_PER_TENSOR) if fp8 else {}
    problem = _mla(batch=batch, num_heads=num_heads, page_size=page_size, max_pages=2048 // page_size, q_len=q_len,
                   token_axis=q_len > 1, **quantised)  # fmt: skip
    config = _plan(problem, num_kv_splits=num_kv_splits, hopper_narrow=False)  # (narrow: its own compile tests)
    config = dataclasses.replace(config, hopper_seesaw=seesaw)
    assert config.hopper_mla
    if num_kv_splits is None:  # the schedule (planned for one token; forced for several)
        from jax_decode.launch.planner import hopper_mla_schedule_programs

        config = dataclasses.replace(config, schedule_programs=hopper_mla_schedule_programs(problem, config.device))
    launch = config.hopper_stage1(config.contiguous_strides())
    if num_kv_splits:
        assert launch.kernel_name == ("mla_hopper_seesaw" if seesaw else "mla_hopper")
    else:
        assert launch.kernel_name == "mla_hopper_seesaw_scheduled"
    kernel = compile_launch(launch, 90)
    ptx = kernel.asm["ptx"]
    assert kernel.metadata.shared <= SM90_SHARED_LIMIT, kernel.metadata.shared
    from jax_decode.launch.planner import HOPPER_MLA_PROGRAMS

    threads, _, shared = HOPPER_MLA_PROGRAMS[launch.kernel_name]
    if fp8:  # the same buffers as bfloat16's, and one more barrier: still one program per SM
        assert 0 < kernel.metadata.shared - shared <= 256 and 32 * kernel.metadata.num_warps == threads
        assert "cvt.rn.f16x2.e4m3x2" in ptx  # the widening, one instruction per pair
        assert [v.dtype for v in launch.tma] == ["bf16", "bf16", "fp8e4nv", "fp8e4nv"]
    else:
        assert (kernel.metadata.shared, 32 * kernel.metadata.num_warps) == (shared, threads), "the planner must know it"
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    assert ".local" not in ptx, "nothing may live in local memory"
    assert len(kernel.metadata.tensordesc_meta) == 4


@pytest.mark.parametrize(
    "batch, num_heads, page_size, num_kv_splits, q_len, seesaw",
    # one pass (bf16 out), splits into float32 scratch, the device-side schedule, and
    # (token, head) rows of several query tokens (fixed splits and the schedule); the
    # two-warpgroup baseline
    [(4, 128, 64, 1, 1, True), (3, 16, 128, 3, 1, True), (5, 128, 64, None, 1, True), (3, 16, 64, 2, 2, True),
     (2, 16, 64, 1, 4, True), (3, 16, 64, 2, 2, False), (5, 128, 64, None, 2, True)],
)  # fmt: skip
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "e4m3"])
def test_product_launch_compiles_for_sm90(batch, num_heads, page_size, num_kv_splits, q_len, seesaw, fp8):
    missing = _gluon_hopper_missing()
    if missing:
        pytest.skip(missing)
    if fp8 and not seesaw:
        pytest.skip("an fp8 cache runs the seesaw kernels only")
    _run_isolated("_check_product_compile", batch, num_heads, page_size, num_kv_splits, q_len, seesaw, fp8)


def _check_jax_lowering(num_kv_splits) -> None:
    """``num_kv_splits``: 1 or 2 (fixed), "device" (the device-side schedule), "two
    tokens", "e4m3", or "graph" (the device-side schedule under
    ``JAX_DECODE_TRITON_CALL=graph``; this runs in a process of its own)."""
    import os

    import jax
    import jax.numpy as jnp

    from jax_decode.backends import typed_ffi

    graph = num_kv_splits == "graph"
    if graph:
        os.environ[typed_ffi.CALL_VARIABLE] = "graph"
        num_kv_splits = "device"

    import jax_decode
    from jax_decode.backends import triton as triton_backend
    from jax_decode.operands import DecodeOperands

    batch, num_heads, num_pages, page_size, max_pages = 4, 128, 16, 64, 4
    sds = jax.ShapeDtypeStruct
    args = (
        sds((batch, num_heads, 576), jnp.bfloat16),
        sds((num_pages, page_size, 1, 576), jnp.bfloat16),
        sds((batch, max_pages), jnp.int32),
        sds((batch,), jnp.int32),
    )

    def step(q, k, pt, sl):
        return jax_decode.decode_attention(
            q, k, None, pt, sl, head_dim_v=512, num_kv_splits=num_kv_splits, return_lse=True, backend="triton"
        )

    if num_kv_splits == "two tokens":
        args = (sds((batch, 2, num_heads, 576), jnp.bfloat16), *args[1:])
        config = _plan(_mla(batch=batch, num_heads=num_heads, max_pages=max_pages, num_pages=num_pages, q_len=2,
                            token_axis=True), num_kv_splits=2)  # fmt: skip
        assert config.hopper_mla

        def step(q, k, pt, sl):  # noqa: F811 - the planned config itself, checked above to be the Gluon one
            return triton_backend.decode_attention(DecodeOperands(q, k, None, pt, sl), config)

    if num_kv_splits == "device":
        import dataclasses

        from jax_decode.launch.planner import hopper_mla_schedule_programs

        problem = _mla(batch=batch, num_heads=num_heads, max_pages=max_pages, num_pages=num_pages)
        config = _plan(problem)
        # The schedule even where the planner takes one split for this small problem.
        config = dataclasses.replace(config, schedule_programs=hopper_mla_schedule_programs(problem, config.device))
        assert config.schedule_programs

        def step(q, k, pt, sl):  # noqa: F811
            return triton_backend.decode_attention(DecodeOperands(q, k, None, pt, sl), config)

    if num_kv_splits == "e4m3":  # an fp8 latent with scales: fp8 descriptors, two scale pointers
        from jax_decode.launch.problem import SCALE_PER_TENSOR

        args = (args[0], sds(args[1].shape, jnp.float8_e4m3fn), *args[2:], sds((1,), jnp.float32),
                sds((1,), jnp.float32))  # fmt: skip
        config = _plan(_mla(batch=batch, num_heads=num_heads, max_pages=max_pages, num_pages=num_pages,
                            kv_dtype="float8_e4m3fn", k_scale=SCALE_PER_TENSOR, v_scale=SCALE_PER_TENSOR),
                       num_kv_splits=2)  # fmt: skip
        assert config.hopper_mla

        def step(q, k, pt, sl, k_scale, v_scale):  # noqa: F811
            return triton_backend.decode_attention(DecodeOperands(q, k, None, pt, sl, k_scale, v_scale), config)

    with jax_decode.compile_target(jax_decode.DeviceInfo(**H200, hopper_kernels=True)):
        text = jax.jit(step).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    calls = [line for line in text.splitlines() if "stablehlo.custom_call @" in line]
    # The Gluon stage 1 takes q and the cache twice (latent and rope descriptors); one
    # split writes out and lse itself, more are merged by stage 2; the device-side
    # schedule adds its schedule kernel before stage 1 and merges with its own kernel.
    assert len(calls) == {1: 1, 2: 2, "device": 3, "two tokens": 2, "e4m3": 2}[num_kv_splits], calls
    gluon = calls[1] if num_kv_splits == "device" else calls[0]
    assert "(%arg0, %arg0, %arg1, %arg1, %arg2, %arg3" in gluon, gluon
    if typed_ffi.typed_ffi_registered():  # Gluon and portable launches alike
        name = typed_ffi.GRAPH_TARGET if graph else typed_ffi.TYPED_FFI_TARGET
        assert all(f"custom_call @{name}(" in line for line in calls), calls


@pytest.mark.parametrize("num_kv_splits", [1, 2, "device", "two tokens", "e4m3", "graph"])
def test_jax_lowers_the_gluon_stage1_for_sm90(num_kv_splits):
    from jax_decode.backends.gluon_call import jaxlib_tma_missing
    from jax_decode.backends.triton import jax_triton_import_error

    for missing in (_gluon_hopper_missing(), jax_triton_import_error(), jaxlib_tma_missing()):
        if missing:
            pytest.skip(missing)
    _run_isolated("_check_jax_lowering", num_kv_splits)
