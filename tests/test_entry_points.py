"""Every entry point refuses the same input with the same message.

JAX's ``decode_attention``, torch's eager ``decode_attention``, the same under
``torch.compile(fullgraph=True)``, and vLLM's drop-in ``decode_attention_fwd`` eager
and compiled all start from :func:`jax_decode.prepare.prepare_decode`; this holds them
to it on one table of bad inputs (the drop-in names its own arguments: ``k_buffer``
for ``k_cache`` and so on).  Under compile what tracing sees (types, devices, strides,
grad) is refused while tracing (inside torch's own exception type, carrying our
message); the rest by the op when the graph runs, with the eager exception itself.
"""

from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from conftest import HAS_GPU, needs_interpreter

import jax_decode
import torch_bridge
from jax_decode.prepare import DECODE_NAMES, VLLM_NAMES

DEVICE = "cuda" if HAS_GPU else "cpu"

B, H, KV, D, PAGES, PAGE, MAX_PAGES, SPLITS = 2, 4, 2, 16, 4, 4, 2, 2


def good() -> dict:
    g = torch.Generator().manual_seed(0)
    return dict(
        q=torch.randn(B, H, D, generator=g),
        k_cache=torch.randn(PAGES, PAGE, KV, D, generator=g),
        v_cache=torch.randn(PAGES, PAGE, KV, D, generator=g),
        page_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
        seq_lens=torch.tensor([3, 7], dtype=torch.int32),
    )


def strided_q(device="cpu"):
    return torch.randn(B, H, 2 * D, device=device)[..., ::2]


def good_on_device() -> dict:
    """good() on the suite's device (a GPU where there is one: the launch path users run)."""
    return {name: t.to(DEVICE) for name, t in good().items()}


# (id, arrays replaced, options, exception, message with {operand} placeholders, JAX can express it)
CASES = [
    (
        "strided_q",
        dict(q=strided_q()),
        {},
        ValueError,
        "{q} must have a contiguous last dimension (stride 1), got strides (128, 32, 2); pass .contiguous()",
        False,
    ),
    (
        "q_rank",
        dict(q=torch.randn(B, H)),
        {},
        ValueError,
        "{q} must be 3-D [batch, num_heads, head_dim_qk] or 4-D [batch, q_len, num_heads, head_dim_qk], "
        "got shape (2, 4)",
        True,
    ),
    (
        "k_dtype",
        dict(k_cache=torch.randn(PAGES, PAGE, KV, D, dtype=torch.float16)),
        {},
        TypeError,
        "{k_cache} dtype (float16) must equal {q} dtype (float32) or be one of float8_e4m3fn, float8_e5m2",
        True,
    ),
    (
        "page_table_int64",
        dict(page_table=torch.zeros(B, MAX_PAGES, dtype=torch.int64)),
        {},
        TypeError,
        "{page_table} must be int32, got int64; cast it with .astype(int32) / .to(torch.int32)",
        False,
    ),
    (
        "seq_lens_batch",
        dict(seq_lens=torch.ones(B + 1, dtype=torch.int32)),
        {},
        ValueError,
        "{seq_lens} batch (3) must equal {q} batch (2)",
        True,
    ),
    (
        "heads_multiple",
        dict(q=torch.randn(B, 3, D)),
        {},
        ValueError,
        "num_heads (3) must be a multiple of num_kv_heads (2)",
        True,
    ),
    (
        "v_layout",
        dict(v_cache=torch.randn(PAGES, PAGE, KV + 1, D)),
        {},
        ValueError,
        "{v_cache} shape (4, 4, 3, 16) must match {k_cache} shape (4, 4, 2, 16) "
        "in [num_pages, page_size, num_kv_heads]",
        True,
    ),
    ("seq_lens_list", dict(seq_lens=[3, 7]), {}, TypeError, "{seq_lens} must be {array}, got list", True),
    ("sm_scale_negative", {}, dict(sm_scale=-1.0), ValueError, "sm_scale must be finite and > 0, got -1.0", True),
    ("logit_cap_nan", {}, dict(logit_cap=float("nan")), ValueError, "logit_cap must be finite and >= 0, got nan", True),
    ("sm_scale_str", {}, dict(sm_scale="0.1"), TypeError, "sm_scale must be a Python float, got str", True),
    ("k_scale_zero", {}, dict(k_scale=0.0), ValueError, "k_scale must be finite and > 0, got 0.0", True),
    (
        "k_scale_shape",
        {},
        dict(k_scale=torch.ones(3)),
        ValueError,
        r"k_scale must have shape () or (1,) (per tensor) or (2,) (per KV head), got (3,)",
        True,
    ),
    ("k_scale_str", {}, dict(k_scale="1"), TypeError, "k_scale must be {array}, a float or None, got str", True),
    (
        "k_on_meta",
        dict(k_cache=torch.randn(PAGES, PAGE, KV, D).to("meta")),
        {},
        ValueError,
        "{k_cache} is on meta but {q} is on cpu; move them together",
        False,
    ),
    (
        "q_requires_grad",
        dict(q=torch.randn(B, H, D).requires_grad_()),
        {},
        ValueError,
        "{q} requires grad, but these kernels have no gradient",
        False,
    ),
    ("sinks_number", {}, dict(sinks=0.5), TypeError, "sinks must be an array of shape (num_heads,), got a float", True),
    ("sinks_list", {}, dict(sinks=[0.5] * H), TypeError, "sinks must be {array} or None, got list", True),
    (
        "num_kv_splits_zero",
        {},
        dict(num_kv_splits=0),
        ValueError,
        "num_kv_splits must be in [1, 256]",  # (decode_attention adds "or None"; vLLM's signature has no None)
        True,
    ),
]
VLLM_ONLY_OPTIONS = {"sm_scale", "logit_cap", "k_scale", "num_kv_splits"}  # the options both signatures take


