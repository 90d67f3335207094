"""What limits a row: reading its cache or the work per byte? The same rows with the cache
token-major inside a page (``[page, token, kv_head, d]``, vLLM's layout: one KV head's
share of a token is ``d`` bytes, the next token's ``num_kv_heads * d`` bytes on) and
head-major (``[page, kv_head, token, d]``, passed as the strided view
``cache.transpose(1, 2)``: a KV head's tokens of a page are contiguous).

    python -m benchmarks.cache_layout --rows "Llama-3.1-8B b64 ctx4096" [--splits 1 4 8]

Two measurements per row and layout, CUDA-graph device time:

* ``torch_bridge.decode_attention`` (the planned launch, or ``--splits``), its output
  checked equal to the token-major call's (same kernel, same values: bitwise);
* a page walk: a kernel that reads exactly the K and V bytes stage 1 reads (its splits'
  bounds, window included), one program per KV head and split in stage 1's grid order
  (KV heads fastest), and only sums them -- the access pattern's own ceiling, with no
  attention arithmetic (stage 1 with several programs per KV head reads a tile once
  per program, the others' reads served by L2); ``--walk`` configs
  ending in ``:1`` read the same bytes as int32 words (no per-element widening).

``--page-sizes`` adds the rows again with other page sizes, ``--layouts`` picks layouts.

Bandwidth is the KV bytes a call must read over its time.
"""

from __future__ import annotations

import argparse
import json

import triton
import triton.language as tl

from jax_decode.kernels.common import row_length, split_bounds


