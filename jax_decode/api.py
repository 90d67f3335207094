"""``decode_attention``: paged decode attention for JAX, usable inside ``jax.jit``.

Dimension names::

    batch       rows decoded in this step (one new query token each)
    num_heads   query heads;  num_kv_heads divides it (GQA / MQA; MHA when equal)
    head_dim_qk q and k width;  head_dim_v: v and output width (MLA: 576 and 512)
    num_pages, page_size   the paged cache;  max_pages: page-table width
"""

from __future__ import annotations

import functools
from typing import Literal, NamedTuple

import jax
import jax.custom_batching
import jax.numpy as jnp

from jax_decode import triton_backend
from jax_decode.interpret_backend import decode_attention_interpret
from jax_decode.launch import DeviceInfo, make_launch_config
from jax_decode.merge import check_merge_args, merge_states
from jax_decode.operands import float_operand, scale_operand
from jax_decode.validation import check_decode_args, check_index_values, check_num_kv_splits
from jax_decode.xla_backend import decode_attention_xla

Backend = Literal["auto", "triton", "xla", "interpret"]
BACKENDS = ("auto", "triton", "xla", "interpret")


def decode_attention(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array | None,
    page_table: jax.Array,
    seq_lens: jax.Array,
    *,
    sm_scale: float | None = None,
    logit_cap: float = 0.0,
    num_kv_splits: int | None = None,
    head_dim_v: int | None = None,
    return_lse: bool = False,
    k_scale: jax.Array | float | None = None,
    v_scale: jax.Array | float | None = None,
    sinks: jax.Array | None = None,
    window_left: int | None = None,
    backend: Backend = "auto",
    check_inputs: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Attention of one new query token per row over that row's paged KV cache.

    Args:
      q: ``[batch, num_heads, head_dim_qk]``, float16, bfloat16 or float32.
      k_cache: ``[num_pages, page_size, num_kv_heads, head_dim_qk]``, q's dtype or
        an fp8 dtype (``float8_e4m3fn``, ``float8_e5m2``; dequantised in the kernel).
      v_cache: ``[num_pages, page_size, num_kv_heads, head_dim_v]``, k_cache's dtype; or
        ``None`` with ``head_dim_v`` set, meaning V is ``k_cache[..., :head_dim_v]``
        (MLA's shared latent cache; read without a copy).
      page_table: int32 ``[batch, max_pages]``; row ``b``'s token ``t`` lives in page
        ``page_table[b, t // page_size]``, slot ``t % page_size``.  Entries should be
        in ``[0, num_pages)``; tokens on pages outside it are left out of the softmax.
      seq_lens: int32 ``[batch]``: tokens per row, clamped to ``[0, max_pages * page_size]``.
        A row of length 0 returns zeros (and LSE ``-inf``).
      sm_scale: score scale; defaults to ``1/sqrt(head_dim_qk)``.
      logit_cap: if > 0, scores become ``logit_cap * tanh(score / logit_cap)``.
      num_kv_splits: KV splits of stage 1; ``None`` lets the launch config choose.
      head_dim_v: width of V; needed when ``v_cache`` is None.
      return_lse: also return the natural log-sum-exp of the scaled scores (sinks
        included: it is the log of the softmax's denominator).
      k_scale, v_scale: dequantisation scales, float ``()``/``[1]`` (per tensor) or
        ``[num_kv_heads]`` (per KV head): the cache holds ``K / k_scale``.  Mostly for
        fp8 caches; ``None`` means 1.  With ``v_cache=None`` (MLA) V takes k_scale.
      sinks: float ``[num_heads]`` attention-sink logits (gpt-oss): each adds
        ``exp(sink)`` to its head's softmax denominator, in units of the scaled scores.
      window_left: sliding window: attend only to the last ``window_left + 1`` tokens
        of each row (Mistral / Gemma local layers); pages before the window are not
        read.  ``None`` (or -1): the whole row.
      backend: ``"triton"`` (the kernels via jax_triton; CUDA/ROCm), ``"xla"`` (plain
        JAX, any platform), ``"interpret"`` (the kernels in Triton's interpreter on the
        host; needs torch; for testing), or ``"auto"``: triton on GPU, xla elsewhere,
        chosen when the function is lowered for a platform.
      check_inputs: also check the values of ``page_table`` and ``seq_lens`` when the
        call runs (a host callback; it synchronises, so it is for debugging): a
        ``seq_lens`` entry outside ``[0, max_pages * page_size]`` or a page id outside
        ``[0, num_pages)`` on a row's used pages makes the call fail with a message
        naming the entry.  Off by default, and then it costs nothing; the kernels never
        touch memory out of bounds either way (see the README for what such inputs return).

    Returns:
      ``out [batch, num_heads, head_dim_v]`` in q's dtype, and with ``return_lse``
      also ``lse`` float32 ``[batch, num_heads]``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    problem = check_decode_args(
        q_shape=q.shape,
        q_dtype=q.dtype,
        k_shape=k_cache.shape,
        k_dtype=k_cache.dtype,
        v_shape=None if v_cache is None else v_cache.shape,
        v_dtype=None if v_cache is None else v_cache.dtype,
        page_table_shape=page_table.shape,
        page_table_dtype=page_table.dtype,
        seq_lens_shape=seq_lens.shape,
        seq_lens_dtype=seq_lens.dtype,
        head_dim_v=head_dim_v,
        sm_scale=sm_scale,
        logit_cap=logit_cap,
        k_scale=_spec(k_scale := float_operand(k_scale)),
        v_scale=_spec(v_scale := float_operand(v_scale)),
        sinks=_spec(sinks := float_operand(sinks)),
        window_left=window_left,
    )
    num_kv_splits = check_num_kv_splits(num_kv_splits)
    if check_inputs:
        check = functools.partial(
            check_index_values,
            num_pages=problem.num_pages,
            page_size=problem.page_size,
            window_left=problem.window_left,
        )
        jax.debug.callback(check, page_table, seq_lens)
    args = DecodeArrays(
        q, k_cache, v_cache, page_table, seq_lens,
        scale_operand(k_scale),
        scale_operand(v_scale),
        None if sinks is None else sinks.astype(jnp.float32),
    )  # fmt: skip
    given = tuple(x is not None for x in args)

    def compute(*arrays):
        it = iter(arrays)
        return _dispatch(DecodeArrays(*(next(it) if g else None for g in given)), problem, backend, num_kv_splits)

    def fold_vmapped_axis(axis_size, in_batched, *arrays):
        """jax.vmap rule: a mapped axis of q / page_table / seq_lens joins the batch."""
        it = iter(zip(arrays, in_batched, strict=True))
        full = DecodeArrays(*(next(it) if g else (None, False) for g in given))
        if any(batched for name, (_, batched) in zip(DecodeArrays._fields, full, strict=True) if name not in _ROW_ARGS):
            raise ValueError(
                "jax.vmap of decode_attention maps q, page_table and seq_lens over one shared "
                "cache; k_cache and v_cache must not be mapped, nor k_scale, v_scale or sinks (give them in_axes=None)"
            )

        def mapped(name):
            x, batched = getattr(full, name)
            return x if batched else jnp.broadcast_to(x, (axis_size, *x.shape))

        q, pt, sl = mapped("q"), mapped("page_table"), mapped("seq_lens")
        out, lse = decode_attention(
            q.reshape(-1, *q.shape[2:]), full.k_cache[0], full.v_cache[0],
            pt.reshape(-1, pt.shape[-1]), sl.reshape(-1),
            sm_scale=problem.sm_scale, logit_cap=problem.logit_cap, num_kv_splits=num_kv_splits,
            head_dim_v=problem.head_dim_v, return_lse=True, k_scale=full.k_scale[0], v_scale=full.v_scale[0],
            sinks=full.sinks[0], window_left=problem.window_left, backend=backend,
        )  # fmt: skip
        return (out.reshape(axis_size, -1, *out.shape[1:]), lse.reshape(axis_size, -1, lse.shape[-1])), (True, True)

    # triton_call has no batching rule: under jax.vmap, fold the mapped axis into the
    # batch (one launch for all of it) instead.
    vmappable = jax.custom_batching.custom_vmap(compute)
    vmappable.def_vmap(fold_vmapped_axis)
    out, lse = vmappable(*(x for x in args if x is not None))
    return (out, lse) if return_lse else out


class DecodeArrays(NamedTuple):
    """decode_attention's array operands, as every backend takes them (None: not given)."""

    q: jax.Array
    k_cache: jax.Array
    v_cache: jax.Array | None
    page_table: jax.Array
    seq_lens: jax.Array
    k_scale: jax.Array | None  # float32 [1] or [num_kv_heads]
    v_scale: jax.Array | None
    sinks: jax.Array | None  # float32 [num_heads]


# The operands that have one entry per row (a vmapped axis folds into their batch).
_ROW_ARGS = ("q", "page_table", "seq_lens")


def _spec(x):
    return None if x is None else (x.shape, x.dtype)


def _dispatch(args, problem, backend: str, num_kv_splits: int | None):
    """(out, lse) of the checked arguments on the chosen backend."""
    q = args.q
    if problem.batch == 0:
        out = jnp.zeros((0, problem.num_heads, problem.head_dim_v), q.dtype)
        lse = jnp.zeros((0, problem.num_heads), jnp.float32)
    elif backend == "xla":
        out, lse = decode_attention_xla(*args, problem)
    elif backend == "interpret":
        config = make_launch_config(problem, DeviceInfo.interpreter(), num_kv_splits)
        out, lse = decode_attention_interpret(*args, config)
    else:
        device = triton_backend.target_device()
        usable = device is not None and triton_backend.jax_triton_available()
        if backend == "triton" and not usable:
            raise ValueError(
                "backend='triton' needs jax_triton and a GPU visible to JAX (or a "
                "jax_decode.compile_target(...) to lower for one); use backend='xla' on CPU"
            )
        if usable:
            config = make_launch_config(problem, device, num_kv_splits)

            def on_gpu():
                return triton_backend.decode_attention_triton(*args, config)

            if backend == "triton":
                out, lse = on_gpu()
            else:  # auto: both staged out; lowering keeps the one for its platform
                out, lse = jax.lax.platform_dependent(
                    cuda=on_gpu, rocm=on_gpu, default=lambda: decode_attention_xla(*args, problem)
                )
        else:
            out, lse = decode_attention_xla(*args, problem)
    return out, lse


def merge_attention_states(
    out_a: jax.Array, lse_a: jax.Array, out_b: jax.Array, lse_b: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Merge two partial results (e.g. a shared prefix and each row's suffix) by LSE.

    ``out_*`` ``[..., head_dim_v]`` as returned by ``decode_attention``, ``lse_*``
    float32 ``[...]`` from ``return_lse=True``.  Returns ``(out in out_a's dtype, lse
    float32)``, equal to attention over both parts' keys; exact for an empty part
    (``lse = -inf``).
    """
    check_merge_args(out_a, lse_a, out_b, lse_b)
    out, lse = merge_states(jnp, lambda x: x.astype(jnp.float32), out_a, lse_a, out_b, lse_b)
    return out.astype(out_a.dtype), lse.astype(jnp.float32)
