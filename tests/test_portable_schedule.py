"""The portable stage 1 under the device-side schedule (``_decode_stage1`` with
``SCHEDULED``, jax_decode.kernels.schedule): through both frontends, against the
float64 oracle, JAX == torch bit for bit, on every feature the fixed splits take (MHA,
GQA, MLA, soft-cap, windows, sinks, several query tokens, fp8 caches with scales) and
on rows of 0, 1, 32 and capacity tokens -- with so few programs that chunks straddle
rows and rows straddle programs.  And where the planner chooses it.

On a CPU-only machine both frameworks run the kernels in Triton's interpreter (the
planner schedules on GPUs only, so the tests force it); on a GPU, compiled."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from cases import GQA4, MHA, MLA, Case
from conftest import HAS_GPU, needs_interpreter
from support import assert_matches_oracle, run_jax

torch = pytest.importorskip("torch")

from torch_support import to_float64, to_tensor  # noqa: E402

import jax_decode.api  # noqa: E402
import torch_bridge  # noqa: E402
import torch_bridge.ops  # noqa: E402
from jax_decode.launch import DecodeProblem, DeviceInfo, make_launch_config  # noqa: E402

DEVICE = "cuda" if HAS_GPU else "cpu"
JAX_KERNEL_BACKEND = "triton" if HAS_GPU else "interpret"
pytestmark = [] if HAS_GPU else [needs_interpreter]

CASES = {
    "gqa_bf16": dataclasses.replace(GQA4, dtype="bfloat16", num_kv_splits=None),
    "mha_f32_page3": dataclasses.replace(MHA, num_kv_splits=None, page_size=3, max_pages=14),
    "mla_bf16_cap": dataclasses.replace(MLA, dtype="bfloat16", logit_cap=30.0, num_kv_splits=None),
    "gqa_f16_window_sinks_qlen3": dataclasses.replace(
        GQA4, dtype="float16", window_left=9, sinks=True, q_len=3, num_kv_splits=None
    ),
    "gqa_e4m3_head_scales": dataclasses.replace(
        GQA4, dtype="bfloat16", kv_dtype="float8_e4m3fn", kv_scales="head", num_kv_splits=None
    ),
}


@pytest.fixture
def forced_schedule(monkeypatch):
    """Both frontends plan with the device-side schedule of ``programs`` programs
    (set ``forced_schedule.programs``); every cache that holds a plan is cleared."""
    planned = []

    def plan(problem, device, num_kv_splits=None, **kwargs):
        config = make_launch_config(problem, device, num_kv_splits, **kwargs)
        config = dataclasses.replace(config, schedule_programs=plan.programs)
        planned.append(config)
        return config

    plan.programs, plan.planned = 3, planned

    def clear():
        torch_bridge.ops._launch_config.cache_clear()
        torch_bridge.ops._ACCEPTED.clear()
        jax.clear_caches()

    clear()
    monkeypatch.setattr(torch_bridge.ops, "make_launch_config", plan)
    monkeypatch.setattr(jax_decode.api, "make_launch_config", plan)
    yield plan
    monkeypatch.undo()
    clear()


@pytest.mark.parametrize("programs", [3, 7])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_scheduled_stage1_matches_the_oracle_and_jax_bit_for_bit(case: Case, programs, forced_schedule):
    forced_schedule.programs = programs
    problem = case.problem()
    tensors = [to_tensor(a, DEVICE) for a in problem.arrays]
    extras = {name: to_tensor(a, DEVICE) for name, a in problem.extras.items()}
    out, lse = torch_bridge.decode_attention(
        *tensors, head_dim_v=problem.head_dim_v if case.mla else None, return_lse=True, **case.options(), **extras
    )
    config = forced_schedule.planned[-1]
    assert config.portable_scheduled and config.stage1(config.contiguous_strides()).meta()["SCHEDULED"]
    assert_matches_oracle(problem, to_float64(out), to_float64(lse), mla=case.mla, **case.oracle_options())

    jax_out, jax_lse = run_jax(problem, backend=JAX_KERNEL_BACKEND, mla=case.mla, **case.options())
    assert forced_schedule.planned[-1].portable_scheduled  # (the JAX call planned too)
    np.testing.assert_array_equal(to_float64(out), jax_out)
    np.testing.assert_array_equal(to_float64(lse), jax_lse)


def test_a_schedule_made_once_serves_every_call_it_was_made_for(forced_schedule, monkeypatch):
    """torch_bridge.decode_schedule's schedule taken by later calls (the accepted-call
    path too): the same bits as calls that compute their own, without the schedule
    kernel; refused for another plan, another seq_lens tensor or one written since;
    taken under inference mode, and under torch.compile the call computes its own."""
    import torch_bridge.launcher

    case = CASES["gqa_f16_window_sinks_qlen3"]
    problem = case.problem()
    q, k, v, pt, sl = (to_tensor(a, DEVICE) for a in problem.arrays)
    options = dict(case.options(), **{name: to_tensor(a, DEVICE) for name, a in problem.extras.items()})
    schedule = torch_bridge.decode_schedule(q, k, v, pt, sl, **options)
    assert schedule.tensor.dtype == torch.int32 and schedule.config.schedule_programs == forced_schedule.programs
    want = torch_bridge.decode_attention(q, k, v, pt, sl, return_lse=True, **options)
    computed, launch = [], torch_bridge.launcher.launch_schedule
    monkeypatch.setattr(torch_bridge.launcher, "launch_schedule", lambda *a: computed.append(1) or launch(*a))
    for _ in range(2):  # planned, then accepted
        got = torch_bridge.decode_attention(q, k, v, pt, sl, return_lse=True, schedule=schedule, **options)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(to_float64(g), to_float64(w))
    assert not computed  # the schedule came from decode_schedule
    torch_bridge.decode_attention(q, k, v, pt, sl, **options)
    assert computed  # (a call without one computes it)

    with pytest.raises(TypeError, match="what torch_bridge.decode_schedule returns"):
        torch_bridge.decode_attention(q, k, v, pt, sl, schedule=tuple(schedule), **options)
    with pytest.raises(ValueError, match="made for another plan"):
        torch_bridge.decode_attention(q, k, v, pt, sl, schedule=schedule, **dict(options, sm_scale=0.5))
    with pytest.raises(ValueError, match="made from other lengths"):
        torch_bridge.decode_attention(q, k, v, pt, sl.clone(), schedule=schedule, **options)
    sl.add_(0)  # an in-place write, even of the same values
    with pytest.raises(ValueError, match="made from other lengths"):
        torch_bridge.decode_attention(q, k, v, pt, sl, schedule=schedule, **options)
    # A schedule made now serves again.
    fresh = torch_bridge.decode_schedule(q, k, v, pt, sl, **options)
    got = torch_bridge.decode_attention(q, k, v, pt, sl, return_lse=True, schedule=fresh, **options)
    np.testing.assert_array_equal(to_float64(got[0]), to_float64(want[0]))

    # Under torch.compile a call computes its own schedule: the same bits.
    def compiled_call(q, k, v, pt, sl, schedule):
        return torch_bridge.decode_attention(q, k, v, pt, sl, schedule=schedule, **options)

    torch._dynamo.reset()
    got = torch.compile(compiled_call, fullgraph=True, backend="aot_eager")(q, k, v, pt, sl, fresh)
    np.testing.assert_array_equal(to_float64(got), to_float64(want[0]))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="what torch_bridge.decode_schedule returns"):  # (inside torch's Unsupported)
        torch.compile(compiled_call, fullgraph=True, backend="aot_eager")(q, k, v, pt, sl, (1, 2))
    torch._dynamo.reset()

    # Lengths made under inference mode (serving code's): torch keeps no version of them,
    # so only their identity is checked.
    with torch.inference_mode():
        lens = sl.clone()
        schedule = torch_bridge.decode_schedule(q, k, v, pt, lens, **options)
        got = torch_bridge.decode_attention(q, k, v, pt, lens, schedule=schedule, **options)
    assert schedule.version is None
    np.testing.assert_array_equal(to_float64(got), to_float64(want[0]))


def test_a_schedule_without_a_device_schedule_holds_no_tensor():
    """Where the plan has fixed splits (here: the interpreter or one row) decode_schedule
    returns a schedule with no tensor, which the calls take like any other."""
    problem = CASES["gqa_bf16"].problem()
    tensors = [to_tensor(a, DEVICE) for a in problem.arrays]
    schedule = torch_bridge.decode_schedule(*tensors, num_kv_splits=2)
    assert schedule.tensor is None and not schedule.config.schedule_programs
    np.testing.assert_array_equal(
        to_float64(torch_bridge.decode_attention(*tensors, num_kv_splits=2, schedule=schedule)),
        to_float64(torch_bridge.decode_attention(*tensors, num_kv_splits=2)),
    )


H200 = DeviceInfo("nvidia", 90, 132)
ASKED = dict(portable_schedule=True)  # (the planner's default leaves the portable stage 1 unscheduled)


def _gqa(batch: int, context: int, q_len: int = 1, **kwargs) -> DecodeProblem:
    fields = dict(
        batch=batch, num_heads=28, num_kv_heads=4, head_dim_qk=128, head_dim_v=128, num_pages=batch * context // 16,
        page_size=16, max_pages=context // 16, dtype="bfloat16", sm_scale=0.088, logit_cap=0.0, v_from_k=False,
        q_len=q_len,
    )  # fmt: skip
    fields.update(kwargs)
    return DecodeProblem(**fields)


def test_the_planner_schedules_where_the_splits_hedge():
    """On an NVIDIA GPU, where the planner would pick more than one split for a batch
    of several rows (a hedge between uniform and long-tailed lengths), it plans one wave
    of scheduled programs instead; never for one row, one split, explicit splits or the
    interpreter."""
    for batch, context, q_len in ((16, 8192, 1), (16, 8192, 4), (64, 4096, 1)):
        config = make_launch_config(_gqa(batch, context, q_len), H200, **ASKED)
        assert config.portable_scheduled, (batch, context, q_len)
        assert not make_launch_config(_gqa(batch, context, q_len), H200).schedule_programs  # (off by default)
        assert config.num_kv_splits > 1  # the fixed splits it replaces (and stands on where it cannot run)
        assert config.stage1_grid == (4, config.schedule_programs, 1)
        assert 0.9 * 132 * 3 / 4 <= config.schedule_programs <= 132 * 4 / 4  # one wave at 3-4 programs per SM
        assert config.mid_o_shape == (batch + config.schedule_programs, *([q_len] if q_len > 1 else []), 28, 128)
    assert not make_launch_config(_gqa(1, 32768), H200, **ASKED).schedule_programs  # one row: no tail to balance
    assert not make_launch_config(_gqa(16, 8192), H200, 8, **ASKED).schedule_programs  # explicit splits
    assert not make_launch_config(_gqa(16, 8192), H200, device_schedule=False, **ASKED).schedule_programs
    assert not make_launch_config(_gqa(16, 8192), DeviceInfo.interpreter(), **ASKED).schedule_programs
    short = make_launch_config(_gqa(256, 256), H200, **ASKED)
    assert short.num_kv_splits == 1 and not short.schedule_programs  # one split writes out itself


def test_the_planner_schedules_where_the_model_finds_the_hedge_dearer():
    """The rule itself: scheduled exactly where the cost model finds the fixed splits'
    hedge further from the best than the schedule's extra launch (short calls keep
    their fixed splits: the launch would cost more than the hedge)."""
    from jax_decode.launch.planner import program_shape, split_hedge

    seen = set()
    for batch, context, heads, kv_heads, head_dim in ((16, 8192, 28, 4, 128), (8, 8192, 8, 1, 256),
                                                      (64, 4096, 32, 8, 128), (2, 2048, 32, 8, 128)):  # fmt: skip
        problem = _gqa(batch, context, num_heads=heads, num_kv_heads=kv_heads, head_dim_qk=head_dim,
                       head_dim_v=head_dim)  # fmt: skip
        config = make_launch_config(problem, H200, **ASKED)
        c = config
        program = program_shape(problem, H200, c.block_h, c.block_n, c.num_warps, c.num_stages, c.block_dmodel,
                                c.block_dpe, c.block_dv)  # fmt: skip
        splits, hedge, schedule = split_hedge(problem, H200, program, kv_heads * c.head_blocks, c.block_n)
        assert config.num_kv_splits == splits
        assert bool(config.schedule_programs) == (splits > 1 and schedule < hedge)
        seen.add(bool(config.schedule_programs))
    assert seen == {True, False}  # both sides of the rule
