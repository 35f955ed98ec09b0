"""How close two runs are: the signal-to-quantization-noise ratio."""

from __future__ import annotations

import math

import torch


def sqnr(ref: torch.Tensor, x: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio of x against ref in dB (inf when equal)."""
    ref, x = ref.double(), x.double()
    noise = (ref - x).norm()
    if noise == 0:
        return math.inf
    return (20 * torch.log10(ref.norm() / noise)).item()
