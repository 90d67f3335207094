"""The benchmark's host-side parts (the GPU timing itself runs on the GPU machine only)."""

from __future__ import annotations

import subprocess
import sys

from jax_decode import bench


def test_default_suite_is_the_seed_shapes_plus_fp16_and_page1_then_features():
    suite = bench.default_suite()
    labels = [s.label for s in suite]
    core = [s for s in suite if not s.feature]
    assert len(core) == 8 and len(set(labels)) == len(suite)
    assert labels[6].endswith("float16") and labels[7].endswith("page1")
    mla = next(s for s in suite if s.mla)
    assert mla.kv_bytes() == 64 * 4096 * 1 * 576 * 2  # the latent is counted once
    fp8 = next(s for s in suite if s.kv_dtype)
    assert fp8.kv_bytes() == suite[0].kv_bytes() // 2  # one byte per element
    window = next(s for s in suite if s.window_left is not None)
    assert window.context == 32768 and window.kv_bytes() == suite[0].kv_bytes()  # only the window is read


def test_summary_is_a_geometric_mean_of_percentages():
    rows = [
        dict(shape="a", impl="jax_decode", tbps=2.0),
        dict(shape="b", impl="jax_decode", tbps=8.0),
        dict(shape="a", impl="pallas", ms=None, note="skipped"),
        dict(shape="c", impl="jax_decode", tbps=0.1, feature=True),  # not in the core geomean
    ]
    summary = bench.summarize(rows, ceiling_tbps=4.0)
    assert summary == {"jax_decode": {"shapes": 2, "geomean_pct": 100.0}}
    table = bench.format_table([dict(shape="a", impl="xla", ms=1.0, tbps=2.0, note="")], 4.0)
    assert "50.0%" in table.splitlines()[1]


def test_cli_lists_shapes_and_refuses_to_time_without_a_gpu():
    listed = subprocess.run([sys.executable, "-m", "jax_decode.bench", "--list", "--dtypes", "float16"],
                            capture_output=True, text=True, check=True)  # fmt: skip
    # Every row re-run in float16, the first shape's float16 row coinciding with itself.
    assert listed.stdout.count("float16") == len(bench.default_suite()) - 1
    bad = subprocess.run([sys.executable, "-m", "jax_decode.bench", "--impls", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown implementations" in bad.stderr


def test_gpu_span_covers_the_kernels_and_not_the_host():
    """The JAX device time is the profiler's kernel span: from the first kernel's start to
    the last kernel's end, gaps between them included, and nothing outside that."""
    import time

    import pytest

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x = torch.randn(4096, 4096, device="cuda")
    x @ x  # warm up cuBLAS
    torch.cuda.synchronize()

    def run():
        y = x @ x
        time.sleep(0.05)  # a host pause between two kernels: a gap inside the span
        torch.cuda.synchronize()
        y @ y
        torch.cuda.synchronize()

    start = time.perf_counter()
    span = bench.gpu_span_ms(run)
    wall = (time.perf_counter() - start) * 1e3
    # The span holds the 50 ms pause between the two matmuls, but not the profiler's
    # setup and teardown around them, which the wall clock does.
    assert 50.0 < span < wall
