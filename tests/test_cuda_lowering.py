"""Every kernel variant compiles for the GPU (sm_80 and sm_90) on a CPU-only machine.

jax.jit(...).trace(...).lower(lowering_platforms=("cuda",)) runs jax_triton's lowering,
which compiles the Triton kernels to GPU code here; needs jax_triton and JAX's CUDA
plugin (installed with --no-deps: its runtime is not needed to lower).
"""

from __future__ import annotations

import os
import re

import jax
import jax.numpy as jnp
import pytest

import jax_decode
from jax_decode.backends import typed_ffi
from jax_decode.backends.triton import jax_triton_available

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


def _lower(name, compute_capability, backend, platform, num_kv_splits=None):
    num_heads, num_kv_heads, dqk, dv, page_size, dtype, mla, cap = VARIANTS[name]
    q, k, v, pt, sl = _arrays(num_heads, num_kv_heads, dqk, dv, page_size, dtype, mla)

    def step(q, k, v, pt, sl):
        return jax_decode.decode_attention(
            q, k, v, pt, sl, head_dim_v=dv, logit_cap=cap, return_lse=True, backend=backend,
            num_kv_splits=num_kv_splits,
        )  # fmt: skip

    target = jax_decode.DeviceInfo(vendor="nvidia", compute_capability=compute_capability, num_sms=132)
    with jax_decode.compile_target(target):
        return jax.jit(step).trace(q, k, v, pt, sl).lower(lowering_platforms=(platform,)).as_text()


@pytest.mark.parametrize("compute_capability", [80, 90])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_variant_compiles_for_cuda(name, compute_capability):
    text = _lower(name, compute_capability, "triton", "cuda", num_kv_splits=2)
    assert text.count("triton_kernel_call") == 2  # stage 1 and stage 2


@pytest.mark.parametrize("compute_capability", [80, 90])
@pytest.mark.parametrize("name", ["gqa_bf16", "mha_f32", "mla_576_512"])
def test_one_split_compiles_to_one_launch(name, compute_capability):
    """With one split stage 1 writes the output itself (tests/test_one_pass.py)."""
    assert _lower(name, compute_capability, "triton", "cuda", num_kv_splits=1).count("triton_kernel_call") == 1


def test_auto_lowers_triton_for_cuda_and_xla_for_cpu():
    assert "triton_kernel_call" in _lower("gqa_bf16", 90, "auto", "cuda")
    assert "triton_kernel_call" not in _lower("gqa_bf16", 90, "auto", "cpu")


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_write_kv_compiles_for_cuda_with_the_cache_aliased(dtype):
    sds = jax.ShapeDtypeStruct
    args = (sds((40, 16, 8, 128), dtype), sds((40, 16, 8, 128), dtype), sds((5, 8, 128), jnp.bfloat16),
            sds((5, 8, 128), jnp.bfloat16), sds((5,), jnp.int32))  # fmt: skip
    step = jax.jit(lambda *a: jax_decode.write_kv(*a, backend="triton"), donate_argnums=(0, 1))
    with jax_decode.compile_target(jax_decode.DeviceInfo("nvidia", 90, 132)):
        text = step.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("triton_kernel_call") == 2  # K and V
    assert text.count("tf.aliasing_output") == 2  # both donated caches updated in place
    if typed_ffi.typed_ffi_registered():  # the typed call keeps the kernel's own in-place update
        assert text.count("output_operand_aliases = [#stablehlo.output_operand_alias<") == 2


def test_launches_go_through_jaxlibs_typed_ffi_call():
    """Every launch lowers to jaxlib's typed-FFI Triton call (fewer GPU gaps between
    launches than the legacy call, jax_decode/backends/typed_ffi.py), whichever
    jax_triton line compiles the kernel."""
    if not typed_ffi.typed_ffi_registered():
        pytest.skip("this jaxlib registers no typed-FFI Triton call")
    text = _lower("gqa_bf16", 90, "triton", "cuda", num_kv_splits=2)
    assert text.count("stablehlo.custom_call @triton_kernel_call_ffi(") == 2
    assert "stablehlo.custom_call @triton_kernel_call(" not in text
    assert text.count("mhlo.backend_config = {opaque = ") == 2


def _jax_triton_03():
    from jax_decode.backends.triton import import_jax_triton, is_jax_triton_04

    if is_jax_triton_04() or not typed_ffi.typed_ffi_registered():
        pytest.skip("jax_triton 0.4 emits the typed call itself, or jaxlib has none")
    return import_jax_triton().triton_lib


