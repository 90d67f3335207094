"""What the compiled stage-1 kernel costs per SM, without a GPU.

Compiles the stage-1 kernel the launch config picks for each benchmark shape for an
NVIDIA target (Triton's bundled ptxas; no GPU or CUDA install needed) and reports its
registers per thread, spilled bytes, shared memory per program, how many programs fit
an SM by each of those, and the SASS of its main loop: instructions per warp per tile
and the most frequent opcodes.  These explain occupancy (an fp8 MLA latent spills with
4 warps; the fp8 GQA kernel needs 255 registers, so two programs fit an SM), but the
instruction count alone does not predict speed: time candidates on a GPU
(``benchmarks/sweep.py``, ``python -m jax_decode.bench``).  The numbers depend on the
Triton version (the H200 image has 3.6; under 3.9 the fp8 GQA kernel needs 203
registers, under 3.6 all 255): report with the version the kernels will run under.

    python benchmarks/kernel_resources.py --shapes MLA --kv-dtype float8_e4m3fn --cc 90
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from jax_decode import kernels
from jax_decode.launch import DecodeProblem, DeviceInfo, make_launch_config
from jax_decode.synthetic import SEED_SHAPES
from jax_decode.validation import check_decode_args

TRITON_TYPES = {
    "float16": "fp16",
    "bfloat16": "bf16",
    "float32": "fp32",
    "float8_e4m3fn": "fp8e4nv",
    "float8_e5m2": "fp8e5",
}
# Per-SM limits of the NVIDIA parts we tune for (registers, threads, resident programs,
# shared memory in bytes).
SM_REGISTERS, SM_THREADS, SM_PROGRAMS = 65536, 2048, 32
SM_SHARED = {80: 167936, 86: 101376, 89: 101376, 90: 232448}


def _tool(name: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def tools_available() -> bool:
    return all(os.path.exists(_tool(name)) for name in ("ptxas", "nvdisasm", "cuobjdump"))


def _stage1_source(config):
    """The ASTSource of the launch's stage-1 kernel: pointer types, runtime ints, constexprs."""
    launch = config.stage1(config.contiguous_strides())
    fn = kernels.STAGE1_KERNELS[launch.kernel_name]
    q_type, kv_type = TRITON_TYPES[config.problem.dtype], TRITON_TYPES[config.problem.cache_dtype]
    runtime = {
        "q_ptr": "*" + q_type,
        "k_ptr": "*" + kv_type,
        "v_ptr": "*" + kv_type,
        "page_table_ptr": "*i32",
        "seq_lens_ptr": "*i32",
        "k_scale_ptr": "*fp32",
        "v_scale_ptr": "*fp32",
        "num_pages": "i32",
        "mid_o_ptr": "*fp32",
        "mid_lse_ptr": "*fp32",
    }
    signature = {name: runtime.get(name, "constexpr") for name in fn.arg_names}
    # Every buffer is 16-byte aligned in both frontends (Triton specialises on it).
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names) if name.endswith("_ptr")}
    return ASTSource(fn, signature, launch.meta(), attrs), launch


