"""PyTorch frontend: the kernels of ``jax_decode`` on torch tensors, and torch custom ops.

CUDA tensors run the compiled kernels, CPU tensors run them in Triton's interpreter.

One path per entry point.  ``decode_attention`` runs :func:`_run_decode` and the vLLM
drop-in ``decode_attention_fwd`` runs :func:`_run_decode_fwd`, eagerly or -- under
``torch.compile`` -- as the body of their custom ops (``jax_decode::decode_attention_``,
``jax_decode::decode_attention_fwd_``), at run time on concrete tensors.  Both start
from :func:`jax_decode.prepare.prepare_decode`, the JAX frontend's checks and operand
normalisation, and plan through :func:`jax_decode.launch.make_launch_config`, so the
same inputs give the same refusal or the same launch (and bit-identical results)
whichever way they arrive.  While torch.compile traces, the entry points check what
tracing sees (types, devices, strides, grad) with the same functions and allocate the
outputs.

The ops write their outputs in place and allocate only scratch whose size depends on
shapes, so ``fullgraph=True`` sees no graph break and a CUDA graph can capture and
replay them.
"""

from __future__ import annotations

import functools
import numbers
from typing import NamedTuple

import torch

from jax_decode.kernels.gluon_compile import hopper_kernels_usable
from jax_decode.launch import DeviceInfo, LaunchConfig, check_cache_dtype_on_device, make_launch_config
from jax_decode.merge import check_merge_args, merge_states
from jax_decode.operands import DecodeOperands
from jax_decode.prepare import (
    VLLM_NAMES,
    DecodeOptions,
    float_input,
    kernel_operands,
    prepare_decode,
    prepare_write,
)
from jax_decode.validation import (
    check_arrays,
    check_flag,
    check_index_values,
    check_num_kv_splits,
    check_option_types,
    dtype_name,
    is_float_scalar,
)
from torch_bridge.launcher import DecodeRun, launch_decode, launch_schedule, launch_write

TENSOR = "a torch.Tensor"


@functools.cache
def _cuda_device_info(index: int) -> DeviceInfo:
    props = torch.cuda.get_device_properties(index)
    if getattr(torch.version, "hip", None):
        return DeviceInfo(vendor="amd", compute_capability=None, num_sms=props.multi_processor_count)
    cc = props.major * 10 + props.minor
    return DeviceInfo("nvidia", cc, props.multi_processor_count, hopper_kernels=cc == 90 and hopper_kernels_usable())


def _check_device_type(device: torch.device) -> None:
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"tensors must be on a CUDA device or the CPU (interpreter), got {device}")


def device_info(device: torch.device) -> DeviceInfo:
    _check_device_type(device)
    if device.type == "cuda":
        return _cuda_device_info(device.index if device.index is not None else torch.cuda.current_device())
    return DeviceInfo.interpreter()


# --------------------------------------------------------------------------- torch's frontend for jax_decode.prepare

_SCALARS: dict[tuple, torch.Tensor] = {}


