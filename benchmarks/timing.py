"""Timing on a CUDA GPU: the two ceilings, torch calls, jitted JAX calls.

* :func:`copy_bandwidth_tbps`: ``dst.copy_(src)`` of 1 GiB, bytes read + written per
  second -- what a memory-bound kernel can approach.
* :func:`matmul_tflops`: an 8192^3 bf16 ``torch.matmul`` on random data -- what a
  compute-bound kernel can approach.
* :func:`time_torch`: ``triton.testing.do_bench`` (median) of single calls, or with
  ``device_time`` of a CUDA graph replaying :data:`DEVICE_TIME_CALLS` calls (the host
  out of the measurement, as serving engines run decode).
* :func:`time_jax`: the median over rounds of jitted calls ending in
  ``block_until_ready()``, or with ``device_time`` the GPU span of one jitted program
  making :data:`DEVICE_TIME_CALLS` calls (:func:`gpu_span_ms`).

Every timer rotates over several input sets, so that L2 does not serve them.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time

CALLS_PER_TIMING, ROUNDS = 20, 15
DEVICE_TIME_CALLS = 32  # calls per CUDA graph / jitted program in device time
L2_BYTES_TO_DEFEAT = 256 * 2**20  # rotate input sets until they exceed this (H200 L2: 60 MB)
MAX_INPUT_SETS = 16


def input_sets_needed(kv_bytes: int) -> int:
    return max(1, min(MAX_INPUT_SETS, -(-L2_BYTES_TO_DEFEAT // max(kv_bytes, 1))))


def copy_bandwidth_tbps() -> float:
    import torch
    import triton

    src = torch.empty(2**30, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * src.numel() / ms / 1e9


def matmul_tflops() -> float:
    import torch
    import triton

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = triton.testing.do_bench(lambda: a @ b, warmup=25, rep=200, return_mode="median")
    return 2 * 8192**3 / ms / 1e9


def time_torch(fn_for_set, sets, device_time: bool, rep_ms: int = 100) -> float:
    """ms per call of ``fn_for_set(set)``, rotating over ``sets``."""
    import torch
    import triton

    counter = [0]

    def step():
        fn_for_set(sets[counter[0] % len(sets)])
        counter[0] += 1

    if not device_time:
        return triton.testing.do_bench(step, warmup=25, rep=rep_ms, return_mode="median")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and warm up outside the capture
        for s in sets:
            fn_for_set(s)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(DEVICE_TIME_CALLS):
            step()
    ms = triton.testing.do_bench(graph.replay, warmup=10, rep=rep_ms, return_mode="median")
    del graph
    return ms / DEVICE_TIME_CALLS


def time_jax(fn, arg_sets, device_time: bool) -> float:
    """ms per call of the jitted ``fn(*args)``, rotating over ``arg_sets``.  With device
    time the calls run in one jitted program, which takes each distinct array once: calls
    that share an array (a decode step's layers share the page table and the lengths)
    share it inside the program too, as in a model's jitted step (where XLA merges the
    work that depends on it alone, such as the device-side schedule)."""
    import jax

    calls = DEVICE_TIME_CALLS if device_time else CALLS_PER_TIMING
    order = [arg_sets[i % len(arg_sets)] for i in range(calls)]
    if device_time:
        leaves, tree = jax.tree_util.tree_flatten(order)
        position = {}
        for leaf in leaves:
            position.setdefault(id(leaf), len(position))
        distinct = list({id(leaf): leaf for leaf in leaves}.values())
        where = [position[id(leaf)] for leaf in leaves]
        many = jax.jit(lambda arrays: [fn(*args) for args in tree.unflatten([arrays[i] for i in where])])

        def one_round():
            return many(distinct)
    else:

        def one_round():
            return [fn(*args) for args in order][-1]

    jax.block_until_ready(one_round())  # compile and warm up
    rounds = []
    for _ in range(ROUNDS):
        if device_time:
            rounds.append(gpu_span_ms(lambda: jax.block_until_ready(one_round())) / calls)
            continue
        start = time.perf_counter()
        jax.block_until_ready(one_round())
        rounds.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(rounds)


def gpu_span_ms(run) -> float:
    """GPU time of ``run()``: from the start of its first kernel (or memset / copy) to
    the end of its last, as CUPTI records them through ``torch.profiler`` (which sees
    every kernel of the process, those XLA launches too).

    This is how JAX's device time is taken: a jitted program's wall time also holds
    its host-side dispatch, which is not the kernels' time.  The span still counts
    the gaps between kernels: XLA launches jax_triton's custom calls one by one,
    outside CUDA graphs.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    spans = [
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")
    ]
    if not spans:
        raise RuntimeError("the profiler recorded no GPU work (is CUPTI available?)")
    return (max(end for _, end in spans) - min(start for start, _ in spans)) / 1e3
