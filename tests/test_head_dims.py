"""Every head-dim class x every kernel variant, in the kernels (interpreter or GPU) and lowered for sm_80/sm_90.

The launch planner covers a head dim with one power-of-two block ("exact"), two
power-of-two blocks ("two_blocks", e.g. 576 = 512 + 64) or one larger block with the
tail masked ("masked"); V's width is "exact" or "masked" likewise.  The variants are
one head per program (MHA) and a head block per KV head (GQA/MQA), each with its own V
cache or V as the first head_dim_v columns of K (MLA's shared latent, re-used from the
K tile when it is exactly the first block).  The matrix below is built from those
classes, and :func:`test_the_matrix_covers_every_class` fails if a class is missing.
"""

from __future__ import annotations

import dataclasses
import itertools
import os

import jax
import jax.numpy as jnp
import pytest
from conftest import HAS_GPU
from support import assert_matches_oracle, run_jax

import jax_decode
from jax_decode.launch import MIN_DOT_DIM, next_power_of_2, split_head_dim
from jax_decode.synthetic import make_paged_problem

QK_CLASSES = ("exact", "two_blocks", "masked")
V_CLASSES = ("exact", "masked")
LAYOUTS = {"mha": (2, 2), "grouped": (4, 1)}  # (num_heads, num_kv_heads)
KERNEL_BACKEND = "triton" if HAS_GPU else "interpret"


def qk_class(head_dim: int) -> str:
    block, rest = split_head_dim(head_dim)
    if rest:
        return "two_blocks"
    return "exact" if block == head_dim else "masked"


def v_class(head_dim_v: int) -> str:
    return "exact" if max(MIN_DOT_DIM, next_power_of_2(head_dim_v)) == head_dim_v else "masked"


# (head_dim_qk, head_dim_v) for a separate V cache, and for V inside K (latent).
SEPARATE_V = [(128, 128), (128, 100), (192, 128), (96, 80), (112, 64), (200, 200)]
LATENT_V = [(128, 128), (128, 96), (576, 512), (288, 256), (96, 48), (200, 128), (120, 100)]


@dataclasses.dataclass(frozen=True)
class HeadDimCase:
    layout: str
    latent: bool
    head_dim_qk: int
    head_dim_v: int

    @property
    def id(self) -> str:
        qk = f"qk{self.head_dim_qk}-{qk_class(self.head_dim_qk)}"
        v = f"v{self.head_dim_v}-{v_class(self.head_dim_v)}"
        return f"{self.layout}_{'latent' if self.latent else 'separate'}_{qk}_{v}"

    def problem(self, dtype: str = "float32"):
        num_heads, num_kv_heads = LAYOUTS[self.layout]
        return make_paged_problem(
            batch=3, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim_qk=self.head_dim_qk,
            head_dim_v=self.head_dim_v, page_size=5, seq_lens=[0, 7, 23], dtype=dtype, mla=self.latent, seed=3,
        )  # fmt: skip


CASES = [
    HeadDimCase(layout, latent, dqk, dv)
    for layout, latent in itertools.product(LAYOUTS, (False, True))
    for dqk, dv in (LATENT_V if latent else SEPARATE_V)
]


def test_every_head_dim_has_a_class():
    for head_dim in range(1, 1025):
        assert qk_class(head_dim) in QK_CLASSES and v_class(head_dim) in V_CLASSES
        block, rest = split_head_dim(head_dim)
        assert block + rest >= head_dim and block & (block - 1) == 0 and rest & (rest - 1) == 0


def test_the_matrix_covers_every_class():
    for layout, latent in itertools.product(LAYOUTS, (False, True)):
        covered = {
            (qk_class(c.head_dim_qk), v_class(c.head_dim_v)) for c in CASES if (c.layout, c.latent) == (layout, latent)
        }
        assert covered == set(itertools.product(QK_CLASSES, V_CLASSES)), (layout, latent)
    # The shared latent re-used from the K tile (MLA's fast path) and read through K's pointer.
    grouped_latent = [jax_decode.make_launch_config(_problem_of(c), jax_decode.DeviceInfo("nvidia", 90, 132))
                      for c in CASES if c.latent and c.layout == "grouped"]  # fmt: skip
    assert {cfg.reuse_k_as_v for cfg in grouped_latent} == {True, False}


def _problem_of(case: HeadDimCase):
    from jax_decode.operands import DecodeOperands, spec
    from jax_decode.validation import check_decode_args

    p = case.problem()
    ops = DecodeOperands(*(spec(a) for a in p.arrays))
    return check_decode_args(ops, head_dim_v=case.head_dim_v if case.latent else None, sm_scale=None, logit_cap=0.0)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_kernels_match_oracle(case: HeadDimCase):
    problem = case.problem()
    out, lse = run_jax(problem, backend=KERNEL_BACKEND, mla=case.latent, num_kv_splits=2)
    assert_matches_oracle(problem, out, lse, mla=case.latent)


@pytest.mark.skipif(
    not jax_decode.backends.triton.jax_triton_available() and not os.environ.get("JAX_DECODE_REQUIRE_LOWERING"),
    reason="jax_triton or JAX's CUDA plugin is not installed",
)
@pytest.mark.parametrize("compute_capability", [80, 90])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_lowers_for_cuda(case: HeadDimCase, compute_capability: int):
    problem = case.problem("bfloat16")
    arrays = [None if a is None else jax.ShapeDtypeStruct(a.shape, jnp.dtype(a.dtype)) for a in problem.arrays]

    def step(q, k, v, pt, sl):
        return jax_decode.decode_attention(
            q,
            k,
            v,
            pt,
            sl,
            head_dim_v=case.head_dim_v if case.latent else None,
            return_lse=True,
            backend="triton",
            num_kv_splits=2,
        )

    with jax_decode.compile_target(jax_decode.DeviceInfo("nvidia", compute_capability, 132)):
        text = jax.jit(step).trace(*arrays).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("triton_kernel_call") == 2  # stage 1 and stage 2
