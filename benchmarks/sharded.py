"""``python -m benchmarks.sharded``: one decode_attention call per sharding mode on N devices
against the same global problem on one device.

The modes are :mod:`jax_decode.sharding`'s, over one mesh axis of N devices:

* ``heads`` (tensor parallel): ``q`` sharded on ``num_heads``, the caches on
  ``num_kv_heads``; default a Llama-3.1-70B-like layer, whole (64 query / 8 KV heads of
  128, bf16, page 16), batch 16 at an 8k context;
* ``pages`` (sequence parallel): the caches sharded on ``num_pages``, the page table
  holding global page ids; default Llama-3.1-8B-like (32 / 8 heads of 128), one row of
  a 128k context;
* ``batch`` (data parallel): ``q``, ``page_table`` and ``seq_lens`` sharded on
  ``batch``, the caches replicated; default Llama-3.1-8B-like, batch 64 at a 4k context.

For each mode: the time per call of the jitted sharded call and of the same jitted call
on the first device alone (:func:`benchmarks.timing.time_jax`: device time, the GPU
span of 32 calls in one program, on GPUs; wall time per call, host included, elsewhere
or with ``--per-call``), the scaling efficiency ``t_one / (N * t_sharded)``, the sharded
result against the one-device result (``OUT_TOLERANCE`` of the dtype, LSE to
``LSE_TOLERANCE``) and the one-device result against the float64 oracle on two rows,
the output's sharding, and the collectives of the compiled program (HLO text): their
bytes, and that none is as large as a device's share of one cache.  For ``pages`` it
prints the README's estimate of the merge's all-reduce bytes beside what the HLO's
collectives move.  Writes the table to stdout and everything to ``--out`` (JSON);
exits 1 if a check failed.

    python -m benchmarks.sharded --out sharded.json                       # every GPU
    XLA_FLAGS=--xla_force_host_platform_device_count=4 python -m benchmarks.sharded \\
        --backend xla --batch 4 --heads 8 --kv-heads 4 --head-dim 16 --context 61 --page-size 4

On a CPU the host devices share the same cores: its times and efficiencies say
nothing about GPUs; the checks hold everywhere.  ``--profile DIR`` records a
``jax.profiler`` trace of a few sharded calls per mode (``DIR/<mode>``; on a GPU the
collective's kernels and their share of the call show there).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import re
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # the device timer's torch shares the GPU

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_decode  # noqa: E402
from benchmarks import timing  # noqa: E402
from jax_decode.reference import LSE_TOLERANCE, decode_attention_reference, tolerance_excess  # noqa: E402
from jax_decode.synthetic import NUMPY_DTYPES, PagedProblem, make_paged_problem  # noqa: E402

AXIS = "x"  # the one mesh axis every mode shards over
MODES = ("heads", "pages", "batch")
NAMES = ("q", "k_cache", "v_cache", "page_table", "seq_lens")
PROFILE_CALLS = 10
CHECKED_ROWS = 2  # the one-device result against the float64 oracle on this many rows


@dataclasses.dataclass(frozen=True)
class Shape:
    """The global problem: every row ``context`` tokens long."""

    batch: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    context: int
    page_size: int = 16
    dtype: str = "bfloat16"

    @property
    def label(self) -> str:
        return f"{self.num_heads}/{self.num_kv_heads} d{self.head_dim} b{self.batch} ctx{self.context}"

    @property
    def max_pages(self) -> int:
        return -(-self.context // self.page_size)

    def kv_bytes(self) -> int:
        """Bytes of K and V one call reads."""
        itemsize = np.dtype(NUMPY_DTYPES[self.dtype]).itemsize
        return self.batch * self.context * self.num_kv_heads * 2 * self.head_dim * itemsize


DEFAULT_SHAPES = {
    "heads": Shape(batch=16, num_heads=64, num_kv_heads=8, head_dim=128, context=8192),  # Llama-3.1-70B
    "pages": Shape(batch=1, num_heads=32, num_kv_heads=8, head_dim=128, context=131072),  # Llama-3.1-8B, 128k
    "batch": Shape(batch=64, num_heads=32, num_kv_heads=8, head_dim=128, context=4096),  # Llama-3.1-8B
}

# Each mode's operand shardings (README "Sharding"); operands not named are replicated.
SPECS = {
    "heads": dict(q=P(None, AXIS), k_cache=P(None, None, AXIS), v_cache=P(None, None, AXIS)),
    "pages": dict(k_cache=P(AXIS), v_cache=P(AXIS)),
    "batch": dict(q=P(AXIS), page_table=P(AXIS), seq_lens=P(AXIS)),
}
# The sharding of out (and lse) each mode must give: anything else means the rule fell back.
OUT_SPECS = {"heads": P(None, AXIS), "pages": P(), "batch": P(AXIS)}


def check_fits(mode: str, shape: Shape, devices: int) -> None:
    """ValueError where ``mode`` cannot split ``shape`` evenly over ``devices`` (the rule
    would silently replicate what it cannot split, and the benchmark time nothing)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if devices < 2:
        raise ValueError(
            f"a sharded benchmark needs at least 2 devices, got {devices}; on a CPU, set "
            "XLA_FLAGS=--xla_force_host_platform_device_count=N before starting Python"
        )
    if mode == "heads" and shape.num_kv_heads % devices:
        raise ValueError(
            f"heads: num_kv_heads ({shape.num_kv_heads}) must be a multiple of the device count ({devices}); "
            "pass --kv-heads or --devices"
        )
    if mode == "batch" and shape.batch % devices:
        raise ValueError(
            f"batch: batch ({shape.batch}) must be a multiple of the device count ({devices}); "
            "pass --batch or --devices"
        )


