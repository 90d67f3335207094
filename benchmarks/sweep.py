"""Launch-parameter sweep on the GPU: the data behind the launch planner's model.

For each chosen benchmark row: the planner's launch, then launches with some of its
parameters replaced (``--splits``, ``--grid`` of block_h / block_n / warps / stages),
each checked against the float64 oracle and timed in device time (a CUDA graph of the
torch launch).  Writes every measurement to a JSON file; not a user benchmark (that is
``python -m benchmarks.bench``).

    python -m benchmarks.sweep out.json --rows "DeepSeek-V3 DP b64" --splits 1,2,4 \\
        --grid block_h=64,block_n=32,num_warps=8,num_stages=2 block_h=64,block_n=64,num_warps=8,num_stages=1
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

from benchmarks.bench import _launch_config, _oracle, _problems
from benchmarks.suites import SUITES


def parse_override(text: str) -> dict:
    """``block_h=64,num_warps=8`` -> {"block_h": 64, "num_warps": 8}."""
    return {key: int(value) for key, value in (item.split("=") for item in text.split(",") if item)}


def run_config(config, problems, device_time: bool = True) -> tuple[float, object]:
    """ms per call of ``config`` launched on the problems (rotated), and its output on the first."""
    import torch

    from benchmarks import timing
    from jax_decode.operands import DecodeOperands
    from torch_bridge.launcher import launch_decode

    p = config.problem
    out = torch.empty(p.batch, p.num_heads, p.head_dim_v, device="cuda", dtype=problems[0].q.dtype)
    lse = torch.empty(p.batch, p.num_heads, device="cuda")
    mid_o = torch.empty(config.mid_o_shape, device="cuda")
    mid_lse = torch.empty(config.mid_lse_shape, device="cuda")

    def run(problem):
        extras = problem.extras
        ops = DecodeOperands(*problem.arrays, extras.get("k_scale"), extras.get("v_scale"), extras.get("sinks"))
        launch_decode(config, ops, mid_o, mid_lse, out, lse)
        return out

    first = run(problems[0]).clone()
    return timing.time_torch(run, problems, device_time, rep_ms=40), first


def main() -> None:
    import torch

    from benchmarks import timing
    from jax_decode.reference import tolerance_excess

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="JSON file for every measurement")
    parser.add_argument("--suite", default="models", choices=list(SUITES))
    parser.add_argument("--rows", nargs="*", help="rows whose label contains one of these (default: all)")
    parser.add_argument("--splits", default="", help="comma-separated split counts to try at the planner's blocks")
    parser.add_argument("--grid", nargs="*", default=[], help="overrides, each like block_h=64,num_warps=8")
    parser.add_argument("--budget-s", type=float, default=400, help="stop starting new rows after this long")
    args = parser.parse_args()
    rows = [r for r in SUITES[args.suite]() if not args.rows or any(s in r.label for s in args.rows)]
    splits = [int(s) for s in args.splits.split(",") if s]
    started, results = time.time(), []
    for row in rows:
        if time.time() - started > args.budget_s:
            print(f"budget spent: stopping before {row.label}", flush=True)
            break
        problems = _problems(row, timing.input_sets_needed(row.kv_bytes()))
        checked_rows, expected = _oracle(row, problems[0])
        base = _launch_config(row, problems[0])
        candidates = [("planner", base)]
        candidates += [(f"splits={s}", dataclasses.replace(base, num_kv_splits=s)) for s in splits]
        for text in args.grid:
            override = parse_override(text)
            config = dataclasses.replace(base, **override)
            if "block_h" in override:
                config = dataclasses.replace(
                    config, head_blocks=-(-row.num_heads // row.num_kv_heads // config.block_h)
                )
            candidates.append((text, config))
            candidates += [(f"{text},splits={s}", dataclasses.replace(config, num_kv_splits=s)) for s in splits]
        for name, config in candidates:
            try:
                ms, out = run_config(config, problems)
                excess = tolerance_excess(out[checked_rows].float().cpu().numpy(), expected, row.dtype)
                note = "" if excess <= 0 else f"WRONG by {excess:.2g}"
            except Exception as error:  # e.g. out of shared memory
                ms, note = None, f"{type(error).__name__}: {str(error).splitlines()[0][:80]}"
            results.append(dict(row=row.label, candidate=name, ms=ms, note=note, block_h=config.block_h,
                                block_n=config.block_n, num_warps=config.num_warps, num_stages=config.num_stages,
                                splits=config.num_kv_splits, kv_bytes=row.kv_bytes(), flops=row.flops()))  # fmt: skip
            shown = f"{ms * 1e3:9.1f} us" if ms is not None else "        -   "
            print(f"{row.label[:44]:<44} {name[:48]:<48} {shown} {note}", flush=True)
        del problems
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(dict(options=vars(args), results=results), f, indent=1)


if __name__ == "__main__":
    main()
