"""``python -m benchmarks.replan BENCH_JSON``: the current launch planner against a
measured split sweep, without a GPU.

A ``bench.json`` whose rows carry the ``best split`` column holds, per row, the device
time of the same kernels at every split count of the sweep.  For each row this prints
the split count the planner chooses now, its time read from that sweep, the best split,
and vLLM's best where it ran -- so a change to the planner or its cost model is judged
on measured times of every row, not only on the shapes it was tuned on.  With
``--chart PATH`` it also draws the % of roofline of the three.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from benchmarks.kernel_resources import row_problem
from benchmarks.suites import Row
from jax_decode.launch import DeviceInfo, make_launch_config

H200 = DeviceInfo(vendor="nvidia", compute_capability=90, num_sms=132)


def replan(results: list[dict], device: DeviceInfo = H200) -> list[dict]:
    """Per row: the chosen split count and its measured time (ms), the best split, vLLM's best."""
    rows = []
    for result in results:
        by_split = {int(k): v for k, v in result["impls"]["best split"]["by_split"].items()}
        chosen = make_launch_config(row_problem(Row(**result["row"])), device).num_kv_splits
        if chosen not in by_split:
            raise ValueError(f"{result['label']}: the planner chose {chosen} splits, which the sweep did not time")
        best = min(by_split, key=by_split.get)
        vllm = result["impls"].get("vllm", {})
        rows.append(dict(label=result["label"], roofline_ms=result["roofline_ms"], bound="FLOPs" if
                         result["compute_bound"] else "bytes", chosen=chosen, chosen_ms=by_split[chosen],
                         best=best, best_ms=by_split[best], vllm_ms=vllm.get("ms"),
                         vllm_note=vllm.get("note", "")))  # fmt: skip
    return rows


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def markdown(rows: list[dict]) -> str:
    def cell(ms: float, roofline: float) -> str:
        return f"{ms * 1e3:.1f} · {100 * roofline / ms:.0f}%"

    header = "| row | roofline µs (bound) | chosen splits: µs · % | best split: µs · % | chosen / best | vLLM 0.9 |"
    lines = [header, "|---|---|---|---|---|---|"]
    for r in rows:
        vllm = cell(r["vllm_ms"], r["roofline_ms"]) if r["vllm_ms"] else (r["vllm_note"] or "not run")
        lines.append(f"| {r['label']} | {r['roofline_ms'] * 1e3:.1f} ({r['bound']}) | {r['chosen']}: "
                     f"{cell(r['chosen_ms'], r['roofline_ms'])} | {r['best']}: {cell(r['best_ms'], r['roofline_ms'])} "
                     f"| {r['chosen_ms'] / r['best_ms']:.3f} | {vllm} |")  # fmt: skip
    ratios = [r["chosen_ms"] / r["best_ms"] for r in rows]
    with_vllm = [r for r in rows if r["vllm_ms"]]
    lines.append(
        f"| **geometric mean** | | **{100 * _geomean([r['roofline_ms'] / r['chosen_ms'] for r in rows]):.1f}%** "
        f"| {100 * _geomean([r['roofline_ms'] / r['best_ms'] for r in rows]):.1f}% | {_geomean(ratios):.3f} "
        f"(worst {max(ratios):.3f}; {sum(x <= 1.05 for x in ratios)} of {len(rows)} within 5%) | "
        + (
            f"chosen no slower on {sum(r['chosen_ms'] <= r['vllm_ms'] for r in with_vllm)} of {len(with_vllm)} |"
            if with_vllm
            else "|"
        )  # fmt: skip
    )
    return "\n".join(lines)


def chart(rows: list[dict], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {"chosen": "chosen_ms", "best split": "best_ms", "vLLM 0.9 best": "vllm_ms"}
    fig, ax = plt.subplots(figsize=(max(10, 0.5 * len(rows)), 6))
    width = 0.8 / len(series)
    for i, (name, key) in enumerate(series.items()):
        values = [100 * r["roofline_ms"] / r[key] if r[key] else 0 for r in rows]
        ax.bar([x + i * width for x in range(len(rows))], values, width, label=name)
    ax.axhline(100, color="black", linewidth=0.8)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(rows))])
    ax.set_xticklabels([r["label"] for r in rows], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("% of roofline (max of bytes / copy rate, FLOPs / matmul rate)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.replan", description=__doc__.split("\n\n")[0])
    parser.add_argument("bench_json", nargs="+", help="bench.json files with a 'best split' column")
    parser.add_argument("--chart", help="write a bar chart here")
    args = parser.parse_args(argv)
    results, environments = [], []
    for path in args.bench_json:
        with open(path) as f:
            data = json.load(f)
        results += [r for r in data["results"] if "by_split" in r["impls"].get("best split", {})]
        environments.append(data["environment"])
    rows = replan(results)
    print(f"measured: {environments[0]}\n\n{markdown(rows)}")
    if args.chart:
        chart(rows, args.chart, "The planner's choice, the best split and vLLM 0.9 (device time)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