class JaxArrays:
    """An :class:`~jax_decode.synthetic.ArrayFactory` of JAX arrays on ``device``, drawn
    there (a cache of gigabytes is not drawn on the host).  No fp8 caches here."""

    def __init__(self, device):
        self.device = device

    def normal(self, rng: np.random.Generator, shape, dtype: str):
        key = jax.random.key(int(rng.integers(2**62)))
        with jax.default_device(self.device):
            return jax.random.normal(key, shape, jnp.dtype(dtype))

    def from_numpy(self, array: np.ndarray):
        return jax.device_put(array, self.device)

    def to_numpy(self, array) -> np.ndarray:
        return np.asarray(array)


def spare_pages(shape: Shape, devices: int) -> int:
    """Pages nobody uses: at least ``devices``, and enough that ``num_pages`` is a
    multiple of ``devices`` (the rules split pages evenly only)."""
    used = shape.batch * shape.max_pages
    return devices + (-(used + devices)) % devices


def make_problem(shape: Shape, devices: int, device, seed: int = 0) -> PagedProblem:
    """The global problem on ``device``, its pages shuffled (:func:`spare_pages` spare)."""
    spare = spare_pages(shape, devices)
    return make_paged_problem(
        batch=shape.batch, num_heads=shape.num_heads, num_kv_heads=shape.num_kv_heads, head_dim_qk=shape.head_dim,
        page_size=shape.page_size, seq_lens=[shape.context] * shape.batch, dtype=shape.dtype,
        max_pages=shape.max_pages, spare_pages=spare, seed=seed, arrays=JaxArrays(device),
    )  # fmt: skip


# --------------------------------------------------------------------------- the compiled program's collectives

COLLECTIVES = ("all-reduce", "all-gather", "all-to-all", "reduce-scatter", "collective-permute",
               "collective-broadcast", "ragged-all-to-all")  # fmt: skip
