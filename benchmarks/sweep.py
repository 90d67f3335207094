"""Launch-parameter sweep on the GPU (tuning data for jax_decode.launch's heuristics).

For each shape: num_kv_splits over powers of two at the config's default blocks,
then (BLOCK_N, warps, stages) around the best splits.  Times with do_bench (median);
writes every measurement to a JSON file for offline fitting.  Not a user benchmark
(that is ``python -m jax_decode.bench``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch
import triton

from jax_decode.launch import DeviceInfo, make_launch_config
from jax_decode.synthetic import SEED_SHAPES
from jax_decode.torch_launch import launch_decode
from jax_decode.validation import check_decode_args

EXTRA_SHAPES = {
    "GQA 64/8 d128 b4 ctx16384": (4, 64, 8, 128, 128, 16384, 16, False),
    "GQA 28/4 d128 b16 ctx2048": (16, 28, 4, 128, 128, 2048, 16, False),
    "MHA 16/16 d64 b2 ctx8192": (2, 16, 16, 64, 64, 8192, 16, False),
    "GQA 32/8 d128 b32 ctx4096 page1": (32, 32, 8, 128, 128, 4096, 1, False),
    "MLA 128/1 576/512 page64 b8 ctx8192": (8, 128, 1, 576, 512, 8192, 64, True),
}
KERNEL_OPTIONS = {
    "mha": [(32, 4, 2), (64, 4, 2), (64, 4, 3), (64, 8, 2), (128, 4, 2), (128, 8, 3), (32, 2, 3), (16, 2, 4)],
    "grouped": [(32, 4, 2), (64, 4, 2), (32, 4, 3), (64, 8, 2), (16, 4, 3), (16, 2, 4), (32, 2, 2), (64, 4, 3)],
}
# fp8 caches: twice the tokens per byte, so larger tiles and deeper pipelines are worth trying.
FP8_OPTIONS = [(64, 4, 2), (64, 4, 3), (64, 4, 4), (128, 4, 2), (128, 4, 3), (128, 8, 2), (128, 8, 3), (64, 8, 3)]


def make_inputs(dims, dt=torch.bfloat16, kv_dtype=None):
    batch, heads, kv_heads, dqk, dv, ctx, page, mla = dims
    max_pages = ctx // page
    num_pages = batch * max_pages
    cache_dt = kv_dtype or dt
    q = torch.randn(batch, heads, dqk, device="cuda", dtype=dt)
    k = torch.randn(num_pages, page, kv_heads, dqk, device="cuda").to(cache_dt)
    v = None if mla else torch.randn(num_pages, page, kv_heads, dv, device="cuda").to(cache_dt)
    pt = torch.randperm(num_pages, device="cuda", dtype=torch.int32).reshape(batch, max_pages)
    sl = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
    kv_bytes = batch * ctx * kv_heads * (dqk if mla else dqk + dv) * k.element_size()
    return q, k, v, pt, sl, kv_bytes


def time_config(cfg, q, k, v, pt, sl) -> float:
    p = cfg.problem
    out = torch.empty(p.batch, p.num_heads, p.head_dim_v, device="cuda", dtype=q.dtype)
    lse = torch.empty(p.batch, p.num_heads, device="cuda", dtype=torch.float32)
    mid_o = torch.empty(cfg.mid_o_shape, device="cuda", dtype=torch.float32)
    mid_lse = torch.empty(cfg.mid_lse_shape, device="cuda", dtype=torch.float32)
    vv = k if v is None else v
    scale = None
    if cfg.problem.k_scale:
        scale = torch.full((cfg.problem.num_kv_heads,), 0.5, device="cuda")
    return triton.testing.do_bench(
        lambda: launch_decode(
            cfg, q, k, vv, pt, sl, mid_o, mid_lse, out, lse, k_scale=scale,
            v_scale=None if v is None else scale, interpret=False,
        ),
        warmup=10, rep=40,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="JSON file for every measurement")
    parser.add_argument("budget_s", nargs="?", type=float, default=400)
    parser.add_argument("--kv-dtype", choices=["float8_e4m3fn", "float8_e5m2"], help="an fp8 cache (scaled per head)")
    parser.add_argument("--shapes", nargs="*", help="substrings of shape names (default: all)")
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    device = DeviceInfo("nvidia", props.major * 10 + props.minor, props.multi_processor_count)
    kv_dtype = getattr(torch, args.kv_dtype) if args.kv_dtype else None
    started = time.time()
    results = []
    shapes = {**SEED_SHAPES, **EXTRA_SHAPES}
    shapes = {n: d for n, d in shapes.items() if not args.shapes or any(sub in n for sub in args.shapes)}
    for name, dims in shapes.items():
        q, k, v, pt, sl, kv_bytes = make_inputs(dims, kv_dtype=kv_dtype)
        scale_spec = ((dims[2],), torch.float32) if kv_dtype else None
        problem = check_decode_args(
            q_shape=q.shape, q_dtype=q.dtype, k_shape=k.shape, k_dtype=k.dtype,
            v_shape=None if v is None else v.shape, v_dtype=None if v is None else v.dtype,
            page_table_shape=pt.shape, page_table_dtype=pt.dtype, seq_lens_shape=sl.shape,
            seq_lens_dtype=sl.dtype, head_dim_v=dims[4], sm_scale=dims[3] ** -0.5, logit_cap=0.0,
            k_scale=scale_spec, v_scale=None if v is None else scale_spec,
        )  # fmt: skip
        base = make_launch_config(problem, device)
        rows = {}

        def measure(cfg, rows=rows, q=q, k=k, v=v, pt=pt, sl=sl, kv_bytes=kv_bytes, name=name):
            key = (cfg.block_n, cfg.num_warps, cfg.num_stages, cfg.num_kv_splits)
            if key in rows:
                return rows[key]
            try:
                ms = time_config(cfg, q, k, v, pt, sl)
            except Exception as error:  # e.g. out of shared memory
                print(f"  {name} {key}: {type(error).__name__} {str(error)[:80]}", flush=True)
                ms = float("inf")
            rows[key] = ms
            results.append(dict(shape=name, variant=cfg.variant, block_n=key[0], warps=key[1], stages=key[2],
                                splits=key[3], block_h=cfg.block_h, ms=ms, tbps=kv_bytes / ms / 1e9))  # fmt: skip
            return ms

        default_ms = measure(base)
        splits_ms = {s: measure(dataclasses.replace(base, num_kv_splits=s)) for s in (1, 2, 4, 8, 16, 32, 64, 128)}
        best_splits = min(splits_ms, key=splits_ms.get)
        for splits in {max(1, best_splits // 2), best_splits, min(128, best_splits * 2)}:
            options = FP8_OPTIONS if kv_dtype and base.variant == "grouped" else KERNEL_OPTIONS[base.variant]
            for block_n, warps, stages in options:
                if time.time() - started > args.budget_s:
                    break
                measure(dataclasses.replace(base, block_n=block_n, num_warps=warps, num_stages=stages,
                                            num_kv_splits=splits))  # fmt: skip
        best = min(rows, key=rows.get)
        print(f"{name:<40} default {kv_bytes / default_ms / 1e9:.2f} TB/s (splits {base.num_kv_splits}); "
              f"best {kv_bytes / rows[best] / 1e9:.2f} TB/s at (block_n, warps, stages, splits)={best}; "
              f"by splits: " + " ".join(f"{s}:{kv_bytes / ms / 1e9:.2f}" for s, ms in splits_ms.items()),
              flush=True)  # fmt: skip
        del q, k, v
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(results, f, indent=0)


if __name__ == "__main__":
    main()
