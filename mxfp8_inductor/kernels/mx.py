"""The public MXFP8 quantizers and scale layouts: Triton kernels for CUDA tensors, the pure-torch
contract (`reference.py`, bit-identical) elsewhere."""

from __future__ import annotations

import types

import torch

from . import reference


def implementation(device: torch.device) -> types.ModuleType:
    """The module that quantizes tensors on `device`: `triton_mx` on GPUs, `reference` elsewhere."""
    if device.type == "cuda":
        from . import triton_mx  # imported lazily: triton is optional off Linux

        return triton_mx
    return reference


def quantize(x: torch.Tensor, dim: int = -1, rounding: str = "rceil") -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8-quantize `x` in blocks of 32 along `dim`: (float8_e4m3fn data shaped like x,
    float8_e8m0fnu scales shaped like x with `dim` divided by 32)."""
    return implementation(x.device).quantize(x, dim, rounding)


def dequantize(
    data: torch.Tensor, scales: torch.Tensor, dim: int = -1, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """Inverse of `quantize`: data * scale, computed in float32, returned as `dtype`."""
    return implementation(data.device).dequantize(data, scales, dim, dtype)


def quantize_groups(
    x_MK: torch.Tensor, offs: torch.Tensor, rounding: str = "rceil"
) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8-quantize [M, K] along the tokens in blocks that restart at every group end in `offs`:
    (data [M, K], scales [M // 32 + G, K]); see `reference.quantize_groups`."""
    return implementation(x_MK.device).quantize_groups(x_MK, offs, rounding)


def dequantize_groups(
    data_MK: torch.Tensor, scales_SK: torch.Tensor, offs: torch.Tensor, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """Inverse of `quantize_groups`; rows past offs[-1] are 0."""
    return reference.dequantize_groups(data_MK, scales_SK, offs, dtype)


def to_blocked(scales: torch.Tensor) -> torch.Tensor:
    """2-D or 3-D (per expert) e8m0 scales in the native GEMM's blocked layout
    (docs/design.md, "Scale layouts")."""
    return implementation(scales.device).to_blocked(scales)


def to_blocked_groups(
    scales: torch.Tensor, offs: torch.Tensor, along: str = "rows"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group blocked scales, groups back to back: (buffer, each group's start); see
    `reference.to_blocked_groups`."""
    return implementation(scales.device).to_blocked_groups(scales, offs, along)
