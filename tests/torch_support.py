"""Torch-side helpers: NumPy problems as torch tensors (bfloat16 included), and back."""

from __future__ import annotations

import numpy as np
import torch


def to_tensor(array, device="cpu"):
    if array is None:
        return None
    array = np.ascontiguousarray(array)
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.uint16).copy()).view(torch.bfloat16).to(device)
    return torch.from_numpy(array.copy()).to(device)


def to_float64(tensor) -> np.ndarray:
    return tensor.detach().float().cpu().numpy().astype(np.float64)
