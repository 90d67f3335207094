"""``python -m benchmarks.bench``: decode attention on a CUDA GPU against its roofline.

Measures, in one run: the copy bandwidth and the bf16 matmul throughput of the GPU
(the two ceilings), then for every row of the chosen suites (:mod:`benchmarks.suites`)

* ``torch_bridge``: the launch the launch config chooses, and -- ``best split`` -- the
  fastest of :data:`SPLIT_SWEEP` for the same kernels, so the table shows how far the
  choice is from the best this kernel can do.  Where the launch has a device-side
  schedule, it is made once per set of inputs (``torch_bridge.decode_schedule``), as a
  decode step's layers share one; FlashMLA's metadata is likewise computed once;
* ``seesaw`` where asked for: torch_bridge's plan with the Gluon MLA seesaw in place of
  the narrow-group kernels (``make_launch_config(..., hopper_narrow=False)``), on the
  sm_90 MLA rows of at most 32 query rows, which the plan gives to the latter;
* ``jax_decode``: the jitted triton backend;
* ``vllm``: vLLM 0.9's ``decode_attention_fwd`` where it imports
  (``vllm.attention.ops.triton_decode_attention``) and supports the row, at its best
  ``num_kv_splits`` of :data:`VLLM_SPLITS`;
* ``flashmla``: FlashMLA (``flash_mla``, e.g. ``sgl-flash-mla``; SM90 dense bf16 MLA,
  576/512, page size 64) on the MLA rows it supports, where it imports;
* ``pallas`` (JAX's GPU ``paged_attention``) and ``xla`` where asked for;
* ``fa3_jax`` where asked for: FlashAttention-3's JAX binding
  (``flash_attn3_jax.flash_mha_with_kvcache`` of ``flash-attn3-jax`` 0.2.3; Python 3.12,
  Hopper) jitted on the same JAX arrays as ``jax_decode`` and timed the same way, at its
  best ``num_splits`` of :data:`FA3_SPLITS`, on the rows it runs (16-bit q and cache,
  head dim <= 128; no fp8 cache, MLA, sinks or soft-cap; windows and several query
  tokens yes).

Every output is checked against the float64 oracle (on two rows) before it is timed; a
wrong one is reported and not timed.  Time is device time by default -- torch replays a
CUDA graph of 32 calls, JAX runs them in one jitted program whose GPU span the
profiler records -- or per call with ``--per-call``.  The calls rotate over input sets
with queries and caches of their own and one page table and lengths tensor for all, as
the layers of a decode step.  Each row reports time, the
roofline ``max(KV bytes / copy bandwidth, FLOPs / matmul throughput)`` and the % of it
reached; the summary gives geometric means per suite.  Writes ``bench.json`` and
``bench.png`` to ``--out``.

    python -m benchmarks.bench --suite core --impls torch_bridge,jax_decode,vllm
    python -m benchmarks.bench --suite models --impls jax_decode,fa3_jax --out fa3_out
    python -m benchmarks.bench --suite models --out bench_out
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX and torch share the GPU

from benchmarks.suites import SUITES, Row  # noqa: E402

IMPLEMENTATIONS = (
    "torch_bridge", "best split", "seesaw", "jax_decode", "vllm", "flashmla", "pallas", "fa3_jax", "xla"
)  # fmt: skip
DEFAULT_IMPLS = ("torch_bridge", "best split", "jax_decode", "vllm", "flashmla")
SPLIT_SWEEP = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
VLLM_SPLITS = (2, 4, 8, 16, 32, 64)
# flash_attn3_jax 0.2.3 takes num_splits >= 1 only (it raises ValueError for 0, so FA3's
# own split heuristic cannot be reached through it): its best of these is reported.
FA3_SPLITS = (1, 2, 4, 8, 16, 32, 64, 128)
CHECKED_ROWS = 2
DEVICE = "cuda"  # where the inputs live (the timing needs CUDA)


# --------------------------------------------------------------------------- rows and summary


def roofline_ms(row: Row, seq_lens, copy_tbps: float, matmul_tflops: float) -> float:
    """The least time the row can take: its KV bytes at the copy rate, or its FLOPs at
    the matmul rate, whichever is longer."""
    return max(row.kv_bytes(seq_lens) / copy_tbps / 1e9, row.flops(seq_lens) / matmul_tflops / 1e9)


def summarize(results: list[dict]) -> dict:
    """Per suite and implementation: geometric mean of % of roofline over the rows it
    ran; for ``torch_bridge`` also how close the chosen launch came to the best split,
    its ratio to vLLM's best and FlashMLA's speed against it where both ran, and
    ``jax_decode``'s time over ``fa3_jax``'s where both ran."""
    summary: dict = {}
    for suite in sorted({r["suite"] for r in results}):
        rows = [r for r in results if r["suite"] == suite]
        per_impl = {}
        for impl in IMPLEMENTATIONS:
            values = [r["impls"][impl]["pct_roofline"] for r in rows if r["impls"].get(impl, {}).get("ms")]
            if values:
                per_impl[impl] = dict(
                    rows=len(values), geomean_pct_roofline=math.exp(sum(map(math.log, values)) / len(values))
                )
        chosen_vs_best = [
            r["impls"]["torch_bridge"]["ms"] / r["impls"]["best split"]["ms"]
            for r in rows
            if r["impls"].get("torch_bridge", {}).get("ms") and r["impls"].get("best split", {}).get("ms")
        ]
        if chosen_vs_best:
            per_impl["chosen_vs_best_split"] = dict(
                rows=len(chosen_vs_best),
                worst=max(chosen_vs_best),
                within_5pct=sum(x <= 1.05 for x in chosen_vs_best),
            )
        vs_vllm = [
            r["impls"]["torch_bridge"]["ms"] / r["impls"]["vllm"]["ms"]
            for r in rows
            if r["impls"].get("torch_bridge", {}).get("ms") and r["impls"].get("vllm", {}).get("ms")
        ]
        if vs_vllm:
            per_impl["torch_vs_vllm_best"] = dict(
                rows=len(vs_vllm), worst=max(vs_vllm), no_slower=sum(x <= 1.0 for x in vs_vllm)
            )
        vs_flashmla = [
            r["impls"]["flashmla"]["ms"] / r["impls"]["torch_bridge"]["ms"]
            for r in rows
            if r["impls"].get("torch_bridge", {}).get("ms") and r["impls"].get("flashmla", {}).get("ms")
        ]
        if vs_flashmla:  # our speed as a fraction of FlashMLA's (its time over ours)
            per_impl["torch_speed_vs_flashmla"] = dict(
                rows=len(vs_flashmla), worst=min(vs_flashmla), best=max(vs_flashmla),
                geomean=math.exp(sum(map(math.log, vs_flashmla)) / len(vs_flashmla)),
            )  # fmt: skip
        vs_fa3 = [
            r["impls"]["jax_decode"]["ms"] / r["impls"]["fa3_jax"]["ms"]
            for r in rows
            if r["impls"].get("jax_decode", {}).get("ms") and r["impls"].get("fa3_jax", {}).get("ms")
        ]
        if vs_fa3:  # our jitted JAX call's time over FA3's JAX binding's (at its best split)
            per_impl["jax_decode_vs_fa3_jax"] = dict(
                rows=len(vs_fa3), worst=max(vs_fa3), no_slower=sum(x <= 1.0 for x in vs_fa3),
                geomean=math.exp(sum(map(math.log, vs_fa3)) / len(vs_fa3)),
            )  # fmt: skip
        summary[suite] = per_impl
    return summary


def format_row(result: dict, impls: tuple[str, ...]) -> str:
    cells = []
    for impl in impls:
        r = result["impls"].get(impl)
        if r is None:
            cells.append(f"{'':>17}")
        elif r.get("ms") is None:
            cells.append(f"{(r.get('note') or '-')[:17]:>17}")
        else:
            cells.append(f"{r['ms'] * 1e3:8.1f} {r['pct_roofline']:6.1f}% ")
    bound = "flops" if result["compute_bound"] else "bytes"
    return f"{result['label'][:46]:<46} {result['roofline_ms'] * 1e3:8.1f} {bound:>5} " + " ".join(cells)


def format_header(impls: tuple[str, ...]) -> str:
    heads = " ".join(f"{impl + ' us, %':>17}" for impl in impls)
    return f"{'row':<46} {'roofline':>8} {'bound':>5} " + heads


# --------------------------------------------------------------------------- the GPU part


def _problem_for(row: Row, arrays, seed: int = 0):
    """The row's inputs, made by ``arrays`` (an :class:`~jax_decode.synthetic.ArrayFactory`)."""
    from jax_decode.synthetic import make_paged_problem

    seq_lens = row.seq_lens()
    return make_paged_problem(
        batch=row.batch,
        num_heads=row.num_heads,
        num_kv_heads=row.num_kv_heads,
        head_dim_qk=row.head_dim_qk,
        head_dim_v=row.head_dim_v,
        page_size=row.page_size,
        seq_lens=seq_lens,
        dtype=row.dtype,
        mla=row.mla,
        max_pages=-(-max(row.context, int(seq_lens.max())) // row.page_size),
        seed=seed,
        kv_dtype=row.kv_dtype,
        kv_scales="head" if row.kv_dtype else "none",
        sinks=row.sinks,
        compact=row.lengths == "mixed",
        arrays=arrays,
        q_len=row.q_len if row.q_len > 1 else None,
    )


def _problems(row: Row, copies: int):
    """``copies`` input sets as torch CUDA tensors: queries and caches of their own (the
    calls rotate over them to defeat the L2 cache, as a step's layers read their own
    caches), one page table and one lengths tensor for all (as a step's layers share)."""
    import dataclasses

    from benchmarks.inputs import TorchArrays

    first, *rest = (_problem_for(row, TorchArrays(DEVICE), seed) for seed in range(copies))
    shared = dict(page_table=first.page_table, seq_lens=first.seq_lens)
    return [first, *(dataclasses.replace(p, **shared) for p in rest)]


def _options(row: Row) -> dict:
    """Keyword options of our implementations (scales and sinks come with the problem)."""
    options = dict(logit_cap=row.logit_cap)
    if row.mla:
        options["head_dim_v"] = row.head_dim_v
    if row.window_left is not None:
        options["window_left"] = row.window_left
    return options


def _oracle(row: Row, problem) -> tuple[list[int], object]:
    """The float64 oracle's output on a few rows (the longest and the first)."""
    from jax_decode.reference import decode_attention_reference

    seq_lens = problem.arrays_from.to_numpy(problem.seq_lens)
    rows = sorted({int(seq_lens.argmax()), 0})[:CHECKED_ROWS]
    host = problem.host_rows(rows)
    expected, _ = decode_attention_reference(*host.arrays, **host.extras, **_options(row))
    return rows, expected


def _implementations(row: Row, wanted: tuple[str, ...], sweep: tuple[int, ...]):
    """name -> (kind, payload): ("torch", fn(problem) -> out), ("splits", {splits: fn}),
    ("jax", jitted fn), ("jax splits", {splits: jitted fn}), ("skip", reason)."""
    import jax
    import torch

    import jax_decode
    import torch_bridge

    options = _options(row)
    impls: dict[str, tuple] = {}
    out_shape = (row.batch, *((row.q_len,) if row.q_len > 1 else ()), row.num_heads, row.head_dim_v)

    def bridge(splits=None):
        out = torch.empty(out_shape, device=DEVICE, dtype=getattr(torch, row.dtype))
        schedules = {}  # per input set, made at its first call (outside the timed graph)

        def run(p):
            schedule = schedules.get(id(p))
            if schedule is None:
                schedule = schedules[id(p)] = torch_bridge.decode_schedule(
                    *p.arrays, num_kv_splits=splits, **p.extras, **options
                )
            return torch_bridge.decode_attention(*p.arrays, out=out, num_kv_splits=splits, schedule=schedule,
                                                 **p.extras, **options)  # fmt: skip

        return run

    if "torch_bridge" in wanted:
        impls["torch_bridge"] = ("torch", bridge())
    if "seesaw" in wanted:
        impls["seesaw"] = _seesaw(row, out_shape)
    if "best split" in wanted:
        impls["best split"] = ("splits", {s: bridge(s) for s in sweep})
    for name, backend in (("jax_decode", "triton"), ("xla", "xla")):
        if name in wanted:
            fn = jax.jit(lambda *a, backend=backend, **kw: jax_decode.decode_attention(*a, backend=backend, **kw,
                                                                                     **options))  # fmt: skip
            impls[name] = ("jax", fn)
    if "vllm" in wanted:
        impls["vllm"] = _vllm(row)
    if "flashmla" in wanted:
        impls["flashmla"] = _flashmla(row)
    if "pallas" in wanted:
        impls["pallas"] = _pallas(row)
    if "fa3_jax" in wanted:
        impls["fa3_jax"] = _fa3_jax(row)
    return impls


def _seesaw(row: Row, out_shape):
    """The frontends' plan with the Gluon MLA seesaw where it has the narrow-group
    kernels, launched through torch_bridge's launcher; its schedule (where the plan has
    one) made once per set of inputs, as ``torch_bridge``'s is."""
    import torch

    from jax_decode.launch import make_launch_config
    from jax_decode.launch.config import HOPPER_NARROW_MAX_ROWS
    from jax_decode.operands import DecodeOperands
    from torch_bridge.launcher import launch_decode, launch_schedule
    from torch_bridge.ops import device_info

    problem = row_problem(row)
    if not (row.mla and row.q_len * row.num_heads <= HOPPER_NARROW_MAX_ROWS):
        return ("skip", "unsupported")
    config = make_launch_config(problem, device_info(torch.device(DEVICE)), None, hopper_narrow=False)
    if not config.hopper_mla:
        return ("skip", "no Gluon MLA stage 1 here")
    out = torch.empty(out_shape, device=DEVICE, dtype=getattr(torch, row.dtype))
    lse = torch.empty(problem.lse_shape, device=DEVICE, dtype=torch.float32)
    prepared: dict[int, tuple] = {}  # per input set: operands and schedule, made at its first call

    def run(p):
        if id(p) not in prepared:
            extras = p.extras
            ops = DecodeOperands(*p.arrays, extras.get("k_scale"), extras.get("v_scale"), extras.get("sinks"))
            prepared[id(p)] = (ops, launch_schedule(config, ops) if config.schedule_programs else None)
        ops, schedule = prepared[id(p)]
        launch_decode(config, ops, None, None, out, lse, schedule=schedule)
        return out

    return ("torch", run)


def _flashmla(row: Row):
    """FlashMLA's dense SM90 decode kernel (``use_legacy=True``), on the rows it runs."""
    supported = (
        row.mla and (row.head_dim_qk, row.head_dim_v, row.page_size, row.dtype) == (576, 512, 64, "bfloat16")
        and not (row.kv_dtype or row.logit_cap or row.window_left is not None or row.sinks)
    )  # fmt: skip
    if not supported:
        return ("skip", "unsupported")
    try:
        import flash_mla
    except Exception as error:  # not installed here
        return ("skip", f"no import: {type(error).__name__}")
    metadata: dict[int, object] = {}  # per input set: computed once per batch, as a serving step does

    def run(p):
        q, k, _, pt, sl = p.arrays
        if id(p) not in metadata:
            try:
                metadata[id(p)] = flash_mla.get_mla_metadata()[0]
            except TypeError:  # the older signature: from the lengths
                metadata[id(p)] = flash_mla.get_mla_metadata(
                    sl, row.q_len * row.num_heads // row.num_kv_heads, row.num_kv_heads
                )
        tokens = q if row.q_len > 1 else q[:, None]  # [batch, s_q, heads, 576]; causal among the s_q
        out, _ = flash_mla.flash_mla_with_kvcache(
            tokens, k, pt, sl, row.head_dim_v, metadata[id(p)], softmax_scale=row.head_dim_qk**-0.5,
            causal=row.q_len > 1, is_fp8_kvcache=False, use_legacy=True,
        )  # fmt: skip
        return out if row.q_len > 1 else out[:, 0]

    return ("torch", run)


def _vllm(row: Row):
    if row.kv_dtype or row.window_left is not None or row.sinks or row.q_len > 1:
        return ("skip", "unsupported")
    try:
        from vllm.attention.ops.triton_decode_attention import decode_attention_fwd
    except Exception as error:  # not installed here
        return ("skip", f"no import: {type(error).__name__}")
    import torch

    def make(splits):
        out = torch.empty(row.batch, row.num_heads, row.head_dim_v, device=DEVICE, dtype=getattr(torch, row.dtype))
        logits = torch.empty(row.batch, row.num_heads, splits, row.head_dim_v + 1, device=DEVICE)

        def run(p):
            q, k, v, pt, sl = p.arrays
            v = k[..., : row.head_dim_v] if v is None else v
            decode_attention_fwd(
                q, k, v, out, pt, sl, logits, splits, row.head_dim_qk**-0.5, row.page_size, row.logit_cap
            )
            return out

        return run

    return ("splits", {s: make(s) for s in VLLM_SPLITS})


def _pallas(row: Row):
    if row.mla or row.head_dim_qk != row.head_dim_v or row.kv_dtype or row.window_left is not None or row.sinks:
        return ("skip", "unsupported")
    if row.logit_cap or row.lengths == "mixed":
        return ("skip", "unsupported")
    try:
        from jax.experimental.pallas.ops.gpu import paged_attention as pallas_paged
    except Exception as error:  # removed or broken in this JAX
        return ("skip", f"no import: {type(error).__name__}")
    import jax

    def run(q, k, v, pt, sl):
        # Pallas applies no score scale and wants [num_kv_heads, num_pages, page_size, head_dim] caches.
        return pallas_paged.paged_attention(
            q * row.head_dim_qk**-0.5, k.transpose(2, 0, 1, 3), v.transpose(2, 0, 1, 3), pt, sl,
            pages_per_compute_block=max(1, 64 // row.page_size),
        )  # fmt: skip

    return ("jax", jax.jit(run))


def _fa3_jax_unsupported(row: Row) -> str | None:
    """Why FlashAttention-3's JAX binding cannot run ``row`` (None: it can)."""
    if row.mla or row.head_dim_qk != row.head_dim_v:
        return "MLA" if row.mla else "head_dim_v != head_dim_qk"
    if row.dtype not in ("bfloat16", "float16"):
        return row.dtype  # the binding asserts fp16 / bf16 q and caches
    if row.kv_dtype:
        return "fp8 cache"  # its caches must have q's dtype, and it passes no descales
    if row.head_dim_qk > 128:
        return f"head dim {row.head_dim_qk}"  # the 0.2.3 wheel's kernels are hdim 128
    if row.logit_cap:
        return "soft-cap"  # its lowering passes softcap=0.0; no argument for it
    if row.sinks:
        return "sinks"
    return None


def _fa3_jax(row: Row):
    """FlashAttention-3's JAX binding (``flash_attn3_jax.flash_mha_with_kvcache``, paged
    mode: q ``[batch, seqlen_q, heads, d]``, caches ``[num_pages, page_size, kv_heads, d]``,
    ``page_table`` int32 ``[batch, max_pages]``, ``cache_seqlens`` int32 ``[batch]``),
    jitted, one function per ``num_splits`` of :data:`FA3_SPLITS` (a static argument)."""
    why = _fa3_jax_unsupported(row)
    if why:
        return ("skip", f"unsupported: {why}")
    try:
        from flash_attn3_jax import flash_mha_with_kvcache
    except Exception as error:  # not installed here (a cp312 wheel), or not for this JAX
        return ("skip", f"no import: {type(error).__name__}")
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        return ("skip", "needs Hopper (sm_90)")  # the wheel's kernels are sm_90 only
    import jax

    return ("jax splits", {s: jax.jit(fa3_jax_call(row, s, flash_mha_with_kvcache)) for s in FA3_SPLITS})


def fa3_jax_call(row: Row, num_splits: int, flash_mha_with_kvcache):
    """``fn(q, k_cache, v_cache, page_table, seq_lens) -> out`` in our layout (q ``[batch,
    (q_len,) heads, d]``), through ``flash_mha_with_kvcache`` at ``num_splits``."""
    # Our window_left=W is the last W + 1 positions up to each query token's own: FA3's
    # (left, right) = (W, 0), bottom-right aligned as its causal mask is.
    window = (-1, -1) if row.window_left is None else (row.window_left, 0)

    def run(q, k, v, pt, sl):
        tokens = q if q.ndim == 4 else q[:, None]  # [batch, q_len, heads, d]
        out = flash_mha_with_kvcache(
            tokens, k, v, cache_seqlens=sl, page_table=pt, softmax_scale=row.head_dim_qk**-0.5,
            is_causal=tokens.shape[1] > 1, window_size=window, num_splits=num_splits,
        )  # fmt: skip
        return out if q.ndim == 4 else out[:, 0]

    return run


def bench_row(row: Row, wanted, ceilings: dict, device_time: bool, sweep: tuple[int, ...]) -> dict:
    import jax
    import torch

    import torch_bridge
    from benchmarks import timing
    from jax_decode.reference import tolerance_excess

    seq_lens = row.seq_lens()
    roofline = roofline_ms(row, seq_lens, ceilings["copy_tbps"], ceilings["matmul_tflops"])
    compute_bound = row.flops(seq_lens) / ceilings["matmul_tflops"] > row.kv_bytes(seq_lens) / ceilings["copy_tbps"]
    problems = _problems(row, timing.input_sets_needed(row.kv_bytes(seq_lens)))
    checked_rows, expected = _oracle(row, problems[0])
    result = dict(
        label=row.label,
        suite=row.suite,
        row=dataclasses.asdict(row),
        kv_bytes=row.kv_bytes(seq_lens),
        flops=row.flops(seq_lens),
        roofline_ms=roofline,
        compute_bound=compute_bound,
        impls={},
    )

    def checked(out) -> str | None:
        got = out[checked_rows].float().cpu().numpy()
        excess = tolerance_excess(got, expected, row.dtype)
        return None if excess <= 0 else f"WRONG by {excess:.2g}"

    def record(impl, ms=None, note="", **extra):
        entry = dict(ms=ms, note=note, **extra)
        if ms is not None:
            entry["pct_roofline"] = 100 * roofline / ms
            entry["tbps"] = result["kv_bytes"] / ms / 1e9
        result["impls"][impl] = entry

    jax_arg_sets: list = []  # the problems as JAX arrays (DLPack, no copy), made at the first JAX implementation
    jax_arrays: dict = {}  # one JAX array per torch tensor, however many sets share it

    def as_jax(t):
        if t is None:
            return None
        if id(t) not in jax_arrays:
            jax_arrays[id(t)] = torch_bridge.to_jax(t)
        return jax_arrays[id(t)]

    def jax_time(fn) -> tuple[float | None, str | None]:
        """(ms per call, None) for the jitted ``fn``, or (None, "WRONG by ...") where its
        output fails the oracle."""
        out = torch_bridge.to_torch(jax.block_until_ready(fn(*jax_arg_sets[0][0], **jax_arg_sets[0][1])))
        wrong = checked(out)
        flat = [(*a, kw) for a, kw in jax_arg_sets]
        ms = None if wrong else timing.time_jax(lambda *a, fn=fn: fn(*a[:-1], **a[-1]), flat, device_time)
        return ms, wrong

    for name, (kind, payload) in _implementations(row, wanted, sweep).items():
        try:
            if kind in ("jax", "jax splits") and not jax_arg_sets:
                jax_arg_sets.extend(
                    (tuple(as_jax(t) for t in p.arrays), {k: as_jax(t) for k, t in p.extras.items()})
                    for p in problems
                )  # fmt: skip
            if kind == "skip":
                record(name, note=payload)
            elif kind == "torch":
                wrong = checked(payload(problems[0]))
                record(name, None if wrong else timing.time_torch(payload, problems, device_time), note=wrong or "")
            elif kind == "splits":
                by_split = {}
                for splits, fn in payload.items():
                    wrong = checked(fn(problems[0]))
                    by_split[splits] = None if wrong else timing.time_torch(fn, problems, device_time, rep_ms=40)
                timed = {s: ms for s, ms in by_split.items() if ms is not None}
                if not timed:
                    record(name, note="WRONG at every split")
                else:
                    best = min(timed, key=timed.get)
                    record(name, timed[best], note=f"splits {best}", splits=best, by_split=by_split)
            elif kind == "jax":
                ms, wrong = jax_time(payload)
                record(name, ms, note=wrong or "")
            elif kind == "jax splits":
                by_split, notes = {}, {}  # notes: why a count has no time (wrong, or an error)
                for splits, fn in payload.items():
                    try:  # one count failing leaves the others
                        by_split[splits], wrong = jax_time(fn)
                        if wrong:
                            notes[splits] = wrong
                    except Exception as error:
                        by_split[splits] = None
                        notes[splits] = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:120]}"
                timed = {s: ms for s, ms in by_split.items() if ms is not None}
                extra = dict(by_split=by_split, **({"split_notes": notes} if notes else {}))
                if not timed:
                    wrong_everywhere = all(n.startswith("WRONG") for n in notes.values())
                    record(name, note=f"{'WRONG' if wrong_everywhere else 'failed'} at every split", **extra)
                else:
                    best = min(timed, key=timed.get)
                    record(name, timed[best], note=f"splits {best}", splits=best, **extra)
        except Exception as error:  # one failing implementation must not end the run
            record(name, note=f"failed: {type(error).__name__}: {str(error).splitlines()[0][:80]}")
        torch.cuda.synchronize()
    if "torch_bridge" in result["impls"]:
        config = _launch_config(row, problems[0])
        result["chosen"] = dict(
            variant=config.variant, splits=config.num_kv_splits, block_h=config.block_h, block_n=config.block_n,
            warps=config.num_warps, stages=config.num_stages,
            schedule_programs=config.schedule_programs,  # > 0: the device-side schedule ran, not the splits
        )  # fmt: skip
    jax_arg_sets.clear()
    jax_arrays.clear()
    del problems
    torch.cuda.empty_cache()
    return result


