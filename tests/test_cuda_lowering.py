"""Every kernel variant compiles for the GPU (sm_80 and sm_90) on a CPU-only machine.

jax.jit(...).trace(...).lower(lowering_platforms=("cuda",)) runs jax_triton's lowering,
which compiles the Triton kernels to GPU code here; needs jax_triton and JAX's CUDA
plugin (installed with --no-deps: its runtime is not needed to lower).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import pytest

import jax_decode
from jax_decode.triton_backend import jax_triton_available

if not jax_triton_available():
    if os.environ.get("JAX_DECODE_REQUIRE_LOWERING"):
        raise RuntimeError("JAX_DECODE_REQUIRE_LOWERING is set but jax_triton / the CUDA plugin do not import")
    pytest.skip("jax_triton or JAX's CUDA plugin is not installed", allow_module_level=True)

VARIANTS = {
    # name: (num_heads, num_kv_heads, head_dim_qk, head_dim_v, page_size, dtype, mla, logit_cap)
    "mha_f16": (4, 4, 128, 128, 16, jnp.float16, False, 0.0),
    "mha_bf16_cap": (4, 4, 96, 96, 1, jnp.bfloat16, False, 30.0),
    "mha_f32": (4, 4, 64, 64, 3, jnp.float32, False, 0.0),
    "gqa_bf16": (32, 8, 128, 128, 16, jnp.bfloat16, False, 0.0),
    "gqa_f16_cap": (16, 2, 256, 256, 7, jnp.float16, False, 50.0),
    "gqa_f32": (8, 2, 64, 64, 16, jnp.float32, False, 0.0),
    "gqa_two_part_dims": (8, 2, 80, 48, 3, jnp.bfloat16, False, 0.0),
    "mqa_d256": (8, 1, 256, 256, 16, jnp.bfloat16, False, 0.0),
    "mla_576_512": (16, 1, 576, 512, 1, jnp.bfloat16, True, 0.0),
    "mla_288_256": (8, 1, 288, 256, 16, jnp.float16, True, 0.0),
}


def _arrays(num_heads, num_kv_heads, head_dim_qk, head_dim_v, page_size, dtype, mla):
    batch, num_pages, max_pages = 3, 40, 8
    sds = jax.ShapeDtypeStruct
    return (
        sds((batch, num_heads, head_dim_qk), dtype),
        sds((num_pages, page_size, num_kv_heads, head_dim_qk), dtype),
        None if mla else sds((num_pages, page_size, num_kv_heads, head_dim_v), dtype),
        sds((batch, max_pages), jnp.int32),
        sds((batch,), jnp.int32),
    )


def _lower(name, compute_capability, backend, platform):
    num_heads, num_kv_heads, dqk, dv, page_size, dtype, mla, cap = VARIANTS[name]
    q, k, v, pt, sl = _arrays(num_heads, num_kv_heads, dqk, dv, page_size, dtype, mla)

    def step(q, k, v, pt, sl):
        return jax_decode.decode_attention(
            q, k, v, pt, sl, head_dim_v=dv, logit_cap=cap, return_lse=True, backend=backend
        )

    target = jax_decode.DeviceInfo(vendor="nvidia", compute_capability=compute_capability, num_sms=132)
    with jax_decode.compile_target(target):
        return jax.jit(step).trace(q, k, v, pt, sl).lower(lowering_platforms=(platform,)).as_text()


@pytest.mark.parametrize("compute_capability", [80, 90])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_variant_compiles_for_cuda(name, compute_capability):
    text = _lower(name, compute_capability, "triton", "cuda")
    assert text.count("triton_kernel_call") >= 2  # stage 1 and stage 2


def test_auto_lowers_triton_for_cuda_and_xla_for_cpu():
    assert "triton_kernel_call" in _lower("gqa_bf16", 90, "auto", "cuda")
    assert "triton_kernel_call" not in _lower("gqa_bf16", 90, "auto", "cpu")
