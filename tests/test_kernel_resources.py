"""benchmarks/kernel_resources.py compiles stage 1 for sm_90 on the CPU and reports it."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "kernel_resources.py"
spec = importlib.util.spec_from_file_location("kernel_resources", SCRIPT)
kernel_resources = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kernel_resources)

if not kernel_resources.tools_available():
    pytest.skip("this Triton install has no bundled ptxas / nvdisasm / cuobjdump", allow_module_level=True)


def test_grouped_kernel_report_matches_its_launch_config():
    dims = (2, 8, 2, 64, 64, 256, 16, False)  # batch, heads, kv heads, dqk, dv, context, page, mla
    report = kernel_resources.kernel_resources(kernel_resources._problem(dims, "bfloat16", None), 90)
    assert (report["variant"], report["block_h"], report["num_warps"]) == ("grouped", 16, 4)
    assert 0 < report["registers"] <= 255 and report["shared_bytes"] > 0
    assert report["programs_per_sm_by_registers"] >= 1 and report["programs_per_sm_by_shared"] >= 1
    opcodes = dict(report["top_opcodes"])
    assert report["loop_instructions_per_warp"] > 0 and "HMMA" in opcodes  # tl.dot on the tensor cores


def test_fp8_cache_report_shows_the_widening():
    dims = (2, 8, 2, 64, 64, 256, 16, False)
    report = kernel_resources.kernel_resources(kernel_resources._problem(dims, "bfloat16", "float8_e4m3fn"), 90)
    assert report["block_n"] == 128  # fp8 tiles: twice the tokens
    assert "F2FP" in dict(report["top_opcodes"])  # fp8 -> f16 conversions in the loop
