"""Host time per call on the GPU: torch_bridge's entry points, vLLM 0.9's
``decode_attention_fwd`` and, with ``--jax``, jitted ``jax_decode.decode_attention``.

A tiny problem (the kernels take microseconds) called many times back to back; the
time per call is then the Python + launch cost.  Median of several rounds.  Each
entry point's output is first checked against the float64 oracle.  The JAX rows: one
jitted call at a time, 16 calls chained in one jitted program (each call's output is
the next one's query, as layers chain), and a trivial jitted op for reference; they
launch through the Triton custom call ``JAX_DECODE_TRITON_CALL`` chooses (``typed``,
the default, ``legacy`` or ``graph``: jax_decode/backends/typed_ffi.py), so two runs
compare them; ``--graph`` times ``typed`` and ``graph`` in one process, checks that their
chained programs give the same bits and counts the command buffers XLA formed.

    python -m benchmarks.host_overhead [--profile] [--jax] [--graph] [--launch-routes]

``--launch-routes`` times torch_bridge's launches through Triton's C launcher directly
(torch_bridge.launcher.direct_runner) and through Triton's own runner, alternately.
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
        "torch_bridge.decode_attention, 1 split": lambda: torch_bridge.decode_attention(
            q, k, v, pt, sl, sm_scale=SM_SCALE, num_kv_splits=1, out=o
        ),
    }
    try:
        from vllm.attention.ops.triton_decode_attention import decode_attention_fwd as vllm_fwd
    except ImportError:
        print("vLLM 0.9's decode_attention_fwd does not import here: torch_bridge only", file=sys.stderr)
    else:
        calls["vLLM 0.9 decode_attention_fwd"] = lambda: vllm_fwd(q, k, v, o, pt, sl, logits, SPLITS, SM_SCALE, 16)
    return calls, problem, o


CHAINED = 16  # decode calls per jitted program in the chained JAX row


def jax_entry_points(problem) -> dict:
    """name -> (jitted function, its argument, decode calls it makes)."""
    import jax
    import jax.numpy as jnp

    import jax_decode

    q, k, v, pt, sl = (jnp.asarray(a) for a in problem.arrays)

    def attend(q, splits=SPLITS):
        return jax_decode.decode_attention(q, k, v, pt, sl, sm_scale=SM_SCALE, num_kv_splits=splits)

    one = jax.jit(attend)

    def chain(splits):
        @jax.jit
        def chained(q):
            for _ in range(CHAINED):
                q = attend(q, splits)
            return q

        return chained

    chained, chained_planned = chain(SPLITS), chain(None)

    trivial = jax.jit(lambda q: q + 1)
    return {
        "jax_decode.decode_attention (jit)": (one, q, 1),
        f"jax_decode.decode_attention ({CHAINED} chained)": (chained, q, CHAINED),
        f"jax_decode.decode_attention ({CHAINED} chained, planned splits)": (chained_planned, q, CHAINED),
        "trivial jitted op (q + 1)": (trivial, q, 1),
    }


def jax_per_call_us(fn, calls_made: int) -> float:
    """Like :func:`per_call_us`, waiting on the last result; per decode call."""
    import jax

    for _ in range(50):
        out = fn()
    jax.block_until_ready(out)
    rounds = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(CALLS // calls_made):
            out = fn()
        jax.block_until_ready(out)
        rounds.append((time.perf_counter() - start) / (CALLS // calls_made * calls_made) * 1e6)
    return statistics.median(rounds)


def fresh_launchers(direct: bool) -> None:
    """Forget torch_bridge's cached launches, which later ones make anew, through
    Triton's C launcher directly (``direct``) or through Triton's own runner."""
    from torch_bridge import launcher, ops

    launcher.DIRECT_LAUNCH = direct
    launcher._DECODE_LAUNCHERS.clear()
    launcher._schedule_launcher.cache_clear()
    ops._ACCEPTED.clear()


def time_torch(calls: dict, o, expected, label: str = "") -> None:
    for name, fn in calls.items():
        o.zero_()
        fn()
        excess = tolerance_excess(o.float().cpu().numpy(), expected, "bfloat16")
        if not excess <= 0:
            raise SystemExit(f"{name} is wrong (by {excess:.3g} beyond the tolerance); not timed")
        print(f"{name + label:<48} {per_call_us(fn):7.1f} us per call", flush=True)


def command_buffers(jitted, arg) -> int:
    """Mentions of command buffers in XLA's compiled program of ``jitted``."""
    return jitted.lower(arg).compile().as_text().count("command_buffer")


def time_jax(problem, expected):
    """Time the JAX rows (each one-call row's output checked first); returns the chained
    program's output."""
    from jax_decode.backends import typed_ffi

    print(f"JAX launches through {typed_ffi.target()!r}", flush=True)
    chained_out = None
    for name, (jitted, arg, calls_made) in jax_entry_points(problem).items():
        out = jitted(arg)
        if calls_made == 1 and "trivial" not in name:
            excess = tolerance_excess(np.asarray(out, np.float64), expected, "bfloat16")
            if not excess <= 0:
                raise SystemExit(f"{name} is wrong (by {excess:.3g} beyond the tolerance); not timed")
        elif chained_out is None and calls_made > 1:
            chained_out = out
        us = jax_per_call_us(lambda jitted=jitted, arg=arg: jitted(arg), calls_made)
        print(f"{name:<36} {us:7.1f} us per call ({command_buffers(jitted, arg)} command-buffer mentions)", flush=True)
    return chained_out


def main() -> None:
    calls, problem, o = entry_points()
    expected, _ = decode_attention_reference(*problem.arrays, sm_scale=SM_SCALE)
    if "--launch-routes" in sys.argv:  # torch_bridge's two launch routes, alternating, one process
        from torch_bridge.launcher import DIRECT_LAUNCH_TRITON, direct_launch_here

        if not direct_launch_here():
            raise SystemExit(f"--launch-routes: this Triton launches through its own runner only "
                             f"(direct launches: Triton {', '.join(DIRECT_LAUNCH_TRITON)})")  # fmt: skip
        for direct in (True, False, True, False):
            fresh_launchers(direct)
            time_torch(calls, o, expected, " (direct)" if direct else " (Triton's runner)")
        fresh_launchers(True)
    else:
        time_torch(calls, o, expected)
    if "--graph" in sys.argv:  # jaxlib's typed call under its name and ours, one process
        import os

        from jax_decode.backends import typed_ffi

        chained = {}
        for choice in ("typed", "graph"):
            os.environ[typed_ffi.CALL_VARIABLE] = choice
            chained[choice] = time_jax(problem, expected)
        if not np.array_equal(*(np.asarray(out).view(np.uint16) for out in chained.values())):
            raise SystemExit("the chained programs' outputs differ between the typed and the graph call")
        print("chained outputs bit-identical between the two calls", flush=True)
    elif "--jax" in sys.argv:
        time_jax(problem, expected)
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
