"""PyTorch frontend: the kernels of ``jax_decode`` on torch tensors, as a torch custom op.

CUDA tensors run the compiled kernels, CPU tensors run them in Triton's interpreter.
Every launch goes through :func:`jax_decode.launch.make_launch_config` and
:func:`torch_bridge.launcher.launch_decode`, with the JAX frontend's argument checks
and operand order, so the same inputs give the same launch and bit-identical results.

The op ``jax_decode::decode_attention_`` writes ``out``, ``lse`` and the float32
``scratch`` in place and allocates nothing, so ``torch.compile(fullgraph=True)`` sees
no graph break and a CUDA graph can capture and replay it.  ``scratch`` is either flat
(the JAX frontend's layout: mid_o then mid_lse) or vLLM's ``attn_logits``
``[batch, num_heads, num_kv_splits, head_dim_v + 1]`` (LSE in the last column).
"""

from __future__ import annotations

import functools

import torch

from jax_decode.launch import DeviceInfo, LaunchConfig, check_cache_dtype_on_device, make_launch_config
from jax_decode.merge import check_merge_args, merge_states
from jax_decode.operands import DecodeOperands, specs
from jax_decode.validation import (
    check_decode_args,
    check_index_values,
    check_num_kv_splits,
    check_write_kv_args,
    write_operands,
)
from torch_bridge.launcher import launch_decode, launch_write


@functools.cache
def _cuda_device_info(index: int) -> DeviceInfo:
    props = torch.cuda.get_device_properties(index)
    if getattr(torch.version, "hip", None):
        return DeviceInfo(vendor="amd", compute_capability=None, num_sms=props.multi_processor_count)
    return DeviceInfo("nvidia", props.major * 10 + props.minor, props.multi_processor_count)


def device_info(device: torch.device) -> DeviceInfo:
    if device.type == "cuda":
        return _cuda_device_info(device.index if device.index is not None else torch.cuda.current_device())
    if device.type == "cpu":
        return DeviceInfo.interpreter()
    raise ValueError(f"tensors must be on a CUDA device or the CPU (interpreter), got {device}")


def _plan_uncached(operand_specs: DecodeOperands, head_dim_v, sm_scale, logit_cap, window_left, num_kv_splits, device):
    """Check the arguments (shapes, dtypes, scalars) and make the launch config."""
    problem = check_decode_args(
        operand_specs, head_dim_v=head_dim_v, sm_scale=sm_scale, logit_cap=logit_cap, window_left=window_left
    )
    return make_launch_config(problem, device_info(device), check_num_kv_splits(num_kv_splits))


_plan_cached = functools.lru_cache(maxsize=4096)(_plan_uncached)


def _plan(ops: DecodeOperands, head_dim_v, sm_scale, logit_cap, window_left, num_kv_splits) -> LaunchConfig:
    """The launch config for these tensors; cached on shapes, dtypes and options.

    ``ops``: torch tensors, v_cache None for MLA.  Checks and config are pure functions
    of (shape, dtype, options, device), so an eager call pays one dict lookup;
    torch.compile traces the uncached function.
    """
    args = (specs(ops), head_dim_v, sm_scale, logit_cap, window_left, num_kv_splits, ops.q.device)
    if torch.compiler.is_compiling():
        return _plan_uncached(*args)
    try:
        return _plan_cached(*args)
    except TypeError as error:
        if "unhashable" not in str(error):
            raise
        return _plan_uncached(*args)  # an unhashable option: let the checks name it


