"""Property-based tests: random valid problems through the kernels and the xla backend vs the oracle
(fp8 caches, windows and sinks among the draws).

Bounded for CI by the "ci" hypothesis profile (fixed examples, see conftest.py); run
more with ``pytest tests/test_properties.py --hypothesis-profile=thorough``.
"""

from __future__ import annotations

import dataclasses

import pytest
from conftest import HAS_GPU, needs_interpreter
from hypothesis import given
from hypothesis import strategies as st
from support import assert_matches_oracle, run_jax

from jax_decode.synthetic import make_paged_problem

KERNEL_BACKEND = "triton" if HAS_GPU else "interpret"
# On a GPU the kernels run compiled; elsewhere only where Triton's interpreter works.
kernels_run = (lambda test: test) if HAS_GPU else needs_interpreter


@dataclasses.dataclass(frozen=True)
class RandomProblem:
    seq_lens: tuple[int, ...]
    num_kv_heads: int
    group: int
    head_dim_qk: int
    head_dim_v: int
    mla: bool
    page_size: int
    max_pages: int
    dtype: str
    logit_cap: float
    num_kv_splits: int | None
    seed: int
    kv_dtype: str | None = None  # an fp8 cache
    kv_scales: str = "none"
    window_left: int | None = None
    sinks: bool = False

    def problem(self):
        return make_paged_problem(
            batch=len(self.seq_lens),
            num_heads=self.num_kv_heads * self.group,
            num_kv_heads=self.num_kv_heads,
            head_dim_qk=self.head_dim_qk,
            head_dim_v=self.head_dim_v,
            page_size=self.page_size,
            seq_lens=self.seq_lens,
            dtype=self.dtype,
            mla=self.mla,
            max_pages=self.max_pages,
            seed=self.seed,
            kv_dtype=self.kv_dtype,
            kv_scales=self.kv_scales,
            sinks=self.sinks,
        )


@st.composite
def random_problems(draw) -> RandomProblem:
    page_size = draw(st.sampled_from([1, 2, 3, 5, 8, 16]))
    max_pages = draw(st.integers(1, max(1, 48 // page_size)))
    capacity = page_size * max_pages
    lengths = st.one_of(st.just(0), st.just(capacity), st.integers(0, capacity))
    mla = draw(st.booleans())
    head_dim_qk = draw(st.sampled_from([16, 24, 32, 48, 64, 80, 96, 128]))
    if mla:  # V is the first head_dim_v lanes of the shared latent
        head_dim_v = draw(st.integers(1, head_dim_qk))
        num_kv_heads = 1
    else:
        head_dim_v = draw(st.sampled_from([head_dim_qk, 16, 32, 40, 64]))
        num_kv_heads = draw(st.integers(1, 3))
    return RandomProblem(
        seq_lens=tuple(draw(st.lists(lengths, min_size=1, max_size=3))),
        num_kv_heads=num_kv_heads,
        group=draw(st.sampled_from([1, 2, 3, 4, 8, 16])),
        head_dim_qk=head_dim_qk,
        head_dim_v=head_dim_v,
        mla=mla,
        page_size=page_size,
        max_pages=max_pages,
        dtype=draw(st.sampled_from(["float32", "float16", "bfloat16"])),
        logit_cap=draw(st.sampled_from([0.0, 0.0, 3.0, 30.0])),
        num_kv_splits=draw(st.one_of(st.none(), st.integers(1, 9))),
        seed=draw(st.integers(0, 2**16)),
        kv_dtype=draw(st.sampled_from([None, None, "float8_e4m3fn", "float8_e5m2"])),
        kv_scales=draw(st.sampled_from(["none", "tensor", "head"])),
        window_left=draw(st.one_of(st.none(), st.none(), st.integers(0, capacity + 2))),
        sinks=draw(st.booleans()),
    )


def _check(spec: RandomProblem, backend: str) -> None:
    problem = spec.problem()
    window = {} if spec.window_left is None else dict(window_left=spec.window_left)
    options = dict(logit_cap=spec.logit_cap, num_kv_splits=spec.num_kv_splits, **window)
    out, lse = run_jax(problem, backend=backend, mla=spec.mla, jit=False, **options)
    assert_matches_oracle(problem, out, lse, mla=spec.mla, logit_cap=spec.logit_cap, **window)


@kernels_run
@given(random_problems())
def test_kernels_match_oracle_on_random_problems(spec):
    _check(spec, KERNEL_BACKEND)


@given(random_problems())
def test_xla_matches_oracle_on_random_problems(spec):
    _check(spec, "xla")


@pytest.mark.parametrize("backend", [pytest.param(KERNEL_BACKEND, marks=() if HAS_GPU else needs_interpreter), "xla"])
def test_a_known_awkward_problem(backend):
    """Pinned example: odd group, odd page size, MLA with a narrow V, more splits than blocks."""
    spec = RandomProblem((0, 37, 5), 1, 3, 80, 24, True, 3, 13, "bfloat16", 3.0, 9, 7)
    _check(spec, backend)
