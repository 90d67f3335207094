"""Data integrity and clear errors at the edges of the domain, in both frontends."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from cases import GQA4, MLA
from conftest import HAS_GPU
from support import device_arrays
from torch_support import to_float64, to_tensor

import jax_decode
import torch_bridge
from jax_decode.launch import KernelLaunch
from jax_decode.synthetic import make_paged_problem

DEVICE = "cuda" if HAS_GPU else "cpu"
KERNEL_BACKEND = "triton" if HAS_GPU else "interpret"


def _run(script: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=300)


# --------------------------------------------------------------------------- values never changed silently


def test_to_jax_refuses_to_narrow_64_bit_tensors():
    big = torch.tensor([2**40 + 5, 7], dtype=torch.int64)
    with pytest.raises(TypeError, match=r"torch.int64 is 64-bit, but JAX runs without x64 .* cast it first"):
        torch_bridge.to_jax(big)
    with pytest.raises(TypeError, match=r"torch.float64 is 64-bit"):
        torch_bridge.to_jax(torch.ones(3, dtype=torch.float64))
    identity = torch_bridge.jax_function(lambda x: x)
    with pytest.raises(TypeError, match=r"torch.int64 is 64-bit"):
        identity(big)
    torch.testing.assert_close(identity(big.to(torch.int32)), big.to(torch.int32))


def test_to_jax_converts_64_bit_tensors_exactly_with_x64():
    result = _run(
        """
        import jax
        jax.config.update("jax_enable_x64", True)
        import torch, torch_bridge
        x = torch_bridge.to_jax(torch.tensor([2**40 + 5, -3], dtype=torch.int64))
        print(x.dtype, int(x[0]), int(x[1]))
        """
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["int64", str(2**40 + 5), "-3"]


@pytest.mark.parametrize("sinks", [False, True])
def test_a_page_table_of_width_zero_holds_no_tokens(sinks):
    problem = make_paged_problem(batch=2, num_heads=4, num_kv_heads=2, head_dim_qk=16, page_size=4, seq_lens=[0, 5],
                                 max_pages=0, sinks=sinks)  # fmt: skip
    assert problem.page_table.shape == (2, 0)
    expected_lse = np.broadcast_to(problem.sinks, (2, 4)) if sinks else np.full((2, 4), -np.inf)
    jax_extras = {k: jnp.asarray(v) for k, v in problem.extras.items()}
    results = [
        jax_decode.decode_attention(*device_arrays(problem), return_lse=True, backend=backend, **jax_extras)
        for backend in ("xla", KERNEL_BACKEND)
    ]
    torch_extras = {k: to_tensor(v, DEVICE) for k, v in problem.extras.items()}
    out, lse = torch_bridge.decode_attention(*(to_tensor(a, DEVICE) for a in problem.arrays), return_lse=True,
                                             **torch_extras)  # fmt: skip
    results.append((to_float64(out), to_float64(lse)))
    for out, lse in results:
        assert (np.asarray(out) == 0).all()
        np.testing.assert_array_equal(np.asarray(lse), expected_lse)


# --------------------------------------------------------------------------- numeric ranges

SDS = jax.ShapeDtypeStruct


def _trace(q=(2, 8, 16), cache=(8, 16, 2, 16), page_table=(2, 4), **options):
    arrays = (SDS(q, jnp.float32), SDS(cache, jnp.float32), SDS(cache, jnp.float32), SDS(page_table, jnp.int32),
              SDS((q[0],), jnp.int32))  # fmt: skip
    jax.jit(lambda *a: jax_decode.decode_attention(*a, backend="xla", **options)).trace(*arrays)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (dict(sm_scale=1e39), r"sm_scale must be finite and > 0 in float32, got 1e\+39"),
        (dict(sm_scale=1e-50), r"sm_scale must be finite and > 0 in float32 \(at least 1.175e-38\), got 1e-50"),
        (dict(logit_cap=1e39), r"logit_cap must be finite and >= 0 in float32"),
        (dict(page_table=(2, 2**27)), r"page_table width \(134217728\) x page_size \(16\) = 2147483648 tokens per row"),
        (dict(q=(2, 70000, 16), cache=(8, 16, 70000, 16)), r"num_heads \(70000\) must be at most 65535"),
        (dict(window_left=2**31), r"window_left must be in \[0, 2147483647\]"),
        (dict(k_scale=1e-40), r"k_scale must be finite and > 0 in float32 \(at least 1.175e-38\), got 1e-40"),
    ],
    ids=[
        "sm_scale_overflows",
        "sm_scale_underflows",
        "cap_overflows",
        "capacity",
        "num_heads",
        "window",
        "subnormal_scale",
    ],  # fmt: skip
)
def test_values_past_the_kernels_range_are_refused(options, match):
    with pytest.raises(ValueError, match=match):
        _trace(**options)
    tensors = {k: options.pop(k) for k in ("q", "cache", "page_table") if k in options}
    if not tensors:  # the same message from torch
        problem = GQA4.problem()
        with pytest.raises(ValueError, match=match):
            torch_bridge.decode_attention(*(to_tensor(a) for a in problem.arrays), **options)


def test_the_largest_window_and_scale_in_range_work():
    problem = GQA4.problem()
    arrays = device_arrays(problem)
    out = jax_decode.decode_attention(*arrays, window_left=2**31 - 1, backend=KERNEL_BACKEND)
    whole = jax_decode.decode_attention(*arrays, backend=KERNEL_BACKEND)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(whole))


@pytest.mark.parametrize("name", ["num_kv_splits", "window_left"])
def test_bool_options_are_refused_whatever_came_before(name):
    tensors = [to_tensor(a, DEVICE) for a in GQA4.problem().arrays]
    torch_bridge.decode_attention(*tensors, **{name: 1})  # cached as 1 ...
    with pytest.raises(TypeError, match=rf"{name} must be an int or None, got bool"):
        torch_bridge.decode_attention(*tensors, **{name: True})  # ... but True is not 1 here
    with pytest.raises(TypeError, match=rf"{name} must be an int or None, got bool"):
        jax_decode.decode_attention(*device_arrays(GQA4.problem()), backend="xla", **{name: True})


# --------------------------------------------------------------------------- memory the kernels write


def test_out_whose_rows_share_memory_is_refused():
    tensors = [to_tensor(a, DEVICE) for a in GQA4.problem().arrays]
    expanded = torch.empty(1, 8, 64, device=DEVICE).expand(4, 8, 64)  # four rows, one memory
    with pytest.raises(
        ValueError, match=r"out has elements that share memory \(shape \(4, 8, 64\), strides \(0, 64, 1\)"
    ):
        torch_bridge.decode_attention(*tensors, out=expanded)
    q, k, v, pt, sl = tensors
    logits = torch.empty(4, 8, 2, 65, device=DEVICE)
    with pytest.raises(ValueError, match=r"o has elements that share memory"):
        torch_bridge.decode_attention_fwd(q, k, v, expanded, pt, sl, logits, 2, 0.125, 16)
    with pytest.raises(ValueError, match=r"attn_logits has elements that share memory"):
        logits = torch.empty(1, 8, 2, 65, device=DEVICE).expand(4, 8, 2, 65)
        torch_bridge.decode_attention_fwd(q, k, v, torch.empty(4, 8, 64, device=DEVICE), pt, sl, logits, 2, 0.125, 16)
    cache = torch.zeros(1, 4, 2, 8, device=DEVICE).expand(6, 4, 2, 8)
    with pytest.raises(ValueError, match=r"k_cache has elements that share memory"):
        torch_bridge.write_kv(cache, None, torch.ones(1, 2, 8, device=DEVICE), None,
                              torch.zeros(1, dtype=torch.int32, device=DEVICE))  # fmt: skip


def test_zero_size_tensors_with_zero_strides_are_accepted():
    problem = make_paged_problem(batch=0, num_heads=8, num_kv_heads=2, head_dim_qk=64, page_size=16, seq_lens=[],
                                 max_pages=2)  # fmt: skip
    tensors = [to_tensor(a, DEVICE) for a in problem.arrays]
    q = torch.empty(0, 8, 64, device=DEVICE).expand(0, 8, 64)
    out = torch.empty(0, 8, 64, device=DEVICE).expand(0, 8, 64)
    result = torch_bridge.decode_attention(q, *tensors[1:], out=out)
    assert result.shape == (0, 8, 64)


# --------------------------------------------------------------------------- gradients


def test_torch_refuses_inputs_that_require_grad():
    tensors = [to_tensor(a, DEVICE) for a in GQA4.problem().arrays]
    q = tensors[0].clone().requires_grad_()
    with pytest.raises(ValueError, match=r"q requires grad, but these kernels have no gradient .* torch.no_grad\(\)"):
        torch_bridge.decode_attention(q, *tensors[1:])
    with torch.no_grad():
        torch_bridge.decode_attention(q, *tensors[1:])
    torch_bridge.decode_attention(q.detach(), *tensors[1:])


def test_jax_refuses_differentiation_by_name():
    arrays = device_arrays(GQA4.problem())

    def loss(q):
        return jax_decode.decode_attention(q, *arrays[1:], backend="xla").sum()

    with pytest.raises(ValueError, match=r"decode_attention has no gradient .* jax.lax.stop_gradient"):
        jax.grad(loss)(arrays[0])
    k, v = arrays[1], arrays[2]
    new = jnp.ones((1, 2, 64))
    with pytest.raises(ValueError, match=r"write_kv has no gradient"):
        jax.grad(lambda n: jax_decode.write_kv(k, v, n, n, jnp.zeros(1, jnp.int32), backend="xla")[0].sum())(new)
    # Not differentiating through it is fine, stop_gradient included.
    jax.grad(lambda q: (q * loss(jax.lax.stop_gradient(q))).sum())(arrays[0])


# --------------------------------------------------------------------------- LSE merge


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_merge_of_a_non_finite_lse_is_nan_not_empty(bad):
    out_a, out_b = np.ones((2, 3, 4), np.float32), np.full((2, 3, 4), 2.0, np.float32)
    lse_a = np.zeros((2, 3), np.float32)
    lse_b = np.zeros((2, 3), np.float32)
    lse_b[0, 1] = bad
    lse_a[1, 2] = -np.inf  # an empty part stays exact
    for merge, convert in ((jax_decode.merge_attention_states, jnp.asarray),
                           (torch_bridge.merge_attention_states, torch.from_numpy)):  # fmt: skip
        out, lse = merge(convert(out_a), convert(lse_a), convert(out_b), convert(lse_b))
        out, lse = np.asarray(out), np.asarray(lse)
        assert np.isnan(out[0, 1]).all() and np.isnan(lse[0, 1])
        np.testing.assert_array_equal(out[1, 2], 2.0)
        assert lse[1, 2] == 0.0
        np.testing.assert_allclose(out[0, 0], 1.5)


# --------------------------------------------------------------------------- scalar forms: one rule


def test_numpy_scalar_scales_work_in_both_frontends_and_sinks_must_be_arrays():
    import dataclasses

    case = dataclasses.replace(GQA4, kv_dtype="float8_e5m2", dtype="float16")
    problem = case.problem()
    arrays = device_arrays(problem)
    jax_out = jax_decode.decode_attention(*arrays, k_scale=np.float32(0.5), v_scale=0.25, backend=KERNEL_BACKEND)
    tensors = [to_tensor(a, DEVICE) for a in problem.arrays]
    torch_out = torch_bridge.decode_attention(*tensors, k_scale=np.float32(0.5), v_scale=0.25)
    np.testing.assert_array_equal(to_float64(torch_out), np.asarray(jax_out, np.float64))
    message = r"sinks must be an array of shape \(num_heads,\), got a float"
    with pytest.raises(TypeError, match=message):
        jax_decode.decode_attention(*arrays, sinks=1.5, backend="xla")
    with pytest.raises(TypeError, match=message):
        torch_bridge.decode_attention(*tensors, sinks=1.5)
    with pytest.raises(TypeError, match=r"k_scale must be a float or an array, got complex"):
        jax_decode.decode_attention(*arrays, k_scale=1j, backend="xla")


@pytest.mark.parametrize("bad", [float("nan"), 0.0, -1.0, float("inf")])
def test_a_scale_given_as_a_number_must_be_finite_and_positive(bad):
    import dataclasses

    problem = dataclasses.replace(GQA4, kv_dtype="float8_e5m2", dtype="float16").problem()
    arrays = device_arrays(problem)
    tensors = [to_tensor(a, DEVICE) for a in problem.arrays]
    with pytest.raises(ValueError, match="k_scale must be finite and > 0"):
        jax_decode.decode_attention(*arrays, k_scale=bad, backend="xla")
    with pytest.raises(ValueError, match="k_scale must be finite and > 0"):
        torch_bridge.decode_attention(*tensors, k_scale=bad)
    k, v, rows = tensors[1], tensors[2], tensors[1][0, :2].clone()
    with pytest.raises(ValueError, match="v_scale must be finite and > 0"):
        torch_bridge.write_kv(k, v, rows, rows, torch.tensor([0, 1], dtype=torch.int32), v_scale=bad)


@pytest.mark.parametrize("position", range(5))
@pytest.mark.parametrize("bad", [None, [1.0, 2.0]], ids=["None", "list"])
def test_an_operand_that_is_missing_or_not_an_array_is_named(position, bad):
    """In every entry point of both frontends (v_cache / v_new may be None: MLA)."""
    problem = GQA4.problem()
    arrays, tensors = list(device_arrays(problem)), [to_tensor(a, "cpu") for a in problem.arrays]
    decode_names = ("q", "k_cache", "v_cache", "page_table", "seq_lens")
    write_names = ("k_cache", "v_cache", "k_new", "v_new", "slot_mapping")
    merge_names = ("out_a", "lse_a", "out_b", "lse_b")
    rows = tensors[1][0, :2].clone()
    writes = [tensors[1], tensors[2], rows, rows, torch.tensor([0, 1], dtype=torch.int32)]
    out, lse = torch.zeros(4, 8, 64), torch.zeros(4, 8)
    calls = [
        (decode_names, arrays, lambda a: jax_decode.decode_attention(*a, backend="xla")),
        (decode_names, tensors, lambda a: torch_bridge.decode_attention(*a)),
        (write_names, [jnp.asarray(w.numpy()) for w in writes], lambda a: jax_decode.write_kv(*a, backend="xla")),
        (write_names, writes, lambda a: torch_bridge.write_kv(*a)),
        (merge_names, [jnp.asarray(out), jnp.asarray(lse)] * 2, lambda a: jax_decode.merge_attention_states(*a)),
        (merge_names, [out, lse] * 2, lambda a: torch_bridge.merge_attention_states(*a)),
    ]
    for names, args, call in calls:
        if position >= len(names) or (bad is None and names[position] in ("v_cache", "v_new")):
            continue
        args = list(args)
        args[position] = bad
        with pytest.raises(TypeError, match=f"^{names[position]} must be a"):
            call(args)


def test_vllm_drop_in_needs_the_split_count_its_scratch_holds():
    problem = GQA4.problem()
    q, k, v, pt, sl = (to_tensor(a, DEVICE) for a in problem.arrays)
    o = torch.empty(q.shape[0], q.shape[1], v.shape[-1], device=DEVICE)
    logits = torch.empty(q.shape[0], q.shape[1], 2, v.shape[-1] + 1, device=DEVICE)
    with pytest.raises(TypeError, match="num_kv_splits must be an int"):
        torch_bridge.decode_attention_fwd(q, k, v, o, pt, sl, logits, None, 0.125, page_size=k.shape[1])


def test_an_interpreter_that_cannot_run_with_this_numpy_says_what_to_install(monkeypatch):
    """Triton 3.6's interpreter with NumPy >= 2.4 fails inside the kernel (measured);
    the error says which versions to install instead."""
    from jax_decode import interpreter

    def broken(fn):
        def launch(*args, **kwargs):
            raise TypeError("only 0-dimensional arrays can be converted to Python scalars")

        return {(1, 1, 1): launch}

    monkeypatch.setattr(interpreter, "_interpreted", broken)
    launch = KernelLaunch("stage2", (1, 1, 1), num_warps=1, num_stages=1, constexprs=())
    with pytest.raises(RuntimeError, match=r"NumPy .* install 'numpy<2.4' or a newer triton"):
        interpreter.run_interpreted(launch, ())


# --------------------------------------------------------------------------- torch.compile, both entry points


@pytest.mark.parametrize("case", [GQA4, MLA], ids=["gqa", "mla_view"])
def test_vllm_drop_in_compiles_with_fullgraph(case):
    problem = case.problem()
    q, k, v, pt, sl = (to_tensor(a, DEVICE) for a in problem.arrays)
    dv = problem.head_dim_v
    v = k[..., :dv] if v is None else v  # MLA: V a view of the latent, found by pointer at run time
    splits = 3

    def layer(q, k, v, pt, sl):
        o = torch.empty(q.shape[0], q.shape[1], dv, dtype=q.dtype, device=q.device)
        logits = torch.empty(q.shape[0], q.shape[1], splits, dv + 1, dtype=torch.float32, device=q.device)
        torch_bridge.decode_attention_fwd(q * 2, k, v, o, pt, sl, logits, splits, 0.125, case.page_size)
        return o * 0.5

    compiled = torch.compile(layer, fullgraph=True, backend="inductor" if HAS_GPU else "aot_eager")
    torch.testing.assert_close(compiled(q, k, v, pt, sl), layer(q, k, v, pt, sl), atol=0, rtol=0)


# --------------------------------------------------------------------------- what a newcomer meets


def test_torch_bridge_without_torch_says_what_to_install():
    result = _run("import sys; sys.modules['torch'] = None\nimport torch_bridge")
    assert "torch_bridge needs PyTorch: `pip install 'jax-decode[torch]'`" in result.stderr


def test_interpret_backend_without_torch_says_what_to_install():
    result = _run(
        """
        import sys; sys.modules["torch"] = None
        import jax.numpy as jnp, jax_decode
        q, k = jnp.ones((1, 2, 16)), jnp.ones((1, 4, 1, 16))
        table, lengths = jnp.zeros((1, 1), "int32"), jnp.ones(1, "int32")
        try:
            jax_decode.decode_attention(q, k, k, table, lengths, backend="interpret")
        except ImportError as error:
            print(error)
        """
    )
    assert "backend='interpret' runs the kernels in Triton's interpreter" in result.stdout, result.stderr[-2000:]
    assert "pip install 'jax-decode[torch]'" in result.stdout
