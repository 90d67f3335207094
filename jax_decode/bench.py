"""``python -m jax_decode.bench``: decode attention against the GPU's copy bandwidth.

Measures, in one run on a CUDA GPU:

* the device's copy bandwidth (``dst.copy_(src)`` of 1 GiB: bytes read + written per
  second), the ceiling a memory-bound kernel can approach;
* ``jax_decode`` (jitted, triton backend), ``torch_bridge``, the xla backend, JAX
  Pallas' GPU ``paged_attention`` where it imports, and vLLM's
  ``decode_attention_fwd`` where ``vllm.attention.ops.triton_decode_attention``
  imports (its best ``num_kv_splits`` of 4..64, as published for the seed).

Inputs are random (never zeros) and rotate over enough copies that L2 cannot serve
them; every implementation's output is checked against a float32 dense reference
before it is timed.  torch is timed with ``triton.testing.do_bench`` (median), JAX as the
median over rounds of ``CALLS_PER_TIMING`` jitted calls ending in ``block_until_ready()``,
both rotating over the input sets; both include per-call host cost where it exceeds the
kernel's time.  ``--device-time`` takes the host out instead: torch replays a CUDA graph
of ``DEVICE_TIME_CALLS`` calls (timed by ``do_bench``), JAX runs them in one jitted
program whose GPU span (first kernel start to last kernel end) the profiler records.  Bandwidth counts
the KV bytes one call must read (an MLA latent once).  Prints a table and writes
``bench.json`` and ``bench.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX and torch share the GPU

from jax_decode.launch import itemsize  # noqa: E402
from jax_decode.synthetic import SEED_SHAPES  # noqa: E402

IMPLEMENTATIONS = ("jax_decode", "torch_bridge", "xla", "pallas", "vllm")
CALLS_PER_TIMING, ROUNDS = 20, 15
DEVICE_TIME_CALLS = 32  # calls per CUDA graph / jitted program with --device-time
L2_BYTES_TO_DEFEAT = 256 * 2**20  # rotate input sets until they exceed this (H200 L2: 60 MB)
MAX_ERROR = {"bfloat16": 5e-2, "float16": 1e-2, "float32": 1e-3}


@dataclasses.dataclass(frozen=True)
class BenchShape:
    name: str
    batch: int
    num_heads: int
    num_kv_heads: int
    head_dim_qk: int
    head_dim_v: int
    context: int
    page_size: int
    mla: bool
    dtype: str = "bfloat16"
    kv_dtype: str | None = None  # an fp8 cache (with per-KV-head scales)
    window_left: int | None = None
    feature: bool = False  # a feature row: reported, but outside the core suite's geomean

    @property
    def label(self) -> str:
        label = self.name if self.dtype == "bfloat16" else f"{self.name} {self.dtype}"
        if self.kv_dtype:
            label += f" kv-{self.kv_dtype.removeprefix('float8_')}"
        return label if self.window_left is None else f"{label} window{self.window_left}"

    @property
    def attended(self) -> int:
        """Tokens each row attends to (and the kernels read): the context or the window."""
        return self.context if self.window_left is None else min(self.context, self.window_left + 1)

    def kv_bytes(self) -> int:
        width = self.head_dim_qk if self.mla else self.head_dim_qk + self.head_dim_v
        return self.batch * self.attended * self.num_kv_heads * width * itemsize(self.kv_dtype or self.dtype)


def default_suite() -> list[BenchShape]:
    """The seed's six shapes (bf16), plus the first one in float16 and with page_size 1;
    then feature rows: fp8 caches, and a long context read through a short window."""
    suite = [BenchShape(name, *dims) for name, dims in SEED_SHAPES.items()]
    first, big = suite[0], suite[1]
    suite.append(dataclasses.replace(first, dtype="float16"))
    suite.append(dataclasses.replace(first, name=f"{first.name} page1", page_size=1))
    mla = next(shape for shape in suite if shape.mla)
    for shape in (first, big, mla):
        suite.append(dataclasses.replace(shape, kv_dtype="float8_e4m3fn", feature=True))
    long = dataclasses.replace(first, name="GQA 32/8 d128 b32 ctx32768", context=32768)
    suite.append(dataclasses.replace(long, window_left=4095, feature=True))
    return suite


def summarize(rows: list[dict], ceiling_tbps: float) -> dict:
    """Geometric mean of % of the ceiling per implementation, over the core suite's
    shapes it ran (feature rows excluded: they are not every implementation's)."""
    summary = {}
    for impl in IMPLEMENTATIONS:
        values = [
            r["tbps"] / ceiling_tbps for r in rows if r["impl"] == impl and r.get("tbps") and not r.get("feature")
        ]
        if values:
            summary[impl] = dict(
                shapes=len(values), geomean_pct=100 * math.exp(sum(map(math.log, values)) / len(values))
            )
    return summary


def format_table(rows: list[dict], ceiling_tbps: float) -> str:
    lines = [f"{'shape':<44} {'implementation':<13} {'ms':>8} {'TB/s':>6} {'% copy':>7}  note"]
    for r in rows:
        if r.get("ms") is None:
            lines.append(f"{r['shape']:<44} {r['impl']:<13} {'-':>8} {'-':>6} {'-':>7}  {r.get('note', '')}")
        else:
            pct = 100 * r["tbps"] / ceiling_tbps
            lines.append(
                f"{r['shape']:<44} {r['impl']:<13} {r['ms']:8.4f} {r['tbps']:6.2f} {pct:6.1f}%  {r.get('note', '')}"
            )
    return "\n".join(lines)


# --------------------------------------------------------------------------- GPU part


def _inputs(shape: BenchShape, copies: int, seed: int):
    """``copies`` independent input sets as torch CUDA tensors (shuffled pages)."""
    import torch

    dt = getattr(torch, shape.dtype)
    cache_dt = getattr(torch, shape.kv_dtype or shape.dtype)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    max_pages = -(-shape.context // shape.page_size)
    num_pages = shape.batch * max_pages
    sets = []
    for _ in range(copies):

        def randn(*dims, dtype=dt):
            return torch.randn(*dims, device="cuda", dtype=torch.float32, generator=gen).to(dtype)

        q = randn(shape.batch, shape.num_heads, shape.head_dim_qk)
        k = randn(num_pages, shape.page_size, shape.num_kv_heads, shape.head_dim_qk, dtype=cache_dt)
        v = (
            None
            if shape.mla
            else randn(num_pages, shape.page_size, shape.num_kv_heads, shape.head_dim_v, dtype=cache_dt)
        )
        order = torch.randperm(num_pages, device="cuda", generator=gen).to(torch.int32)
        pt = order.reshape(shape.batch, max_pages)
        sl = torch.full((shape.batch,), shape.context, device="cuda", dtype=torch.int32)
        sets.append((q, k, v, pt, sl))
    return sets


def _extras(shape: BenchShape) -> dict:
    """Keyword options of our implementations: per-KV-head scales for an fp8 cache, the window."""
    import torch

    extras = {}
    if shape.kv_dtype:
        scales = torch.linspace(0.5, 1.0, shape.num_kv_heads, device="cuda")
        extras.update(k_scale=scales, v_scale=None if shape.mla else scales.flip(0).contiguous())
    if shape.window_left is not None:
        extras["window_left"] = shape.window_left
    return {name: x for name, x in extras.items() if x is not None}


def _reference_rows(shape: BenchShape, q, k, v, pt, sl, rows: int):
    """float32 dense attention of the first ``rows`` rows, gathered through the page table."""
    import torch

    out = []
    extras = _extras(shape)
    k_scale = extras.get("k_scale")
    v_scale = k_scale if v is None else extras.get("v_scale")
    v_cache = k[..., : shape.head_dim_v] if v is None else v
    group = shape.num_heads // shape.num_kv_heads
    for b in range(rows):
        n = int(sl[b])
        first = 0 if shape.window_left is None else max(n - 1 - shape.window_left, 0)
        pages = pt[b, : -(-n // shape.page_size)].long()
        keys = k[pages].reshape(-1, shape.num_kv_heads, shape.head_dim_qk)[first:n].float()
        values = v_cache[pages].reshape(-1, shape.num_kv_heads, shape.head_dim_v)[first:n].float()
        if k_scale is not None:
            keys, values = keys * k_scale[:, None], values * v_scale[:, None]
        keys = keys.repeat_interleave(group, dim=1)  # [n, heads, d]
        values = values.repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[b].float(), keys) * shape.head_dim_qk**-0.5
        out.append(torch.einsum("hn,nhd->hd", scores.softmax(-1), values))
    return torch.stack(out)


def _time_torch(fn_for_set, sets, device_time: bool) -> float:
    """ms per call: do_bench (median) of single calls rotating over the input sets, or
    with ``device_time`` of a CUDA graph replaying DEVICE_TIME_CALLS calls (the host
    out of the measurement, as serving engines run decode)."""
    import torch
    import triton

    counter = [0]

    def step():
        fn_for_set(sets[counter[0] % len(sets)])
        counter[0] += 1

    if not device_time:
        return triton.testing.do_bench(step, warmup=25, rep=100, return_mode="median")
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
    return triton.testing.do_bench(graph.replay, warmup=10, rep=100, return_mode="median") / DEVICE_TIME_CALLS


def _time_jax(fn, arg_sets, device_time: bool) -> float:
    """ms per call: median over rounds of CALLS_PER_TIMING jitted calls (dispatched
    back to back) ending in ``block_until_ready()``; with ``device_time``, the GPU time
    of one jitted program making DEVICE_TIME_CALLS calls, first kernel start to last
    kernel end (:func:`gpu_span_ms`)."""
    import jax

    calls = DEVICE_TIME_CALLS if device_time else CALLS_PER_TIMING
    order = [arg_sets[i % len(arg_sets)] for i in range(calls)]
    if device_time:
        many = jax.jit(lambda sets: [fn(*args) for args in sets])

        def one_round():
            return many(order)
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
    its host-side dispatch (the arguments of 32 calls, the outputs), which is not the
    kernels' time.  The span still counts the gaps between kernels: XLA launches
    custom calls one by one (jaxlib's Triton handler is not admitted to XLA's CUDA
    graphs), ~1.4 us apart on the H200 where a CUDA graph's nodes are ~0.35 us apart.
    """
    import tempfile

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


def copy_bandwidth_tbps() -> float:
    import torch
    import triton

    src = torch.empty(2**30, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200)
    return 2 * src.numel() / ms / 1e9


def _implementations(shape: BenchShape, wanted: tuple[str, ...]):
    """name -> (kind, make) where make(set) returns a callable on one input set, or a reason string."""
    import jax
    import torch

    import jax_decode
    import torch_bridge

    head_dim_v = shape.head_dim_v if shape.mla else None
    extras = _extras(shape)
    window = extras.pop("window_left", None)
    jax_extras = {name: torch_bridge.to_jax(x) for name, x in extras.items()}
    impls = {}
    if "jax_decode" in wanted or "xla" in wanted:

        def jitted(backend):
            return jax.jit(
                lambda *a: jax_decode.decode_attention(
                    *a, head_dim_v=head_dim_v, window_left=window, backend=backend, **jax_extras
                )
            )

        for name, backend in (("jax_decode", "triton"), ("xla", "xla")):
            if name in wanted:
                impls[name] = ("jax", jitted(backend))
    if "torch_bridge" in wanted:
        out = torch.empty(
            shape.batch, shape.num_heads, shape.head_dim_v, device="cuda", dtype=getattr(torch, shape.dtype)
        )

        def run_bridge(s, out=out):
            q, k, v, pt, sl = s
            return torch_bridge.decode_attention(
                q, k, v, pt, sl, head_dim_v=head_dim_v, window_left=window, out=out, **extras
            )

        impls["torch_bridge"] = ("torch", run_bridge)
    others = {"pallas": _pallas, "vllm": _vllm}
    for name in (n for n in others if n in wanted):
        if shape.kv_dtype or shape.window_left is not None:
            impls[name] = ("skip", "no fp8 cache / sliding window in this implementation")
        else:
            impls[name] = others[name](shape)
    return impls


def _pallas(shape: BenchShape):
    try:
        from jax.experimental.pallas.ops.gpu import paged_attention as pallas_paged
    except Exception as error:  # removed or broken in this JAX
        return ("skip", f"does not import: {type(error).__name__}: {str(error)[:80]}")
    if shape.mla or shape.head_dim_qk != shape.head_dim_v:
        return ("skip", "no separate head_dim_v / shared latent (MLA) support")
    import jax

    def prepare(q, k, v, pt, sl):
        # Pallas applies no score scale and wants [num_kv_heads, num_pages, page_size, head_dim]
        # caches: both done once per input set, outside the timing.
        return (q * shape.head_dim_qk**-0.5, k.transpose(2, 0, 1, 3), v.transpose(2, 0, 1, 3), pt, sl)

    def run(q, k_pages, v_pages, pt, sl):
        return pallas_paged.paged_attention(
            q, k_pages, v_pages, pt, sl, pages_per_compute_block=max(1, 64 // shape.page_size)
        )

    return ("jax-layout", (jax.jit(prepare), jax.jit(run)))


def _vllm(shape: BenchShape):
    try:
        from vllm.attention.ops.triton_decode_attention import decode_attention_fwd
    except Exception as error:
        return ("skip", f"does not import: {type(error).__name__}: {str(error)[:80]}")
    return ("vllm", decode_attention_fwd)


def bench_shape(shape: BenchShape, wanted: tuple[str, ...], ceiling: float, device_time: bool = False) -> list[dict]:
    import jax
    import torch

    import torch_bridge

    copies = max(1, min(8, -(-L2_BYTES_TO_DEFEAT // shape.kv_bytes())))
    sets = _inputs(shape, copies, seed=0)
    expected = _reference_rows(shape, *sets[0], rows=min(2, shape.batch))
    rows = []

    def record(impl, ms=None, out=None, note=""):
        row = dict(shape=shape.label, impl=impl, kv_bytes=shape.kv_bytes(), ms=ms, note=note, feature=shape.feature)
        if out is not None:
            got = out[: expected.shape[0]].float()
            row["max_error"] = float((got - expected).abs().max())
            if not row["max_error"] <= MAX_ERROR[shape.dtype]:
                row.update(ms=None, note=f"WRONG: max error {row['max_error']:.3g}; not timed")
        if row["ms"] is not None:
            row["tbps"] = shape.kv_bytes() / row["ms"] / 1e9
            row["pct_of_copy"] = 100 * row["tbps"] / ceiling
        rows.append(row)
        print(format_table([row], ceiling).splitlines()[1], flush=True)

    for name, (kind, fn) in _implementations(shape, wanted).items():
        try:
            if kind == "skip":
                record(name, note=fn)
            elif kind == "torch":
                out = fn(sets[0]).clone()
                record(name, _time_torch(fn, sets, device_time), out)
            elif kind == "jax":
                arg_sets = [tuple(None if t is None else torch_bridge.to_jax(t) for t in s) for s in sets]
                out = torch_bridge.to_torch(jax.block_until_ready(fn(*arg_sets[0])))
                record(name, _time_jax(fn, arg_sets, device_time), out)
            elif kind == "jax-layout":
                prepare, fn = fn
                arg_sets = [prepare(*(torch_bridge.to_jax(t) for t in s)) for s in sets]
                out = torch_bridge.to_torch(jax.block_until_ready(fn(*arg_sets[0])))
                record(name, _time_jax(fn, arg_sets, device_time), out)
                del arg_sets
            elif kind == "vllm":
                best = None
                for splits in (4, 8, 16, 32, 64):
                    q0 = sets[0][0]
                    out = torch.empty(shape.batch, shape.num_heads, shape.head_dim_v, device="cuda", dtype=q0.dtype)
                    logits = torch.empty(shape.batch, shape.num_heads, splits, shape.head_dim_v + 1, device="cuda")

                    def run(s, splits=splits, out=out, logits=logits, fn=fn):
                        q, k, v, pt, sl = s
                        v = k[..., : shape.head_dim_v] if v is None else v
                        fn(q, k, v, out, pt, sl, logits, splits, shape.head_dim_qk**-0.5, shape.page_size)

                    ms = _time_torch(run, sets, device_time)
                    if best is None or ms < best[0]:
                        run(sets[0])
                        best = (ms, splits, out.clone())
                record(name, best[0], best[2], note=f"best num_kv_splits {best[1]}")
        except Exception as error:  # one failing implementation must not end the run
            record(name, note=f"failed: {type(error).__name__}: {str(error).splitlines()[0][:90]}")
        torch.cuda.synchronize()
    del sets
    torch.cuda.empty_cache()
    return rows


def _environment() -> dict:
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
        from jax_decode.triton_backend import import_jax_triton  # keeps TRITON_CACHE_DIR usable

        env["jax_triton"] = import_jax_triton().__version__
    except Exception:  # not installed: the jax_decode rows will say why they failed
        pass
    return env


def plot(rows: list[dict], ceiling: float, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    impls = [i for i in IMPLEMENTATIONS if any(r["impl"] == i and r.get("tbps") for r in rows)]
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(shapes)), 5))
    width = 0.8 / max(1, len(impls))
    for i, impl in enumerate(impls):
        values = [
            next(
                (100 * r["tbps"] / ceiling for r in rows if r["shape"] == s and r["impl"] == impl and r.get("tbps")), 0
            )
            for s in shapes
        ]
        ax.bar([x + i * width for x in range(len(shapes))], values, width, label=impl)
    ax.axhline(100, color="black", linewidth=0.8)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(shapes))])
    ax.set_xticklabels(shapes, rotation=25, ha="right", fontsize=8)
    ax.set_ylabel(f"% of copy bandwidth ({ceiling:.2f} TB/s)")
    ax.set_title("Decode attention: KV bytes read per second")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    suite = default_suite()
    parser = argparse.ArgumentParser(prog="python -m jax_decode.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="*", help="substrings of shape names to run (default: all)")
    parser.add_argument("--dtypes", nargs="*", choices=["bfloat16", "float16"], help="re-run the shapes in these")
    parser.add_argument(
        "--impls", default=",".join(IMPLEMENTATIONS), help="comma-separated, of " + ", ".join(IMPLEMENTATIONS)
    )
    parser.add_argument("--out", default="bench_out", help="folder for bench.json and bench.png")
    parser.add_argument("--device-time", action="store_true", help="time without per-call host cost (see above)")
    parser.add_argument("--list", action="store_true", help="list the default shapes and exit")
    args = parser.parse_args(argv)
    if args.shapes:
        suite = [s for s in suite if any(sub in s.label for sub in args.shapes)]
    if args.dtypes:
        suite = list(
            {
                dataclasses.replace(s, dtype=d).label: dataclasses.replace(s, dtype=d)
                for s in suite
                for d in args.dtypes
            }.values()
        )
    wanted = tuple(i.strip() for i in args.impls.split(",") if i.strip())
    unknown = set(wanted) - set(IMPLEMENTATIONS)
    if unknown:
        parser.error(f"unknown implementations {sorted(unknown)}; choose from {', '.join(IMPLEMENTATIONS)}")
    if args.list:
        for s in suite:
            print(f"{s.label}: {s.kv_bytes() / 1e6:.1f} MB of KV per call")
        return 0

    import torch

    if not torch.cuda.is_available():
        print(
            "python -m jax_decode.bench needs a CUDA GPU (timing the interpreter would mean nothing)", file=sys.stderr
        )
        return 2
    env = _environment()
    env["timing"] = (
        "device (torch: CUDA graph replay; JAX: GPU span of one jitted program)"
        if args.device_time
        else "per call (host included)"
    )
    ceiling = copy_bandwidth_tbps()
    print(f"{env}\ncopy bandwidth (the ceiling): {ceiling:.2f} TB/s\n", flush=True)
    print(format_table([], ceiling), flush=True)
    rows = []
    for shape in suite:
        rows += bench_shape(shape, wanted, ceiling, args.device_time)
    summary = summarize(rows, ceiling)
    print("\ngeometric mean of % of copy bandwidth (core suite; feature rows excluded):")
    for impl, s in summary.items():
        print(f"  {impl:<13} {s['geomean_pct']:5.1f}% over {s['shapes']} shapes")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump(dict(environment=env, copy_tbps=ceiling, rows=rows, summary=summary), f, indent=1)
    try:
        plot(rows, ceiling, os.path.join(args.out, "bench.png"))
    except ImportError:
        print("matplotlib is not installed: no bench.png", file=sys.stderr)
    print(f"\nwrote {args.out}/bench.json and bench.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
