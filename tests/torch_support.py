"""Torch-side helpers: NumPy problems as torch tensors (bfloat16 included), and back."""

from __future__ import annotations

import numpy as np
import torch


def to_tensor(array, device="cpu"):
    if array is None:
        return None
    array = np.ascontiguousarray(array)
    bits = {"bfloat16": np.uint16, "float8_e4m3fn": np.uint8, "float8_e5m2": np.uint8}.get(array.dtype.name)
    if bits is not None:  # ml_dtypes types torch.from_numpy does not know
        return torch.from_numpy(array.view(bits).copy()).view(getattr(torch, array.dtype.name)).to(device)
    return torch.from_numpy(array.copy()).to(device)


def to_float64(tensor) -> np.ndarray:
    return tensor.detach().float().cpu().numpy().astype(np.float64)
