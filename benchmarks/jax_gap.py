"""Diagnose the JAX path's per-call gap against torch: device time per call of the same
kernels, jitted N calls per program, for a long and a short shape.  Run once with the
default XLA flags and once with command buffers off, e.g.

    XLA_FLAGS=--xla_gpu_enable_command_buffer= python benchmarks/jax_gap.py
"""

from __future__ import annotations

import os
import statistics
import time

import jax
import torch

import jax_decode
import torch_bridge
from jax_decode.bench import BenchShape, _inputs, _time_torch
from jax_decode.synthetic import SEED_SHAPES


def per_call_ms(fn, args, calls):
    many = jax.jit(lambda a: [fn(*a) for _ in range(calls)])
    jax.block_until_ready(many(args))
    rounds = []
    for _ in range(10):
        start = time.perf_counter()
        jax.block_until_ready(many(args))
        rounds.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(rounds)


def main():
    print("XLA_FLAGS", os.environ.get("XLA_FLAGS"))
    for name in ("GQA 32/8 d128 b128 ctx8192", "MQA 8/1 d256 b8 ctx8192"):
        shape = BenchShape(name, *SEED_SHAPES[name])
        ((q, k, v, pt, sl),) = _inputs(shape, 1, 0)
        args = tuple(torch_bridge.to_jax(t) for t in (q, k, v, pt, sl))
        fn = jax.jit(lambda *a: jax_decode.decode_attention(*a, backend="triton"))
        out = torch.empty(shape.batch, shape.num_heads, shape.head_dim_v, device="cuda", dtype=q.dtype)
        torch_ms = _time_torch(lambda s, out=out: torch_bridge.decode_attention(*s, out=out), [(q, k, v, pt, sl)])
        row = {n: per_call_ms(fn, args, n) for n in (1, 8, 32)}
        print(
            f"{name}: torch graph {torch_ms * 1e3:.1f} us; jax "
            + " ".join(f"{n} calls/program {ms * 1e3:.1f} us" for n, ms in row.items()),
            flush=True,
        )
        print(jax.jit(fn).lower(*args).compile().as_text().count("custom-call"), "custom calls in one call's HLO")


if __name__ == "__main__":
    main()