def row_problem(row: Row):
    """The DecodeProblem both frontends build for a benchmark row, from shapes alone
    (through :func:`jax_decode.prepare.decode_problem`, the checks every call runs)."""
    from benchmarks.precompile import SpecArrays
    from jax_decode.operands import DecodeOperands, Spec
    from jax_decode.prepare import DECODE_NAMES, DecodeOptions, decode_problem

    problem = _problem_for(row, SpecArrays())
    arrays = (*problem.arrays, problem.k_scale, problem.v_scale, problem.sinks)
    specs = DecodeOperands(*(None if a is None else Spec(tuple(a.shape), a.dtype) for a in arrays))
    options = _options(row)
    return decode_problem(specs, DecodeOptions(options.get("head_dim_v"), None, row.logit_cap, row.window_left),
                          DECODE_NAMES)  # fmt: skip


def _launch_config(row: Row, problem, num_kv_splits: int | None = None):
    """The launch config torch_bridge plans for ``row`` on ``problem``'s device."""
    from jax_decode.launch import make_launch_config
    from torch_bridge.ops import device_info

    return make_launch_config(row_problem(row), device_info(problem.q.device), num_kv_splits)


def environment() -> dict:
    import jax
    import torch
    import triton

    env = dict(
        gpu=torch.cuda.get_device_name(),
        python=platform.python_version(),
        jax=jax.__version__,
        torch=torch.__version__,
        triton=triton.__version__,
        date=time.strftime("%Y-%m-%d"),
    )
    try:
        from jax_decode.backends.triton import import_jax_triton  # keeps TRITON_CACHE_DIR usable

        env["jax_triton"] = import_jax_triton().__version__
    except Exception:  # not installed: the jax_decode rows will say why they failed
        pass
    from importlib.metadata import PackageNotFoundError, version

    for peer in ("vllm", "flash-attn3-jax"):  # the installed versions, without importing them
        try:
            env[peer] = version(peer)
        except PackageNotFoundError:
            pass
    return env