def message(template: str, names, array: str) -> str:
    return template.format(**names._asdict(), array=array)


def run_torch(arrays: dict, options: dict, compiled: bool):
    def call(q, k_cache, v_cache, page_table, seq_lens):
        return torch_bridge.decode_attention(q, k_cache, v_cache, page_table, seq_lens, **options)

    fn = torch.compile(call, fullgraph=True, backend="aot_eager") if compiled else call
    return fn(*arrays.values())


def run_vllm(arrays: dict, options: dict, compiled: bool):
    options = dict(options)
    splits = options.pop("num_kv_splits", SPLITS)
    sm_scale = options.pop("sm_scale", 0.25)
    logit_cap = options.pop("logit_cap", 0.0)

    def call(q, k_buffer, v_buffer, req_to_token, b_seq_len):
        o = torch.empty(B, H, D, device=q.device)
        attn_logits = torch.empty(B, H, max(splits, 1) if isinstance(splits, int) else 1, D + 1, device=q.device)
        torch_bridge.decode_attention_fwd(q, k_buffer, v_buffer, o, req_to_token, b_seq_len, attn_logits, splits,
                                          sm_scale, PAGE, logit_cap, **options)  # fmt: skip
        return o

    fn = torch.compile(call, fullgraph=True, backend="aot_eager") if compiled else call
    return fn(*arrays.values())


def as_jax(value):
    if isinstance(value, torch.Tensor):
        return jnp.asarray(value.contiguous().numpy())
    return value


ENTRY_POINTS = ["jax", "torch", "torch_compiled", "vllm", "vllm_compiled"]


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize(
    ("case", "arrays", "options", "error", "template", "jax_too"), CASES, ids=[c[0] for c in CASES]
)
def test_every_entry_point_refuses_alike(entry, case, arrays, options, error, template, jax_too):
    torch._dynamo.reset()
    args = {**good(), **arrays}
    if entry == "jax":
        if not jax_too:
            pytest.skip("JAX arrays cannot carry this mistake (dense, row-major, no int64 without x64)")
        expected = message(template, DECODE_NAMES, "an array (jax.Array or NumPy)")
        run = lambda: jax_decode.decode_attention(  # noqa: E731
            *map(as_jax, args.values()), backend="xla", **{k: as_jax(v) for k, v in options.items()}
        )
    elif entry.startswith("torch"):
        expected = message(template, DECODE_NAMES, "a torch.Tensor")
        run = lambda: run_torch(args, options, compiled=entry.endswith("compiled"))  # noqa: E731
    else:
        if not set(options) <= VLLM_ONLY_OPTIONS:
            pytest.skip("vLLM's signature has no such option")
        expected = message(template, VLLM_NAMES, "a torch.Tensor")
        run = lambda: run_vllm(args, options, compiled=entry.endswith("compiled"))  # noqa: E731
    with pytest.raises(Exception) as caught:
        run()
    raised = caught.value
    # Refused while tracing: torch wraps our exception; its message still carries ours.
    traced = entry.endswith("compiled") and not isinstance(raised, error)
    assert re.escape(expected) and expected in str(raised), (type(raised), str(raised)[-600:])
    if not traced:
        assert type(raised) is error or isinstance(raised, error), type(raised)


def test_compiled_drop_in_matches_eager_on_valid_input():
    """The regression the table guards: compiled and eager run one path, same bits."""
    args = {name: t.to(DEVICE) for name, t in good().items()}
    eager = run_vllm(args, {}, compiled=False)
    torch._dynamo.reset()
    compiled = run_vllm(args, {}, compiled=True)
    np.testing.assert_array_equal(compiled.cpu().numpy(), eager.cpu().numpy())


def test_import_torch_bridge_does_not_import_jax():
    import subprocess
    import sys

    code = "import sys, torch_bridge; assert 'jax' not in sys.modules, 'jax imported'; print('ok')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.stdout.strip() == "ok", result.stderr[-2000:]


# --------------------------------------------------------------------------- the per-call fast path

