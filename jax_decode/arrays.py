"""The optional float operands (scales, sinks) as the JAX frontends take and pass them."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_decode.validation import check_scale_value, is_float_scalar


def float_operand(name: str, x, *, scalar_ok: bool = True):
    """A real scalar becomes a float32 array (a scale of 1 must not be an int32 array);
    arrays pass through unchanged, for the argument checks to judge."""
    if x is None:
        return None
    if is_float_scalar(name, x, scalar_ok=scalar_ok):
        check_scale_value(name, x)
        return jnp.asarray(x, jnp.float32)
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        raise TypeError(f"{name} must be an array, a float or None, got {type(x).__name__}")
    return x


def scale_operand(x):
    """A checked scale (or None) as the kernels read it: float32 ``[1]`` or ``[num_kv_heads]``."""
    return None if x is None else x.astype(jnp.float32).reshape(-1)


def without_gradient(fn, what: str):
    """``fn`` (on arrays) with a JVP rule that refuses differentiation by name, rather
    than failing inside jax_triton or the host callback."""
    wrapped = jax.custom_jvp(fn)

    def refuse(primals, tangents):
        raise ValueError(
            f"{what} has no gradient (it is an inference kernel): jax.grad and jax.jvp through it are not "
            "supported; apply jax.lax.stop_gradient to its inputs"
        )

    wrapped.defjvp(refuse)
    return wrapped