@triton.jit
def _page_walk(
    k_ptr, v_ptr, page_table_ptr, seq_lens_ptr, out_ptr,
    STRIDE_KP, STRIDE_KS, STRIDE_KH, STRIDE_VP, STRIDE_VS, STRIDE_VH, STRIDE_PTB,
    D: tl.constexpr, BLOCK_D: tl.constexpr, PAGE_SIZE: tl.constexpr, CAPACITY: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, WINDOW_LEFT: tl.constexpr,
):  # fmt: skip
    """Sum of one KV head's K and V over one split of one row (grid: kv heads, batch,
    splits), the split's tokens as stage 1 bounds them (its window included)."""
    kv_head = tl.program_id(0).to(tl.int64)
    row = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    start, end = split_bounds(row_length(seq_lens_ptr, row, CAPACITY), split, SPLITS, BLOCK_N, WINDOW_LEFT, 1)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for first in range(start, end, BLOCK_N):
        tokens = first + offs_n
        live = tokens < end
        page = tl.load(page_table_ptr + row * STRIDE_PTB + tokens // PAGE_SIZE, mask=live, other=0).to(tl.int64)
        slot = (tokens % PAGE_SIZE).to(tl.int64)
        k_rows = page * STRIDE_KP + slot * STRIDE_KS + kv_head * STRIDE_KH
        v_rows = page * STRIDE_VP + slot * STRIDE_VS + kv_head * STRIDE_VH
        mask = live[:, None] & mask_d[None, :]
        k = tl.load(k_ptr + k_rows[:, None] + offs_d[None, :], mask=mask, other=0.0)
        v = tl.load(v_ptr + v_rows[:, None] + offs_d[None, :], mask=mask, other=0.0)
        acc += tl.sum(k.to(tl.float32) + v.to(tl.float32), axis=0)
    tl.store(out_ptr + ((row * SPLITS + split) * tl.num_programs(0) + kv_head) * D + offs_d, acc, mask=mask_d)


def head_major(cache):
    """The same values with each page's bytes head-major, as a token-major strided view."""
    return cache.transpose(1, 2).contiguous().transpose(1, 2)


def page_walk(problem, splits: int, block_n: int, num_warps: int, num_stages: int, words: bool = False,
              window_left: int | None = None):  # fmt: skip
    """A function launching the page walk on ``problem`` (torch tensors); with ``words``
    the cache read as int32 words (the same bytes, no per-element conversion: rows whose
    bytes are a multiple of 4)."""
    import torch

    k, v, page_table, seq_lens = problem.k_cache, problem.v_cache, problem.page_table, problem.seq_lens
    if words:
        k, v = k.view(torch.int32), v.view(torch.int32)
    num_kv_heads, d = k.shape[2], k.shape[3]
    batch = page_table.shape[0]
    out = torch.empty(batch * splits * num_kv_heads * d, dtype=torch.float32, device=k.device)

    grid = (num_kv_heads, batch, splits)
    args = (k, v, page_table, seq_lens, out, *k.stride()[:3], *v.stride()[:3], page_table.stride(0))
    options = dict(
        D=d, BLOCK_D=triton.next_power_of_2(d), PAGE_SIZE=k.shape[1], CAPACITY=k.shape[1] * page_table.shape[1],
        BLOCK_N=block_n, SPLITS=splits, WINDOW_LEFT=-1 if window_left is None else window_left,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip

    def call():
        if k.device.type == "cpu":  # Triton's interpreter (the tests)
            from jax_decode.interpreter import run_kernel_interpreted

            run_kernel_interpreted(_page_walk, grid, args, **options)
        else:
            _page_walk[grid](*args, **options)
        return out.view(batch, splits, num_kv_heads, d)

    return call


def main(argv: list[str] | None = None) -> int:
    import dataclasses

    import torch

    import torch_bridge
    from benchmarks import timing
    from benchmarks.bench import _options, _problem_for, environment
    from benchmarks.inputs import TorchArrays
    from benchmarks.suites import SUITES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="+", required=True, help="rows whose label contains one of these")
    parser.add_argument("--splits", type=int, nargs="*", default=[], help="fixed splits besides the planned launch")
    parser.add_argument("--walk", nargs="*", default=["32:4:3", "64:4:3", "128:8:3"],
                        help="page-walk configs BLOCK_N:warps:stages[:1 to read int32 words]")  # fmt: skip
    parser.add_argument("--walk-splits", type=int, default=4)
    parser.add_argument("--page-sizes", type=int, nargs="*", default=[], help="the rows again at these page sizes")
    parser.add_argument("--layouts", nargs="*", default=["token-major", "head-major"])
    parser.add_argument("--json", help="write the records here")
    args = parser.parse_args(argv)

    rows = [r for name in ("core", "models") for r in SUITES[name]() if any(s in r.label for s in args.rows)]
    rows = list({r.label: r for r in rows}.values())
    rows += [dataclasses.replace(r, name=f"{r.name} page{n}", page_size=n) for r in rows for n in args.page_sizes]
    records = []
    print(json.dumps(environment()), flush=True)
    for row in rows:
        if row.mla:  # (one latent cache, no V to walk or lay out)
            print(f"{row.label}: skipped (MLA)", flush=True)
            continue
        problems = [_problem_for(row, TorchArrays("cuda"), 0)]
        kv_bytes = problems[0].kv_bytes(row.window_left)
        # Enough input sets that L2 does not serve them.
        problems += [_problem_for(row, TorchArrays("cuda"), s) for s in range(1, timing.input_sets_needed(kv_bytes))]
        layouts = {
            "token-major": problems,
            "head-major": [
                dataclasses.replace(p, k_cache=head_major(p.k_cache), v_cache=head_major(p.v_cache)) for p in problems
            ],
        }
        layouts = {name: sets for name, sets in layouts.items() if name in args.layouts}
        expected = {}
        options = _options(row)
        for layout, sets in layouts.items():
            for splits in [None, *args.splits]:

                def fn(p, splits=splits, options=options):
                    return torch_bridge.decode_attention(*p.arrays, num_kv_splits=splits, **p.extras, **options)

                got = fn(sets[0])
                same = None
                if splits not in expected:
                    expected[splits] = got
                else:
                    same = bool(torch.equal(got, expected[splits]))
                us = timing.time_torch(fn, sets, device_time=True) * 1e3
                rec = dict(row=row.label, layout=layout, kind="decode_attention", splits=splits, us=round(us, 1),
                           tbps=round(kv_bytes / us / 1e6, 3), bitwise_equal=same)  # fmt: skip
                records.append(rec)
                print(json.dumps(rec), flush=True)
            for config in args.walk:
                block_n, warps, stages, *words = map(int, config.split(":"))
                as_words = bool(words and words[0])
                calls = [
                    page_walk(p, args.walk_splits, block_n, warps, stages, as_words, row.window_left) for p in sets
                ]
                us = timing.time_torch(lambda c: c(), calls, device_time=True) * 1e3
                rec = dict(row=row.label, layout=layout, kind="page_walk", splits=args.walk_splits, config=config,
                           us=round(us, 1), tbps=round(kv_bytes / us / 1e6, 3))  # fmt: skip
                records.append(rec)
                print(json.dumps(rec), flush=True)
        del problems, layouts
        torch.cuda.empty_cache()
    records.append(dict(copy_tbps=round(timing.copy_bandwidth_tbps(), 3)))
    print(json.dumps(records[-1]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(environment=environment(), records=records), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
