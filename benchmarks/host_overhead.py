"""Host overhead per call on the GPU: torch_bridge vs the seed's decode_attention_fwd.

A tiny problem (the kernels take microseconds) called many times back to back; the
time per call is then the Python + launch cost.  Median of several rounds.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

import torch_bridge

CALLS, ROUNDS = 2000, 5


def per_call_us(fn) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
        rounds.append((time.perf_counter() - start) / CALLS * 1e6)
    return statistics.median(rounds)


def main() -> None:
    from vllm.attention.ops.triton_decode_attention import decode_attention_fwd as seed_fwd

    batch, heads, kv_heads, dim, page, pages, splits = 1, 8, 2, 128, 16, 4, 4
    q = torch.randn(batch, heads, dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(pages, page, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    pt = torch.arange(pages, device="cuda", dtype=torch.int32).reshape(1, pages)
    sl = torch.full((batch,), 40, device="cuda", dtype=torch.int32)
    o = torch.empty(batch, heads, dim, device="cuda", dtype=torch.bfloat16)
    logits = torch.empty(batch, heads, splits, dim + 1, device="cuda", dtype=torch.float32)
    rows = {
        "seed decode_attention_fwd": lambda: seed_fwd(q, k, v, o, pt, sl, logits, splits, 0.088, page),
        "torch_bridge.decode_attention_fwd": lambda: torch_bridge.decode_attention_fwd(
            q, k, v, o, pt, sl, logits, splits, 0.088, page
        ),
        "torch_bridge.decode_attention": lambda: torch_bridge.decode_attention(
            q, k, v, pt, sl, sm_scale=0.088, num_kv_splits=splits, out=o
        ),
    }
    for name, fn in rows.items():
        print(f"{name:<36} {per_call_us(fn):7.1f} us per call", flush=True)
    if "--profile" in sys.argv:  # where the time of our drop-in goes
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.runcall(lambda: [rows["torch_bridge.decode_attention_fwd"]() for _ in range(CALLS)])
        pstats.Stats(profiler).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
