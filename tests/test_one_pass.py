"""With one KV split, stage 1 writes ``out`` and ``lse`` itself and stage 2 is not
launched: stage 2's merge of one split is the identity (weight exp(0) = 1, denominator
1, LSE + log 1), so the one-pass result must equal the two-stage one bit for bit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from cases import GQA4, MHA, MLA, MQA
from conftest import HAS_GPU, needs_interpreter
from torch_support import to_tensor

from jax_decode.launch import make_launch_config
from jax_decode.operands import DecodeOperands, stage1_inputs, stage2_inputs
from jax_decode.prepare import DecodeOptions, prepare_decode
from torch_bridge.launcher import StageLauncher, kernel_strides, launch_decode, scratch
from torch_bridge.ops import TORCH, device_info

DEVICE = "cuda" if HAS_GPU else "cpu"
pytestmark = [] if HAS_GPU else [needs_interpreter]

CASES = {
    "mha_f32": MHA,
    "gqa_bf16": dataclasses.replace(GQA4, dtype="bfloat16"),
    "mqa_f16_cap": dataclasses.replace(MQA, dtype="float16", logit_cap=20.0),
    "gqa_e4m3_head_scales": dataclasses.replace(GQA4, dtype="bfloat16", kv_dtype="float8_e4m3fn", kv_scales="head"),
    "gqa_window_qlen2": dataclasses.replace(GQA4, dtype="bfloat16", window_left=9, q_len=2),
    "mla_bf16": dataclasses.replace(MLA, dtype="bfloat16", max_pages=12),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_one_pass_equals_two_stages_bitwise(case):
    problem = case.problem()
    arrays = [to_tensor(a, DEVICE) for a in problem.arrays]
    extras = {name: to_tensor(a, DEVICE) for name, a in problem.extras.items()}
    given = DecodeOperands(*arrays, k_scale=extras.get("k_scale"), v_scale=extras.get("v_scale"))
    head_dim_v = problem.head_dim_v if problem.v_cache is None else None
    options = DecodeOptions(head_dim_v, None, case.logit_cap, case.window_left, 1)
    decode, ops = prepare_decode(given, options, TORCH)
    config = make_launch_config(decode, device_info(ops.q.device), 1)
    assert config.one_pass

    def outputs():
        out = torch.full(decode.out_shape, float("nan"), dtype=ops.q.dtype, device=DEVICE)
        lse = torch.full(decode.lse_shape, float("nan"), dtype=torch.float32, device=DEVICE)
        return out, lse

    one_out, one_lse = outputs()
    launch_decode(config, ops, None, None, one_out, one_lse)

    two_out, two_lse = outputs()
    mid_o, mid_lse = scratch(config, two_out)
    strides = kernel_strides(ops, decode, mid_o, mid_lse, two_out, two_lse)
    StageLauncher(config.stage1(strides, partials=True))((*stage1_inputs(ops, decode), mid_o, mid_lse))
    StageLauncher(config.stage2(strides))((*stage2_inputs(ops, mid_o, mid_lse), two_out, two_lse))

    bits = torch.int16 if one_out.element_size() == 2 else torch.int32
    np.testing.assert_array_equal(one_out.view(bits).cpu().numpy(), two_out.view(bits).cpu().numpy())
    np.testing.assert_array_equal(one_lse.cpu().numpy(), two_lse.cpu().numpy())
    assert not torch.isnan(one_lse).any()


def test_sinks_keep_stage2():
    """Stage 2 adds the sinks to each head's denominator, so a one-split plan with sinks
    still runs it."""
    problem = dataclasses.replace(GQA4, sinks=True).problem()
    arrays = [to_tensor(a, "cpu") for a in problem.arrays]
    given = DecodeOperands(*arrays, sinks=to_tensor(problem.extras["sinks"]))
    decode, _ = prepare_decode(given, DecodeOptions(None, None, 0.0, None, 1), TORCH)
    assert not make_launch_config(decode, device_info(torch.device("cpu")), 1).one_pass


@pytest.mark.parametrize("case", [MHA, MQA], ids=["mha", "mqa"])
def test_an_out_sharing_memory_with_q_takes_two_stages(case):
    """One pass writes out while other programs still read q: an out that shares q's
    memory (here each row's output lies on the next row's query) must see q as it was."""
    import torch_bridge
    from jax_decode.reference import decode_attention_reference

    problem = case.problem()
    q, k, v, pt, sl = (to_tensor(a, DEVICE) for a in problem.arrays)
    batch, heads, dim = q.shape
    buffer = torch.zeros((batch + 1) * heads * dim, dtype=q.dtype, device=DEVICE)
    shared_q = buffer[: batch * heads * dim].view(q.shape).copy_(q)
    out = buffer[heads * dim :].view(q.shape)
    expected, _ = decode_attention_reference(*problem.arrays)
    torch_bridge.decode_attention(shared_q, k, v, pt, sl, num_kv_splits=1, out=out)
    np.testing.assert_allclose(out.double().cpu().numpy(), expected, atol=2e-5, rtol=2e-5)
