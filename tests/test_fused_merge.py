"""The fused merge: stage 1's last split per row merges, with no stage-2 kernel.

It must give the same bits as the stage-2 kernel (same maths, other program), count
every split of every row exactly once, and touch no counter outside its own row.
On a CPU-only machine the kernels run in Triton's interpreter, on a GPU compiled.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from cases import GQA4, MHA, MLA, Case
from conftest import HAS_GPU
from torch_support import to_tensor

from jax_decode.launch import make_launch_config
from jax_decode.torch_launch import launch_decode
from jax_decode.validation import check_decode_args
from torch_bridge.ops import device_info

DEVICE = "cuda" if HAS_GPU else "cpu"
CASES = [
    dataclasses.replace(MHA, num_kv_splits=3),
    dataclasses.replace(GQA4, num_kv_splits=3, sinks=True),
    dataclasses.replace(MLA, num_kv_splits=5),
    dataclasses.replace(GQA4, num_kv_splits=1),
    dataclasses.replace(GQA4, num_kv_splits=None, window_left=7),
]


def _launch(case: Case, fused: bool, counters=None):
    """(out, lse) of one launch of ``case`` with the merge fused or as its own kernel."""
    problem = case.problem()
    t = {name: to_tensor(getattr(problem, name), DEVICE) for name in ("q", "k_cache", "v_cache", "page_table",
                                                                      "seq_lens", "k_scale", "v_scale", "sinks")}  # fmt: skip
    decode = check_decode_args(
        q_shape=t["q"].shape, q_dtype=t["q"].dtype, k_shape=t["k_cache"].shape, k_dtype=t["k_cache"].dtype,
        v_shape=None if case.mla else t["v_cache"].shape, v_dtype=None if case.mla else t["v_cache"].dtype,
        page_table_shape=t["page_table"].shape, page_table_dtype=t["page_table"].dtype,
        seq_lens_shape=t["seq_lens"].shape, seq_lens_dtype=t["seq_lens"].dtype,
        head_dim_v=problem.head_dim_v if case.mla else None, sm_scale=None, logit_cap=case.logit_cap,
        k_scale=None, v_scale=None, sinks=None if t["sinks"] is None else ((case.num_heads,), "float32"),
        window_left=-1 if case.window_left is None else case.window_left,
    )  # fmt: skip
    config = dataclasses.replace(
        make_launch_config(decode, device_info(t["q"].device), case.num_kv_splits), fused_merge=fused
    )
    q = t["q"]
    p = config.problem
    out = torch.full((p.batch, p.num_heads, p.head_dim_v), float("nan"), dtype=q.dtype, device=q.device)
    lse = torch.full((p.batch, p.num_heads), float("nan"), device=q.device)
    mid_o = torch.empty(config.mid_o_shape, device=q.device)
    mid_lse = torch.empty(config.mid_lse_shape, device=q.device)
    v = t["k_cache"] if case.mla else t["v_cache"]
    launch_decode(
        config, q, t["k_cache"], v, t["page_table"], t["seq_lens"], mid_o, mid_lse, out, lse,
        sinks=t["sinks"], counters=counters, interpret=not HAS_GPU,
    )  # fmt: skip
    return config, out, lse


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_fused_merge_gives_the_stage2_kernels_bits(case: Case):
    _, fused_out, fused_lse = _launch(case, fused=True)
    _, out, lse = _launch(case, fused=False)
    assert not fused_out.isnan().any()  # every row was merged (the outputs start as NaN)
    assert torch.equal(fused_out.view(torch.int16 if out.element_size() == 2 else torch.int32),
                       out.view(torch.int16 if out.element_size() == 2 else torch.int32))  # fmt: skip
    assert torch.equal(fused_lse, lse)


@pytest.mark.parametrize("case", CASES[:3], ids=lambda c: c.id)
def test_every_split_is_counted_once_in_its_own_row(case: Case):
    config, _, _ = _launch(case, fused=True)
    rows = config.counters_shape[0] * config.counters_shape[1]
    guarded = torch.zeros(rows + 64, dtype=torch.int32, device=DEVICE)
    _launch(case, fused=True, counters=guarded[32 : 32 + rows].view(config.counters_shape))
    assert (guarded[32 : 32 + rows] == config.num_kv_splits).all()
    assert (guarded[:32] == 0).all() and (guarded[32 + rows :] == 0).all()
