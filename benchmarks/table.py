"""``python -m benchmarks.table BENCH_JSON``: a benchmark run as a Markdown table.

One row per benchmark row: the roofline, then each implementation's device time and %
of the roofline (vLLM with the split count it was best at), and torch_bridge's time
over vLLM's where both ran; a last row of geometric means.  docs/performance.md's
tables are this command's output on the checked-in runs (tests/test_bench.py holds
them to it).
"""

from __future__ import annotations

import argparse
import json
import math
import sys

COLUMNS = ("torch_bridge", "jax_decode", "best split", "vllm")
HEADINGS = dict(zip(COLUMNS, ("torch_bridge", "jax_decode", "best split", "vLLM 0.9 best"), strict=True))


def _cell(measured: dict | None) -> str:
    if measured is None:
        return "–"
    if not measured.get("ms"):
        return measured.get("note") or "–"
    splits = f" ({measured['splits']} splits)" if measured.get("splits") else ""
    return f"{measured['ms'] * 1e3:.1f} · {measured['pct_roofline']:.0f}%{splits}"


def _geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def markdown(results: list[dict]) -> str:
    """The Markdown table of a run's rows (the columns any row has, in COLUMNS order)."""
    columns = [c for c in COLUMNS if any(r["impls"].get(c, {}).get("ms") for r in results)]
    head = ["row", "roofline µs (bound)"] + [HEADINGS[c] + " µs · %" for c in columns] + ["torch_bridge / vLLM"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ratios = []
    for r in results:
        bound = "FLOPs" if r["compute_bound"] else "bytes"
        torch_ms, vllm_ms = (r["impls"].get(c, {}).get("ms") for c in ("torch_bridge", "vllm"))
        ratio = "–"
        if torch_ms and vllm_ms:
            ratios.append(torch_ms / vllm_ms)
            ratio = f"{torch_ms / vllm_ms:.3f}"
        cells = [r["label"], f"{r['roofline_ms'] * 1e3:.1f} ({bound})"] + [_cell(r["impls"].get(c)) for c in columns]
        lines.append("| " + " | ".join(cells + [ratio]) + " |")
    means = []
    for c in columns:
        values = [r["impls"][c]["pct_roofline"] for r in results if r["impls"].get(c, {}).get("ms")]
        means.append(f"**{_geomean(values):.1f}%** ({len(values)} rows)")
    no_slower = sum(x <= 1.0 for x in ratios)
    summary = f"no slower on {no_slower} of {len(ratios)}; worst {max(ratios):.3f}" if ratios else "–"
    lines.append("| " + " | ".join(["**geometric mean**", ""] + means + [summary]) + " |")
    # vLLM runs only some rows (no fp8 caches, windows or sinks): compare on those alone.
    both = [r for r in results if all(r["impls"].get(c, {}).get("ms") for c in columns)]
    if ratios and len(both) < len(results):
        same = [f"{_geomean([r['impls'][c]['pct_roofline'] for r in both]):.1f}%" for c in columns]
        lines.append("| " + " | ".join(["geometric mean, rows every column ran", ""] + same + [""]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.table", description=__doc__.split("\n\n")[0])
    parser.add_argument("bench_json", nargs="+", help="bench.json files written by benchmarks.bench")
    parser.add_argument("--suite", help="only the rows of this suite (core, models)")
    args = parser.parse_args(argv)
    for path in args.bench_json:
        with open(path) as f:
            run = json.load(f)
        results = [r for r in run["results"] if not args.suite or r["suite"] == args.suite]
        env, ceilings = run["environment"], run["ceilings"]
        print(f"{path}: {env['gpu']}, {env['date']}; copy {ceilings['copy_tbps']:.2f} TB/s, "
              f"bf16 matmul {ceilings['matmul_tflops']:.0f} TFLOP/s\n")  # fmt: skip
        print(markdown(results) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
