"""The benchmark's host-side parts (the GPU timing itself runs on the GPU machine only)."""

from __future__ import annotations

import subprocess
import sys

from jax_decode import bench


def test_default_suite_is_the_seed_shapes_plus_fp16_and_page1():
    suite = bench.default_suite()
    labels = [s.label for s in suite]
    assert len(suite) == 8 and len(set(labels)) == 8
    assert labels[6].endswith("float16") and labels[7].endswith("page1")
    mla = next(s for s in suite if s.mla)
    assert mla.kv_bytes() == 64 * 4096 * 1 * 576 * 2  # the latent is counted once


def test_summary_is_a_geometric_mean_of_percentages():
    rows = [
        dict(shape="a", impl="jax_decode", tbps=2.0),
        dict(shape="b", impl="jax_decode", tbps=8.0),
        dict(shape="a", impl="pallas", ms=None, note="skipped"),
    ]
    summary = bench.summarize(rows, ceiling_tbps=4.0)
    assert summary == {"jax_decode": {"shapes": 2, "geomean_pct": 100.0}}
    table = bench.format_table([dict(shape="a", impl="xla", ms=1.0, tbps=2.0, note="")], 4.0)
    assert "50.0%" in table.splitlines()[1]


def test_cli_lists_shapes_and_refuses_to_time_without_a_gpu():
    listed = subprocess.run([sys.executable, "-m", "jax_decode.bench", "--list", "--dtypes", "float16"],
                            capture_output=True, text=True, check=True)  # fmt: skip
    assert listed.stdout.count("float16") == 7  # page1 and the fp16 copy of the first shape coincide
    bad = subprocess.run([sys.executable, "-m", "jax_decode.bench", "--impls", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown implementations" in bad.stderr
