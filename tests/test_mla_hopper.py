"""The Gluon Hopper MLA stage 1: it compiles for sm_90 without a GPU, and on an H100/H200
its results, merged by our stage 2, match the float64 oracle on awkward input."""

from __future__ import annotations

import importlib
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SM90_SHARED_LIMIT = 232448  # bytes of shared memory one block may use on sm_90


def _gluon_hopper_missing() -> str | None:
    """Why this Triton cannot compile the kernel, or None."""
    try:
        hopper = importlib.import_module("triton.experimental.gluon.language.nvidia.hopper")
        gl = importlib.import_module("triton.experimental.gluon.language")
        for module, name in ((gl, "thread_barrier"), (hopper, "warpgroup_mma"), (hopper.tma, "tensor_descriptor")):
            if not hasattr(module, name):
                raise AttributeError(f"{module.__name__}.{name}")
        runtime = importlib.import_module("triton.experimental.gluon._runtime")
        runtime.GluonASTSource  # noqa: B018
        importlib.import_module("jax_decode.kernels.mla_hopper")
    except Exception as error:  # noqa: BLE001 - any failure to import means: not this Triton
        return f"this Triton ({importlib.import_module('triton').__version__}) lacks Gluon's Hopper API: {error!r}"
    return None


def compile_for_sm90(pipeline: int, num_heads: int = 128, num_kv_splits: int = 4):
    """The kernel compiled for sm_90 (no GPU needed); ``pipeline`` 2 is the seesaw kernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    from jax_decode.kernels.mla_hopper import _mla_stage1_hopper, _mla_stage1_hopper_seesaw

    block = 256 if pipeline == 2 else 512
    layout = gl.NVMMASharedLayout.get_default_for([64, block], gl.bfloat16)
    latent, rope = f"tensordesc<bf16[64, {block}],{layout!r}>", f"tensordesc<bf16[64, 64],{layout!r}>"
    signature = dict(
        q_desc=latent,
        qr_desc=rope,
        k_desc=latent,
        kr_desc=rope,
        page_table_ptr="*i32",
        seq_lens_ptr="*i32",
        num_pages="i32",
        mid_o_ptr="*fp32",
        mid_lse_ptr="*fp32",
    )
    s = num_kv_splits
    constexprs = dict(
        STRIDE_PTB=64,
        STRIDE_MOB=num_heads * s * 512,
        STRIDE_MOH=s * 512,
        STRIDE_MOS=512,
        STRIDE_MLB=num_heads * s,
        STRIDE_MLH=s,
        STRIDE_MLS=1,
        SM_SCALE=1 / math.sqrt(576),
        NUM_HEADS=num_heads,
        PAGE_SIZE=64,
        CAPACITY=4096,
        NUM_KV_SPLITS=s,
        NUM_STAGES=2,
        PIPELINE=pipeline,
    )
    kernel, num_warps = _mla_stage1_hopper, 8
    if pipeline == 2:
        del constexprs["NUM_STAGES"], constexprs["PIPELINE"]
        kernel, num_warps = _mla_stage1_hopper_seesaw, 4
    signature.update({name: "constexpr" for name in constexprs})
    source = GluonASTSource(kernel, signature, constexprs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps))


def _check_compile(pipeline: int) -> None:
    kernel = compile_for_sm90(pipeline)
    ptx = kernel.asm["ptx"]
    assert kernel.metadata.shared <= SM90_SHARED_LIMIT, kernel.metadata.shared
    assert "wgmma.mma_async" in ptx, "the products must be warpgroup MMAs"
    assert "cp.async.bulk.tensor" in ptx, "K tiles must arrive by TMA"
    assert ".local" not in ptx, "nothing may live in local memory"


def _check_oracle(pipeline: int, num_kv_splits: int) -> None:
    import torch

    from benchmarks.mla_hopper import HEAD_DIM_V, MlaHopper, edge_case, oracle_check

    q, k_cache, page_table, seq_lens = edge_case(seed=num_kv_splits)
    batch, num_heads = q.shape[:2]
    sm_scale = 1 / math.sqrt(576)
    run = MlaHopper(batch, num_heads, k_cache.shape[0], page_table.shape[1], sm_scale, num_kv_splits, pipeline)
    out = torch.full((batch, num_heads, HEAD_DIM_V), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((batch, num_heads), float("nan"), dtype=torch.float32, device="cuda")
    run.mid_o.fill_(float("nan"))
    run(q, k_cache, page_table, seq_lens, out, lse)
    torch.cuda.synchronize()
    err = oracle_check(
        q, k_cache, page_table, seq_lens, out, lse, sm_scale, list(range(batch)), list(range(0, num_heads, 7))
    )
    assert not err["nan"], err
    assert err["tol_excess"] <= 0, err
    assert err["lse_ok"], err


def _run_isolated(name: str, *args) -> None:
    """Run ``name(*args)`` of this file in a fresh Python: a failed run of Triton's
    interpreter elsewhere in the session (conftest's probe, on NumPy >= 2.4) can leave
    ``triton.language`` patched, which breaks later Gluon compiles in that process."""
    code = f"import runpy; runpy.run_path({__file__!r})[{name!r}](*{args!r})"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]


@pytest.mark.parametrize("pipeline", [0, 1, 2], ids=lambda p: f"{p=}")
def test_compiles_for_sm90(pipeline):
    missing = _gluon_hopper_missing()
    if missing:
        pytest.skip(missing)
    _run_isolated("_check_compile", pipeline)


@pytest.mark.gpu
@pytest.mark.parametrize("pipeline", [0, 1], ids=lambda p: f"{p=}")
@pytest.mark.parametrize("num_kv_splits", [1, 3, 8], ids=lambda s: f"{s=}")
def test_matches_oracle_on_awkward_input(pipeline, num_kv_splits):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs a Hopper (sm_90) GPU visible to torch")
    missing = _gluon_hopper_missing()
    if missing:
        pytest.skip(missing)
    _run_isolated("_check_oracle", pipeline, num_kv_splits)
