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

COLUMNS = ("torch_bridge", "jax_decode", "best split", "vllm", "flashmla")
HEADINGS = dict(zip(COLUMNS, ("torch_bridge", "jax_decode", "best split", "vLLM 0.9 best", "FlashMLA"), strict=True))


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


def multi_token_markdown(results: list[dict]) -> str:
    """The multi-token suite: each workload at one query token per row and at q_len,
    torch_bridge's times, q_len's time over one token's and over q_len one-token calls,
    and FlashMLA (``s_q = q_len``) where it ran."""
    head = ["row", "1 token µs", "q_len", "q_len tokens µs", "÷ 1 token", "÷ q_len one-token calls",
            "FLOP rate ÷ 1 token", "FlashMLA 1 / q_len µs"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by_shape: dict[tuple, dict[int, dict]] = {}
    for r in results:
        row = r["row"]
        by_shape.setdefault((row["name"], row["batch"], row["context"]), {})[row["q_len"]] = r
    for (name, batch, context), runs in by_shape.items():
        one, q_len = runs.get(1), max(runs)
        many = runs[q_len]
        if one is None or q_len == 1:
            continue
        t1, tq = (x["impls"]["torch_bridge"]["ms"] * 1e3 for x in (one, many))
        flash = [x["impls"].get("flashmla", {}).get("ms") for x in (one, many)]
        flash_cell = " / ".join(f"{m * 1e3:.1f}" for m in flash) if all(flash) else "–"
        cells = [f"{name} b{batch} ctx{context}", f"{t1:.1f}", str(q_len), f"{tq:.1f}", f"{tq / t1:.2f}",
                 f"{tq / (q_len * t1):.2f}", f"{q_len * t1 / tq:.2f}", flash_cell]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
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
        if any(r["suite"] == "multi" for r in results):
            print(multi_token_markdown([r for r in results if r["suite"] == "multi"]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
