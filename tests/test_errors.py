"""Every bad-input message: a ValueError/TypeError at trace time naming the argument."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from conftest import HAS_GPU

import jax_decode

B, H, KV, D, PAGES, PAGE, MAX_PAGES = 2, 8, 2, 64, 6, 4, 3


def sds(shape, dtype=jnp.float16):
    return jax.ShapeDtypeStruct(shape, dtype)


GOOD = dict(
    q=sds((B, H, D)),
    k_cache=sds((PAGES, PAGE, KV, D)),
    v_cache=sds((PAGES, PAGE, KV, D)),
    page_table=sds((B, MAX_PAGES), jnp.int32),
    seq_lens=sds((B,), jnp.int32),
)


def trace(options=None, **arrays):
    """Trace decode_attention under jax.jit with GOOD arrays, some replaced."""
    args = {**GOOD, **arrays}
    names = list(args)
    fn = lambda *a: jax_decode.decode_attention(*a, backend="xla", **(options or {}))  # noqa: E731
    return jax.jit(fn).trace(*[args[n] for n in names])


def test_good_arguments_trace():
    trace()


BAD_ARRAYS = [
    (
        "q_rank",
        dict(q=sds((B, H))),
        ValueError,
        r"q must be 3-D \[batch, num_heads, head_dim_qk\] or 4-D \[batch, q_len, num_heads, head_dim_qk\], "
        r"got shape \(2, 8\)",
    ),
    (
        "k_rank",
        dict(k_cache=sds((PAGES, KV, D))),
        ValueError,
        r"k_cache must be 4-D \[num_pages, page_size, num_kv_heads, head_dim_qk\], got shape \(6, 2, 64\)",
    ),
    ("v_rank", dict(v_cache=sds((PAGES * PAGE, KV, D))), ValueError, r"v_cache must be 4-D"),
    (
        "page_table_rank",
        dict(page_table=sds((B * MAX_PAGES,), jnp.int32)),
        ValueError,
        r"page_table must be 2-D \[batch, max_pages\], got shape \(6,\)",
    ),
    ("seq_lens_rank", dict(seq_lens=sds((B, 1), jnp.int32)), ValueError, r"seq_lens must be 1-D \[batch\]"),
    (
        "q_dtype",
        dict(q=sds((B, H, D), jnp.complex64)),
        TypeError,
        r"q dtype must be one of float16, bfloat16, float32, got complex64",
    ),
    ("q_int", dict(q=sds((B, H, D), jnp.int32)), TypeError, r"q dtype must be one of .* got int32"),
    (
        "k_dtype",
        dict(k_cache=sds((PAGES, PAGE, KV, D), jnp.bfloat16)),
        TypeError,
        r"k_cache dtype \(bfloat16\) must equal q dtype \(float16\)",
    ),
    (
        "v_dtype",
        dict(v_cache=sds((PAGES, PAGE, KV, D), jnp.float32)),
        TypeError,
        r"v_cache dtype \(float32\) must equal k_cache dtype \(float16\)",
    ),
    (
        "page_table_float",
        dict(page_table=sds((B, MAX_PAGES), jnp.float32)),
        TypeError,
        r"page_table must be int32, got float32",
    ),
    (
        "page_table_int16",
        dict(page_table=sds((B, MAX_PAGES), jnp.int16)),
        TypeError,
        r"page_table must be int32, got int16",
    ),
    ("seq_lens_float", dict(seq_lens=sds((B,), jnp.float32)), TypeError, r"seq_lens must be int32, got float32"),
    (
        "page_table_batch",
        dict(page_table=sds((B + 1, MAX_PAGES), jnp.int32)),
        ValueError,
        r"page_table batch \(3\) must equal q batch \(2\)",
    ),
    (
        "seq_lens_batch",
        dict(seq_lens=sds((B + 2,), jnp.int32)),
        ValueError,
        r"seq_lens batch \(4\) must equal q batch \(2\)",
    ),
    (
        "heads_multiple",
        dict(q=sds((B, 7, D)), k_cache=sds((PAGES, PAGE, 3, D)), v_cache=sds((PAGES, PAGE, 3, D))),
        ValueError,
        r"num_heads \(7\) must be a multiple of num_kv_heads \(3\)",
    ),
    ("head_dim", dict(q=sds((B, H, 32))), ValueError, r"k_cache head_dim \(64\) must equal q head_dim_qk \(32\)"),
    (
        "v_layout",
        dict(v_cache=sds((PAGES, PAGE, KV + 1, D))),
        ValueError,
        r"v_cache shape \(6, 4, 3, 64\) must match k_cache shape \(6, 4, 2, 64\) "
        r"in \[num_pages, page_size, num_kv_heads\]",
    ),
    (
        "no_pages",
        dict(k_cache=sds((0, PAGE, KV, D)), v_cache=sds((0, PAGE, KV, D))),
        ValueError,
        r"k_cache must hold at least one page of at least one slot, got shape \(0, 4, 2, 64\)",
    ),
    (
        "head_dim_too_big",
        dict(q=sds((B, H, 2048)), k_cache=sds((PAGES, PAGE, KV, 2048)), v_cache=sds((PAGES, PAGE, KV, 64))),
        ValueError,
        r"head_dim_qk \(2048\) must be in \[1, 1024\]",
    ),
]


@pytest.mark.parametrize(("name", "arrays", "error", "match"), BAD_ARRAYS, ids=[b[0] for b in BAD_ARRAYS])
def test_bad_arrays(name, arrays, error, match):
    with pytest.raises(error, match=match):
        trace(**arrays)


BAD_OPTIONS = [
    (
        "backend",
        dict(backend="cuda"),
        ValueError,
        r"backend must be one of 'auto', 'triton', 'xla', 'interpret', got 'cuda'",
    ),
    ("sm_scale_negative", dict(sm_scale=-1.0), ValueError, r"sm_scale must be finite and > 0, got -1.0"),
    ("sm_scale_nan", dict(sm_scale=float("nan")), ValueError, r"sm_scale must be finite and > 0, got nan"),
    ("sm_scale_array", dict(sm_scale=jnp.float32(0.1)), TypeError, r"sm_scale must be a Python float, got"),
    ("logit_cap_negative", dict(logit_cap=-2.0), ValueError, r"logit_cap must be finite and >= 0, got -2.0"),
    ("logit_cap_inf", dict(logit_cap=float("inf")), ValueError, r"logit_cap must be finite and >= 0, got inf"),
    ("splits_zero", dict(num_kv_splits=0), ValueError, r"num_kv_splits must be in \[1, 256\] or None, got 0"),
    ("splits_huge", dict(num_kv_splits=1000), ValueError, r"num_kv_splits must be in \[1, 256\] or None, got 1000"),
    ("splits_float", dict(num_kv_splits=2.0), TypeError, r"num_kv_splits must be an int or None, got float"),
    (
        "head_dim_v_mismatch",
        dict(head_dim_v=32),
        ValueError,
        r"head_dim_v \(32\) must equal v_cache head_dim_v \(64\) or be None",
    ),
    ("head_dim_v_type", dict(head_dim_v="64"), TypeError, r"head_dim_v must be an int or None, got str"),
]


@pytest.mark.parametrize(("name", "options", "error", "match"), BAD_OPTIONS, ids=[b[0] for b in BAD_OPTIONS])
def test_bad_options(name, options, error, match):
    backend = options.pop("backend", "xla")
    args = [GOOD[n] for n in GOOD]
    fn = lambda *a: jax_decode.decode_attention(*a, backend=backend, **options)  # noqa: E731
    with pytest.raises(error, match=match):
        jax.jit(fn).trace(*args)


def mla_trace(head_dim_v):
    args = [GOOD["q"], GOOD["k_cache"], None, GOOD["page_table"], GOOD["seq_lens"]]
    fn = lambda q, k, pt, sl: jax_decode.decode_attention(q, k, None, pt, sl, head_dim_v=head_dim_v)  # noqa: E731
    return jax.jit(fn).trace(args[0], args[1], args[3], args[4])


def test_mla_needs_head_dim_v():
    with pytest.raises(ValueError, match=r"v_cache=None needs head_dim_v: V is then k_cache\[..., :head_dim_v\]"):
        mla_trace(None)


def test_mla_head_dim_v_not_larger_than_qk():
    with pytest.raises(
        ValueError, match=r"head_dim_v \(65\) must be in \[1, head_dim_qk \(64\)\] when v_cache is None"
    ):
        mla_trace(65)


def test_mla_head_dim_v_within_qk_traces():
    mla_trace(48)


@pytest.mark.skipif(HAS_GPU, reason="a GPU is visible, so the triton backend is usable")
def test_triton_backend_without_gpu():
    args = [GOOD[n] for n in GOOD]
    fn = lambda *a: jax_decode.decode_attention(*a, backend="triton")  # noqa: E731
    with pytest.raises(ValueError, match=r"backend='triton' needs a GPU visible to JAX, or jax_decode.compile_target"):
        jax.jit(fn).trace(*args)


def test_triton_backend_names_jax_tritons_own_import_error(monkeypatch):
    """The message carries why jax_triton does not import, and says what to install."""
    from jax_decode.backends import triton as triton_backend

    def broken():
        raise ImportError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(triton_backend, "import_jax_triton", broken)
    args = [GOOD[n] for n in GOOD]
    fn = lambda *a: jax_decode.decode_attention(*a, backend="triton")  # noqa: E731
    with jax_decode.compile_target(jax_decode.DeviceInfo("nvidia", 90, 132)):
        with pytest.raises(ValueError, match=r"needs jax_triton, which does not import here \(ImportError: libcuda"):
            jax.jit(fn).trace(*args)
    # auto falls back to xla without a word.
    jax.jit(lambda *a: jax_decode.decode_attention(*a)).trace(*args)


def test_batch_beyond_the_grid_limit_is_refused():
    from jax_decode.operands import DecodeOperands, Spec
    from jax_decode.validation import check_decode_args

    with pytest.raises(ValueError, match=r"q batch \(70000\) must be at most 65535"):
        check_decode_args(
            DecodeOperands(Spec((70000, 4, 16), "float32"), Spec((8, 16, 4, 16), "float32"), None,
                           Spec((70000, 2), "int32"), Spec((70000,), "int32")),
            head_dim_v=16, sm_scale=None, logit_cap=0.0,
        )  # fmt: skip


F8 = jnp.float8_e4m3fn
BAD_EXTRAS = [
    ("q_fp8", dict(q=sds((B, H, D), F8)), TypeError, r"q dtype must be one of float16, bfloat16, float32, got float8"),
    (
        "k_int8",
        dict(k_cache=sds((PAGES, PAGE, KV, D), jnp.int8)),
        TypeError,
        r"k_cache dtype must be one of float16, bfloat16, float32, got int8",
    ),
    (
        "v_not_fp8_with_fp8_k",
        dict(k_cache=sds((PAGES, PAGE, KV, D), F8)),
        TypeError,
        r"v_cache dtype \(float16\) must equal k_cache dtype \(float8_e4m3fn\)",
    ),
    (
        "k_scale_shape",
        dict(k_scale=sds((3,), jnp.float32)),
        ValueError,
        r"k_scale must have shape \(\) or \(1,\) \(per tensor\) or \(2,\) \(per KV head\), got \(3,\)",
    ),
    (
        "v_scale_dtype",
        dict(v_scale=sds((KV,), jnp.int32)),
        TypeError,
        r"v_scale dtype must be one of float16, bfloat16, float32, got int32",
    ),
    ("sinks_shape", dict(sinks=sds((KV,), jnp.float32)), ValueError, r"sinks must have shape \(num_heads,\) = \(8,\)"),
    ("sinks_int", dict(sinks=sds((H,), jnp.int32)), TypeError, r"sinks dtype must be one of .* got int32"),
]


def trace_with(**replace):
    """Trace with GOOD arrays, some replaced, and optional operands, all as jit arguments."""
    arrays = {**GOOD, **{k: v for k, v in replace.items() if k in GOOD}}
    extras = {k: v for k, v in replace.items() if k not in GOOD}

    def fn(*a, **kw):
        return jax_decode.decode_attention(*a, backend="xla", **kw)

    return jax.jit(fn).trace(*arrays.values(), **extras)


@pytest.mark.parametrize(("name", "arrays", "error", "match"), BAD_EXTRAS, ids=[b[0] for b in BAD_EXTRAS])
def test_bad_fp8_scales_and_sinks(name, arrays, error, match):
    with pytest.raises(error, match=match):
        trace_with(**arrays)


def test_fp8_caches_with_scales_and_sinks_trace():
    fp8 = dict(k_cache=sds((PAGES, PAGE, KV, D), F8), v_cache=sds((PAGES, PAGE, KV, D), jnp.float8_e5m2))
    with pytest.raises(TypeError, match=r"v_cache dtype \(float8_e5m2\) must equal k_cache dtype"):
        trace_with(**fp8)
    fp8["v_cache"] = sds((PAGES, PAGE, KV, D), F8)
    trace_with(**fp8, k_scale=sds((), jnp.float32), v_scale=sds((KV,), jnp.bfloat16), sinks=sds((H,), jnp.float32))


BAD_WINDOWS = [
    ("window_negative", dict(window_left=-2), ValueError, r"window_left must be in \[0, 2147483647\] \(or -1 / None"),
    ("window_past_int32", dict(window_left=2**31), ValueError, r"window_left must be in \[0, 2147483647\]"),
    ("window_float", dict(window_left=4.0), TypeError, r"window_left must be an int or None, got float"),
]


@pytest.mark.parametrize(("name", "options", "error", "match"), BAD_WINDOWS, ids=[b[0] for b in BAD_WINDOWS])
def test_bad_window(name, options, error, match):
    fn = lambda *a: jax_decode.decode_attention(*a, backend="xla", **options)  # noqa: E731
    with pytest.raises(error, match=match):
        jax.jit(fn).trace(*GOOD.values())


def test_mla_takes_no_v_scale():
    fn = lambda q, k, pt, sl, s: jax_decode.decode_attention(q, k, None, pt, sl, head_dim_v=32, v_scale=s)  # noqa: E731
    with pytest.raises(ValueError, match=r"v_scale must be None when v_cache is None"):
        jax.jit(fn).trace(GOOD["q"], GOOD["k_cache"], GOOD["page_table"], GOOD["seq_lens"], sds((1,), jnp.float32))


def test_more_pages_than_int32_page_ids_is_refused():
    """A cache of 2**31 pages would need page ids past int32 (and overflows the kernel's
    page-count argument): refused by name, before any tracing of the kernels."""
    with pytest.raises(ValueError, match=r"k_cache num_pages \(2147483648\) must be at most 2147483647"):
        trace(k_cache=sds((2**31, 1, KV, D)), v_cache=sds((2**31, 1, KV, D)))


def test_write_kv_cache_past_int32_slots_is_refused():
    cache = sds((2**29, 8, 1, 8))  # 2**32 slots: more than an int32 slot id reaches
    new, slots = sds((4, 1, 8)), sds((4,), jnp.int32)
    with pytest.raises(ValueError, match=r"k_cache holds num_pages \* page_size = 4294967296 slots"):
        jax.jit(lambda *a: jax_decode.write_kv(*a, backend="xla")).trace(cache, cache, new, new, slots)


@pytest.mark.parametrize("flag", ["return_lse", "check_inputs"])
def test_bool_options_must_be_bools(flag):
    with pytest.raises(TypeError, match=rf"{flag} must be a Python bool, got str"):
        trace({flag: "no"})


def _numpy_call(fn, x64: bool):
    """decode_attention, write_kv and merge_attention_states on NumPy inputs of NumPy's
    default dtypes (int64 indices, float64 values), through ``fn`` (identity or jax.jit)."""
    import numpy as np

    rng = np.random.default_rng(0)
    q, cache = rng.standard_normal((B, H, D)), rng.standard_normal((PAGES, PAGE, KV, D))
    page_table, seq_lens = np.arange(B * MAX_PAGES).reshape(B, MAX_PAGES) % PAGES, np.array([5, 12])
    decode = fn(lambda *a: jax_decode.decode_attention(*a, backend="xla", return_lse=True))
    write = fn(lambda *a: jax_decode.write_kv(*a, backend="xla"))
    merge = fn(jax_decode.merge_attention_states)
    with jax.enable_x64(x64):
        out, lse = decode(q, cache, cache, page_table, seq_lens)
        k, _ = write(cache, cache, q[:, :KV], q[:, :KV], np.array([0, 7]))
        merged, _ = merge(np.asarray(out), np.asarray(lse), np.asarray(out), np.asarray(lse))
    return out, k, merged


def test_numpy_inputs_are_taken_as_jit_takes_them():
    """jax.jit hands a jitted function NumPy int64 indices as int32 and float64 values as
    float32 (without x64): the eager call takes them the same way, with the same results;
    with x64 on, both refuse the float64 q alike."""
    import numpy as np

    eager, jitted = _numpy_call(lambda f: f, x64=False), _numpy_call(jax.jit, x64=False)
    for a, b in zip(eager, jitted, strict=True):
        assert a.dtype == b.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
    for fn in (lambda f: f, jax.jit):
        with pytest.raises(TypeError, match="q dtype must be one of float16, bfloat16, float32, got float64"):
            _numpy_call(fn, x64=True)
