"""Zero-copy exchange between torch tensors and JAX arrays through DLPack."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch

# 64-bit dtypes JAX keeps only with jax_enable_x64 (it would narrow them otherwise).
_WIDE = (torch.int64, torch.float64, torch.uint64, torch.complex128)


def to_jax(tensor: torch.Tensor, *, copy: bool = False) -> jax.Array:
    """The JAX array sharing ``tensor``'s memory (same device pointer).

    JAX arrays are dense and row-major, so a non-contiguous tensor cannot be shared:
    that raises ``ValueError`` unless ``copy=True`` asks for a contiguous copy.  A
    64-bit tensor (e.g. torch's default int64) needs JAX's x64 mode: without it JAX
    would narrow every value to 32 bits, so that raises ``TypeError`` instead.  A
    lazily negated or conjugated view (``is_neg()``/``is_conj()``) is refused unless
    ``copy=True``, which resolves it.  So is a tensor whose address JAX will not take
    as it is (JAX copies buffers that are not aligned as it requires: on the CPU, a
    view starting off a 64-byte boundary, such as a row slice).
    """
    return _to_jax(tensor, copy, must_share=True)


def _to_jax(tensor: torch.Tensor, copy: bool, must_share: bool) -> jax.Array:
    """to_jax; ``must_share=False`` copies a tensor that cannot be shared as it is (a
    non-contiguous, negated or conjugated view; one JAX would copy itself) instead of
    refusing it (``copy=True`` copies anyway)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype in _WIDE and not jax.config.jax_enable_x64:
        raise TypeError(
            f"tensor dtype {tensor.dtype} is 64-bit, but JAX runs without x64 and would narrow its values to "
            "32 bits; cast it first (e.g. .to(torch.int32) for page tables and lengths) or enable "
            'jax.config.update("jax_enable_x64", True)'
        )
    if tensor.is_neg() or tensor.is_conj():
        # A lazy negation or conjugation lives in the tensor's flags, not its memory:
        # shared as stored, the values would arrive with the wrong sign.
        if must_share and not copy:
            raise ValueError(
                "tensor is a lazily negated or conjugated view (is_neg() / is_conj()): its memory holds other "
                "values, so it cannot be shared with JAX without a copy; pass copy=True or call .resolve_neg() / "
                ".resolve_conj()"
            )
        tensor = tensor.resolve_neg().resolve_conj()
    if not tensor.is_contiguous():
        if must_share and not copy:
            raise ValueError(
                f"tensor with shape {tuple(tensor.shape)} and strides {tuple(tensor.stride())} is not contiguous, "
                "so it cannot be shared with JAX without a copy; pass copy=True or call .contiguous()"
            )
        tensor = tensor.contiguous()
    if tensor.requires_grad:
        tensor = tensor.detach()
    array = jax.dlpack.from_dlpack(tensor)
    if copy:
        array = jnp.array(array, copy=True)
    elif must_share and tensor.numel() and array.unsafe_buffer_pointer() != tensor.data_ptr():
        raise ValueError(
            f"tensor's memory at address {tensor.data_ptr():#x} ({tensor.data_ptr() % 64} bytes past a 64-byte "
            "boundary) is not aligned as JAX requires, so JAX copied it instead of sharing it (writes to the tensor "
            "would not reach the array); pass copy=True to accept the copy, or a tensor with its own storage (.clone())"
        )
    return array


def to_torch(array: jax.Array, *, copy: bool = False) -> torch.Tensor:
    """The torch tensor sharing ``array``'s memory (same device pointer); ``copy=True`` clones."""
    if not isinstance(array, jax.Array):
        raise TypeError(f"array must be a jax.Array, got {type(array).__name__}")
    tensor = torch.from_dlpack(array)
    return tensor.clone() if copy else tensor


def jax_function(fn=None, *, static_argnames: tuple[str, ...] = ()):
    """Wrap a JAX function so torch code calls it with tensors and gets tensors back.

    Tensors in the arguments (any pytree) go in through :func:`to_jax`, array outputs
    come back through :func:`to_torch`: zero-copy both ways, except that an argument
    JAX cannot take as it is (see :func:`to_jax`) is copied rather than refused.  ``fn``
    is jitted once (``jax.jit`` then compiles once per signature); ``static_argnames``
    as for jax.jit.
    """
    if fn is None:
        return functools.partial(jax_function, static_argnames=static_argnames)
    jitted = jax.jit(fn, static_argnames=static_argnames)

    def to_jax_leaf(x):
        # An argument is read, never written through: where JAX cannot take a tensor's
        # memory as it is, its copy serves as well.
        return _to_jax(x, copy=False, must_share=False) if isinstance(x, torch.Tensor) else x

    def to_torch_leaf(x):
        return to_torch(x) if isinstance(x, jax.Array) else x

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        args, kwargs = jax.tree_util.tree_map(to_jax_leaf, (args, kwargs))
        return jax.tree_util.tree_map(to_torch_leaf, jitted(*args, **kwargs))

    return wrapper