def plot(results: list[dict], impls: tuple[str, ...], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["label"] for r in results]
    shown = [i for i in impls if any(r["impls"].get(i, {}).get("ms") for r in results)]
    fig, ax = plt.subplots(figsize=(max(10, 0.35 * len(labels) * max(1, len(shown))), 6))
    width = 0.8 / max(1, len(shown))
    for i, impl in enumerate(shown):
        values = [r["impls"].get(impl, {}).get("pct_roofline") or 0 for r in results]
        ax.bar([x + i * width for x in range(len(labels))], values, width, label=impl)
    ax.axhline(100, color="black", linewidth=0.8)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(labels))])
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("% of roofline (max of bytes / copy rate, FLOPs / matmul rate)")
    ax.set_title("Decode attention against its roofline")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench",
        description=__doc__.split("\n\n")[0].split(": ", 1)[1],
        epilog="Suites: core (the six core shapes plus fp16 / page-1 rows, and fp8 / window feature rows); "
        "models (real models' attention layers at several batches and contexts, uniform and long-tailed "
        "lengths, with fp8-cache variants); multi (one and several query tokens per row: speculative "
        "verification and multi-token prediction); all (core and models).",
    )
    parser.add_argument("--suite", default="core", choices=(*SUITES, "all"))  # "all": core and models
    parser.add_argument("--rows", nargs="*", help="only rows whose label contains one of these")
    parser.add_argument("--exclude", nargs="*", default=[], help="no rows whose label contains one of these")
    parser.add_argument("--impls", default=",".join(DEFAULT_IMPLS),
                        help=f"comma-separated, of: {', '.join(IMPLEMENTATIONS)}")  # fmt: skip
    parser.add_argument("--per-call", action="store_true", help="time single calls, host included")
    parser.add_argument("--sweep", default=",".join(map(str, SPLIT_SWEEP)), help="splits for 'best split'")
    parser.add_argument("--out", default="bench_out", help="folder for bench.json and bench.png")
    parser.add_argument("--list", action="store_true", help="list the rows and exit")
    parser.add_argument("--jobs", type=int, default=None, help="processes compiling kernels before the timing")
    args = parser.parse_args(argv)

    suites = ["core", "models"] if args.suite == "all" else [args.suite]
    rows = [row for suite in suites for row in SUITES[suite]()]
    if args.rows:
        rows = [r for r in rows if any(s in r.label for s in args.rows)]
    rows = [r for r in rows if not any(s in r.label for s in args.exclude)]
    wanted = tuple(i.strip() for i in args.impls.split(",") if i.strip())
    unknown = set(wanted) - set(IMPLEMENTATIONS)
    if unknown:
        parser.error(f"unknown implementations {sorted(unknown)}; choose from {', '.join(IMPLEMENTATIONS)}")
    sweep = tuple(int(s) for s in args.sweep.split(","))
    if args.list:
        for row in rows:
            print(f"{row.label}: {row.kv_bytes() / 1e6:.1f} MB of KV, {row.flops() / 1e9:.2f} GFLOP per call")
        return 0

    import torch

    if not torch.cuda.is_available():
        print(
            "python -m benchmarks.bench needs a CUDA GPU (timing the interpreter would mean nothing)", file=sys.stderr
        )
        return 2
    from benchmarks import timing

    env = environment()
    env["timing"] = "per call (host included)" if args.per_call else "device (CUDA graph / GPU span)"
    ceilings = dict(copy_tbps=timing.copy_bandwidth_tbps(), matmul_tflops=timing.matmul_tflops())
    print(f"{env}\nceilings: copy {ceilings['copy_tbps']:.2f} TB/s, bf16 matmul {ceilings['matmul_tflops']:.0f} "
          f"TFLOP/s\n\n{format_header(wanted)}", flush=True)  # fmt: skip
    unique = list({row.shape_key: row for row in rows}.values())
    jobs = [("ours", row, (None, *sweep)) for row in unique if {"torch_bridge", "best split"} & set(wanted)]
    jobs += [("vllm", row, VLLM_SPLITS) for row in unique if "vllm" in wanted and _vllm(row)[0] != "skip"]
    if jobs:
        from benchmarks.precompile import precompile

        started = time.time()
        compiled, errors = precompile(jobs, args.jobs)
        print(f"precompiled {compiled} kernels in {time.time() - started:.0f} s" + "".join(f"\n  {e}" for e in errors))
    results, done = [], {}
    for row in rows:
        key = row.shape_key
        if key in done:  # the same call under another model's name
            result = dict(done[key], label=row.label, suite=row.suite, row=dataclasses.asdict(row))
        else:
            result = done[key] = bench_row(row, wanted, ceilings, not args.per_call, sweep)
        results.append(result)
        print(format_row(result, wanted), flush=True)
        _write_json(args.out, env, ceilings, results)  # after every row: a run cut short keeps what it measured
    summary = _write_json(args.out, env, ceilings, results)
    print("\nsummary (geometric mean of % of roofline; chosen launch vs best split; torch_bridge vs vLLM best; "
          "jax_decode vs fa3_jax):")  # fmt: skip
    print(json.dumps(summary, indent=1))
    try:
        plot(results, wanted, os.path.join(args.out, "bench.png"))
    except ImportError:
        print("matplotlib is not installed: no bench.png", file=sys.stderr)
    print(f"\nwrote {args.out}/bench.json and bench.png")
    return 0


def _write_json(folder: str, env: dict, ceilings: dict, results: list) -> dict:
    summary = summarize(results)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "bench.json"), "w") as f:
        json.dump(dict(environment=env, ceilings=ceilings, results=results, summary=summary), f, indent=1)
    return summary


if __name__ == "__main__":
    sys.exit(main())
