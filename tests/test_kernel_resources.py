"""benchmarks/kernel_resources.py compiles stage 1 for sm_90 on the CPU and reports it."""

from __future__ import annotations

import pytest

from benchmarks import kernel_resources
from benchmarks.suites import Row

if not kernel_resources.tools_available():
    pytest.skip("this Triton install has no bundled ptxas / nvdisasm / cuobjdump", allow_module_level=True)

SMALL_GQA = Row("GQA 8/2", batch=2, num_heads=8, num_kv_heads=2, head_dim_qk=64, head_dim_v=64, context=256,
                page_size=16)  # fmt: skip


def test_grouped_kernel_report_matches_its_launch_config():
    report = kernel_resources.kernel_resources(kernel_resources.row_problem(SMALL_GQA), 90)
    assert (report["variant"], report["block_h"], report["num_warps"]) == ("grouped", 16, 4)
    assert 0 < report["registers"] <= 255 and report["shared_bytes"] > 0
    assert report["programs_per_sm_by_registers"] >= 1 and report["programs_per_sm_by_shared"] >= 1
    assert report["loop_instructions_per_warp"] > 0 and report["opcodes"].get("HMMA", 0) > 0  # tl.dot on tensor cores


def test_fp8_cache_report_shows_the_widening():
    import dataclasses

    fp8 = dataclasses.replace(SMALL_GQA, kv_dtype="float8_e4m3fn")
    report = kernel_resources.kernel_resources(kernel_resources.row_problem(fp8), 90)
    assert report["block_n"] == 128  # fp8 tiles: twice the tokens
    assert report["opcodes"].get("F2FP", 0) > 0  # fp8 -> f16 conversions in the loop


@pytest.mark.parametrize("window", [None, 63], ids=["plain", "window"])
def test_the_scheduled_kernel_keeps_the_fixed_splits_registers(window):
    """Under the device-side schedule stage 1 loops over rows around the tile loop; the
    body it calls is a function of its own, so what the compiler would hoist out of the
    row loop does not stay live across the tile loop: registers (hence programs per SM,
    hence the planner's wave) as with fixed splits.  (Inlined, GQA d128 took 148 against 118.)"""
    import dataclasses

    from jax_decode.launch import DeviceInfo, make_launch_config

    row = dataclasses.replace(SMALL_GQA, head_dim_qk=128, head_dim_v=128, context=4096, window_left=window)
    fixed = make_launch_config(kernel_resources.row_problem(row), DeviceInfo("nvidia", 90, 132), 4)
    scheduled = dataclasses.replace(fixed, schedule_programs=8)
    assert scheduled.portable_scheduled and not fixed.schedule_programs
    fixed_report, scheduled_report = map(kernel_resources.config_resources, (fixed, scheduled))
    assert scheduled_report["spilled_bytes"] == 0
    assert scheduled_report["registers"] <= fixed_report["registers"] + (8 if window is None else 24)