def _split_scratch(scratch: torch.Tensor, config: LaunchConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(mid_o, mid_lse) views of the scratch buffer, in either layout."""
    dv = config.problem.head_dim_v
    if scratch.dim() == 4:  # vLLM's attn_logits: [batch, num_heads, num_kv_splits, head_dim_v + 1]
        return scratch[..., :dv], scratch[..., dv]
    mid_o_size = config.mid_o_shape[0] * config.mid_o_shape[1] * config.mid_o_shape[2] * dv
    return scratch[:mid_o_size].view(config.mid_o_shape), scratch[mid_o_size:].view(config.mid_lse_shape)


@torch.library.custom_op("jax_decode::decode_attention_", mutates_args=("out", "lse", "scratch"))
def _decode_attention_op(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    scratch: torch.Tensor,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    sinks: torch.Tensor | None,
    sm_scale: float,
    logit_cap: float,
    head_dim_v: int,
    v_from_k: bool,
    window_left: int,
    num_kv_splits: int,
) -> None:
    ops = DecodeOperands(q, k_cache, None if v_from_k else v_cache, page_table, seq_lens, k_scale,
                         None if v_from_k else v_scale, sinks)  # fmt: skip
    config = _plan(ops, head_dim_v, sm_scale, logit_cap, window_left, num_kv_splits)
    launch_decode(config, ops, *_split_scratch(scratch, config), out, lse)


def _run_op(config: LaunchConfig, ops: DecodeOperands, out, lse, scratch) -> None:
    """Through the custom op under torch.compile (opaque to it); directly otherwise.

    The op's dispatch costs tens of microseconds per call, and eager callers (CUDA
    graph capture included) do not need it.
    """
    if torch.compiler.is_compiling():
        p = config.problem
        torch.ops.jax_decode.decode_attention_(
            ops.q, ops.k_cache, ops.k_cache if p.v_from_k else ops.v_cache, ops.page_table, ops.seq_lens, out, lse,
            scratch, ops.k_scale, ops.v_scale, ops.sinks, p.sm_scale, p.logit_cap, p.head_dim_v, p.v_from_k,
            p.window_left, config.num_kv_splits,
        )  # fmt: skip
    else:
        launch_decode(config, ops, *_split_scratch(scratch, config), out, lse)


@_decode_attention_op.register_fake
def _(q, k_cache, v_cache, page_table, seq_lens, out, lse, scratch, k_scale, v_scale, sinks, sm_scale, logit_cap,
      head_dim_v, v_from_k, window_left, num_kv_splits):  # fmt: skip
    return None


_SCALARS: dict[tuple, torch.Tensor] = {}


def _float_tensor(name: str, value, like: torch.Tensor) -> torch.Tensor | None:
    """A scale or sinks operand as the kernels read it: float32, at least 1-D.

    A Python number becomes a cached device tensor (made once per value and device,
    so later calls do no host-to-device copy); float16/bfloat16 tensors are cast.
    """
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        key = (float(value), like.device)
        if key not in _SCALARS:
            _SCALARS[key] = torch.tensor([float(value)], dtype=torch.float32, device=like.device)
        return _SCALARS[key]
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, a Python float or None, got {type(value).__name__}")
    if value.dtype in (torch.float16, torch.bfloat16):
        value = value.float()
    return value.reshape(1) if value.dim() == 0 else value


def _check_tensors(names: tuple[str, ...], tensors: tuple) -> None:
    """Same device everywhere; contiguous last dimensions (the kernels' only stride rule)."""
    first = None
    for name, tensor in zip(names, tensors, strict=True):
        if tensor is None:
            continue
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if first is None:
            first = (name, tensor)
            device_info(tensor.device)
        # get_device() (an int: the CUDA index, -1 elsewhere) is much cheaper than .device.
        elif (index := tensor.get_device()) != first[1].get_device() or (
            index < 0 and tensor.device != first[1].device
        ):
            raise ValueError(f"{name} is on {tensor.device} but {first[0]} is on {first[1].device}; move them together")
        if tensor.dim() > 0 and tensor.stride(-1) != 1 and tensor.shape[-1] > 1:
            raise ValueError(
                f"{name} must have a contiguous last dimension (stride 1), got strides {tuple(tensor.stride())}; "
                "pass .contiguous()"
            )


_LSE_SINKS: dict[tuple, torch.Tensor] = {}


def _lse_sink(q: torch.Tensor, config: LaunchConfig) -> torch.Tensor:
    """A reused buffer for the LSE that vLLM's signature does not return.

    Only ever written (by stage 2), never read, so calls may share it; reusing it
    saves an allocation per call.  Under torch.compile a fresh one is traced instead.
    """
    p = config.problem
    if torch.compiler.is_compiling():
        return q.new_empty((p.batch, p.num_heads), dtype=torch.float32)
    key = (q.get_device(), p.batch, p.num_heads)
    sink = _LSE_SINKS.get(key)
    if sink is None:
        sink = _LSE_SINKS[key] = q.new_empty((p.batch, p.num_heads), dtype=torch.float32)
    return sink


def _check_values(page_table: torch.Tensor, seq_lens: torch.Tensor, config: LaunchConfig) -> None:
    """check_inputs=True: the shared run-time rule on host copies of the index tensors."""
    p = config.problem
    check_index_values(
        page_table.cpu().numpy(), seq_lens.cpu().numpy(), num_pages=p.num_pages, page_size=p.page_size,
        window_left=p.window_left,
    )  # fmt: skip


_DECODE_NAMES = ("q", "k_cache", "v_cache", "page_table", "seq_lens", "k_scale", "v_scale", "sinks", "out")
_FWD_NAMES = ("q", "k_buffer", "v_buffer", "req_to_token", "b_seq_len", "k_scale", "v_scale", "o", "attn_logits")


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor | None,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    sm_scale: float | None = None,
    logit_cap: float = 0.0,
    num_kv_splits: int | None = None,
    head_dim_v: int | None = None,
    return_lse: bool = False,
    k_scale: torch.Tensor | float | None = None,
    v_scale: torch.Tensor | float | None = None,
    sinks: torch.Tensor | None = None,
    window_left: int | None = None,
    out: torch.Tensor | None = None,
    check_inputs: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``jax_decode.decode_attention`` for torch tensors: same shapes, semantics and errors.

    ``out``, if given, is written in place (``[batch, num_heads, head_dim_v]``, q's
    dtype and device; strided rows are fine).  Returns ``out`` or ``(out, lse)``.
    ``k_scale``/``v_scale`` (fp8 caches), ``sinks`` and ``window_left`` as in JAX;
    scales and sinks in float32 cost nothing extra (16-bit ones are cast per call).
    ``check_inputs=True`` checks the values of ``page_table`` and ``seq_lens`` first
    and raises ValueError on a bad one (it copies them to the host: eager use only).
    """
    k_scale, v_scale = _float_tensor("k_scale", k_scale, q), _float_tensor("v_scale", v_scale, q)
    sinks = _float_tensor("sinks", sinks, q)
    ops = DecodeOperands(q, k_cache, v_cache, page_table, seq_lens, k_scale, v_scale, sinks)
    _check_tensors(_DECODE_NAMES, (*ops, out))
    config = _plan(ops, head_dim_v, sm_scale, logit_cap, window_left, num_kv_splits)
    if check_inputs:
        _check_values(page_table, seq_lens, config)
    problem = config.problem
    expected = (problem.batch, problem.num_heads, problem.head_dim_v)
    if out is None:
        out = q.new_empty(expected)
    elif tuple(out.shape) != expected or out.dtype != q.dtype:
        raise ValueError(f"out must be {q.dtype} of shape {expected}, got {out.dtype} of shape {tuple(out.shape)}")
    lse = q.new_empty((problem.batch, problem.num_heads), dtype=torch.float32)
    scratch_size = (problem.head_dim_v + 1) * config.mid_lse_shape[0] * config.mid_lse_shape[1] * config.num_kv_splits
    scratch = q.new_empty((scratch_size,), dtype=torch.float32)
    _run_op(config, ops, out, lse, scratch)
    return (out, lse) if return_lse else out


def decode_attention_fwd(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    o: torch.Tensor,
    req_to_token: torch.Tensor,
    b_seq_len: torch.Tensor,
    attn_logits: torch.Tensor,
    num_kv_splits: int,
    sm_scale: float,
    page_size: int = 1,
    logit_cap: float = 0.0,
    *,
    k_scale: torch.Tensor | float | None = None,
    v_scale: torch.Tensor | float | None = None,
    check_inputs: bool = False,
) -> None:
    """Drop-in for vLLM 0.9's ``decode_attention_fwd``: writes ``o`` in place.

    ``k_scale``/``v_scale`` (later vLLM versions pass them) dequantise fp8 buffers.

    ``k_buffer``/``v_buffer`` are ``[num_tokens, num_kv_heads, D]`` (page_size 1) or
    ``[num_pages, page_size, num_kv_heads, D]``; ``v_buffer`` may be a view such as
    ``k_buffer[..., :512]`` (MLA), read without a copy (and, when it is exactly that
    view, through the K tile already loaded).  ``attn_logits`` float32
    ``[batch, num_heads, num_kv_splits, head_dim_v + 1]`` is the scratch.
    """
    if k_buffer.dim() == 3 and v_buffer.dim() == 3:
        if page_size != 1:
            raise ValueError(f"3-D k_buffer [num_tokens, num_kv_heads, D] needs page_size 1, got {page_size}")
        k_buffer, v_buffer = k_buffer.unsqueeze(1), v_buffer.unsqueeze(1)
    if k_buffer.dim() == 4 and k_buffer.shape[1] != page_size:
        raise ValueError(f"k_buffer page_size ({k_buffer.shape[1]}) must equal page_size ({page_size})")
    k_scale, v_scale = _float_tensor("k_scale", k_scale, q), _float_tensor("v_scale", v_scale, q)
    _check_tensors(_FWD_NAMES, (q, k_buffer, v_buffer, req_to_token, b_seq_len, k_scale, v_scale, o, attn_logits))
    v_from_k = (
        v_buffer.data_ptr() == k_buffer.data_ptr()
        and v_buffer.stride() == k_buffer.stride()
        and v_buffer.shape[:-1] == k_buffer.shape[:-1]
        and (v_scale is None or v_scale is k_scale)
    )
    # V is K's latent (MLA): read through K's tile, with K's scale.
    ops = DecodeOperands(q, k_buffer, None if v_from_k else v_buffer, req_to_token, b_seq_len, k_scale,
                         None if v_from_k else v_scale)  # fmt: skip
    config = _plan(ops, v_buffer.shape[-1], sm_scale, logit_cap, None, num_kv_splits)
    problem = config.problem
    expected = (problem.batch, problem.num_heads, num_kv_splits, problem.head_dim_v + 1)
    if tuple(attn_logits.shape) != expected or attn_logits.dtype != torch.float32:
        raise ValueError(
            f"attn_logits must be float32 of shape {expected} [batch, num_heads, num_kv_splits, head_dim_v + 1], "
            f"got {attn_logits.dtype} of shape {tuple(attn_logits.shape)}"
        )
    if tuple(o.shape) != (problem.batch, problem.num_heads, problem.head_dim_v) or o.dtype != q.dtype:
        raise ValueError(f"o must be {q.dtype} of shape {(problem.batch, problem.num_heads, problem.head_dim_v)}, "
                         f"got {o.dtype} of shape {tuple(o.shape)}")  # fmt: skip
    if check_inputs:
        _check_values(req_to_token, b_seq_len, config)
    _run_op(config, ops, o, _lse_sink(q, config), attn_logits)


def merge_attention_states(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``jax_decode.merge_attention_states`` for torch tensors (the same definition)."""
    check_merge_args(out_a, lse_a, out_b, lse_b)
    out, lse = merge_states(torch, lambda x: x.float(), out_a, lse_a, out_b, lse_b)
    return out.to(out_a.dtype), lse.float()


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor | None,
    k_new: torch.Tensor,
    v_new: torch.Tensor | None,
    slot_mapping: torch.Tensor,
    *,
    k_scale: torch.Tensor | float | None = None,
    v_scale: torch.Tensor | float | None = None,
) -> None:
    """``jax_decode.write_kv`` for torch tensors: writes the caches in place, same kernel.

    No host sync and no data-dependent allocation, so it can be captured in a CUDA graph.
    """
    k_scale, v_scale = _float_tensor("k_scale", k_scale, k_new), _float_tensor("v_scale", v_scale, k_new)
    names = ("k_cache", "v_cache", "k_new", "v_new", "slot_mapping", "k_scale", "v_scale")
    _check_tensors(names, (k_cache, v_cache, k_new, v_new, slot_mapping, k_scale, v_scale))

    k, v = write_operands(k_cache, v_cache, k_new, v_new, slot_mapping, k_scale, v_scale)
    for ops, problem in zip((k, v), check_write_kv_args(specs(k), None if v is None else specs(v)), strict=True):
        if ops is not None:
            check_cache_dtype_on_device(problem.cache_dtype, device_info(ops.cache.device))
            launch_write(problem, ops)
