"""``decode_attention``: paged decode attention for JAX, usable inside ``jax.jit``.

Dimension names::

    batch       rows decoded in this step (one new query token each)
    num_heads   query heads;  num_kv_heads divides it (GQA / MQA; MHA when equal)
    head_dim_qk q and k width;  head_dim_v: v and output width (MLA: 576 and 512)
    num_pages, page_size   the paged cache;  max_pages: page-table width
"""

from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.custom_batching
import jax.numpy as jnp

from jax_decode import triton_backend
from jax_decode.interpret_backend import decode_attention_interpret
from jax_decode.launch import DeviceInfo, make_launch_config
from jax_decode.merge import check_merge_args, merge_states
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
    backend: Backend = "auto",
    check_inputs: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Attention of one new query token per row over that row's paged KV cache.

    Args:
      q: ``[batch, num_heads, head_dim_qk]``, float16, bfloat16 or float32.
      k_cache: ``[num_pages, page_size, num_kv_heads, head_dim_qk]``, q's dtype.
      v_cache: ``[num_pages, page_size, num_kv_heads, head_dim_v]``, q's dtype; or
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
      return_lse: also return the natural log-sum-exp of the scaled scores.
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
    )
    num_kv_splits = check_num_kv_splits(num_kv_splits)
    if check_inputs:
        check = functools.partial(check_index_values, num_pages=problem.num_pages, page_size=problem.page_size)
        jax.debug.callback(check, page_table, seq_lens)
    args = (q, k_cache, v_cache, page_table, seq_lens)

    has_v = v_cache is not None

    def compute(*arrays):
        q, k, v, pt, sl = arrays if has_v else (arrays[0], arrays[1], None, *arrays[2:])
        return _dispatch((q, k, v, pt, sl), problem, backend, num_kv_splits)

    def fold_vmapped_axis(axis_size, in_batched, *arrays):
        """jax.vmap rule: a mapped axis of q / page_table / seq_lens joins the batch."""
        if any(in_batched[1:-2]):
            raise ValueError(
                "jax.vmap of decode_attention maps q, page_table and seq_lens over one shared "
                "cache; k_cache and v_cache must not be mapped (give them in_axes=None)"
            )

        def mapped(x, batched):
            return x if batched else jnp.broadcast_to(x, (axis_size, *x.shape))

        q, pt, sl = (mapped(arrays[i], in_batched[i]) for i in (0, -2, -1))
        k, v = arrays[1], (arrays[2] if has_v else None)
        out, lse = decode_attention(
            q.reshape(-1, *q.shape[2:]), k, v,
            pt.reshape(-1, pt.shape[-1]), sl.reshape(-1),
            sm_scale=problem.sm_scale, logit_cap=problem.logit_cap, num_kv_splits=num_kv_splits,
            head_dim_v=problem.head_dim_v, return_lse=True, backend=backend,
        )  # fmt: skip
        return (out.reshape(axis_size, -1, *out.shape[1:]), lse.reshape(axis_size, -1, lse.shape[-1])), (True, True)

    # triton_call has no batching rule: under jax.vmap, fold the mapped axis into the
    # batch (one launch for all of it) instead.
    vmappable = jax.custom_batching.custom_vmap(compute)
    vmappable.def_vmap(fold_vmapped_axis)
    out, lse = vmappable(*(x for x in args if x is not None))
    return (out, lse) if return_lse else out


def _dispatch(args, problem, backend: str, num_kv_splits: int | None):
    """(out, lse) of the checked arguments on the chosen backend."""
    q = args[0]
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