def _main_loop(sass: str) -> list[str]:
    """Instructions of the longest backward branch (the loop over the KV blocks)."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"\s*\.(L_x_\d+):", line))}
    longest = (0, -1)
    for i, line in enumerate(lines):
        m = re.search(r"BRA\s+(?:`\()?\.?(L_x_\d+)", line)
        if m and labels.get(m.group(1), i) < i and i - labels[m.group(1)] > longest[1] - longest[0]:
            longest = (labels[m.group(1)], i)
    return [line for line in lines[longest[0] : longest[1] + 1] if re.search(r"/\*[0-9a-f]{4}\*/", line)]


def kernel_resources(problem: DecodeProblem, compute_capability: int = 90, num_sms: int = 132) -> dict:
    """Compile the stage-1 kernel for ``problem`` and return its per-SM resource report."""
    config = make_launch_config(problem, DeviceInfo("nvidia", compute_capability, num_sms))
    source, launch = _stage1_source(config)
    compiled = triton.compile(
        source,
        target=GPUTarget("cuda", compute_capability, 32),
        options=dict(num_warps=launch.num_warps, num_stages=launch.num_stages),
    )
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "stage1.cubin")
        with open(cubin, "wb") as f:
            f.write(compiled.asm["cubin"])
        usage = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", cubin], capture_output=True, text=True)
        sass = subprocess.run([_tool("nvdisasm"), "-c", cubin], capture_output=True, text=True).stdout
    registers = int(re.search(r"REG:(\d+)", usage.stdout).group(1))
    spilled = int(re.search(r"STACK:(\d+)", usage.stdout).group(1))
    shared = compiled.metadata.shared
    threads = 32 * launch.num_warps
    loop = _main_loop(sass)
    opcodes = collections.Counter(
        m.group(1).split(".")[0]
        for line in loop
        if (m := re.search(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line))
    )
    return dict(
        variant=config.variant,
        block_n=config.block_n,
        block_h=config.block_h,
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
        registers=registers,
        spilled_bytes=spilled,
        shared_bytes=shared,
        programs_per_sm_by_registers=min(SM_REGISTERS // (registers * threads), SM_THREADS // threads),
        programs_per_sm_by_shared=min(SM_SHARED.get(compute_capability, SM_SHARED[80]) // max(shared, 1), SM_PROGRAMS),
        loop_instructions_per_warp=len(loop),
        loop_tokens=config.block_n,
        top_opcodes=opcodes.most_common(8),
    )


def _problem(dims, dtype: str, kv_dtype: str | None) -> DecodeProblem:
    """The problem decode_attention would build for a benchmark shape (through the same
    argument checks), with per-KV-head scales for an fp8 cache, as the benchmark's rows."""
    batch, heads, kv_heads, dqk, dv, context, page, mla = dims
    cache_dtype = kv_dtype or dtype
    pages = batch * context // page + 1
    scale = ((kv_heads,), "float32") if kv_dtype else None
    return check_decode_args(
        q_shape=(batch, heads, dqk),
        q_dtype=dtype,
        k_shape=(pages, page, kv_heads, dqk),
        k_dtype=cache_dtype,
        v_shape=None if mla else (pages, page, kv_heads, dv),
        v_dtype=None if mla else cache_dtype,
        page_table_shape=(batch, context // page),
        page_table_dtype="int32",
        seq_lens_shape=(batch,),
        seq_lens_dtype="int32",
        head_dim_v=dv if mla else None,
        sm_scale=None,
        logit_cap=0.0,
        k_scale=scale,
        v_scale=None if mla else scale,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="*", help="substrings of benchmark shape names (default: all)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--kv-dtype", choices=["float8_e4m3fn", "float8_e5m2"], help="an fp8 cache")
    parser.add_argument("--cc", type=int, default=90, help="compute capability to compile for (default 90)")
    args = parser.parse_args()
    if not tools_available():
        raise SystemExit("this Triton install has no bundled ptxas / nvdisasm / cuobjdump")
    for name, dims in SEED_SHAPES.items():
        if args.shapes and not any(s in name for s in args.shapes):
            continue
        report = kernel_resources(_problem(dims, args.dtype, args.kv_dtype), args.cc)
        cache = args.kv_dtype or args.dtype
        print(f"{name} ({cache} cache, sm_{args.cc}):")
        print(
            f"  {report['variant']}: BLOCK_N {report['block_n']}, BLOCK_H {report['block_h']}, "
            f"{report['num_warps']} warps, {report['num_stages']} stages"
        )
        print(
            f"  {report['registers']} registers/thread, {report['spilled_bytes']} B spilled, "
            f"{report['shared_bytes']} B shared; programs per SM: {report['programs_per_sm_by_registers']} "
            f"by registers, {report['programs_per_sm_by_shared']} by shared memory"
        )
        ops = ", ".join(f"{op} {count}" for op, count in report["top_opcodes"])
        print(
            f"  main loop: {report['loop_instructions_per_warp']} instructions/warp "
            f"per {report['loop_tokens']} tokens ({ops})"
        )


if __name__ == "__main__":
    main()
