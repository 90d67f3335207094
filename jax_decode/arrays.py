"""The JAX frontend's arrays: how :mod:`jax_decode.prepare` makes and casts them, and
the gradient rule of every JAX entry point."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_decode.validation import ANY_ARRAY


class JaxFrontend:
    """:class:`jax_decode.prepare.Frontend` for JAX arrays (and anything array-like)."""

    array_type = None
    array_kind = ANY_ARRAY

    @staticmethod
    def scalar(value: float, like):
        return jnp.asarray(value, jnp.float32)

    @staticmethod
    def float32(x):
        return jnp.asarray(x).astype(jnp.float32).reshape(-1)

    @staticmethod
    def check(named: dict) -> None:
        """JAX arrays are contiguous and on one device (or sharded); a torch tensor is not
        one (it fails deep inside JAX): refused with the two ways to pass it."""
        for name, value in named.items():
            if type(value).__module__.startswith("torch"):
                raise TypeError(
                    f"{name} is a torch.Tensor: pass a jax.Array (torch_bridge.to_jax shares the tensor's memory) "
                    "or call torch_bridge's function of the same name"
                )


JAX = JaxFrontend()


def as_traced(*arrays):
    """The arrays as ``jax.jit`` hands them to the function it wraps: a NumPy array becomes
    a JAX array of JAX's canonical dtype (int64 -> int32 and float64 -> float32 unless x64
    is on), anything else stays as it is.  So an eager call accepts, or refuses, what its
    jitted twin does (a NumPy int64 page table is int32 by the time jit traces it)."""
    return tuple(jnp.asarray(x) if isinstance(x, np.ndarray) else x for x in arrays)


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
