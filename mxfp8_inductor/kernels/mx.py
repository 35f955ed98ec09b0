"""The public MXFP8 quantizers and scale layouts: Triton kernels for CUDA tensors, the pure-torch
contract (`reference.py`, bit-identical) elsewhere. Each checks its arguments and raises
ValueError naming the requirement; `offs` values are checked too, which reads them (a host sync
on GPU)."""

from __future__ import annotations

import types
from typing import Any

import torch

from ..eligibility import check_offs
from . import reference

_FLOAT = (torch.bfloat16, torch.float32)


def _check_tensor(name: str, t: Any, dtypes: tuple[torch.dtype, ...], what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} must be {what}, got {t.dtype}")


def _check_dim(x: torch.Tensor, dim: int) -> None:
    if x.dim() == 0:
        raise ValueError("MXFP8 blocks run along a dimension: a 0-d tensor has none")
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim={dim} is out of range for a {x.dim()}-D tensor")
    if x.shape[dim] % reference.BLOCK:
        raise ValueError(f"dim {dim} of shape {tuple(x.shape)} must be a multiple of {reference.BLOCK}")


def _check_2d(name: str, t: torch.Tensor) -> None:
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D [M, K], got shape {tuple(t.shape)}")


def implementation(device: torch.device) -> types.ModuleType:
    """The module that quantizes tensors on `device`: `triton_mx` on GPUs, `reference` elsewhere."""
    if device.type == "cuda":
        from . import triton_mx  # imported lazily: triton is optional off Linux

        return triton_mx
    return reference


def quantize(x: torch.Tensor, dim: int = -1, rounding: str = "rceil") -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8-quantize `x` in blocks of 32 along `dim`: (float8_e4m3fn data shaped like x,
    float8_e8m0fnu scales shaped like x with `dim` divided by 32)."""
    _check_tensor("x", x, _FLOAT, "bf16 or fp32")
    _check_dim(x, dim)
    return implementation(x.device).quantize(x, dim, rounding)


def dequantize(
    data: torch.Tensor, scales: torch.Tensor, dim: int = -1, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """Inverse of `quantize`: data * scale, computed in float32, returned as `dtype`."""
    _check_tensor("data", data, (torch.float8_e4m3fn,), "float8_e4m3fn (quantize's data)")
    _check_tensor("scales", scales, (torch.float8_e8m0fnu,), "float8_e8m0fnu (quantize's scales)")
    _check_dim(data, dim)
    want = list(data.shape)
    want[dim] //= reference.BLOCK
    if list(scales.shape) != want:
        raise ValueError(f"scales of shape {tuple(scales.shape)} do not fit data {tuple(data.shape)} along dim {dim}")
    if dtype not in _FLOAT:
        raise ValueError(f"dequantize writes bf16 or fp32, got {dtype}")
    return implementation(data.device).dequantize(data, scales, dim, dtype)


def quantize_groups(
    x_MK: torch.Tensor, offs: torch.Tensor, rounding: str = "rceil"
) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8-quantize [M, K] along the tokens in blocks that restart at every group end in `offs`:
    (data [M, K], scales [M // 32 + G, K]); see `reference.quantize_groups`."""
    _check_tensor("x_MK", x_MK, _FLOAT, "bf16 or fp32")
    _check_2d("x_MK", x_MK)
    check_offs(offs, x_MK.shape[0])
    return implementation(x_MK.device).quantize_groups(x_MK, offs, rounding)


def dequantize_groups(
    data_MK: torch.Tensor, scales_SK: torch.Tensor, offs: torch.Tensor, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """Inverse of `quantize_groups`; rows past offs[-1] are 0."""
    _check_tensor("data_MK", data_MK, (torch.float8_e4m3fn,), "float8_e4m3fn (quantize_groups' data)")
    _check_tensor("scales_SK", scales_SK, (torch.float8_e8m0fnu,), "float8_e8m0fnu (quantize_groups' scales)")
    _check_2d("data_MK", data_MK)
    check_offs(offs, data_MK.shape[0])
    return reference.dequantize_groups(data_MK, scales_SK, offs, dtype)


def to_blocked(scales: torch.Tensor) -> torch.Tensor:
    """2-D or 3-D (per expert) e8m0 scales in the native GEMM's blocked layout
    (docs/design.md, "Scale layouts")."""
    _check_tensor("scales", scales, (torch.float8_e8m0fnu, torch.uint8), "float8_e8m0fnu (or its uint8 bytes)")
    if scales.dim() not in (2, 3):
        raise ValueError(f"to_blocked takes 2-D or 3-D (per expert) scales, got shape {tuple(scales.shape)}")
    return implementation(scales.device).to_blocked(scales)


def to_blocked_groups(
    scales: torch.Tensor, offs: torch.Tensor, along: str = "rows"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group blocked scales, groups back to back: (buffer, each group's start); see
    `reference.to_blocked_groups`."""
    _check_tensor("scales", scales, (torch.float8_e8m0fnu, torch.uint8), "float8_e8m0fnu (or its uint8 bytes)")
    _check_2d("scales", scales)
    if along not in ("rows", "cols"):
        raise ValueError(f'along must be "rows" or "cols", got {along!r}')
    rows, cols = scales.shape
    check_offs(offs, rows if along == "rows" else cols * reference.BLOCK)
    return implementation(scales.device).to_blocked_groups(scales, offs, along)