def test_a_lowering_registered_in_jax_tritons_place_is_kept():
    """A rule someone registered over jax_triton 0.3's lowering still lowers every call:
    ours ask it for the legacy call and turn that into the typed one."""
    from jax.interpreters import mlir

    lib = _jax_triton_03()
    primitive, registered = lib.triton_kernel_call_p, typed_ffi._cuda_lowering(lib.triton_kernel_call_p)
    asked = []

    def users_rule(ctx, *arrays, **params):
        asked.append(params["custom_call_target_name"])
        return registered(ctx, *arrays, **params)

    mlir.register_lowering(primitive, users_rule, platform="cuda")
    try:
        assert typed_ffi.route_jax_triton_03(__import__("jax_triton"))
        text = _lower("gqa_bf16", 90, "triton", "cuda", num_kv_splits=2)
    finally:
        mlir.register_lowering(primitive, registered, platform="cuda")
    assert asked == [typed_ffi.LEGACY_TARGET] * 2
    assert text.count("stablehlo.custom_call @triton_kernel_call_ffi(") == 2


def test_the_legacy_call_on_request(monkeypatch):
    """JAX_DECODE_TRITON_CALL=legacy lowers every launch of ours to the legacy call."""
    _jax_triton_03()
    monkeypatch.setenv(typed_ffi.CALL_VARIABLE, "legacy")
    text = _lower("gqa_bf16", 90, "triton", "cuda", num_kv_splits=2)
    assert text.count("stablehlo.custom_call @triton_kernel_call(") == 2
    assert "triton_kernel_call_ffi" not in text
    monkeypatch.setenv(typed_ffi.CALL_VARIABLE, "fast")
    choices = "'typed', 'legacy', 'graph'"
    with pytest.raises(ValueError, match=f"JAX_DECODE_TRITON_CALL must be one of {choices}, got 'fast'"):
        _lower("gqa_bf16", 90, "triton", "cuda", num_kv_splits=2)


def _opaques(text: str) -> list[str]:
    """The serialized kernel calls of a lowered program's Triton custom calls, in order."""
    return re.findall(r'mhlo.backend_config = \{opaque = "([^"]*)"', text)


def _address(capsule) -> int:
    """The pointer a PyCapsule holds (a handler stage of jaxlib's)."""
    import ctypes

    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return get(capsule, None)


def test_the_graph_call_on_request(monkeypatch):
    """JAX_DECODE_TRITON_CALL=graph lowers every launch of ours to jaxlib's typed handler
    registered again under our name, declared command-buffer compatible, with the very
    kernel calls the typed call takes -- whichever jax_triton line compiles the kernel."""
    if not typed_ffi.typed_ffi_registered():
        pytest.skip("this jaxlib registers no typed-FFI Triton call")
    typed = _lower("gqa_bf16", 90, "triton", "cuda", num_kv_splits=2)
    registered = []
    monkeypatch.setattr(jax.ffi, "register_ffi_target", lambda *args, **kwargs: registered.append((args, kwargs)))
    typed_ffi._register_graph_target.cache_clear()
    monkeypatch.setenv(typed_ffi.CALL_VARIABLE, "graph")
    try:
        graph = _lower("gqa_bf16", 90, "triton", "cuda", num_kv_splits=2)
    finally:
        typed_ffi._register_graph_target.cache_clear()
    assert graph.count(f"stablehlo.custom_call @{typed_ffi.GRAPH_TARGET}(") == 2
    assert "triton_kernel_call" not in graph
    assert _opaques(graph) == _opaques(typed) and len(_opaques(typed)) == 2
    from jax._src.lib import gpu_triton, xla_client

    (args, kwargs), *others = registered
    assert not others  # once per process
    name, stages = args
    assert name == typed_ffi.GRAPH_TARGET
    jaxlibs = gpu_triton._cuda_triton.registrations()[typed_ffi.TYPED_FFI_TARGET]
    assert {stage: _address(c) for stage, c in stages.items()} == {stage: _address(c) for stage, c in jaxlibs.items()}
    assert kwargs == dict(platform="CUDA", traits=xla_client.CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE)


