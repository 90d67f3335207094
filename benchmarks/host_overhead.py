"""Host time per call on the GPU: torch_bridge's entry points and vLLM 0.9's ``decode_attention_fwd``.

A tiny problem (the kernels take microseconds) called many times back to back; the
time per call is then the Python + launch cost.  Median of several rounds.  Each
entry point's output is first checked against the float64 oracle.

    python -m benchmarks.host_overhead [--profile]
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
import torch

import torch_bridge
from jax_decode.reference import decode_attention_reference, tolerance_excess
from jax_decode.synthetic import make_paged_problem

CALLS, ROUNDS = 2000, 5
SPLITS, SM_SCALE = 4, 0.088


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


def entry_points() -> tuple[dict, object, torch.Tensor]:
    """name -> zero-argument call writing ``o``; the problem; ``o``."""
    problem = make_paged_problem(batch=1, num_heads=8, num_kv_heads=2, head_dim_qk=128, page_size=16, seq_lens=[40],
                                 dtype="bfloat16")  # fmt: skip
    q, k, v, pt, sl = (torch.from_numpy(np.asarray(a).view(np.uint16 if a.dtype.name == "bfloat16" else a.dtype))
                       .view(torch.bfloat16 if a.dtype.name == "bfloat16" else torch.int32).cuda()
                       for a in problem.arrays)  # fmt: skip
    o = torch.empty(1, 8, 128, device="cuda", dtype=torch.bfloat16)
    logits = torch.empty(1, 8, SPLITS, 129, device="cuda", dtype=torch.float32)
    calls = {
        "torch_bridge.decode_attention_fwd": lambda: torch_bridge.decode_attention_fwd(
            q, k, v, o, pt, sl, logits, SPLITS, SM_SCALE, 16
        ),
        "torch_bridge.decode_attention": lambda: torch_bridge.decode_attention(
            q, k, v, pt, sl, sm_scale=SM_SCALE, num_kv_splits=SPLITS, out=o
        ),
    }
    try:
        from vllm.attention.ops.triton_decode_attention import decode_attention_fwd as vllm_fwd
    except ImportError:
        print("vLLM 0.9's decode_attention_fwd does not import here: torch_bridge only", file=sys.stderr)
    else:
        calls["vLLM 0.9 decode_attention_fwd"] = lambda: vllm_fwd(q, k, v, o, pt, sl, logits, SPLITS, SM_SCALE, 16)
    return calls, problem, o


def main() -> None:
    calls, problem, o = entry_points()
    expected, _ = decode_attention_reference(*problem.arrays, sm_scale=SM_SCALE)
    for name, fn in calls.items():
        o.zero_()
        fn()
        excess = tolerance_excess(o.float().cpu().numpy(), expected, "bfloat16")
        if not excess <= 0:
            raise SystemExit(f"{name} is wrong (by {excess:.3g} beyond the tolerance); not timed")
        print(f"{name:<36} {per_call_us(fn):7.1f} us per call", flush=True)
    if "--profile" in sys.argv:  # where the time of our entry points goes
        import cProfile
        import pstats

        for name in ("torch_bridge.decode_attention_fwd", "torch_bridge.decode_attention"):
            profiler = cProfile.Profile()
            fn = calls[name]
            profiler.runcall(lambda fn=fn: [fn() for _ in range(CALLS)])
            print(f"\n{name}:")
            pstats.Stats(profiler).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