# "%name = <type> <op>(" and "<op>-start(" (async on GPU); "-done" repeats a start and is left out.
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z][\w\-]*)\(")
_ARRAY_TYPE = re.compile(r"\b(pred|[suf]\d+|bf16|f8e\w+|c64|c128)\[([\d,]*)\]")
_BITS = {"pred": 8, "bf16": 16, "c64": 64, "c128": 128}


def _type_bytes(text: str) -> tuple[int, list[str]]:
    """(bytes, ["f32[2,8]", ...]) of every array type in an HLO type (a tuple included)."""
    total, arrays = 0, []
    for dtype, dims in _ARRAY_TYPE.findall(text):
        bits = _BITS.get(dtype) or int(re.search(r"\d+", dtype).group())  # f8e4m3fn: 8
        total += math.prod(int(d) for d in dims.split(",") if d) * bits // 8
        arrays.append(f"{dtype}[{dims}]")
    return total, arrays


def _call_operands(line: str, start: int) -> str:
    """The text between the parentheses opening at ``line[start]``."""
    depth = 0
    for i in range(start, len(line)):
        depth += {"(": 1, ")": -1}.get(line[i], 0)
        if depth == 0:
            return line[start + 1 : i]
    return line[start + 1 :]


def collectives(hlo: str) -> list[dict]:
    """Each collective of a compiled HLO module's text: its op, the arrays and bytes of
    its result and of its operands (typed inline, or found at their definitions)."""
    types, found = {}, []
    for line in hlo.splitlines():
        match = _INSTRUCTION.match(line)
        if match is None:
            continue
        name, result_type, op = match.groups()
        types[name] = result_type
        base = op.removesuffix("-start")
        if base not in COLLECTIVES:
            continue
        operand_text = _call_operands(line, match.end() - 1)
        operand_bytes, operand_arrays = _type_bytes(operand_text)
        if not operand_arrays:  # untyped operands ("%fusion.3"): their definitions' types
            for ref in re.findall(r"%([\w.\-]+)", operand_text):
                b, arrays = _type_bytes(types.get(ref, ""))
                operand_bytes, operand_arrays = operand_bytes + b, operand_arrays + arrays
        result_bytes, result_arrays = _type_bytes(result_type)
        found.append(dict(op=base, name=name, result=result_arrays, result_bytes=result_bytes,
                          operands=operand_arrays, operand_bytes=operand_bytes))  # fmt: skip
    return found


def moving_a_cache(found: list[dict], cache_bytes: int) -> list[dict]:
    """The collectives whose operands or result are as large as ``cache_bytes`` (one
    device's share of one cache): none should be; the rules move out and lse only."""
    return [c for c in found if max(c["operand_bytes"], c["result_bytes"]) >= cache_bytes]


def readme_merge_bytes(shape: Shape) -> int:
    """The README's estimate of the pages mode's collectives ("a max and two sums of
    ``[batch, heads(, head_dim_v)]`` float32"): the max of lse, the sums of the weights
    and of the weighted out."""
    return 4 * shape.batch * shape.num_heads * (1 + 1 + shape.head_dim)


def si_bytes(n: float) -> str:
    """Bytes in decimal units."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


# --------------------------------------------------------------------------- one mode


def _lse_excess(got, expected) -> float:
    """max(|got - expected| - (atol + rtol * |expected|)); equal infinities pass."""
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    same = got == expected  # -inf rows
    with np.errstate(invalid="ignore"):
        excess = np.abs(got - expected) - (LSE_TOLERANCE["atol"] + LSE_TOLERANCE["rtol"] * np.abs(expected))
    excess = np.where(same, -np.inf, excess)
    return float(np.nan) if np.isnan(excess).any() else float(excess.max(initial=-np.inf))


def _oracle_excess(problem: PagedProblem, out, dtype: str) -> float:
    """The one-device out against the float64 oracle on the first and last rows."""
    rows = sorted({0, problem.q.shape[0] - 1})[:CHECKED_ROWS]
    host = problem.host_rows(rows)
    expected, _ = decode_attention_reference(*host.arrays)
    return tolerance_excess(np.asarray(out[np.asarray(rows)], np.float64), expected, dtype)


def _place(problem: PagedProblem, mesh: Mesh, mode: str) -> tuple:
    specs = SPECS[mode]
    named = zip(NAMES, problem.arrays, strict=True)
    return tuple(jax.device_put(a, NamedSharding(mesh, specs.get(n, P()))) for n, a in named)


def _decode(backend: str):
    return jax.jit(lambda *arrays: jax_decode.decode_attention(*arrays, return_lse=True, backend=backend))


def bench_mode(mode: str, shape: Shape, devices: list, *, backend: str, device_time: bool,
               profile_dir: str | None = None) -> dict:  # fmt: skip
    """One mode on ``devices`` (a mesh of one axis) against ``devices[0]`` alone.

    Checks first (results, output sharding, collectives); times only where the results
    match."""
    n = len(devices)
    check_fits(mode, shape, n)
    mesh = Mesh(np.array(devices), (AXIS,))
    sets = max(1, timing.input_sets_needed(shape.kv_bytes() // n))  # each device's L2 meets new data
    problems = [make_problem(shape, n, devices[0], seed) for seed in range(sets)]
    local = [tuple(p.arrays) for p in problems]
    placed = [_place(p, mesh, mode) for p in problems]
    one, sharded = _decode(backend), _decode(backend)

    out_one, lse_one = jax.block_until_ready(one(*local[0]))
    out_n, lse_n = jax.block_until_ready(sharded(*placed[0]))
    result = dict(mode=mode, label=shape.label, shape=dataclasses.asdict(shape), devices=n, backend=backend,
                  input_sets=sets)  # fmt: skip
    result["oracle_excess"] = _oracle_excess(problems[0], out_one, shape.dtype)
    result["out_excess"] = tolerance_excess(np.asarray(out_n, np.float64), np.asarray(out_one, np.float64),
                                            shape.dtype)  # fmt: skip
    result["lse_excess"] = _lse_excess(lse_n, lse_one)
    result["out_max_abs_diff"] = float(np.abs(np.asarray(out_n, np.float64) - np.asarray(out_one, np.float64)).max())
    expected = NamedSharding(mesh, OUT_SPECS[mode])
    result["out_sharding"] = str(out_n.sharding.spec)
    sharded_as_expected = out_n.sharding.is_equivalent_to(expected, out_n.ndim) and lse_n.sharding.is_equivalent_to(
        expected, lse_n.ndim
    )

    hlo = sharded.lower(*placed[0]).compile().as_text()
    found = collectives(hlo)
    cache = placed[0][1]  # k_cache
    cache_bytes = cache.addressable_shards[0].data.nbytes  # one device's share of one cache
    result.update(
        collectives=found,
        collective_bytes=sum(c["operand_bytes"] for c in found),
        cache_bytes_per_device=cache_bytes,
        cache_moved=moving_a_cache(found, cache_bytes),
    )
    if mode == "pages":
        result["readme_merge_bytes"] = readme_merge_bytes(shape)

    matches = result["oracle_excess"] <= 0 and result["out_excess"] <= 0 and result["lse_excess"] <= 0  # NaN fails
    problems_found = []
    if not result["oracle_excess"] <= 0:
        problems_found.append(f"one device off the oracle by {result['oracle_excess']:.3g}")
    if not (result["out_excess"] <= 0 and result["lse_excess"] <= 0):
        problems_found.append(f"sharded != one device (out by {result['out_excess']:.3g}, "
                              f"lse by {result['lse_excess']:.3g} beyond the tolerance)")  # fmt: skip
    if not sharded_as_expected:
        problems_found.append(f"out sharded as {out_n.sharding.spec}, not {OUT_SPECS[mode]}")
    if result["cache_moved"]:
        problems_found.append(f"{len(result['cache_moved'])} collective(s) move a cache's worth of bytes")
    result["wrong"] = "; ".join(problems_found) or None

    result["one_device_ms"] = result["sharded_ms"] = result["efficiency"] = None
    if matches:
        result["one_device_ms"] = timing.time_jax(one, local, device_time)
        result["sharded_ms"] = timing.time_jax(sharded, placed, device_time)
        result["efficiency"] = efficiency(result["one_device_ms"], result["sharded_ms"], n)
    if profile_dir:
        with jax.profiler.trace(os.path.join(profile_dir, mode), create_perfetto_trace=True):
            for i in range(PROFILE_CALLS):
                jax.block_until_ready(sharded(*placed[i % len(placed)]))
    return result


def efficiency(one_ms: float, sharded_ms: float, devices: int) -> float:
    """``t_one / (N * t_sharded)``: 1 when N devices are N times as fast as one."""
    return one_ms / (devices * sharded_ms)


# --------------------------------------------------------------------------- output


def environment(devices: list, backend: str, device_time: bool) -> dict:
    import jaxlib

    env = dict(
        device_kind=devices[0].device_kind,
        platform=devices[0].platform,
        device_count=len(devices),
        devices_visible=len(jax.devices()),
        backend=backend,
        timing="device (GPU span of 32 calls in one program)" if device_time else "wall time per call, host included",
        python=platform.python_version(),
        jax=jax.__version__,
        jaxlib=jaxlib.__version__,
        date=time.strftime("%Y-%m-%d"),
    )
    from importlib.metadata import PackageNotFoundError, version

    for package in ("triton", "jax-triton", "torch"):  # the installed versions, without importing them
        try:
            env[package] = version(package)
        except PackageNotFoundError:
            env[package] = None
    return env


HEADER = ("| mode | shape | devices | one device ms | sharded ms | efficiency | vs one device | collectives "
          "| largest / cache per device |\n|---|---|---|---|---|---|---|---|---|")  # fmt: skip


def format_row(r: dict) -> str:
    def ms(x):
        return "–" if x is None else f"{x:.4f}"

    ops: dict[str, int] = {}
    for c in r["collectives"]:
        ops[c["op"]] = ops.get(c["op"], 0) + 1
    moved = ", ".join(f"{op} ×{k}" for op, k in ops.items()) or "none"
    if r["collectives"]:
        moved += f", {si_bytes(r['collective_bytes'])}"
    largest = max((max(c["operand_bytes"], c["result_bytes"]) for c in r["collectives"]), default=0)
    check = "ok" if r["wrong"] is None else f"WRONG: {r['wrong']}"
    eff = "–" if r["efficiency"] is None else f"{r['efficiency']:.2f}"
    share = f"{si_bytes(largest)} / {si_bytes(r['cache_bytes_per_device'])}"
    return (f"| {r['mode']} | {r['label']} | {r['devices']} | {ms(r['one_device_ms'])} | {ms(r['sharded_ms'])} "
            f"| {eff} | {check} | {moved} | {share} |")  # fmt: skip


def pages_note(r: dict) -> str:
    return (f"pages: the README's estimate of the merge (a max and two sums of [batch, heads(, head_dim_v)] "
            f"float32) is {si_bytes(r['readme_merge_bytes'])} ({r['readme_merge_bytes']} B); the HLO's "
            f"collectives move {si_bytes(r['collective_bytes'])} ({r['collective_bytes']} B): "
            + "; ".join(f"{c['op']} {' '.join(c['operands'])}" for c in r["collectives"]))  # fmt: skip


def _shape_for(mode: str, args) -> Shape:
    overrides = dict(batch=args.batch, num_heads=args.heads, num_kv_heads=args.kv_heads, head_dim=args.head_dim,
                     context=args.context, page_size=args.page_size, dtype=args.dtype)  # fmt: skip
    return dataclasses.replace(DEFAULT_SHAPES[mode], **{k: v for k, v in overrides.items() if v is not None})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sharded",
                                     description=__doc__.split("\n\n")[0].split(": ", 1)[1])  # fmt: skip
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of: {', '.join(MODES)}")
    parser.add_argument("--devices", type=int, default=None, help="how many of jax.devices() (default: all)")
    parser.add_argument("--backend", choices=("triton", "xla", "interpret"), default=None,
                        help="default: triton on GPUs, xla elsewhere")  # fmt: skip
    parser.add_argument("--per-call", action="store_true", help="wall time per call (host included) on GPUs too")
    for flag, what in (
        ("--batch", "rows"),
        ("--heads", "query heads"),
        ("--kv-heads", "KV heads"),
        ("--head-dim", "head dim"),
        ("--context", "tokens per row"),
        ("--page-size", "page size"),
    ):
        parser.add_argument(flag, type=int, default=None, help=f"{what}, for every mode (default: each mode's)")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default=None)
    parser.add_argument("--profile", metavar="DIR", default=None, help="a jax.profiler trace per mode in DIR/<mode>")
    parser.add_argument("--out", default="sharded.json", help="the JSON file")
    args = parser.parse_args(argv)

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"unknown modes {unknown}; choose from {', '.join(MODES)}")
    if args.backend == "interpret":
        parser.error("backend 'interpret' runs the kernels in a host callback, which JAX cannot partition "
                     "(README 'Sharding'); use xla on a CPU, triton on GPUs")  # fmt: skip
    devices = jax.devices()
    if args.devices is not None:
        if not 2 <= args.devices <= len(devices):
            parser.error(f"--devices must be in [2, {len(devices)}] (the devices JAX sees), got {args.devices}")
        devices = devices[: args.devices]
    on_gpu = devices[0].platform == "gpu"
    backend = args.backend or ("triton" if on_gpu else "xla")
    device_time = on_gpu and not args.per_call
    shapes = {mode: _shape_for(mode, args) for mode in modes}
    try:
        for mode in modes:
            check_fits(mode, shapes[mode], len(devices))
    except ValueError as error:
        parser.error(str(error))

    env = environment(devices, backend, device_time)
    print(json.dumps(env), flush=True)
    if not on_gpu:
        print("(not GPUs: the devices share this host's cores, so times and efficiencies say nothing about GPUs)")
    print("\n" + HEADER, flush=True)
    results, notes = [], []
    for mode in modes:
        result = bench_mode(mode, shapes[mode], devices, backend=backend, device_time=device_time,
                            profile_dir=args.profile)  # fmt: skip
        results.append(result)
        print(format_row(result), flush=True)
        if mode == "pages":
            notes.append(pages_note(result))
        _write(args.out, env, results)  # after every mode: a run cut short keeps what it measured
    print("\n" + "\n".join(notes) if notes else "", f"\nwrote {args.out}", sep="")
    return 1 if any(r["wrong"] for r in results) else 0


def _write(path: str, env: dict, results: list[dict]) -> None:
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "w") as f:
        json.dump(dict(environment=env, results=results), f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
