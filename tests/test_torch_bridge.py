"""torch_bridge: the same kernels on torch tensors, vs the oracle and bit-exact vs the JAX path.

On a CPU-only machine both frameworks run the kernels in Triton's interpreter; on a GPU
the torch path runs them compiled and the JAX path through jax_triton.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from cases import GQA4, MATRIX, MHA, MLA, Case
from conftest import HAS_GPU
from support import assert_matches_oracle, run_jax
from torch_support import to_float64, to_tensor

import torch_bridge
from jax_decode.reference import decode_attention_reference

DEVICE = "cuda" if HAS_GPU else "cpu"
JAX_KERNEL_BACKEND = "triton" if HAS_GPU else "interpret"


def run_torch(problem, case: Case, **extra):
    tensors = [to_tensor(a, DEVICE) for a in problem.arrays]
    out, lse = torch_bridge.decode_attention(
        *tensors, head_dim_v=problem.head_dim_v if case.mla else None, return_lse=True, **case.options(), **extra
    )
    return out, lse


@pytest.mark.parametrize("case", MATRIX, ids=lambda c: c.id)
def test_torch_matches_oracle_and_jax_bit_for_bit(case: Case):
    problem = case.problem()
    out, lse = run_torch(problem, case)
    assert out.dtype == to_tensor(problem.q).dtype and out.device.type == DEVICE
    assert_matches_oracle(problem, to_float64(out), to_float64(lse), mla=case.mla, logit_cap=case.logit_cap)

    jax_out, jax_lse = run_jax(problem, backend=JAX_KERNEL_BACKEND, mla=case.mla, **case.options())
    # Same kernels, same launch: any difference is a launch-config bug, not noise.
    np.testing.assert_array_equal(to_float64(out), jax_out)
    np.testing.assert_array_equal(to_float64(lse), jax_lse)


def test_out_is_written_in_place():
    problem = GQA4.problem()
    tensors = [to_tensor(a, DEVICE) for a in problem.arrays]
    buffer = torch.full((4, 8, 2 * 64), 7.0, device=DEVICE)
    out_view = buffer[..., :64]  # strided rows
    result = torch_bridge.decode_attention(*tensors, out=out_view, num_kv_splits=2)
    assert result.data_ptr() == buffer.data_ptr()
    assert (buffer[..., 64:] == 7.0).all(), "nothing outside out is touched"
    expected, _ = decode_attention_reference(*problem.arrays)
    np.testing.assert_allclose(to_float64(out_view), expected, atol=2e-5, rtol=2e-5)


def _vllm_inputs(case: Case, three_d: bool):
    problem = case.problem()
    q, k, v, pt, sl = (to_tensor(a, DEVICE) for a in problem.arrays)
    if three_d:  # page_size 1 caches as [num_tokens, num_kv_heads, D]
        k, v = k.squeeze(1), (None if v is None else v.squeeze(1))
    return problem, q, k, v, pt, sl


PAGE1_GQA = dataclasses.replace(GQA4, page_size=1, max_pages=40)


@pytest.mark.parametrize(
    ("case", "three_d"),
    [(PAGE1_GQA, True), (PAGE1_GQA, False), (MHA, False)],  # 3-D buffers hold page_size 1 only
    ids=["3d_k_buffer", "4d_k_buffer_page1", "4d_k_buffer_page16"],
)
def test_vllm_drop_in(case, three_d):
    problem, q, k, v, pt, sl = _vllm_inputs(case, three_d)
    splits = 3
    o = torch.empty(q.shape[0], q.shape[1], v.shape[-1], dtype=q.dtype, device=DEVICE)
    attn_logits = torch.empty(q.shape[0], q.shape[1], splits, v.shape[-1] + 1, dtype=torch.float32, device=DEVICE)
    torch_bridge.decode_attention_fwd(q, k, v, o, pt, sl, attn_logits, splits, 0.125, page_size=case.page_size)
    expected, _ = decode_attention_reference(*problem.arrays, sm_scale=0.125)
    np.testing.assert_allclose(to_float64(o), expected, atol=2e-5, rtol=2e-5)


def test_vllm_drop_in_mla_view_without_copy():
    problem, q, k, _, pt, sl = _vllm_inputs(MLA, three_d=True)
    v = k[..., :512]  # a view: V is the latent
    o = torch.empty(q.shape[0], q.shape[1], 512, dtype=q.dtype, device=DEVICE)
    attn_logits = torch.empty(q.shape[0], q.shape[1], 4, 513, dtype=torch.float32, device=DEVICE)
    torch_bridge.decode_attention_fwd(q, k, v, o, pt, sl, attn_logits, 4, 0.04, page_size=1)
    expected, _ = decode_attention_reference(*problem.arrays, sm_scale=0.04, head_dim_v=512)
    np.testing.assert_allclose(to_float64(o), expected, atol=2e-5, rtol=2e-5)


# Every option that reaches the planner or the checks under torch.compile: the defaults
# (the planner chooses the splits), and each float and int option set.
COMPILE_OPTIONS = {
    "defaults": {},
    "num_kv_splits": dict(num_kv_splits=2),
    "sm_scale": dict(sm_scale=0.1),
    "logit_cap": dict(logit_cap=30.0),
    "window_left": dict(window_left=5),
    "sinks": dict(sinks=torch.linspace(-1, 1, 8)),
    "everything": dict(sm_scale=0.2, logit_cap=20.0, window_left=9, num_kv_splits=3, return_lse=True),
}


@pytest.mark.parametrize("options", list(COMPILE_OPTIONS))
def test_torch_compile_fullgraph(options):
    torch._dynamo.reset()  # each option set traced afresh (the layer's code object is shared)
    problem = GQA4.problem()
    tensors = [to_tensor(a, DEVICE) for a in problem.arrays]
    kwargs = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in COMPILE_OPTIONS[options].items()}

    def layer(q, k, v, pt, sl):
        # Only exact elementwise work around the op, so compiled and eager must agree bit for bit.
        result = torch_bridge.decode_attention(q * 2, k, v, pt, sl, **kwargs)
        return (result[0] * 0.5, result[1]) if kwargs.get("return_lse") else result * 0.5

    compiled = torch.compile(layer, fullgraph=True, backend="inductor" if HAS_GPU else "aot_eager")
    torch.testing.assert_close(compiled(*tensors), layer(*tensors), atol=0, rtol=0)


@pytest.mark.parametrize(
    "options, error",
    [
        (dict(sm_scale=-1.0), ValueError),
        (dict(logit_cap=float("nan")), ValueError),
        (dict(k_scale=float("nan")), ValueError),
        (dict(v_scale=-1.0), ValueError),
        (dict(k_scale=1e39), ValueError),
        (dict(window_left=-2), ValueError),
        (dict(sm_scale=True), TypeError),
        (dict(window_left=2.0), TypeError),
    ],
)
def test_torch_compile_refuses_bad_options_by_name(options, error):
    """Compiled, values are checked by the op when it runs (they may be symbolic while
    tracing), with the eager call's ValueError; a wrong type is refused while tracing,
    which torch.compile(fullgraph=True) reports inside its Unsupported."""
    tensors = [to_tensor(a, DEVICE) for a in GQA4.problem().arrays]
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: torch_bridge.decode_attention(*a, **options), fullgraph=True,
                             backend="aot_eager")  # fmt: skip
    name = next(iter(options))
    with pytest.raises((error, torch._dynamo.exc.Unsupported), match=f"{error.__name__}.*{name}|^{name}"):
        compiled(*tensors)


def test_torch_compile_follows_batch_window_and_scale_changes():
    """One compiled function over calls whose batch, window and scales change (the plan
    is made when the op runs, so symbolic shapes and options are fine), and with
    dynamic=True: bit-identical to eager every time."""
    problem = GQA4.problem()
    q, k, v, pt, sl = (to_tensor(a, DEVICE) for a in problem.arrays)
    torch._dynamo.reset()

    def layer(q, k, v, pt, sl, window_left, sm_scale):
        return torch_bridge.decode_attention(q, k, v, pt, sl, window_left=window_left, sm_scale=sm_scale)

    for dynamic in (None, True):
        compiled = torch.compile(layer, fullgraph=True, backend="aot_eager", dynamic=dynamic)
        for rows, window, scale in [(4, None, 0.1), (2, 7, 0.2), (3, 3, 0.3), (1, 5, 0.1)]:
            args = (q[:rows], k, v, pt[:rows], sl[:rows], window, scale)
            torch.testing.assert_close(compiled(*args), layer(*args), atol=0, rtol=0)


def test_torch_compile_of_mla_with_out_and_lse():
    """The MLA form (v_cache None, head_dim_v) compiled, writing a given out in place."""
    problem = MLA.problem()
    q, k, _, pt, sl = (to_tensor(a, DEVICE) if a is not None else None for a in problem.arrays)
    dv = problem.head_dim_v
    torch._dynamo.reset()

    def layer(q, k, pt, sl, out):
        return torch_bridge.decode_attention(q, k, None, pt, sl, head_dim_v=dv, out=out, return_lse=True)

    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    out_c, out_e = (torch.empty(q.shape[0], q.shape[1], dv, dtype=q.dtype, device=DEVICE) for _ in range(2))
    (o_c, lse_c), (o_e, lse_e) = compiled(q, k, pt, sl, out_c), layer(q, k, pt, sl, out_e)
    assert o_c.data_ptr() == out_c.data_ptr()
    torch.testing.assert_close(o_c, o_e, atol=0, rtol=0)
    torch.testing.assert_close(lse_c, lse_e, atol=0, rtol=0)


def test_torch_compile_of_the_vllm_drop_in_refuses_wrong_types():
    problem = GQA4.problem()
    q, k, v, pt, sl = (to_tensor(a, DEVICE) for a in problem.arrays)
    o = torch.empty(q.shape[0], q.shape[1], v.shape[-1], device=DEVICE)
    logits = torch.empty(q.shape[0], q.shape[1], 2, v.shape[-1] + 1, device=DEVICE)
    torch._dynamo.reset()

    def fwd(sm_scale):
        torch_bridge.decode_attention_fwd(q, k, v, o, pt, sl, logits, 2, sm_scale, page_size=k.shape[1])
        return o

    compiled = torch.compile(fwd, fullgraph=True, backend="aot_eager")
    for bad in (True, "0.5"):
        with pytest.raises((TypeError, torch._dynamo.exc.Unsupported), match="sm_scale must be a Python float"):
            compiled(bad)
    torch.testing.assert_close(compiled(0.3).clone(), fwd(0.3).clone(), atol=0, rtol=0)


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay():
    problem = GQA4.problem()
    q, k, v, pt, sl = (to_tensor(a, "cuda") for a in problem.arrays)
    out = torch.empty(4, 8, 64, device="cuda")
    torch_bridge.decode_attention(q, k, v, pt, sl, out=out)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch_bridge.decode_attention(q, k, v, pt, sl, out=out)
    q.copy_(to_tensor(problem.q * 3, "cuda"))  # new inputs in the captured buffers
    sl.copy_(torch.tensor([3, 0, 17, 64], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    problem.q = problem.q * 3
    problem.seq_lens[:] = [3, 0, 17, 64]
    expected, _ = decode_attention_reference(*problem.arrays)
    np.testing.assert_allclose(to_float64(out), expected, atol=2e-5, rtol=2e-5)


@pytest.mark.gpu
def test_cached_launch_respects_pointer_alignment():
    """Later calls skip Triton's binder; a misaligned view must still get its own kernel."""
    problem = GQA4.problem()
    q, k, v, pt, sl = (to_tensor(a, "cuda") for a in problem.arrays)
    expected, _ = decode_attention_reference(*problem.arrays)
    for _ in range(3):  # first call compiles, the others take the cached launcher
        out = torch_bridge.decode_attention(q, k, v, pt, sl, num_kv_splits=2)
        np.testing.assert_allclose(to_float64(out), expected, atol=2e-5, rtol=2e-5)
    # The same shapes, but q starts 4 bytes into its storage (not 16-byte aligned).
    storage = torch.empty(q.numel() + 1, device="cuda", dtype=q.dtype)
    q_shifted = storage[1:].view(q.shape)
    q_shifted.copy_(q)
    assert q_shifted.data_ptr() % 16 != 0
    for _ in range(2):
        out = torch_bridge.decode_attention(q_shifted, k, v, pt, sl, num_kv_splits=2)
        np.testing.assert_allclose(to_float64(out), expected, atol=2e-5, rtol=2e-5)
