"""What the compiled stage-1 kernel costs per SM, without a GPU.

Compiles the stage-1 kernel the launch planner picks for each benchmark row (or a
variant of it, ``--grid``) for an NVIDIA target (Triton's bundled ptxas; no GPU or
CUDA install needed) and reports its registers per thread, spilled bytes, shared
memory per program, how many programs fit an SM by each of those, whether its dots
use warpgroup MMA, and the SASS of its main loop: instructions per warp per tile and
the most frequent opcodes.  These explain occupancy and where a kernel spends its
instructions, but not its speed: time candidates on a GPU (``benchmarks.sweep``).
The numbers depend on the Triton version: report with the version the kernels will
run under.

    python -m benchmarks.kernel_resources --suite models --rows "DeepSeek-V3 DP b64" \
        --grid block_h=64,num_warps=8,block_n=32,num_stages=2
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from benchmarks.suites import SUITES
from jax_decode.kernels import KERNELS
from jax_decode.launch import DecodeProblem, DeviceInfo, LaunchConfig, make_launch_config

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


def resource_usage(cubin_path: str) -> dict[str, int]:
    """REG, STACK (spills), LOCAL, SHARED, ... of a cubin's kernel, as the bundled
    ``cuobjdump --dump-resource-usage`` reports them (spills show there, not in the PTX)."""
    usage = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", cubin_path], capture_output=True, text=True)
    return {name: int(value) for name, value in re.findall(r"([A-Z]+):(\d+)", usage.stdout)}


def _stage1_source(config):
    """The ASTSource of the launch's stage-1 kernel: pointer types, runtime ints, constexprs."""
    launch = config.stage1(config.contiguous_strides())
    fn = KERNELS[launch.kernel_name]
    q_type, kv_type = TRITON_TYPES[config.problem.dtype], TRITON_TYPES[config.problem.cache_dtype]
    runtime = {
        "q_ptr": "*" + q_type,
        "k_ptr": "*" + kv_type,
        "v_ptr": "*" + kv_type,
        "page_table_ptr": "*i32",
        "seq_lens_ptr": "*i32",
        "k_scale_ptr": "*fp32",
        "v_scale_ptr": "*fp32",
        "schedule_ptr": "*i32",
        "num_pages": "i32",
        "mid_o_ptr": "*fp32",
        "mid_lse_ptr": "*fp32",
    }
    signature = {name: runtime.get(name, "constexpr") for name in fn.arg_names}
    # Every buffer is 16-byte aligned in both frontends (Triton specialises on it).
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names) if name.endswith("_ptr")}
    return ASTSource(fn, signature, launch.meta(), attrs), launch


def _main_loop(sass: str) -> list[str]:
    """Instructions of the loop over the KV blocks: of the backward branches, the one
    whose body holds the most matrix-multiply and global-load instructions (then the
    longest; Triton's pipeliner also emits short loops, e.g. around the prologue)."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"\s*\.(L_x_\d+):", line))}
    best, best_key = (0, -1), (-1, -1)
    for i, line in enumerate(lines):
        m = re.search(r"BRA\s+(?:`\()?\.?(L_x_\d+)", line)
        if not m or labels.get(m.group(1), i) >= i:
            continue
        body = lines[labels[m.group(1)] : i + 1]
        work = sum(bool(re.search(r"\b(H|Q)?G?MMA|\bLDG|\bLDGSTS|\bUTMALDG", b)) for b in body)
        if (work, i - labels[m.group(1)]) > best_key:
            best, best_key = (labels[m.group(1)], i), (work, i - labels[m.group(1)])
    return [line for line in lines[best[0] : best[1] + 1] if re.search(r"/\*[0-9a-f]{4}\*/", line)]


def kernel_resources(problem: DecodeProblem, compute_capability: int = 90, num_sms: int = 132) -> dict:
    """Compile the stage-1 kernel for ``problem`` and return its per-SM resource report."""
    return config_resources(make_launch_config(problem, DeviceInfo("nvidia", compute_capability, num_sms)))


def config_resources(config: LaunchConfig) -> dict:
    """Compile ``config``'s stage-1 kernel for its device and return the resource report."""
    compute_capability = config.device.compute_capability
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
        usage = resource_usage(cubin)
        sass = subprocess.run([_tool("nvdisasm"), "-c", cubin], capture_output=True, text=True).stdout
    registers, spilled = usage["REG"], usage["STACK"]
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
        warpgroup_mma="HGMMA" in opcodes or "QGMMA" in opcodes,
        top_opcodes=opcodes.most_common(8),
        opcodes=dict(opcodes),
    )


def row_problem(row) -> DecodeProblem:
    """The problem decode_attention builds for a benchmark row (through the same checks)."""
    from benchmarks.bench import row_problem as problem_of

    return problem_of(row)


def main() -> None:
    from benchmarks.sweep import parse_override

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="core", choices=list(SUITES))
    parser.add_argument("--rows", nargs="*", help="rows whose label contains one of these (default: all)")
    parser.add_argument(
        "--grid", nargs="*", default=[], help="variants of the planner's launch, e.g. block_h=64,num_warps=8"
    )
    parser.add_argument("--cc", type=int, default=90, help="compute capability to compile for (default 90)")
    args = parser.parse_args()
    if not tools_available():
        raise SystemExit("this Triton install has no bundled ptxas / nvdisasm / cuobjdump")
    device = DeviceInfo("nvidia", args.cc, 132)
    for row in SUITES[args.suite]():
        if args.rows and not any(s in row.label for s in args.rows):
            continue
        base = make_launch_config(row_problem(row), device)
        for name, override in [("planner", {}), *((text, parse_override(text)) for text in args.grid)]:
            config = dataclasses.replace(base, **override)
            if "block_h" in override:
                config = dataclasses.replace(config, head_blocks=-(-base.problem.kv_group // config.block_h))
            report = config_resources(config)
            print(f"{row.label} ({row.kv_dtype or row.dtype} cache, sm_{args.cc}), {name}:")
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
