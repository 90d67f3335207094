"""The optional float operands (scales, sinks) as the JAX frontends take and pass them."""

from __future__ import annotations

import numbers

import jax.numpy as jnp


def float_operand(x):
    """A Python number becomes a float32 array (a scale of 1 must not be an int32 array);
    arrays pass through unchanged, for the argument checks to judge."""
    return jnp.asarray(x, jnp.float32) if isinstance(x, numbers.Real) and not isinstance(x, bool) else x


def scale_operand(x):
    """A checked scale (or None) as the kernels read it: float32 ``[1]`` or ``[num_kv_heads]``."""
    return None if x is None else x.astype(jnp.float32).reshape(-1)
