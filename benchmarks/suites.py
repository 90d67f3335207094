"""What the benchmark runs: the core shapes, and the attention layers of real models.

Each :class:`Row` is one decode-attention call: a head layout, a batch of sequence
lengths (uniform, or drawn from a long-tailed distribution), dtypes and features.  Its
roofline is ``max(KV bytes / copy bandwidth, FLOPs / bf16 matmul throughput)``, both
ceilings measured on the GPU in the same run.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jax_decode.launch import itemsize
from jax_decode.synthetic import CORE_SHAPES, long_tailed_lengths


@dataclasses.dataclass(frozen=True)
class Model:
    """The attention layer of a model, as one GPU holds it."""

    name: str
    num_heads: int
    num_kv_heads: int
    head_dim_qk: int
    head_dim_v: int
    page_size: int = 16
    mla: bool = False  # V is the first head_dim_v columns of the one latent cache
    logit_cap: float = 0.0
    window_left: int | None = None
    sinks: bool = False


# Head counts per GPU: a tensor-parallel degree divides the model's heads.
MODELS = (
    Model("Llama-3.1-8B", 32, 8, 128, 128),
    Model("Llama-3.1-70B TP8", 8, 1, 128, 128),
    Model("Qwen2.5-7B", 28, 4, 128, 128),
    Model("Qwen2.5-72B TP8", 8, 1, 128, 128),
    Model("Mistral-7B", 32, 8, 128, 128, window_left=4095),
    Model("Gemma-2-9B", 16, 8, 256, 256, logit_cap=50.0),
    Model("gpt-oss-120b", 64, 8, 64, 64, sinks=True),
    Model("gpt-oss-120b window", 64, 8, 64, 64, sinks=True, window_left=127),  # its alternate layers
    Model("Phi-3-mini", 32, 32, 96, 96),
    Model("DeepSeek-V3 DP", 128, 1, 576, 512, page_size=64, mla=True),  # data-parallel attention
    Model("DeepSeek-V3 TP8", 16, 1, 576, 512, page_size=64, mla=True),
)

# (batch, context, lengths): every model at each.  "mixed": long-tailed lengths of
# mean ``context``, up to 32k.
WORKLOADS = ((1, 32768, "uniform"), (16, 8192, "uniform"), (64, 4096, "uniform"), (128, 1024, "uniform"),
             (64, 2048, "mixed"))  # fmt: skip
FP8_MODELS = ("Llama-3.1-8B", "DeepSeek-V3 DP", "DeepSeek-V3 TP8")
MIXED_LONGEST = 32768


@dataclasses.dataclass(frozen=True)
class Row:
    """One benchmarked call."""

    name: str
    batch: int
    num_heads: int
    num_kv_heads: int
    head_dim_qk: int
    head_dim_v: int
    context: int
    page_size: int
    mla: bool = False
    dtype: str = "bfloat16"
    kv_dtype: str | None = None  # an fp8 cache (with per-KV-head scales)
    window_left: int | None = None
    logit_cap: float = 0.0
    sinks: bool = False
    lengths: str = "uniform"  # or "mixed"
    suite: str = "core"  # "core" (the geometric mean), "feature", "models" or "multi"
    q_len: int = 1  # query tokens per row (multi-token decode: q [batch, q_len, heads, d])

    @property
    def label(self) -> str:
        label = self.name if self.dtype == "bfloat16" else f"{self.name} {self.dtype}"
        if self.suite in ("models", "multi"):
            label += f" b{self.batch} {'mean ' if self.lengths == 'mixed' else ''}ctx{self.context}"
        if self.kv_dtype:
            label += f" kv-{self.kv_dtype.removeprefix('float8_')}"
        if self.window_left is not None and self.suite != "models":
            label += f" window{self.window_left}"
        if self.suite == "multi":
            label += f" q_len{self.q_len}"
        return label

    @property
    def shape_key(self) -> tuple:
        """Rows with equal keys are the same call (e.g. two models with one head layout)."""
        fields = dataclasses.asdict(self)
        fields.pop("name")
        fields.pop("suite")
        return tuple(sorted(fields.items()))

    def seq_lens(self) -> np.ndarray:
        if self.lengths == "mixed":
            return long_tailed_lengths(np.random.default_rng(1), self.batch, self.context, MIXED_LONGEST)
        return np.full(self.batch, self.context, np.int32)

    def attended(self, seq_lens: np.ndarray) -> np.ndarray:
        """Tokens each row attends to (and the kernels read): its length or the window."""
        return seq_lens if self.window_left is None else np.minimum(seq_lens, self.window_left + 1)

    def kv_bytes(self, seq_lens: np.ndarray | None = None) -> int:
        """Bytes of K and V one call must read (an MLA latent counted once)."""
        seq_lens = self.seq_lens() if seq_lens is None else seq_lens
        width = self.head_dim_qk if self.mla else self.head_dim_qk + self.head_dim_v
        tokens = int(self.attended(seq_lens).sum())
        return tokens * self.num_kv_heads * width * itemsize(self.kv_dtype or self.dtype)

    def flops(self, seq_lens: np.ndarray | None = None) -> int:
        """Multiply-adds of q.k and p.v, two FLOPs each, over every attended token."""
        seq_lens = self.seq_lens() if seq_lens is None else seq_lens
        tokens = int(self.attended(seq_lens).sum())
        return 2 * tokens * self.q_len * self.num_heads * (self.head_dim_qk + self.head_dim_v)


def core_suite() -> list[Row]:
    """The six core shapes (bf16), the first in float16 and with page_size 1; then
    feature rows: fp8 caches, and a long context read through a short window."""
    suite = [Row(name, *dims) for name, dims in CORE_SHAPES.items()]
    first, big = suite[0], suite[1]
    suite.append(dataclasses.replace(first, dtype="float16"))
    suite.append(dataclasses.replace(first, name=f"{first.name} page1", page_size=1))
    mla = next(row for row in suite if row.mla)
    for row in (first, big, mla):
        suite.append(dataclasses.replace(row, kv_dtype="float8_e4m3fn", suite="feature"))
    long = dataclasses.replace(first, name="GQA 32/8 d128 b32 ctx32768", context=32768)
    suite.append(dataclasses.replace(long, window_left=4095, suite="feature"))
    return suite


def model_suite() -> list[Row]:
    """Every model of :data:`MODELS` at every workload, then fp8-cache variants of the
    GQA and MLA models."""
    rows = []
    for model in MODELS:
        fields = dataclasses.asdict(model)
        name = fields.pop("name")
        for batch, context, lengths in WORKLOADS:
            row = Row(name, batch=batch, context=context, lengths=lengths, suite="models", **fields)
            rows.append(row)
            if name in FP8_MODELS:
                rows.append(dataclasses.replace(row, kv_dtype="float8_e4m3fn"))
    return rows


# Multi-token decode (speculative-draft verification, multi-token prediction): each row
# at one token and at q_len tokens, the bytes read the same.
MULTI_TOKEN = (("Llama-3.1-8B", 4), ("Qwen2.5-7B", 4), ("DeepSeek-V3 DP", 2), ("DeepSeek-V3 TP8", 2))
MULTI_WORKLOADS = ((16, 8192), (64, 4096))


def multi_token_suite() -> list[Row]:
    """Models of :data:`MULTI_TOKEN` at each workload, with one query token per row and
    with the model's q_len."""
    models = {m.name: m for m in MODELS}
    rows = []
    for name, q_len in MULTI_TOKEN:
        fields = dataclasses.asdict(models[name])
        fields.pop("name")
        for batch, context in MULTI_WORKLOADS:
            for tokens in (1, q_len):
                rows.append(Row(name, batch=batch, context=context, suite="multi", q_len=tokens, **fields))
    return rows


SUITES = {"core": core_suite, "models": model_suite, "multi": multi_token_suite}