REFUSED_AFTER_ACCEPTED = [
    ("strided_q", lambda a: dict(a, q=strided_q(a["q"].device)), {}, "must have a contiguous last dimension"),
    ("q_requires_grad", lambda a: dict(a, q=a["q"].clone().requires_grad_()), {}, "q requires grad"),
    ("page_table_int64", lambda a: dict(a, page_table=a["page_table"].long()), {}, "{page_table} must be int32"),
    ("k_scale_nan", lambda a: a, dict(k_scale=float("nan")), "k_scale must be finite and > 0, got nan"),
    ("meta_device", lambda a: {n: t.to("meta") for n, t in a.items()}, {}, "CUDA device or the CPU"),
    ("negative_view_q", lambda a: dict(a, q=torch._neg_view(a["q"])), {}, "{q} is a negative view"),
]


@pytest.mark.parametrize("entry", ["torch", "vllm"])
@pytest.mark.parametrize(("case", "change", "options", "message"), REFUSED_AFTER_ACCEPTED,
                         ids=[c[0] for c in REFUSED_AFTER_ACCEPTED])  # fmt: skip
def test_a_call_like_an_accepted_one_but_for_one_thing_is_still_refused(entry, case, change, options, message):
    """After a call is accepted, calls whose arguments have the same shapes skip the
    checks only where nothing a check reads differs (strides, dtype, device, grad, a
    scale's value): each of these differs in one such thing and is refused."""
    run = run_torch if entry == "torch" else run_vllm
    accepted = dict(k_scale=0.5) if options else {}
    run(good_on_device(), accepted, compiled=False)
    names = DECODE_NAMES if entry == "torch" else VLLM_NAMES
    with pytest.raises((ValueError, TypeError), match=re.escape(message.format(**names._asdict()))):
        run(change(good_on_device()), options, compiled=False)


def test_accepted_calls_are_bit_identical_to_first_calls():
    from torch_bridge import ops

    args = good_on_device()
    ops._ACCEPTED.clear()
    first = run_torch(args, dict(num_kv_splits=2), compiled=False).clone()
    assert ops._ACCEPTED, "the first call was remembered"
    again = run_torch(args, dict(num_kv_splits=2), compiled=False)
    np.testing.assert_array_equal(again.cpu().numpy(), first.cpu().numpy())


def test_a_returned_lse_is_the_callers_own():
    """Calls that do not return the LSE write it to a shared buffer; one that does
    returns a tensor no later call writes."""
    args = good_on_device()
    _, lse = run_torch(args, dict(num_kv_splits=2, return_lse=True), compiled=False)
    kept = lse.clone()
    other = dict(args, q=-args["q"])
    run_torch(other, dict(num_kv_splits=2), compiled=False)
    _, lse2 = run_torch(other, dict(num_kv_splits=2, return_lse=True), compiled=False)
    assert lse2.data_ptr() != lse.data_ptr()
    np.testing.assert_array_equal(lse.cpu().numpy(), kept.cpu().numpy())


# --------------------------------------------------------------------------- found by an outside tester


def test_numpy_integer_split_count_is_an_int():
    args = good_on_device()
    out = run_torch(args, dict(num_kv_splits=np.int64(2)), compiled=False).cpu()
    np.testing.assert_array_equal(out.numpy(), run_torch(args, dict(num_kv_splits=2), compiled=False).cpu().numpy())
    jax_out = jax_decode.decode_attention(*map(as_jax, good().values()), num_kv_splits=np.int64(2), backend="xla")
    assert jax_out.shape == out.shape


def test_out_that_is_not_a_tensor_is_named():
    with pytest.raises(TypeError, match=r"out must be a torch.Tensor, got ndarray"):
        torch_bridge.decode_attention(*good().values(), out=np.zeros((B, H, D), np.float32))


def test_a_numpy_bool_flag_names_its_type():
    with pytest.raises(TypeError, match=r"return_lse must be a Python bool, got numpy.bool"):
        torch_bridge.decode_attention(*good().values(), return_lse=np.True_)


def test_torch_tensors_given_to_jax_are_refused_with_the_way_out():
    with pytest.raises(TypeError, match=r"q is a torch.Tensor: pass a jax.Array \(torch_bridge.to_jax"):
        jax_decode.decode_attention(*good().values(), backend="xla")


@needs_interpreter
def test_compiled_drop_in_takes_the_default_scale():
    """vLLM's sm_scale may be None (the default 1/sqrt(head_dim)) eager and compiled alike."""
    args = good()
    q, k, v, pt, sl = args.values()

    def call(q, k, v, pt, sl):
        o = torch.empty(B, H, D)
        torch_bridge.decode_attention_fwd(q, k, v, o, pt, sl, torch.empty(B, H, SPLITS, D + 1), SPLITS, None, PAGE)
        return o

    eager = call(q, k, v, pt, sl)
    torch._dynamo.reset()
    compiled = torch.compile(call, fullgraph=True, backend="aot_eager")(q, k, v, pt, sl)
    np.testing.assert_array_equal(compiled.numpy(), eager.numpy())
