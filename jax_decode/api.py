"""``decode_attention``: paged decode attention for JAX, usable inside ``jax.jit``.

Dimension names::

    batch       rows decoded in this step
    q_len       query tokens per row (1 to 16; its last q_len positions, already in the cache)
    num_heads   query heads;  num_kv_heads divides it (GQA / MQA; MHA when equal)
    head_dim_qk q and k width;  head_dim_v: v and output width (MLA: 576 and 512)
    num_pages, page_size   the paged cache;  max_pages: page-table width
"""

from __future__ import annotations

import atexit
import functools
import logging

import jax
import jax.custom_batching
import jax.numpy as jnp
import numpy as np

from jax_decode.arrays import JAX, as_traced, without_gradient
from jax_decode.backends import Backend, check_backend, dispatch
from jax_decode.backends import interpret as interpret_backend
from jax_decode.backends import triton as triton_backend
from jax_decode.backends import xla as xla_backend
from jax_decode.launch import MAX_BATCH, DeviceInfo, make_launch_config
from jax_decode.merge import check_merge_args, merge_states
from jax_decode.operands import ROW_OPERANDS, DecodeOperands
from jax_decode.prepare import DecodeOptions, prepare_decode
from jax_decode.sharding import sharded_decode
from jax_decode.validation import BadIndexValues, check_flag, check_index_values


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
    """Attention of each row's new query tokens over that row's paged KV cache.

    Args:
      q: ``[batch, num_heads, head_dim_qk]`` (one query token per row) or
        ``[batch, q_len, num_heads, head_dim_qk]`` (``1 <= q_len <= 16``: speculative
        drafts to verify, multi-token prediction), float16, bfloat16 or float32.  The
        ``q_len`` tokens are the row's last positions, already written to the cache:
        token ``t`` of row ``b`` attends to positions ``< seq_lens[b] - q_len + t + 1``
        (causal among the new tokens).  Query head ``h`` uses KV head
        ``h // (num_heads // num_kv_heads)``.
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
      window_left: sliding window: each query token attends only to the last
        ``window_left + 1`` positions up to its own (Mistral / Gemma local layers); pages
        before the window are not read.  ``None`` (or -1): the whole row.
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
      ``out [batch, (q_len,) num_heads, head_dim_v]`` in q's dtype (with q_len when q
      has it), and with ``return_lse`` also ``lse`` float32 ``[batch, (q_len,) num_heads]``.
    """
    check_backend(backend)
    check_flag("return_lse", return_lse)
    check_flag("check_inputs", check_inputs)
    given = DecodeOperands(*as_traced(q, k_cache, v_cache, page_table, seq_lens, k_scale, v_scale, sinks))
    options = DecodeOptions(head_dim_v, sm_scale, logit_cap, window_left, num_kv_splits)
    out, lse = _decode(given, options, backend, check_inputs)
    return (out, lse) if return_lse else out


def _decode(given: DecodeOperands, options: DecodeOptions, backend: str, check_inputs: bool = False):
    """(out, lse) of decode_attention's arguments, checked; jax.vmap folds into the batch."""
    problem, ops = prepare_decode(given, options, JAX)
    if check_inputs:
        ops = ops._replace(seq_lens=_checked_seq_lens(ops.page_table, ops.seq_lens, problem))
    present = tuple(x is not None for x in ops)

    def unflatten(items, absent):
        it = iter(items)
        return DecodeOperands(*(next(it) if p else absent for p in present))

    def compute(*arrays):
        def on_device(ops, device_problem):  # one device's shard, or the whole call
            return _dispatch(ops, device_problem, backend, options.num_kv_splits)

        host_callback = backend == "interpret"
        return sharded_decode(unflatten(arrays, None), problem, on_device, host_callback=host_callback)

    def fold_vmapped_axis(axis_size, in_batched, *arrays):
        """jax.vmap rule: a mapped axis of q / page_table / seq_lens joins the batch."""
        batched = unflatten(in_batched, False)
        if any(getattr(batched, name) for name in DecodeOperands._fields if name not in ROW_OPERANDS):
            raise ValueError(
                "jax.vmap of decode_attention maps q, page_table and seq_lens over one shared "
                "cache; k_cache and v_cache must not be mapped, nor k_scale, v_scale or sinks (give them in_axes=None)"
            )
        full = unflatten(arrays, None)
        # Rows per mapped element, explicitly: an axis of size 0 leaves nothing to infer -1 from.
        batch = full.q.shape[1] if batched.q else full.q.shape[0]
        if axis_size * batch > MAX_BATCH:
            raise ValueError(
                f"jax.vmap of decode_attention folds the mapped axis into the batch: {axis_size} mapped elements of "
                f"{batch} rows make {axis_size * batch} rows, more than the {MAX_BATCH} one call takes (the CUDA grid "
                "limit of stage 1's batch axis); map fewer elements at a time (e.g. jax.lax.map over chunks)"
            )

        def folded(name):
            x = getattr(full, name)
            x = x if getattr(batched, name) else jnp.broadcast_to(x, (axis_size, *x.shape))
            return x.reshape(-1, *x.shape[2:])

        rows = full._replace(**{name: folded(name) for name in ROW_OPERANDS})
        out, lse = _decode(rows, options, backend)
        out = out.reshape(axis_size, batch, *out.shape[1:])
        lse = lse.reshape(axis_size, batch, *lse.shape[1:])
        return (out, lse), (True, True)

    # triton_call has no batching rule: under jax.vmap, fold the mapped axis into the
    # batch (one launch for all of it) instead.
    vmappable = jax.custom_batching.custom_vmap(compute)
    vmappable.def_vmap(fold_vmapped_axis)
    return without_gradient(vmappable, "decode_attention")(*(x for x in ops if x is not None))


