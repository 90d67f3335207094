"""``write_kv``: this step's keys and values into their paged-cache slots, for JAX.

Under ``jax.jit`` with the caches donated (``donate_argnums``) the update happens in
place: the triton backend aliases each cache to the kernel's output, and the xla
backend's scatter is updated in place by XLA; without donation XLA copies the cache
first (correct, but a full cache write per step).
"""

from __future__ import annotations

from jax_decode.arrays import JAX, as_traced, without_gradient
from jax_decode.backends import check_backend, dispatch
from jax_decode.backends import interpret as interpret_backend
from jax_decode.backends import triton as triton_backend
from jax_decode.backends import xla as xla_backend
from jax_decode.launch import WriteProblem, check_cache_dtype_on_device
from jax_decode.operands import WriteOperands
from jax_decode.prepare import prepare_write
from jax_decode.sharding import sharded_write


def write_kv(k_cache, v_cache, k_new, v_new, slot_mapping, *, k_scale=None, v_scale=None, backend: str = "auto"):
    """Write token ``t``'s rows into flat slot ``slot_mapping[t]`` (= page * page_size + slot).

    Args:
      k_cache, v_cache: ``[num_pages, page_size, num_kv_heads, head_dim]`` (v_cache None
        for MLA's single latent cache, with v_new None).
      k_new, v_new: ``[num_tokens, num_kv_heads, head_dim]``; cast to the cache dtype.
        An fp8 cache stores ``k_new / k_scale`` rounded to nearest and saturated to the
        format's finite range (so no value becomes inf or NaN).
      k_scale, v_scale: float ``()``/``[1]`` or ``[num_kv_heads]``, or None (no division).
      slot_mapping: int32 ``[num_tokens]``; slots outside ``[0, num_pages * page_size)``
        (e.g. -1 for padding tokens) are skipped.  Two tokens with one slot: one wins.
      backend: as for ``decode_attention`` (``"auto"``: the Triton kernel on GPU, an XLA
        scatter elsewhere).

    Returns ``(k_cache, v_cache)`` updated (v_cache None when it was None).
    """
    check_backend(backend)
    k_cache, v_cache, k_new, v_new, slot_mapping, k_scale, v_scale = as_traced(
        k_cache, v_cache, k_new, v_new, slot_mapping, k_scale, v_scale
    )
    k, v = prepare_write(k_cache, v_cache, k_new, v_new, slot_mapping, k_scale, v_scale, JAX)
    return _write_one(*k, backend), None if v is None else _write_one(*v, backend)


def _write_one(ops: WriteOperands, problem: WriteProblem, backend: str):
    if problem.num_tokens == 0:
        return ops.cache

    present = tuple(x is not None for x in ops)

    def on_device(given: WriteOperands, device_problem: WriteProblem):  # one device's shard, or the whole cache
        return dispatch(
            backend,
            on_gpu=lambda device: _write_on_gpu(given, device_problem, device),
            on_xla=lambda: xla_backend.write_cache(given, device_problem),
            on_interpreter=lambda: interpret_backend.write_cache(given, device_problem),
        )

    def write(*arrays):
        it = iter(arrays)
        ops = WriteOperands(*(next(it) if p else None for p in present))
        return sharded_write(ops, problem, on_device, host_callback=backend == "interpret")

    return without_gradient(write, "write_kv")(*(x for x in ops if x is not None))


def _write_on_gpu(ops: WriteOperands, problem: WriteProblem, device):
    check_cache_dtype_on_device(problem.cache_dtype, device)
    return triton_backend.write_cache(ops, problem, device)
