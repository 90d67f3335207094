"""``python -m jax_decode``: decode attention on synthetic paged caches, checked and timed.

Runs a few model shapes (GQA, MHA, MQA, MLA) on the best backend available (the Triton
kernels on a GPU, plain XLA elsewhere), checks each against the float64 oracle, and
prints a table: shape, backend, max error, time, and on a GPU the KV bandwidth.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

# JAX and the kernels are imported after the arguments are parsed: ``--help`` and a bad
# argument answer at once, and JAX imports through jax_decode._quiet.
BACKENDS = ("auto", "triton", "xla", "interpret")  # jax_decode.backends.BACKENDS, held equal by a test
GPU_PLATFORMS = ("gpu", "cuda", "rocm")

# Worst |error| accepted per dtype (outputs are O(1)); the tests hold the tight ones.
MAX_ERROR = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}
CHECKED_ROWS = 8  # the float64 oracle is a Python loop: check a subset of large batches


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    batch: int
    num_heads: int
    num_kv_heads: int
    head_dim_qk: int
    head_dim_v: int
    context: int
    page_size: int = 16
    mla: bool = False


GPU_SHAPES = (
    Shape("GQA 32/8 d128", 32, 32, 8, 128, 128, 4096),
    Shape("GQA 32/8 d128 long", 1, 32, 8, 128, 128, 32768),
    Shape("MHA 32/32 d128", 64, 32, 32, 128, 128, 2048),
    Shape("MQA 8/1 d256", 8, 8, 1, 256, 256, 8192),
    Shape("MLA 16/1 576/512", 64, 16, 1, 576, 512, 4096, page_size=1, mla=True),
)
CPU_SHAPES = (
    Shape("GQA 32/8 d128", 4, 32, 8, 128, 128, 1024),
    Shape("MHA 16/16 d128", 4, 16, 16, 128, 128, 512),
    Shape("MQA 8/1 d256", 2, 8, 1, 256, 256, 1024),
    Shape("MLA 16/1 576/512", 2, 16, 1, 576, 512, 512, mla=True),
)


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _time_ms(fn, args, repeats: int) -> float:
    import jax

    jax.block_until_ready(fn(*args))  # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def run_shape(shape: Shape, backend: str, dtype: str, on_gpu: bool, repeats: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jax_decode.api import decode_attention
    from jax_decode.reference import decode_attention_reference
    from jax_decode.synthetic import make_paged_problem

    # Lengths vary around the context so rows are not all alike.
    lengths = np.linspace(shape.context // 2, shape.context, shape.batch).astype(np.int32)
    problem = make_paged_problem(
        batch=shape.batch,
        num_heads=shape.num_heads,
        num_kv_heads=shape.num_kv_heads,
        head_dim_qk=shape.head_dim_qk,
        head_dim_v=shape.head_dim_v,
        page_size=shape.page_size,
        seq_lens=lengths,
        dtype=dtype,
        mla=shape.mla,
    )
    head_dim_v = shape.head_dim_v if shape.mla else None
    step = jax.jit(lambda *a: decode_attention(*a, head_dim_v=head_dim_v, backend=backend))
    args = tuple(None if a is None else jnp.asarray(a) for a in problem.arrays)
    out = np.asarray(jax.block_until_ready(step(*args)), np.float64)

    rows = np.unique(np.linspace(0, shape.batch - 1, min(CHECKED_ROWS, shape.batch)).astype(int))
    q, k, v, pt, sl = problem.arrays
    expected, _ = decode_attention_reference(q[rows], k, v, pt[rows], sl[rows], head_dim_v=head_dim_v)
    error = float(np.abs(out[rows] - expected).max())
    ms = _time_ms(step, args, repeats)
    tbps = problem.kv_bytes() / (ms * 1e-3) / 1e12 if on_gpu else None
    return dict(
        shape=shape.name, backend=backend, dtype=dtype, error=error, ms=ms, tbps=tbps, ok=error <= MAX_ERROR[dtype]
    )


def _format_table(rows: list[dict]) -> str:
    header = f"{'shape':<22} {'backend':<9} {'dtype':<9} {'max |err|':>10} {'ms':>9} {'TB/s':>6}  check"
    lines = [header, "-" * len(header)]
    for r in rows:
        tbps = f"{r['tbps']:.2f}" if r["tbps"] is not None else "-"
        lines.append(
            f"{r['shape']:<22} {r['backend']:<9} {r['dtype']:<9} {r['error']:>10.2e} {r['ms']:>9.3f} {tbps:>6}  "
            + ("ok" if r["ok"] else "FAILED")
        )
    return "\n".join(lines)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (the time is the median of that many calls), got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m jax_decode", description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=BACKENDS, default="auto")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--repeats", type=_positive_int, default=20, help="timed calls per shape (median; >= 1)")
    parser.add_argument("--quick", action="store_true", help="small shapes, few repeats (a smoke test)")
    return parser.parse_args(argv)


def _why_unusable(backend: str, platform: str) -> str | None:
    """Why ``backend`` cannot run here, in one line (a known user error), or None."""
    if backend == "triton":
        if platform not in GPU_PLATFORMS:
            return (
                f"--backend triton runs the Triton kernels on a CUDA GPU, and JAX has none here (platform {platform}); "
                "use --backend xla, or leave --backend out (triton on a GPU, xla elsewhere)"
            )
        from jax_decode.backends import triton as triton_backend

        why = triton_backend.why_unusable(triton_backend.target_device())
        return None if why is None else f"--backend triton {why}"
    if backend == "interpret":
        from jax_decode.backends.interpret import require_torch

        try:
            require_torch()
        except ImportError as error:
            return f"--backend interpret: {error}"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from jax_decode._quiet import import_jax

    jax = import_jax()
    platform = jax.devices()[0].platform
    unusable = _why_unusable(args.backend, platform)
    if unusable is not None:
        print(f"python -m jax_decode: error: {unusable}", file=sys.stderr)
        return 2

    on_gpu = platform in GPU_PLATFORMS
    shapes = GPU_SHAPES if on_gpu else CPU_SHAPES
    if args.quick:
        shapes = tuple(dataclasses.replace(s, batch=min(s.batch, 2), context=min(s.context, 128)) for s in shapes)
        args.repeats = min(args.repeats, 3)
    backend = args.backend
    label = backend
    if backend == "auto":  # as jax_decode.backends.dispatch chooses
        label = "triton" if on_gpu and _why_unusable("triton", platform) is None else "xla"
    _progress(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; backend {label}")

    rows = []
    for i, shape in enumerate(shapes, 1):
        _progress(
            f"[{i}/{len(shapes)}] {shape.name}, batch {shape.batch}, context {shape.context}: "
            "compiling, checking against the float64 oracle, timing ..."
        )
        row = run_shape(shape, backend, args.dtype, on_gpu, args.repeats)
        rows.append(dict(row, backend=label))
    print(_format_table(rows))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