class _DropCheckFailureLogs(logging.Filter):
    """JAX logs a callback's exception with its traceback before it fails the call with
    the same message; for check_inputs' own refusal the failed call says it all."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], BadIndexValues))


logging.getLogger("jax._src.callback").addFilter(_DropCheckFailureLogs())


def _forget_delivered_check_failures() -> None:
    """On a GPU, JAX keeps the last computation's runtime token, which holds a failed host
    callback's error, and re-raises it from an exit handler ("Exception ignored in atexit
    callback") after the call itself has already failed with it.  This handler,
    registered after JAX's and so run before it, waits on those tokens first and drops
    the error when it is check_inputs' refusal; any other error is raised as JAX would.
    """
    try:
        from jax._src import dispatch as jax_dispatch  # private; absent: nothing to do
    except ImportError:
        return
    tokens = getattr(jax_dispatch, "runtime_tokens", None)
    if tokens is None or not hasattr(tokens, "clear"):
        return
    try:
        tokens.block_until_ready()
    except Exception as error:
        tokens.clear()
        if f"{BadIndexValues.__name__}:" not in str(error):
            raise


atexit.register(_forget_delivered_check_failures)


def _checked_seq_lens(page_table, seq_lens, problem):
    """``seq_lens``, once :func:`check_index_values` has passed on the index values.

    Eagerly (concrete arrays) a bad value raises ValueError here.  Under ``jax.jit`` the
    check is a host callback whose result the kernels read, so it runs before them and
    a bad value fails the call itself: ``jax.errors.JaxRuntimeError``, its message ending
    in the ValueError's, raised once (not again at exit: see
    :func:`_forget_delivered_check_failures`).
    """
    check = functools.partial(
        check_index_values, num_pages=problem.num_pages, page_size=problem.page_size,
        window_left=problem.window_left, q_len=problem.q_len,
    )  # fmt: skip
    if not isinstance(page_table, jax.core.Tracer) and not isinstance(seq_lens, jax.core.Tracer):
        check(np.asarray(page_table), np.asarray(seq_lens))
        return seq_lens

    def checked(page_table, seq_lens):
        check(page_table, seq_lens)
        return np.asarray(seq_lens)

    # Under jax.vmap the check runs once per mapped element, on that element's arrays.
    result_type = jax.ShapeDtypeStruct(seq_lens.shape, seq_lens.dtype)
    return jax.pure_callback(checked, result_type, page_table, seq_lens, vmap_method="sequential")


def _dispatch(ops: DecodeOperands, problem, backend: str, num_kv_splits: int | None):
    """(out, lse) of the checked operands on the chosen backend."""
    if problem.batch == 0:
        return jnp.zeros(problem.out_shape, ops.q.dtype), jnp.zeros(problem.lse_shape, jnp.float32)
    return dispatch(
        backend,
        on_gpu=lambda device: triton_backend.decode_attention(ops, make_launch_config(problem, device, num_kv_splits)),
        on_xla=lambda: xla_backend.decode_attention(ops, problem),
        on_interpreter=lambda: interpret_backend.decode_attention(
            ops, make_launch_config(problem, DeviceInfo.interpreter(), num_kv_splits)
        ),
    )


def merge_attention_states(
    out_a: jax.Array, lse_a: jax.Array, out_b: jax.Array, lse_b: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Merge two partial results (e.g. a shared prefix and each row's suffix) by LSE.

    ``out_*`` ``[..., head_dim_v]`` as returned by ``decode_attention``, ``lse_*``
    float32 ``[...]`` from ``return_lse=True``.  Returns ``(out in out_a's dtype, lse
    float32)``, equal to attention over both parts' keys; exact for an empty part
    (``lse = -inf``).
    """
    out_a, lse_a, out_b, lse_b = as_traced(out_a, lse_a, out_b, lse_b)
    check_merge_args(out_a, lse_a, out_b, lse_b)
    out, lse = merge_states(jnp, lambda x: x.astype(jnp.float32), out_a, lse_a, out_b, lse_b)
    return out.astype(out_a.dtype), lse.astype(jnp.float32)