def test_the_graph_call_leaves_other_kernels_alone(monkeypatch):
    """Under JAX_DECODE_TRITON_CALL=graph a jax_triton call of someone else's kernel in
    the same program keeps jax_triton's own custom call (it may autotune, which a
    command buffer cannot replay)."""
    import triton
    import triton.language as tl

    from jax_decode.backends.triton import import_jax_triton, is_jax_triton_04

    if not typed_ffi.typed_ffi_registered():
        pytest.skip("this jaxlib registers no typed-FFI Triton call")

    @triton.jit
    def add_one(x_ptr, y_ptr, BLOCK: tl.constexpr):
        offsets = tl.arange(0, BLOCK)
        tl.store(y_ptr + offsets, tl.load(x_ptr + offsets) + 1)

    jt = import_jax_triton()
    x = jax.ShapeDtypeStruct((16,), jnp.float32)
    outputs = {"out_type" if is_jax_triton_04() else "out_shape": x}
    step = jax.jit(lambda x: jt.triton_call(x, kernel=add_one, grid=(1,), BLOCK=16, compute_capability=90, **outputs))
    monkeypatch.setattr(jax.ffi, "register_ffi_target", lambda *args, **kwargs: None)
    typed_ffi._register_graph_target.cache_clear()
    monkeypatch.setenv(typed_ffi.CALL_VARIABLE, "graph")
    try:
        text = step.trace(x).lower(lowering_platforms=("cuda",)).as_text()
    finally:
        typed_ffi._register_graph_target.cache_clear()
    jax_tritons = typed_ffi.TYPED_FFI_TARGET if is_jax_triton_04() else typed_ffi.LEGACY_TARGET
    assert text.count(f"stablehlo.custom_call @{jax_tritons}(") == 1
    assert typed_ffi.GRAPH_TARGET not in text


def test_without_the_wrapper_our_calls_stay_legacy():
    """Our jax_triton 0.3 calls name the typed target only where the wrapper that emits
    its form is the registered lowering (here someone registered jax_triton's own
    lowering again after ours)."""
    import functools

    from jax.interpreters import mlir

    lib = _jax_triton_03()
    primitive, registered = lib.triton_kernel_call_p, typed_ffi._cuda_lowering(lib.triton_kernel_call_p)
    jax_tritons = functools.partial(lib.triton_kernel_call_lowering, lib.get_cuda_backend)
    mlir.register_lowering(primitive, jax_tritons, platform="cuda")
    try:
        text = _lower("gqa_bf16", 90, "triton", "cuda", num_kv_splits=2)
    finally:
        mlir.register_lowering(primitive, registered, platform="cuda")
    assert text.count("stablehlo.custom_call @triton_kernel_call(") == 2
    assert "triton_kernel_call_ffi" not in text


def test_vmap_lowers_to_one_launch_per_stage():
    q, k, v, pt, sl = _arrays(32, 8, 128, 128, 16, jnp.bfloat16, False)
    stacked = [jax.ShapeDtypeStruct((4, *x.shape), x.dtype) for x in (q, pt, sl)]

    def call(q, pt, sl):
        return jax_decode.decode_attention(q, k_arr, v_arr, pt, sl, backend="triton", num_kv_splits=2)

    k_arr, v_arr = jnp.zeros(k.shape, k.dtype), jnp.zeros(v.shape, v.dtype)
    with jax_decode.compile_target(jax_decode.DeviceInfo("nvidia", 90, 132)):
        text = jax.jit(jax.vmap(call)).trace(*stacked).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("triton_kernel_call") == 2  # the mapped axis joined the batch: no loop, no per-map launch


FEATURE_VARIANTS = {
    # name: (base variant, cache dtype, scale shape or None, window_left, sinks)
    "gqa_e4m3_head_scales_window_sinks": ("gqa_bf16", jnp.float8_e4m3fn, (8,), 1023, True),
    "mha_e5m2_tensor_scale": ("mha_f16", jnp.float8_e5m2, (), None, False),
    "mqa_e4m3": ("mqa_d256", jnp.float8_e4m3fn, (1,), None, False),
    "mla_e4m3_sinks": ("mla_576_512", jnp.float8_e4m3fn, (), None, True),
    "gqa_window": ("gqa_f16_cap", None, None, 0, False),
    "mha_sinks": ("mha_f32", None, None, None, True),
}


