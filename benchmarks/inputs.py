"""The benchmarks' arrays: :func:`jax_decode.synthetic.make_paged_problem` on a CUDA device.

Caches of gigabytes are drawn on the GPU (``torch.randn`` seeded from the problem's
generator); page tables and lengths come from the host builder as in the tests.
"""

from __future__ import annotations

import numpy as np
import torch

from jax_decode.synthetic import NUMPY_DTYPES

_TORCH_BITS = {"bfloat16": torch.uint16, "float8_e4m3fn": torch.uint8, "float8_e5m2": torch.uint8}


class TorchArrays:
    """torch tensors on ``device``, drawn there."""

    def __init__(self, device: str = "cuda"):
        self.device = device

    def normal(self, rng: np.random.Generator, shape, dtype: str):
        generator = torch.Generator(device=self.device).manual_seed(int(rng.integers(2**62)))
        values = torch.randn(shape, generator=generator, device=self.device, dtype=torch.float32)
        return values.to(getattr(torch, dtype))

    def from_numpy(self, array: np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(array)).to(self.device)

    def to_numpy(self, array) -> np.ndarray:
        name = str(array.dtype).removeprefix("torch.")
        if name in _TORCH_BITS:
            return array.view(_TORCH_BITS[name]).cpu().numpy().view(NUMPY_DTYPES[name])
        return array.cpu().numpy()

    def quantise(self, cache, scale, dtype: str):
        values = cache.float()
        if scale is not None:
            values = values / torch.as_tensor(scale, device=values.device)[:, None]
        return values.to(getattr(torch, dtype))
