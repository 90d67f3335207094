"""The configuration matrix the kernel, xla and parity tests share.

Each case varies one or two axes from a small base so the interpreter runs stay fast:
head layouts (MHA, GQA groups 4 and 8, MQA, MLA 576/512 on a shared cache), head dims,
page sizes 1 / 16 / 3, soft-cap, explicit and automatic splits, the three dtypes, and
lengths mixing 0, 1, block multiples and full capacity.
"""

from __future__ import annotations

import dataclasses

from jax_decode.synthetic import PagedProblem, make_paged_problem


@dataclasses.dataclass(frozen=True)
class Case:
    num_heads: int = 4
    num_kv_heads: int = 4
    head_dim_qk: int = 64
    head_dim_v: int | None = None
    page_size: int = 16
    max_pages: int = 4
    dtype: str = "float32"
    logit_cap: float = 0.0
    num_kv_splits: int | None = 2
    mla: bool = False
    seed: int = 0
    kv_dtype: str | None = None  # an fp8 cache dtype
    kv_scales: str = "none"  # "none", "tensor" or "head"
    window_left: int | None = None
    sinks: bool = False
    q_len: int | None = None  # query tokens per row (None: a 3-D q)

    @property
    def id(self) -> str:
        kind = "mla" if self.mla else f"h{self.num_heads}kv{self.num_kv_heads}"
        id_ = (
            f"{kind}_d{self.head_dim_qk}_page{self.page_size}_{self.dtype}"
            f"_cap{self.logit_cap:g}_splits{self.num_kv_splits}"
        )
        if self.kv_dtype:
            id_ += f"_{self.kv_dtype.removeprefix('float8_')}_scale-{self.kv_scales}"
        if self.window_left is not None:
            id_ += f"_window{self.window_left}"
        id_ += "_sinks" if self.sinks else ""
        return id_ + (f"_qlen{self.q_len}" if self.q_len is not None else "")

    def lengths(self) -> list[int]:
        # 0, 1, a multiple of every BLOCK_N (32 and 64 are both used), full capacity.
        capacity = self.max_pages * self.page_size
        return [0, 1, min(32, capacity), capacity]

    def problem(self) -> PagedProblem:
        lengths = self.lengths()
        return make_paged_problem(
            batch=len(lengths),
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim_qk=self.head_dim_qk,
            head_dim_v=self.head_dim_v,
            page_size=self.page_size,
            seq_lens=lengths,
            dtype=self.dtype,
            mla=self.mla,
            max_pages=self.max_pages,
            seed=self.seed,
            kv_dtype=self.kv_dtype,
            kv_scales=self.kv_scales,
            sinks=self.sinks,
            q_len=self.q_len,
        )

    def options(self) -> dict:
        """Scalar options (array ones, scales and sinks, come with the problem)."""
        options = dict(logit_cap=self.logit_cap, num_kv_splits=self.num_kv_splits)
        if self.window_left is not None:
            options["window_left"] = self.window_left
        return options

    def oracle_options(self) -> dict:
        options = dict(logit_cap=self.logit_cap)
        if self.window_left is not None:
            options["window_left"] = self.window_left
        return options


MHA = Case()
GQA4 = Case(num_heads=8, num_kv_heads=2)
GQA8 = Case(num_heads=16, num_kv_heads=2)
MQA = Case(num_heads=4, num_kv_heads=1)
MLA = Case(num_heads=16, num_kv_heads=1, head_dim_qk=576, head_dim_v=512, page_size=1, max_pages=40, mla=True)
LAYOUTS = {"mha": MHA, "gqa4": GQA4, "gqa8": GQA8, "mqa": MQA, "mla": MLA}


def _matrix() -> list[Case]:
    cases = []
    for layout in LAYOUTS.values():
        for dtype in ("float32", "float16", "bfloat16"):
            cases.append(dataclasses.replace(layout, dtype=dtype))
    for head_dim in (96, 128, 256):  # 64 is the base
        cases.append(dataclasses.replace(GQA4, head_dim_qk=head_dim))
        cases.append(dataclasses.replace(MHA, head_dim_qk=head_dim, dtype="bfloat16"))
    for page_size, max_pages in ((1, 40), (3, 14)):  # 16 is the base
        for layout in (MHA, GQA4, MQA):
            cases.append(dataclasses.replace(layout, page_size=page_size, max_pages=max_pages))
    for layout in (MHA, GQA8):
        cases.append(dataclasses.replace(layout, logit_cap=5.0, dtype="bfloat16"))
    for splits in (1, 5, 16, None):  # 2 is the base
        cases.append(dataclasses.replace(GQA4, num_kv_splits=splits))
        cases.append(dataclasses.replace(MHA, num_kv_splits=splits, page_size=3, max_pages=14))
    cases.append(dataclasses.replace(MLA, logit_cap=30.0, num_kv_splits=None, dtype="bfloat16"))
    cases.append(Case(num_heads=8, num_kv_heads=2, head_dim_qk=80, head_dim_v=48, page_size=7, max_pages=6))
    cases.append(
        Case(
            num_heads=8,
            num_kv_heads=1,
            head_dim_qk=288,
            head_dim_v=256,
            page_size=3,
            max_pages=12,
            mla=True,
            dtype="bfloat16",
        )
    )
    unique = {c.id: c for c in cases}
    return list(unique.values())


MATRIX = _matrix()


def _features() -> list[Case]:
    """fp8 caches, sliding windows and sinks, alone and together, across head layouts."""
    e4m3, e5m2 = "float8_e4m3fn", "float8_e5m2"
    bf16 = dict(dtype="bfloat16")
    cases = [
        dataclasses.replace(GQA4, kv_dtype=e4m3, kv_scales="head", **bf16),
        dataclasses.replace(GQA8, kv_dtype=e5m2, kv_scales="tensor", dtype="float16"),
        dataclasses.replace(MHA, kv_dtype=e4m3, kv_scales="tensor", **bf16),
        dataclasses.replace(MHA, kv_dtype=e5m2, kv_scales="none", dtype="float32"),
        dataclasses.replace(MQA, kv_dtype=e4m3, kv_scales="head", dtype="float16"),
        dataclasses.replace(MLA, kv_dtype=e4m3, kv_scales="tensor", **bf16),
        dataclasses.replace(MHA, window_left=5, page_size=3, max_pages=14),
        dataclasses.replace(GQA4, window_left=0),
        dataclasses.replace(GQA8, window_left=40, num_kv_splits=None),
        dataclasses.replace(MQA, window_left=20, num_kv_splits=5),
        dataclasses.replace(MLA, window_left=17),
        dataclasses.replace(MHA, sinks=True),
        dataclasses.replace(GQA4, sinks=True, num_kv_splits=5),
        dataclasses.replace(MLA, sinks=True, **bf16),
        dataclasses.replace(
            GQA4, kv_dtype=e4m3, kv_scales="head", window_left=20, sinks=True, logit_cap=5.0, num_kv_splits=None, **bf16
        ),
        dataclasses.replace(MHA, kv_dtype=e5m2, kv_scales="head", window_left=9, sinks=True, page_size=1, max_pages=40),
    ]
    return cases


FEATURES = _features()