@pytest.mark.parametrize("name", list(FEATURE_VARIANTS))
def test_feature_variant_compiles_for_sm90(name):
    base, cache_dtype, scale_shape, window_left, sinks = FEATURE_VARIANTS[name]
    num_heads, num_kv_heads, dqk, dv, page_size, dtype, mla, cap = VARIANTS[base]
    q, k, v, pt, sl = _arrays(num_heads, num_kv_heads, dqk, dv, page_size, dtype, mla)
    if cache_dtype is not None:
        k = jax.ShapeDtypeStruct(k.shape, cache_dtype)
        v = None if v is None else jax.ShapeDtypeStruct(v.shape, cache_dtype)
    extras = {}
    if scale_shape is not None:
        extras["k_scale"] = jax.ShapeDtypeStruct(scale_shape, jnp.float32)
        if not mla:
            extras["v_scale"] = jax.ShapeDtypeStruct(scale_shape, jnp.float32)
    if sinks:
        extras["sinks"] = jax.ShapeDtypeStruct((num_heads,), jnp.float32)

    def step(q, k, v, pt, sl, **extras):
        return jax_decode.decode_attention(
            q, k, v, pt, sl, head_dim_v=dv, logit_cap=cap, window_left=window_left, return_lse=True,
            backend="triton", num_kv_splits=2, **extras,
        )  # fmt: skip

    with jax_decode.compile_target(jax_decode.DeviceInfo("nvidia", 90, 132)):
        text = jax.jit(step).trace(q, k, v, pt, sl, **extras).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("triton_kernel_call") >= 2


@pytest.mark.parametrize("cache_dtype", [jnp.float8_e4m3fn, jnp.float8_e5m2])
def test_fp8_write_kv_compiles_for_sm90(cache_dtype):
    sds = jax.ShapeDtypeStruct
    args = (sds((40, 16, 8, 128), cache_dtype), sds((40, 16, 8, 128), cache_dtype), sds((5, 8, 128), jnp.bfloat16),
            sds((5, 8, 128), jnp.bfloat16), sds((5,), jnp.int32))  # fmt: skip
    scales = dict(k_scale=sds((8,), jnp.float32), v_scale=sds((), jnp.float32))
    step = jax.jit(lambda *a, **kw: jax_decode.write_kv(*a, backend="triton", **kw), donate_argnums=(0, 1))
    with jax_decode.compile_target(jax_decode.DeviceInfo("nvidia", 90, 132)):
        text = step.trace(*args, **scales).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("tf.aliasing_output") == 2


def test_e4m3_cache_is_refused_before_sm89():
    q, k, v, pt, sl = _arrays(32, 8, 128, 128, 16, jnp.bfloat16, False)
    k = v = jax.ShapeDtypeStruct(k.shape, jnp.float8_e4m3fn)

    def step(q, k, v, pt, sl):
        return jax_decode.decode_attention(q, k, v, pt, sl, backend="triton")

    with jax_decode.compile_target(jax_decode.DeviceInfo("nvidia", 80, 108)):
        with pytest.raises(ValueError, match=r"float8_e4m3fn cache needs .* compute capability >= 8.9.*sm_80"):
            jax.jit(step).trace(q, k, v, pt, sl).lower(lowering_platforms=("cuda",))
        # float8_e5m2 compiles there.
        e5m2 = jax.ShapeDtypeStruct(k.shape, jnp.float8_e5m2)
        jax.jit(step).trace(q, e5m2, e5m2, pt, sl).lower(lowering_platforms=("cuda",))


MULTI_TOKEN = {
    # name: (num_heads, num_kv_heads, head_dim_qk, head_dim_v, page_size, dtype, mla, q_len)
    "mha_q4": (4, 4, 128, 128, 16, jnp.bfloat16, False, 4),
    "gqa_q4": (32, 8, 128, 128, 16, jnp.bfloat16, False, 4),
    "mqa_q16": (8, 1, 256, 256, 16, jnp.float16, False, 16),
    "mla128_q2": (128, 1, 576, 512, 64, jnp.bfloat16, True, 2),  # 256 rows: warpgroup-MMA blocks on sm_90
    "mla16_q2": (16, 1, 576, 512, 64, jnp.bfloat16, True, 2),  # 32 rows: two 16-row head blocks
}


@pytest.mark.parametrize("compute_capability", [80, 90])
@pytest.mark.parametrize("name", list(MULTI_TOKEN))
def test_multi_token_variant_compiles_for_cuda(name, compute_capability):
    num_heads, num_kv_heads, dqk, dv, page_size, dtype, mla, q_len = MULTI_TOKEN[name]
    q, k, v, pt, sl = _arrays(num_heads, num_kv_heads, dqk, dv, page_size, dtype, mla)
    q = jax.ShapeDtypeStruct((q.shape[0], q_len, *q.shape[1:]), dtype)

    def step(q, k, v, pt, sl):
        return jax_decode.decode_attention(q, k, v, pt, sl, head_dim_v=dv, window_left=100, return_lse=True,
                                           backend="triton", num_kv_splits=2)  # fmt: skip

    target = jax_decode.DeviceInfo(vendor="nvidia", compute_capability=compute_capability, num_sms=132)
    with jax_decode.compile_target(target):
        text = jax.jit(step).trace(q, k, v, pt, sl).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("triton_kernel_call") >= 2
