"""benchmarks/sharded.py on host CPU devices (tests/conftest.py sets 8): each mode's
checks on tiny shapes with the xla backend, the HLO collective parser, and the command
line end to end.  The times here are host times and are not judged, only computed."""

from __future__ import annotations

import json
import os

import jax
import pytest

from benchmarks import sharded, timing

pytestmark = pytest.mark.skipif(
    len(jax.devices("cpu")) < 4, reason="needs 4 host devices (tests/conftest.py sets them)"
)

# Rows of 61 tokens (not a multiple of the page), 4 KV heads (2 query heads each).
TINY = sharded.Shape(batch=4, num_heads=8, num_kv_heads=4, head_dim=16, context=61, page_size=4)
TINY_FLAGS = ["--batch", "4", "--heads", "8", "--kv-heads", "4", "--head-dim", "16", "--context", "61",
              "--page-size", "4"]  # fmt: skip


@pytest.fixture
def quick_timing(monkeypatch):
    """A few calls per timing: the host's times are not what is tested."""
    monkeypatch.setattr(timing, "CALLS_PER_TIMING", 3)
    monkeypatch.setattr(timing, "ROUNDS", 2)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("mode", sharded.MODES)
def test_each_mode_matches_one_device_and_moves_no_cache(mode, n, quick_timing):
    r = sharded.bench_mode(mode, TINY, jax.devices("cpu")[:n], backend="xla", device_time=False)
    assert r["wrong"] is None, r["wrong"]
    assert r["oracle_excess"] <= 0 and r["out_excess"] <= 0 and r["lse_excess"] <= 0
    assert r["efficiency"] == pytest.approx(r["one_device_ms"] / (n * r["sharded_ms"])) and r["efficiency"] > 0
    assert not r["cache_moved"]
    assert all(max(c["operand_bytes"], c["result_bytes"]) < r["cache_bytes_per_device"] for c in r["collectives"])
    if mode == "pages":
        # The LSE merge: a max of lse, then sums of the weights and of the weighted out,
        # all float32 [batch, heads(, head_dim_v)]: exactly the README's estimate.
        assert r["collectives"] and {c["op"] for c in r["collectives"]} == {"all-reduce"}
        moved = {a for c in r["collectives"] for a in c["operands"]}
        assert moved == {"f32[4,8]", "f32[4,8,16]"}
        assert r["collective_bytes"] == r["readme_merge_bytes"] == 4 * 4 * 8 * (16 + 2)
    else:
        assert r["collectives"] == []  # README: none per call
        assert r["out_max_abs_diff"] == 0.0  # xla computes a row's head alike on a shard


def test_a_collective_as_large_as_a_cache_share_is_caught():
    """Typed and untyped operands, async starts (their -done not counted twice)."""
    hlo = """
  %p.1 = bf16[16,4,4,16]{3,2,1,0} parameter(1)
  %fusion.3 = f32[4,8]{1,0} fusion(%p.1), kind=kLoop, calls=%fused
  %all-reduce = f32[4,8]{1,0} all-reduce(%fusion.3), channel_id=1, replica_groups={{0,1}}, to_apply=%add
  %all-gather-start = (bf16[16,4,4,16]{3,2,1,0}, bf16[64,4,4,16]{3,2,1,0}) all-gather-start(bf16[16,4,4,16]{3,2,1,0} %p.1), dimensions={0}
  %all-gather-done = bf16[64,4,4,16]{3,2,1,0} all-gather-done(%all-gather-start)
"""  # noqa: E501
    found = sharded.collectives(hlo)
    assert [(c["op"], c["operand_bytes"]) for c in found] == [("all-reduce", 128), ("all-gather", 8192)]
    assert found[1]["result_bytes"] == 8192 + 32768
    assert sharded.moving_a_cache(found, 8192) == [found[1]]
    assert sharded.moving_a_cache(found, 8193 + 32768) == []


@pytest.mark.parametrize(
    "mode, shape, devices, match",
    [
        ("heads", TINY, 8, r"heads: num_kv_heads \(4\) must be a multiple of the device count \(8\)"),
        ("batch", TINY, 8, r"batch: batch \(4\) must be a multiple of the device count \(8\)"),
        ("pages", TINY, 1, r"at least 2 devices, got 1; on a CPU, set XLA_FLAGS"),
        ("rows", TINY, 2, r"mode must be one of \('heads', 'pages', 'batch'\), got 'rows'"),
    ],
)
def test_splits_the_rules_would_not_make_are_refused(mode, shape, devices, match):
    with pytest.raises(ValueError, match=match):
        sharded.check_fits(mode, shape, devices)


@pytest.mark.parametrize("context", [1, 61, 64, 1000])
def test_the_cache_has_a_page_count_every_device_count_splits(context):
    """The spare pages round num_pages up to a multiple of the device count (make_problem's
    caches, which the pages mode's tests above shard)."""
    shape = sharded.Shape(batch=3, num_heads=8, num_kv_heads=4, head_dim=16, context=context, page_size=16)
    for n in range(2, 9):
        spare = sharded.spare_pages(shape, n)
        assert spare >= n and (3 * -(-context // 16) + spare) % n == 0


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the command line picks jax.devices(): here not the CPU's")
def test_the_command_line_prints_the_table_and_writes_json(tmp_path, capsys, quick_timing):
    out, profile = tmp_path / "sharded.json", tmp_path / "profile"
    code = sharded.main(["--devices", "2", *TINY_FLAGS, "--out", str(out), "--profile", str(profile)])
    printed = capsys.readouterr().out
    assert code == 0
    assert "| mode | shape | devices |" in printed and printed.count("| ok |") == 3
    assert "README's estimate of the merge" in printed and "the HLO's collectives move 2.3 kB (2304 B)" in printed
    written = json.loads(out.read_text())
    env = written["environment"]
    assert env["device_count"] == 2 and env["platform"] == "cpu" and env["backend"] == "xla"
    assert env["jax"] == jax.__version__ and "jaxlib" in env and "triton" in env and env["timing"].startswith("wall")
    assert [r["mode"] for r in written["results"]] == list(sharded.MODES)
    assert all(r["efficiency"] > 0 for r in written["results"])
    for mode in sharded.MODES:  # a trace per mode
        assert any(files for _, _, files in os.walk(profile / mode))


def test_the_interpret_backend_is_refused_with_the_reason(capsys):
    with pytest.raises(SystemExit):
        sharded.main(["--backend", "interpret", "--devices", "2"])
    assert "host callback, which JAX cannot partition" in capsys.readouterr().err
