"""PyTorch frontend: the kernels of ``jax_decode`` on torch tensors, and a torch custom op.

CUDA tensors run the compiled kernels, CPU tensors run them in Triton's interpreter.
Every launch goes through :func:`jax_decode.launch.make_launch_config` and
:func:`torch_bridge.launcher.launch_decode`, with the JAX frontend's argument checks
and operand order, so the same inputs give the same launch and bit-identical results.

Eager calls launch directly (the custom op's dispatch costs tens of microseconds).
Under ``torch.compile`` both entry points are the op ``jax_decode::decode_attention_``,
which writes ``out``, ``lse`` and the float32 ``scratch`` in place and allocates
nothing, so ``fullgraph=True`` sees no graph break and a CUDA graph can capture and
replay it.  ``scratch`` is either flat (mid_o then mid_lse) or vLLM's ``attn_logits``
``[batch, num_heads, num_kv_splits, head_dim_v + 1]`` (LSE in the last column).
"""

from __future__ import annotations

import functools

import torch

from jax_decode.launch import DeviceInfo, LaunchConfig, check_cache_dtype_on_device, make_launch_config
from jax_decode.merge import check_merge_args, merge_states
from jax_decode.operands import DecodeOperands, specs
from jax_decode.validation import (
    check_arrays,
    check_decode_args,
    check_index_values,
    check_num_kv_splits,
    check_scale_value,
    check_write_kv_args,
    dtype_name,
    is_float_scalar,
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


# --------------------------------------------------------------------------- planning


def _plan_uncached(operand_specs: DecodeOperands, head_dim_v, sm_scale, logit_cap, window_left, num_kv_splits, device):
    """Check the arguments (shapes, dtypes, scalars) and make the launch config."""
    problem = check_decode_args(
        operand_specs, head_dim_v=head_dim_v, sm_scale=sm_scale, logit_cap=logit_cap, window_left=window_left
    )
    return make_launch_config(problem, device_info(device), check_num_kv_splits(num_kv_splits))


# typed: True == 1 and 1.0 == 1 as keys, but the checks treat them differently.
_plan_cached = functools.lru_cache(maxsize=4096, typed=True)(_plan_uncached)


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


# --------------------------------------------------------------------------- operands and checks

_SCALARS: dict[tuple, torch.Tensor] = {}


def _float_input(name: str, value, like: torch.Tensor, *, scalar_ok: bool = True) -> torch.Tensor | None:
    """A scale or sinks argument as a tensor: a real scalar (Python or NumPy) becomes a
    float32 ``[1]`` device tensor, made once per value and device (so later calls copy
    nothing to the device); a tensor passes through for the checks to judge."""
    if value is None:
        return None
    if is_float_scalar(name, value, scalar_ok=scalar_ok):
        check_scale_value(name, value)
        key = (float(value), like.device)
        if key not in _SCALARS:
            _SCALARS[key] = torch.tensor([float(value)], dtype=torch.float32, device=like.device)
        return _SCALARS[key]
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, a float or None, got {type(value).__name__}")
    return value


def _kernel_floats(ops: DecodeOperands) -> DecodeOperands:
    """Checked scales and sinks as the kernels read them: float32, 1-D (16-bit ones are
    cast, a copy per call)."""

    def as_kernel_reads(t):
        if t is None:
            return None
        if t.dtype != torch.float32:
            t = t.float()
        return t.reshape(1) if t.dim() == 0 else t

    return ops._replace(
        k_scale=as_kernel_reads(ops.k_scale), v_scale=as_kernel_reads(ops.v_scale), sinks=as_kernel_reads(ops.sinks)
    )


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
        if tensor.dim() > 0 and tensor.stride(-1) != 1 and tensor.shape[-1] > 1 and tensor.numel() > 0:
            raise ValueError(
                f"{name} must have a contiguous last dimension (stride 1), got strides {tuple(tensor.stride())}; "
                "pass .contiguous()"
            )


def _refuse_grad(names: tuple[str, ...], tensors: tuple) -> None:
    """The kernels have no backward: refuse, rather than return an output with no grad_fn."""
    if not torch.is_grad_enabled():
        return
    for name, tensor in zip(names, tensors, strict=True):
        if tensor is not None and tensor.requires_grad:
            raise ValueError(
                f"{name} requires grad, but decode attention has no gradient (it is an inference kernel); "
                f"call it under torch.no_grad() or torch.inference_mode(), or pass {name}.detach()"
            )


@functools.lru_cache(maxsize=1024)
def _elements_overlap(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether two elements of a strided tensor may share an address (e.g. an expanded
    tensor): each dimension, in order of stride, must step past all smaller ones."""
    span = 1
    for stride, size in sorted((st, sz) for st, sz in zip(strides, shape, strict=True) if sz > 1):
        if stride < span:
            return True
        span += stride * (size - 1)
    return False


def _check_writable(name: str, tensor: torch.Tensor) -> None:
    """A tensor the kernels write in place must give every element its own memory."""
    if _elements_overlap(tuple(tensor.shape), tensor.stride()):
        raise ValueError(
            f"{name} has elements that share memory (shape {tuple(tensor.shape)}, strides {tuple(tensor.stride())}), "
            f"so writes to it would overwrite each other; pass a tensor with its own storage (e.g. {name}.contiguous())"
        )


_LSE_SINKS: dict[tuple, torch.Tensor] = {}


def _lse_sink(q: torch.Tensor, config: LaunchConfig) -> torch.Tensor:
    """A reused buffer for the LSE that vLLM's signature does not return.

    Only ever written (by stage 2), never read, so calls may share it; reusing it
    saves an allocation per call.
    """
    p = config.problem
    key = (q.get_device(), p.batch, p.num_heads)
    sink = _LSE_SINKS.get(key)
    if sink is None:
        sink = _LSE_SINKS[key] = q.new_empty((p.batch, p.num_heads), dtype=torch.float32)
    return sink


def _check_values(page_table: torch.Tensor, seq_lens: torch.Tensor, config: LaunchConfig) -> None:
    """check_inputs=True: the shared run-time rule on host copies of the index tensors."""
    if torch.compiler.is_compiling():
        raise ValueError("check_inputs=True copies page tables to the host: call it eagerly, not under torch.compile")
    p = config.problem
    check_index_values(
        page_table.cpu().numpy(), seq_lens.cpu().numpy(), num_pages=p.num_pages, page_size=p.page_size,
        window_left=p.window_left,
    )  # fmt: skip


def _fwd_operands(q, k_buffer, v_buffer, req_to_token, b_seq_len, k_scale, v_scale) -> DecodeOperands:
    """vLLM's buffers as operands; V is K's latent (MLA: read through K's tile, with K's
    scale) when ``v_buffer`` is a view of ``k_buffer``'s first columns."""
    v_from_k = (
        v_buffer.data_ptr() == k_buffer.data_ptr()
        and v_buffer.stride() == k_buffer.stride()
        and v_buffer.shape[:-1] == k_buffer.shape[:-1]
        and (v_scale is None or v_scale is k_scale)
    )
    return DecodeOperands(q, k_buffer, None if v_from_k else v_buffer, req_to_token, b_seq_len, k_scale,
                          None if v_from_k else v_scale)  # fmt: skip


def _check_fwd_buffers(config: LaunchConfig, o: torch.Tensor, attn_logits: torch.Tensor, num_kv_splits: int) -> None:
    p = config.problem
    expected = (p.batch, p.num_heads, num_kv_splits, p.head_dim_v + 1)
    if tuple(attn_logits.shape) != expected or attn_logits.dtype != torch.float32:
        raise ValueError(
            f"attn_logits must be float32 of shape {expected} [batch, num_heads, num_kv_splits, head_dim_v + 1], "
            f"got {attn_logits.dtype} of shape {tuple(attn_logits.shape)}"
        )
    if tuple(o.shape) != (p.batch, p.num_heads, p.head_dim_v) or dtype_name(o.dtype) != p.dtype:
        raise ValueError(f"o must be {p.dtype} of shape {(p.batch, p.num_heads, p.head_dim_v)}, "
                         f"got {o.dtype} of shape {tuple(o.shape)}")  # fmt: skip


# --------------------------------------------------------------------------- the custom op


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
    sm_scale: float | None,
    logit_cap: float,
    head_dim_v: int | None,
    v_from_k: bool | None,
    window_left: int | None,
    num_kv_splits: int | None,
    k_scale_number: float | None,
    v_scale_number: float | None,
) -> None:
    """Both entry points under torch.compile, where every value-dependent step runs here,
    at run time, on concrete values: the checks (the eager call's errors), the plan
    (shapes and options may be symbolic while tracing) and scales given as numbers.

    ``v_from_k`` None: vLLM's buffers, where whether V is K's latent is found from their
    pointers here.  An empty ``scratch``: decode_attention's, allocated here once the
    plan has chosen the splits.
    """
    if k_scale_number is not None:
        k_scale = _float_input("k_scale", k_scale_number, q)
    if v_scale_number is not None:
        v_scale = _float_input("v_scale", v_scale_number, q)
    _check_writable("o" if v_from_k is None else "out", out)
    if v_from_k is None:
        _check_writable("attn_logits", scratch)
        ops = _fwd_operands(q, k_cache, v_cache, page_table, seq_lens, k_scale, v_scale)
        config = _plan(ops, head_dim_v, sm_scale, logit_cap, None, num_kv_splits)
        _check_fwd_buffers(config, out, scratch, num_kv_splits)
    else:
        ops = DecodeOperands(q, k_cache, None if v_from_k else v_cache, page_table, seq_lens, k_scale,
                             None if v_from_k else v_scale, sinks)  # fmt: skip
        _check_tensors(_DECODE_NAMES, (*ops, out))
        config = _plan(ops, head_dim_v, sm_scale, logit_cap, window_left, num_kv_splits)
        _check_out(out, config)
        scratch = _scratch(q, config)
    launch_decode(config, _kernel_floats(ops), *_split_scratch(scratch, config), out, lse)


@_decode_attention_op.register_fake
def _(q, k_cache, v_cache, page_table, seq_lens, out, lse, scratch, k_scale, v_scale, sinks, sm_scale, logit_cap,
      head_dim_v, v_from_k, window_left, num_kv_splits, k_scale_number, v_scale_number):  # fmt: skip
    return None


def _scratch(q: torch.Tensor, config: LaunchConfig) -> torch.Tensor:
    """Stage 1's partial results for ``config``'s splits, as one float32 buffer."""
    p = config.problem
    return q.new_empty(((p.head_dim_v + 1) * p.batch * p.num_heads * config.num_kv_splits,), dtype=torch.float32)


def _check_out(out: torch.Tensor, config: LaunchConfig) -> None:
    p = config.problem
    expected = (p.batch, p.num_heads, p.head_dim_v)
    if tuple(out.shape) != expected or dtype_name(out.dtype) != p.dtype:
        raise ValueError(f"out must be {p.dtype} of shape {expected}, got {dtype_name(out.dtype)} of shape "
                         f"{tuple(out.shape)}")  # fmt: skip
    _check_writable("out", out)


def _traced_number(name: str, value, *, optional: bool = True):
    """A float option while torch.compile traces: its type is checked here, its value by
    the op when it runs (it may be symbolic now)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a Python float{' or None' if optional else ''}, got {type(value).__name__}")
    return value


def _traced_int(name: str, value):
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
    return value


def _traced_scale(name: str, value):
    """(tensor, number) of a scale while torch.compile traces: a number goes to the op,
    which checks it and makes it a tensor when it runs."""
    if value is None or isinstance(value, torch.Tensor):
        return value, None
    return None, _traced_number(name, value, optional=False)


def _decode_attention_traced(q, k_cache, v_cache, page_table, seq_lens, *, sm_scale, logit_cap, num_kv_splits,
                             head_dim_v, return_lse, k_scale, v_scale, sinks, window_left, out,
                             check_inputs):  # fmt: skip
    """decode_attention while torch.compile traces: everything the graph needs (types,
    the outputs' shapes) here, every value-dependent step in the op."""
    if check_inputs:
        _check_values(page_table, seq_lens, None)  # (refuses: it needs the values on the host)
    (k_scale, k_number), (v_scale, v_number) = _traced_scale("k_scale", k_scale), _traced_scale("v_scale", v_scale)
    check_arrays(dict(q=q, k_cache=k_cache, v_cache=v_cache, page_table=page_table, seq_lens=seq_lens, sinks=sinks,
                      out=out), optional=("v_cache", "sinks", "out"), array_type=torch.Tensor)  # fmt: skip
    head_dim_v = _traced_int("head_dim_v", head_dim_v)
    if head_dim_v is None and v_cache is None:
        raise ValueError("v_cache=None needs head_dim_v: V is then k_cache[..., :head_dim_v] (MLA)")
    dv = head_dim_v if head_dim_v is not None else v_cache.shape[-1]
    if out is None:
        out = q.new_empty((q.shape[0], q.shape[1], dv))
    lse = q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32)
    torch.ops.jax_decode.decode_attention_(
        q, k_cache, k_cache if v_cache is None else v_cache, page_table, seq_lens, out, lse,
        q.new_empty((0,), dtype=torch.float32), k_scale, v_scale, sinks, _traced_number("sm_scale", sm_scale),
        _traced_number("logit_cap", logit_cap, optional=False), head_dim_v, v_cache is None,
        _traced_int("window_left", window_left), _traced_int("num_kv_splits", num_kv_splits), k_number, v_number,
    )  # fmt: skip
    return (out, lse) if return_lse else out


# --------------------------------------------------------------------------- entry points

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
    dtype and device; strided rows are fine, rows sharing memory are refused).  Returns
    ``out`` or ``(out, lse)``.  ``k_scale``/``v_scale`` (fp8 caches), ``sinks`` and
    ``window_left`` as in JAX; scales and sinks in float32 cost nothing extra (16-bit
    ones are cast per call).  ``check_inputs=True`` checks the values of ``page_table``
    and ``seq_lens`` first and raises ValueError on a bad one (it copies them to the
    host: eager use only).  Inputs that require grad are refused under grad mode.
    """
    if torch.compiler.is_compiling():
        return _decode_attention_traced(
            q, k_cache, v_cache, page_table, seq_lens, sm_scale=sm_scale, logit_cap=logit_cap,
            num_kv_splits=num_kv_splits, head_dim_v=head_dim_v, return_lse=return_lse, k_scale=k_scale,
            v_scale=v_scale, sinks=sinks, window_left=window_left, out=out, check_inputs=check_inputs,
        )  # fmt: skip
    check_arrays(dict(q=q, k_cache=k_cache, v_cache=v_cache, page_table=page_table, seq_lens=seq_lens),
                 optional=("v_cache",), array_type=torch.Tensor)  # fmt: skip
    ops = DecodeOperands(
        q, k_cache, v_cache, page_table, seq_lens, _float_input("k_scale", k_scale, q),
        _float_input("v_scale", v_scale, q), _float_input("sinks", sinks, q, scalar_ok=False),
    )  # fmt: skip
    _check_tensors(_DECODE_NAMES, (*ops, out))
    _refuse_grad(_DECODE_NAMES, (*ops, out))
    config = _plan(ops, head_dim_v, sm_scale, logit_cap, window_left, num_kv_splits)
    if check_inputs:
        _check_values(page_table, seq_lens, config)
    p = config.problem
    if out is None:
        out = q.new_empty((p.batch, p.num_heads, p.head_dim_v))
    else:
        _check_out(out, config)
    lse = q.new_empty((p.batch, p.num_heads), dtype=torch.float32)
    launch_decode(config, _kernel_floats(ops), *_split_scratch(_scratch(q, config), config), out, lse)
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
    if num_kv_splits is None:  # vLLM's signature: the split count attn_logits was sized for
        raise TypeError("num_kv_splits must be an int (the split count attn_logits holds), got None")
    check_num_kv_splits(num_kv_splits)
    if torch.compiler.is_compiling():  # planned and checked inside the op, at run time
        if check_inputs:
            _check_values(req_to_token, b_seq_len, None)
        (k_scale, k_number), (v_scale, v_number) = _traced_scale("k_scale", k_scale), _traced_scale("v_scale", v_scale)
        tensors = (q, k_buffer, v_buffer, req_to_token, b_seq_len, k_scale, v_scale, o, attn_logits)
        check_arrays(dict(zip(_FWD_NAMES, tensors, strict=True)), optional=("k_scale", "v_scale"),
                     array_type=torch.Tensor)  # fmt: skip
        lse = q.new_empty(tuple(q.shape[:2]), dtype=torch.float32)
        torch.ops.jax_decode.decode_attention_(
            q, k_buffer, v_buffer, req_to_token, b_seq_len, o, lse, attn_logits, k_scale, v_scale, None,
            _traced_number("sm_scale", sm_scale, optional=False), _traced_number("logit_cap", logit_cap,
            optional=False), v_buffer.shape[-1], None, None, num_kv_splits, k_number, v_number,
        )  # fmt: skip
        return
    k_scale, v_scale = _float_input("k_scale", k_scale, q), _float_input("v_scale", v_scale, q)
    tensors = (q, k_buffer, v_buffer, req_to_token, b_seq_len, k_scale, v_scale, o, attn_logits)
    _check_tensors(_FWD_NAMES, tensors)
    _refuse_grad(_FWD_NAMES, tensors)
    _check_writable("o", o)
    _check_writable("attn_logits", attn_logits)
    ops = _fwd_operands(q, k_buffer, v_buffer, req_to_token, b_seq_len, k_scale, v_scale)
    config = _plan(ops, v_buffer.shape[-1], sm_scale, logit_cap, None, num_kv_splits)
    _check_fwd_buffers(config, o, attn_logits, num_kv_splits)
    if check_inputs:
        _check_values(req_to_token, b_seq_len, config)
    launch_decode(config, _kernel_floats(ops), *_split_scratch(attn_logits, config), o, _lse_sink(q, config))


def merge_attention_states(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``jax_decode.merge_attention_states`` for torch tensors (the same definition)."""
    check_arrays(dict(out_a=out_a, lse_a=lse_a, out_b=out_b, lse_b=lse_b), array_type=torch.Tensor)
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
    check_arrays(dict(k_cache=k_cache, v_cache=v_cache, k_new=k_new, v_new=v_new, slot_mapping=slot_mapping),
                 optional=("v_cache", "v_new"), array_type=torch.Tensor)  # fmt: skip
    k_scale, v_scale = _float_input("k_scale", k_scale, k_new), _float_input("v_scale", v_scale, k_new)
    names = ("k_cache", "v_cache", "k_new", "v_new", "slot_mapping", "k_scale", "v_scale")
    tensors = (k_cache, v_cache, k_new, v_new, slot_mapping, k_scale, v_scale)
    _check_tensors(names, tensors)
    _refuse_grad(names, tensors)
    k, v = write_operands(k_cache, v_cache, k_new, v_new, slot_mapping, k_scale, v_scale)
    for ops, problem, name in zip(
        (k, v), check_write_kv_args(specs(k), None if v is None else specs(v)), ("k_cache", "v_cache"), strict=True
    ):
        if ops is not None:
            _check_writable(name, ops.cache)
            check_cache_dtype_on_device(problem.cache_dtype, device_info(ops.cache.device))
            scale = None if ops.scale is None else ops.scale.float().reshape(-1)
            launch_write(problem, ops._replace(scale=scale))