@functools.lru_cache(maxsize=1024)
def _elements_overlap(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether two elements of a strided tensor may share an address (e.g. an expanded
    tensor): each dimension, in order of stride, must step past all smaller ones.  A
    tensor with no elements has none to share."""
    if 0 in shape:
        return False
    span = 1
    for stride, size in sorted((st, sz) for st, sz in zip(strides, shape, strict=True) if sz > 1):
        if stride < span:
            return True
        span += stride * (size - 1)
    return False


class _TorchFrontend:
    """:class:`jax_decode.prepare.Frontend` for torch tensors."""

    array_type = torch.Tensor
    array_kind = TENSOR

    @staticmethod
    def scalar(value: float, like: torch.Tensor) -> torch.Tensor:
        """A float32 ``[1]`` tensor on ``like``'s device, made once per value and device
        (so later calls copy nothing to the device)."""
        key = (value, like.device)
        tensor = _SCALARS.get(key)
        if tensor is None:
            tensor = _SCALARS[key] = torch.tensor([value], dtype=torch.float32, device=like.device)
        return tensor

    @staticmethod
    def float32(x: torch.Tensor) -> torch.Tensor:
        """As the kernels read scales and sinks: float32 (16-bit ones are cast, a copy per
        call), 1-D."""
        if x.dtype != torch.float32:
            x = x.float()
        return x if x.dim() == 1 else x.reshape(-1)

    @staticmethod
    def check(named: dict[str, torch.Tensor]) -> None:
        """One device (CUDA or CPU); contiguous last dimensions (the kernels' only stride
        rule); no input that requires grad under grad mode (the kernels have no backward)."""
        first_name, first = None, None
        grad = torch.is_grad_enabled()
        for name, tensor in named.items():
            if first is None:
                first_name, first = name, tensor
                # The type only: device_info would query the device (and Triton), which
                # torch.compile must not trace.
                _check_device_type(tensor.device)
            # get_device() (an int: the CUDA index, -1 elsewhere) is much cheaper than .device.
            elif (index := tensor.get_device()) != first.get_device() or (index < 0 and tensor.device != first.device):
                raise ValueError(
                    f"{name} is on {tensor.device} but {first_name} is on {first.device}; move them together"
                )
            if tensor.dim() > 0 and tensor.stride(-1) != 1 and tensor.shape[-1] > 1 and tensor.numel() > 0:
                raise ValueError(
                    f"{name} must have a contiguous last dimension (stride 1), got strides {tuple(tensor.stride())}; "
                    "pass .contiguous()"
                )
            # (Not while torch.compile traces, which cannot; the op's body checks it when it runs.)
            if not torch.compiler.is_compiling() and tensor.is_neg():
                raise ValueError(
                    f"{name} is a negative view (torch's lazy negation, e.g. the .imag of a conjugate), which the "
                    f"kernels would read unnegated; pass {name}.resolve_neg()"
                )
            if grad and tensor.requires_grad:
                raise ValueError(
                    f"{name} requires grad, but these kernels have no gradient (they are for inference); "
                    f"call it under torch.no_grad() or torch.inference_mode(), or pass {name}.detach()"
                )


TORCH = _TorchFrontend()


def _check_writable(name: str, tensor: torch.Tensor) -> None:
    """A tensor the kernels write in place must give every element its own memory."""
    if _elements_overlap(tuple(tensor.shape), tensor.stride()):
        raise ValueError(
            f"{name} has elements that share memory (shape {tuple(tensor.shape)}, strides {tuple(tensor.stride())}), "
            f"so writes to it would overwrite each other; pass a tensor with its own storage (e.g. {name}.contiguous())"
        )


@functools.lru_cache(maxsize=4096, typed=True)
def _launch_config(problem, device: DeviceInfo, num_kv_splits: int | None) -> LaunchConfig:
    return make_launch_config(problem, device, num_kv_splits)


def _check_values(page_table: torch.Tensor, seq_lens: torch.Tensor, config: LaunchConfig) -> None:
    """check_inputs=True: the shared run-time rule on host copies of the index tensors
    (always eagerly: under torch.compile the entry points run it through _checked_eagerly)."""
    p = config.problem
    check_index_values(
        page_table.cpu().numpy(), seq_lens.cpu().numpy(), num_pages=p.num_pages, page_size=p.page_size,
        window_left=p.window_left, q_len=p.q_len,
    )  # fmt: skip


def _check_output(name: str, tensor: torch.Tensor, shape: tuple[int, ...], dtype: str, layout: str) -> None:
    if tuple(tensor.shape) != shape or dtype_name(tensor.dtype) != dtype:
        raise ValueError(
            f"{name} must be {dtype} of shape {shape}, got {dtype_name(tensor.dtype)} of shape {tuple(tensor.shape)} "
            f"({name} is {layout})"
        )
    _check_writable(name, tensor)


_LSE_SINKS: dict[tuple, torch.Tensor] = {}
MAX_LSE_SINKS = 256


def _lse_sink(q: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """A reused float32 buffer for an LSE the caller does not take (vLLM's signature
    does not return it; decode_attention without ``return_lse``).

    Only ever written (by the last kernel), never read, so calls may share it; reusing
    it saves an allocation per call.
    """
    key = (q.get_device(), shape)
    sink = _LSE_SINKS.get(key)
    if sink is None:
        sink = q.new_empty(shape, dtype=torch.float32)
        if len(_LSE_SINKS) < MAX_LSE_SINKS:  # beyond that, one per call (as many shapes are rare)
            _LSE_SINKS[key] = sink
    return sink


# --------------------------------------------------------------------------- the two call paths


# --- The per-call cost.  Every check and the plan are pure functions of what a call's
# arguments are (each tensor's type, shape, strides, dtype, device and requires_grad;
# each number's type and value; the options; grad mode), never of the tensors' values.
# So a call whose arguments are, in all of that, those of a call the full path already
# accepted reuses that call's launch config: the same checks would pass and the same
# plan come out.  Anything else (a tensor subclass, another type, check_inputs) takes
# the full path.


class _Accepted(NamedTuple):
    """What a call accepted by the full path leaves for calls like it: its launch config
    and, once it has launched, the launcher of its config, device and strides."""

    config: LaunchConfig
    run: DecodeRun | None


_ACCEPTED: dict[tuple, _Accepted] = {}
MAX_ACCEPTED = 4096


def _call_key(*args) -> tuple | None:
    """What the checks and the plan read of ``args``; None if an argument is not a plain
    tensor, number or None (the full path judges it)."""
    key = [torch.is_grad_enabled()]
    for x in args:
        kind = type(x)
        if kind is torch.Tensor:
            key.append((x.shape, x.stride(), x.dtype, x.device, x.requires_grad, x.is_neg()))
        elif x is None or kind in (int, float):
            key.append((kind, x))
        else:
            return None
    return tuple(key)


def _scale_arrays(q, k_scale, v_scale) -> tuple:
    """An accepted call's scales as arrays (a number becomes its cached tensor)."""
    return float_input("k_scale", k_scale, TORCH, q), float_input("v_scale", v_scale, TORCH, q)


def _accept(key: tuple | None, config: LaunchConfig, run: DecodeRun | None) -> None:
    if key is not None:
        if len(_ACCEPTED) >= MAX_ACCEPTED:
            del _ACCEPTED[next(iter(_ACCEPTED))]  # the oldest
        _ACCEPTED[key] = _Accepted(config, run)


def _launch(key, accepted: _Accepted | None, config: LaunchConfig, ops: DecodeOperands, mid_o, mid_lse, out, lse,
            out_given: bool, schedule: torch.Tensor | None = None):  # fmt: skip
    """Launch through the accepted call's launcher, or find one and accept the call."""
    if accepted is not None and accepted.run is not None:
        accepted.run(ops, mid_o, mid_lse, out, lse, out_given, schedule)
    else:
        _accept(key, config, launch_decode(config, ops, mid_o, mid_lse, out, lse, out_given, schedule))


class DecodeSchedule(NamedTuple):
    """The device-side schedule of one set of lengths, made once by :func:`decode_schedule`
    and taken by every ``decode_attention`` call it was made for (``schedule=``)."""

    config: LaunchConfig  # the plan of the calls it serves
    tensor: torch.Tensor | None  # int32, on seq_lens' device; None where the plan has no schedule
    seq_lens: torch.Tensor  # the lengths it was computed from ...
    version: int | None  # ... and their torch version counter then (None: an inference tensor has none)


def _version(seq_lens: torch.Tensor) -> int | None:
    """seq_lens' version counter (torch bumps it on in-place writes through torch), or
    None for an inference tensor, whose writes torch does not count."""
    return None if seq_lens.is_inference() else seq_lens._version


def _check_schedule_type(schedule) -> None:
    if type(schedule) is not DecodeSchedule:
        raise TypeError(f"schedule must be what torch_bridge.decode_schedule returns, got {type(schedule).__name__}")


def _check_schedule(schedule, config: LaunchConfig, seq_lens: torch.Tensor) -> torch.Tensor | None:
    """A ``schedule=`` argument's tensor, if it was made for this call's plan and lengths."""
    _check_schedule_type(schedule)
    if schedule.config is not config and schedule.config != config:
        raise ValueError(
            "schedule was made for another plan: give decode_schedule the shapes, dtypes and options of the "
            "decode_attention calls it serves"
        )
    if schedule.seq_lens is not seq_lens or _version(seq_lens) != schedule.version:
        raise ValueError(
            "schedule was made from other lengths: pass the seq_lens tensor it was made from, unchanged since "
            "(after seq_lens changes, call decode_schedule again)"
        )
    return schedule.tensor


def _plan_call(q, k_cache, v_cache, page_table, seq_lens, k_scale, v_scale, sinks, options: DecodeOptions, out, lse,
               check_inputs: bool):  # fmt: skip
    """Check a decode_attention call and plan it: (its accepted-call key, what a call like
    it left, the launch config, the kernel operands)."""
    key = None if check_inputs else _call_key(q, k_cache, v_cache, page_table, seq_lens, k_scale, v_scale, sinks, out,
                                              lse, *options)  # fmt: skip
    accepted = _ACCEPTED.get(key) if key is not None else None
    if accepted is None:
        given = DecodeOperands(q, k_cache, v_cache, page_table, seq_lens, k_scale, v_scale, sinks)
        problem, ops = prepare_decode(given, options, TORCH)
        config = _launch_config(problem, device_info(q.device), options.num_kv_splits)
        if check_inputs:
            _check_values(page_table, seq_lens, config)
        if out is not None:
            check_arrays(dict(out=out), array_type=torch.Tensor, array_kind=TENSOR)
            TORCH.check(dict(q=q, out=out))
            _check_output("out", out, problem.out_shape, problem.dtype, "[batch, (q_len,) num_heads, head_dim_v], as q")
    else:  # arguments like those of a call that passed (see _call_key)
        config = accepted.config
        given = DecodeOperands(q, k_cache, v_cache, page_table, seq_lens, *_scale_arrays(q, k_scale, v_scale), sinks)
        ops = kernel_operands(given, config.problem, TORCH)
    return key, accepted, config, ops


def _run_decode(q, k_cache, v_cache, page_table, seq_lens, k_scale, v_scale, sinks, options: DecodeOptions, out,
                lse, return_lse: bool, check_inputs: bool,
                schedule=None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """decode_attention, eager or in its op: check, plan, launch; ``out``/``lse`` are
    allocated when None (``lse`` in a shared write-only buffer unless ``return_lse``)."""
    key, accepted, config, ops = _plan_call(q, k_cache, v_cache, page_table, seq_lens, k_scale, v_scale, sinks, options,
                                            out, lse, check_inputs)  # fmt: skip
    schedule_tensor = None if schedule is None else _check_schedule(schedule, config, seq_lens)
    p = config.problem
    out_given = out is not None
    if out is None:
        out = q.new_empty(p.out_shape)
    if lse is None:
        lse = q.new_empty(p.lse_shape, dtype=torch.float32) if return_lse else _lse_sink(q, p.lse_shape)
    _launch(key, accepted, config, ops, None, None, out, lse, out_given, schedule_tensor)
    return out, lse


def _run_decode_fwd(q, k_buffer, v_buffer, o, req_to_token, b_seq_len, attn_logits, num_kv_splits, sm_scale,
                    page_size, logit_cap, k_scale, v_scale, check_inputs: bool) -> None:  # fmt: skip
    """vLLM's decode_attention_fwd, eager or in its op: check, plan, launch into ``o``."""
    args = (q, k_buffer, v_buffer, o, req_to_token, b_seq_len, attn_logits, num_kv_splits, sm_scale, page_size,
            logit_cap, k_scale, v_scale)  # fmt: skip
    key = None if check_inputs else _call_key(*args)
    if key is not None:  # (both buffers are tensors) whether V is K's latent depends on where v_buffer points
        key += (_v_is_k(k_buffer, v_buffer, k_scale, v_scale),)
    accepted = _ACCEPTED.get(key) if key is not None else None
    if accepted is None:
        config, ops = _prepare_fwd(*args)
        if check_inputs:
            _check_values(req_to_token, b_seq_len, config)
    else:  # arguments like those of a call that passed (see _call_key)
        config = accepted.config
        given = _fwd_operands(q, k_buffer, v_buffer, req_to_token, b_seq_len, *_scale_arrays(q, k_scale, v_scale),
                              config.problem.v_from_k)  # fmt: skip
        ops = kernel_operands(given, config.problem, TORCH)
    # Stage 1's partial outputs are attn_logits[..., :dv] and its LSEs attn_logits[..., dv].
    # The kernels address the former by its base and strides alone, which are
    # attn_logits' own: it is passed whole, saving a view per call.
    lse = _lse_sink(q, config.problem.lse_shape)
    _launch(key, accepted, config, ops, attn_logits, attn_logits.select(-1, config.problem.head_dim_v), o, lse, True)


def _prepare_fwd(q, k_buffer, v_buffer, o, req_to_token, b_seq_len, attn_logits, num_kv_splits, sm_scale, page_size,
                 logit_cap, k_scale, v_scale) -> tuple[LaunchConfig, DecodeOperands]:  # fmt: skip
    """vLLM's arguments checked and planned; its buffers as decode_attention's operands."""
    if num_kv_splits is None:  # vLLM's signature: the split count attn_logits was sized for
        raise TypeError("num_kv_splits must be an int (the split count attn_logits holds), got None")
    check_num_kv_splits(num_kv_splits, optional=False)
    if isinstance(page_size, bool) or not isinstance(page_size, numbers.Integral):
        raise TypeError(f"page_size must be an int, got {type(page_size).__name__}")
    check_arrays(dict(q=q, k_buffer=k_buffer, v_buffer=v_buffer, o=o, req_to_token=req_to_token, b_seq_len=b_seq_len,
                      attn_logits=attn_logits), array_type=torch.Tensor, array_kind=TENSOR)  # fmt: skip
    if q.dim() == 4:  # vLLM's signature: one query token per row
        raise ValueError(f"q must be 3-D [batch, num_heads, head_dim] (one token per row), got shape {tuple(q.shape)}")
    if k_buffer.dim() == 3 and v_buffer.dim() == 3 and page_size != 1:
        raise ValueError(f"3-D k_buffer [num_tokens, num_kv_heads, D] needs page_size 1, got {page_size}")
    if k_buffer.dim() == 4 and k_buffer.shape[1] != page_size:
        raise ValueError(f"k_buffer page_size ({k_buffer.shape[1]}) must equal page_size ({page_size})")
    v_from_k = _v_is_k(k_buffer, v_buffer, k_scale, v_scale)
    given = _fwd_operands(q, k_buffer, v_buffer, req_to_token, b_seq_len, k_scale, v_scale, v_from_k)
    options = DecodeOptions(v_buffer.shape[-1] if v_buffer.dim() else None, sm_scale, logit_cap, None, num_kv_splits)
    problem, ops = prepare_decode(given, options, TORCH, VLLM_NAMES)
    config = _launch_config(problem, device_info(q.device), num_kv_splits)
    p = config.problem
    TORCH.check(dict(q=q, o=o, attn_logits=attn_logits))
    _check_output("attn_logits", attn_logits, (p.batch, p.num_heads, num_kv_splits, p.head_dim_v + 1), "float32",
                  "[batch, num_heads, num_kv_splits, head_dim_v + 1]")  # fmt: skip
    _check_output("o", o, (p.batch, p.num_heads, p.head_dim_v), p.dtype, "[batch, num_heads, head_dim_v]")
    return config, ops


def _v_is_k(k_buffer, v_buffer, k_scale, v_scale) -> bool:
    """Whether V is K's latent (MLA: read through K's tile, with K's scale): v_buffer is
    a view of k_buffer's first columns."""
    return (
        v_buffer.data_ptr() == k_buffer.data_ptr()
        and v_buffer.stride() == k_buffer.stride()
        and v_buffer.shape[:-1] == k_buffer.shape[:-1]
        and (v_scale is None or v_scale is k_scale)
    )


def _fwd_operands(q, k_buffer, v_buffer, req_to_token, b_seq_len, k_scale, v_scale, v_from_k) -> DecodeOperands:
    """vLLM's buffers as decode_attention's operands (3-D buffers: pages of one token)."""
    if k_buffer.dim() == 3 and v_buffer.dim() == 3:
        k_buffer, v_buffer = k_buffer.unsqueeze(1), v_buffer.unsqueeze(1)
    return DecodeOperands(q, k_buffer, None if v_from_k else v_buffer, req_to_token, b_seq_len, k_scale,
                          None if v_from_k else v_scale)  # fmt: skip


# --------------------------------------------------------------------------- the custom ops (torch.compile)


def _scale(tensor: torch.Tensor | None, number: float | None):
    """A scale as the op received it: a tensor, or a number (which the schema passes apart)."""
    return tensor if number is None else number


@torch.library.custom_op("jax_decode::decode_attention_", mutates_args=("out", "lse"))
def _decode_attention_op(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor | None,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    sinks: torch.Tensor | None,
    sm_scale: float | None,
    logit_cap: float,
    head_dim_v: int | None,
    window_left: int | None,
    num_kv_splits: int | None,
    k_scale_number: float | None,
    v_scale_number: float | None,
) -> None:
    """decode_attention under torch.compile: :func:`_run_decode` at run time, on concrete
    values (shapes and options may be symbolic while tracing)."""
    options = DecodeOptions(head_dim_v, sm_scale, logit_cap, window_left, num_kv_splits)
    k_scale, v_scale = _scale(k_scale, k_scale_number), _scale(v_scale, v_scale_number)
    _run_decode(q, k_cache, v_cache, page_table, seq_lens, k_scale, v_scale, sinks, options, out, lse,
                return_lse=True, check_inputs=False)  # fmt: skip


@_decode_attention_op.register_fake
def _(*args):
    return None


@torch.library.custom_op("jax_decode::decode_attention_fwd_", mutates_args=("o", "attn_logits"))
def _decode_attention_fwd_op(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    o: torch.Tensor,
    req_to_token: torch.Tensor,
    b_seq_len: torch.Tensor,
    attn_logits: torch.Tensor,
    num_kv_splits: int,
    sm_scale: float | None,
    page_size: int,
    logit_cap: float,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    k_scale_number: float | None,
    v_scale_number: float | None,
) -> None:
    """decode_attention_fwd under torch.compile: :func:`_run_decode_fwd` at run time."""
    _run_decode_fwd(q, k_buffer, v_buffer, o, req_to_token, b_seq_len, attn_logits, num_kv_splits, sm_scale, page_size,
                    logit_cap, _scale(k_scale, k_scale_number), _scale(v_scale, v_scale_number),
                    check_inputs=False)  # fmt: skip


@_decode_attention_fwd_op.register_fake
def _(*args):
    return None


def _traced_scale(name: str, value) -> tuple[torch.Tensor | None, float | None]:
    """(tensor, number) of a scale while torch.compile traces: the schema takes a tensor
    or a number apart; the op checks either when it runs."""
    if value is None or isinstance(value, torch.Tensor):
        return value, None
    if is_float_scalar(name, value, scalar_ok=True):
        return None, value
    raise TypeError(f"{name} must be {TENSOR}, a float or None, got {type(value).__name__}")


_EAGER_CHECK = (
    "check_inputs=True copies page tables to the host: it runs eagerly, a graph break under torch.compile, which "
    "fullgraph=True refuses; call it eagerly"
)


def _checked_eagerly(run, *args) -> None:
    """``run(*args)`` (an entry point's eager path with check_inputs=True) outside the
    graph: the check needs the index values on the host."""
    return run(*args)


def _eager_path(run, compiling: bool):
    """An entry point's eager path ``run``: itself, or while torch.compile traces (a
    check_inputs=True call) the same run outside the graph."""
    return functools.partial(_checked_eagerly, run) if compiling else run


try:  # (the reason is shown where fullgraph=True refuses the break; torch before 2.8 takes none)
    _checked_eagerly = torch.compiler.disable(_checked_eagerly, reason=_EAGER_CHECK)
except TypeError:
    _checked_eagerly = torch.compiler.disable(_checked_eagerly)


def _traced_tensors(named: dict) -> None:
    """While tracing, the checks of the tensors' static properties: devices, strides and
    grad (the op's body never sees grad: autograd has stripped it by then), with the
    eager call's messages.  (An output whose elements share memory is refused by
    torch's functionalization before the op runs.)"""
    TORCH.check({name: t for name, t in named.items() if t is not None})


# --------------------------------------------------------------------------- entry points


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
    schedule: DecodeSchedule | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``jax_decode.decode_attention`` for torch tensors: same shapes, semantics and errors.

    ``out``, if given, is written in place (``[batch, num_heads, head_dim_v]``, q's
    dtype and device; strided rows are fine, rows sharing memory are refused).  Returns
    ``out`` or ``(out, lse)``.  ``k_scale``/``v_scale`` (fp8 caches), ``sinks`` and
    ``window_left`` as in JAX; scales and sinks in float32 cost nothing extra (16-bit
    ones are cast per call).  ``check_inputs=True`` checks the values of ``page_table``
    and ``seq_lens`` first and raises ValueError on a bad one (it copies them to the
    host: eager use only).  Inputs that require grad are refused under grad mode.

    ``schedule``: what :func:`decode_schedule` returned for the same arguments and this
    ``seq_lens`` tensor, unchanged since: the call then takes the device-side schedule
    from it instead of computing its own (a decode step's layers share one).  Under
    torch.compile the call does not take it and computes its own (the same result).
    """
    check_flag("return_lse", return_lse)
    check_flag("check_inputs", check_inputs)
    options = DecodeOptions(head_dim_v, sm_scale, logit_cap, window_left, num_kv_splits)
    compiling = torch.compiler.is_compiling()
    if not compiling or check_inputs:
        run = _eager_path(_run_decode, compiling)
        out, lse = run(q, k_cache, v_cache, page_table, seq_lens, k_scale, v_scale, sinks, options, out, None,
                       return_lse, check_inputs, schedule)  # fmt: skip
        return (out, lse) if return_lse else out
    # Tracing: what the op's schema needs; the op runs _run_decode when the graph runs
    # (computing its own schedule: a schedule= is not taken here, see the docstring, but
    # one of another type is refused as eagerly).
    if schedule is not None:
        _check_schedule_type(schedule)
    arrays = dict(q=q, k_cache=k_cache, v_cache=v_cache, page_table=page_table, seq_lens=seq_lens, out=out)
    check_arrays(arrays, optional=("v_cache", "out"), array_type=torch.Tensor, array_kind=TENSOR)
    check_option_types(**options._asdict())
    (k_tensor, k_number), (v_tensor, v_number) = _traced_scale("k_scale", k_scale), _traced_scale("v_scale", v_scale)
    sinks = float_input("sinks", sinks, TORCH, q, scalar_ok=False)
    _traced_tensors(dict(arrays, k_scale=k_tensor, v_scale=v_tensor, sinks=sinks))
    rows = tuple(q.shape[:-1]) if q.dim() in (3, 4) else (0,)  # a wrong rank is refused by the op
    if out is None:
        dv = head_dim_v if head_dim_v is not None else v_cache.shape[-1] if v_cache is not None else 0
        out = q.new_empty((*rows, dv) if q.dim() in (3, 4) else (0,))
    lse = q.new_empty(rows, dtype=torch.float32)
    torch.ops.jax_decode.decode_attention_(
        q, k_cache, v_cache, page_table, seq_lens, out, lse, k_tensor, v_tensor, sinks, sm_scale, logit_cap,
        head_dim_v, window_left, num_kv_splits, k_number, v_number,
    )  # fmt: skip
    return (out, lse) if return_lse else out


@torch.compiler.disable  # (a Python object holding tensors: made eagerly, a graph break under torch.compile)
def decode_schedule(
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
    k_scale: torch.Tensor | float | None = None,
    v_scale: torch.Tensor | float | None = None,
    sinks: torch.Tensor | None = None,
    window_left: int | None = None,
    check_inputs: bool = False,
) -> DecodeSchedule:
    """The device-side schedule of ``seq_lens`` for :func:`decode_attention` calls with
    these arguments (their shapes, dtypes and options), computed once -- per decode
    step, say -- and passed to each of them as ``schedule=``, FlashInfer's plan / run
    split.  Where the launch config splits the batch's work on the device (MLA on
    Hopper, batches of several rows) every call otherwise launches the schedule kernel
    itself; elsewhere the schedule holds no tensor and a call taking it runs as without.

    A call refuses the schedule (ValueError) if its plan differs (the shapes, dtypes
    and options that decide the launch; the values of scales and sinks do not), or if
    ``seq_lens`` is another tensor or one torch counted a write to since (an in-place
    operation on it or on a view of it).  Torch counts no writes through ``.data``,
    ``.numpy()``, DLPack or storage aliases, raw pointers or other frameworks, nor any
    to an inference tensor (it keeps no version for those): after such a write, make a
    new schedule.  Under a CUDA graph capture the schedule kernel is captured with the
    calls and recomputed at each replay.  Under torch.compile it runs eagerly (a graph
    break, which ``fullgraph=True`` refuses).
    """
    check_flag("check_inputs", check_inputs)
    options = DecodeOptions(head_dim_v, sm_scale, logit_cap, window_left, num_kv_splits)
    _, _, config, ops = _plan_call(q, k_cache, v_cache, page_table, seq_lens, k_scale, v_scale, sinks, options, None,
                                   None, check_inputs)  # fmt: skip
    tensor = launch_schedule(config, ops) if config.schedule_programs else None
    return DecodeSchedule(config, tensor, seq_lens, _version(seq_lens))


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
    check_flag("check_inputs", check_inputs)
    compiling = torch.compiler.is_compiling()
    if not compiling or check_inputs:
        run = _eager_path(_run_decode_fwd, compiling)
        run(q, k_buffer, v_buffer, o, req_to_token, b_seq_len, attn_logits, num_kv_splits, sm_scale, page_size,
            logit_cap, k_scale, v_scale, check_inputs)  # fmt: skip
        return
    # Tracing: what the op's schema needs; the op runs _run_decode_fwd when the graph runs.
    if num_kv_splits is None:
        raise TypeError("num_kv_splits must be an int (the split count attn_logits holds), got None")
    check_arrays(dict(q=q, k_buffer=k_buffer, v_buffer=v_buffer, o=o, req_to_token=req_to_token, b_seq_len=b_seq_len,
                      attn_logits=attn_logits), array_type=torch.Tensor, array_kind=TENSOR)  # fmt: skip
    check_option_types(sm_scale=sm_scale, logit_cap=logit_cap, head_dim_v=None, window_left=None,
                       num_kv_splits=num_kv_splits)  # fmt: skip
    if isinstance(page_size, bool) or not isinstance(page_size, numbers.Integral):
        raise TypeError(f"page_size must be an int, got {type(page_size).__name__}")
    (k_tensor, k_number), (v_tensor, v_number) = _traced_scale("k_scale", k_scale), _traced_scale("v_scale", v_scale)
    _traced_tensors(dict(q=q, k_buffer=k_buffer, v_buffer=v_buffer, req_to_token=req_to_token, b_seq_len=b_seq_len,
                         k_scale=k_tensor, v_scale=v_tensor, o=o, attn_logits=attn_logits))  # fmt: skip
    torch.ops.jax_decode.decode_attention_fwd_(
        q, k_buffer, v_buffer, o, req_to_token, b_seq_len, attn_logits, num_kv_splits, sm_scale, page_size, logit_cap,
        k_tensor, v_tensor, k_number, v_number,
    )  # fmt: skip


def merge_attention_states(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``jax_decode.merge_attention_states`` for torch tensors (the same definition)."""
    check_arrays(dict(out_a=out_a, lse_a=lse_a, out_b=out_b, lse_b=lse_b), array_type=torch.Tensor, array_kind=TENSOR)
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

    No host sync and no data-dependent allocation, so it can be captured in a CUDA graph;
    under ``torch.compile`` it is the custom op ``jax_decode::write_kv_``.
    """
    if not torch.compiler.is_compiling():
        _run_write(k_cache, v_cache, k_new, v_new, slot_mapping, k_scale, v_scale)
        return
    # Tracing: what the op's schema needs; the op runs _run_write when the graph runs.
    arrays = dict(k_cache=k_cache, v_cache=v_cache, k_new=k_new, v_new=v_new, slot_mapping=slot_mapping)
    check_arrays(arrays, optional=("v_cache", "v_new"), array_type=torch.Tensor, array_kind=TENSOR)
    (k_tensor, k_number), (v_tensor, v_number) = _traced_scale("k_scale", k_scale), _traced_scale("v_scale", v_scale)
    _traced_tensors(dict(arrays, k_scale=k_tensor, v_scale=v_tensor))
    torch.ops.jax_decode.write_kv_(k_cache, v_cache, k_new, v_new, slot_mapping, k_tensor, v_tensor, k_number, v_number)


def _run_write(k_cache, v_cache, k_new, v_new, slot_mapping, k_scale, v_scale) -> None:
    """write_kv, eager or in its op: check, then launch per cache."""
    k, v = prepare_write(k_cache, v_cache, k_new, v_new, slot_mapping, k_scale, v_scale, TORCH)
    for (ops, problem), name in ((k, "k_cache"), (v, "v_cache")) if v is not None else ((k, "k_cache"),):
        _check_writable(name, ops.cache)
        check_cache_dtype_on_device(problem.cache_dtype, device_info(ops.cache.device))
        launch_write(problem, ops)


@torch.library.custom_op("jax_decode::write_kv_", mutates_args=("k_cache", "v_cache"))
def _write_kv_op(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor | None,
    k_new: torch.Tensor,
    v_new: torch.Tensor | None,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    k_scale_number: float | None,
    v_scale_number: float | None,
) -> None:
    """write_kv under torch.compile: :func:`_run_write` at run time, on concrete values."""
    _run_write(k_cache, v_cache, k_new, v_new, slot_mapping, _scale(k_scale, k_scale_number),
               _scale(v_scale, v_scale_number))  # fmt: skip


@_write_kv_op.register_fake
def _(*args):
    return None
