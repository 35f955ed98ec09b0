"""Which kernel runs each GEMM: the one home of the compute-capability checks and of the routes
from (numerics, device, shape) to a kernel (docs/design.md, "Lowering and dispatch"). A leaf: it
imports nothing from the package.

The recipes' lowerings (`lowering/mxfp8.py`, `rowwise.py`, `blockwise.py`) ask `route` which
implementation to build; `recipe="auto"` (`lowering/auto.py`) asks the capability checks which
GPUs its H200 calibration applies to.
"""

from __future__ import annotations

import enum

import torch


class Route(str, enum.Enum):
    """An implementation of one GEMM in one recipe's numerics."""

    MXFP8_NATIVE = "mxfp8 native"  # float8 + blocked e8m0 scales into torch._scaled_grouped_mm
    MXFP8_FUSED = "mxfp8 fused"  # our Triton GEMMs that round their bf16 operands as they load them
    MXFP8_EMULATED = "mxfp8 emulated"  # Triton quantize-dequantize into the bf16 GEMM
    MXFP8_REFERENCE = "mxfp8 reference"  # the pure-torch quantize-dequantize into the bf16 GEMM
    ROWWISE_TORCH = "fp8_rowwise torch"  # torch's FP8 GEMMs (`_scaled_grouped_mm`, `_scaled_mm`)
    ROWWISE_TRITON = "fp8_rowwise triton"  # our Triton FP8 grouped GEMM (kernels/triton_fp8_gemm.py)
    ROWWISE_EMULATED = "fp8_rowwise emulated"  # dequantized float8 operands into the bf16 GEMM
    BLOCKWISE_TRITON = "fp8_blockwise triton"  # our Triton FP8 grouped GEMM, scaled per contraction step
    BLOCKWISE_EMULATED = "fp8_blockwise emulated"  # dequantized float8 operands into the bf16 GEMM


# the routes whose GEMMs multiply in FP8; the others multiply rounded operands in bf16, which
# cannot beat bf16 alone (`recipe="auto"` does not time them)
FP8_MMA = frozenset({Route.MXFP8_NATIVE, Route.ROWWISE_TORCH, Route.ROWWISE_TRITON, Route.BLOCKWISE_TRITON})


# Where torch's FP8 grouped GEMM (CUTLASS) takes an fp8_rowwise GEMM from ours on compute
# capability 9.x: groups of at least this many tokens on average, with K and N both at least
# TORCH_FP8_MIN_DIM. Its tiles are sized for large GEMMs: below either bound it runs at 0.4-0.6x
# of ours, above both within about 10% either way (docs/performance.md, "FP8 grouped GEMM rates").
TORCH_FP8_MIN_TOKENS_PER_GROUP = 2048
TORCH_FP8_MIN_DIM = 2048


def _cuda_major(device: torch.device) -> int | None:
    """The compute capability's major version of an NVIDIA GPU; None elsewhere (CPU, and ROCm,
    whose gfx9 parts report 9.x but run none of these kernels)."""
    if device.type != "cuda" or torch.version.hip is not None:
        return None
    return torch.cuda.get_device_capability(device)[0]


def has_mxfp8_mma(device: torch.device) -> bool:
    """Compute capability 10.x: the MXFP8 MMA and torch's MXFP8 grouped GEMM. Calling that GEMM
    elsewhere (9.x) corrupts the CUDA context, so every native path is gated here, never tried."""
    return _cuda_major(device) == 10


def has_fp8_grouped_mm(device: torch.device) -> bool:
    """Whether torch's rowwise FP8 grouped GEMM, and our Triton one (TMA, FP8 wgmma), are known to
    run here: compute capability 9.x. torch's CUTLASS kernel is built for sm_90 only in some torch
    builds and traps on sm_103 in others (pytorch/pytorch#188063), so Blackwell takes the
    emulation (MXFP8 is its native recipe)."""
    return _cuda_major(device) == 9


def route(numerics: str, device: torch.device, K: int, N: int, tokens_per_group: float | None = None,
          fused: bool = False) -> Route:
    """The implementation of one GEMM (any role: each passes its own contraction K and output
    width N): `numerics` "mxfp8", "fp8_rowwise" or "fp8_blockwise", `tokens_per_group` the mean
    group size of a grouped GEMM (None: a dense one); `fused` opts mxfp8 into the fused GEMMs on
    CUDA GPUs."""
    if numerics == "mxfp8":
        if device.type != "cuda":
            return Route.MXFP8_REFERENCE
        if fused:
            return Route.MXFP8_FUSED
        # the native scale layouts are verified only where K/32 and N/32 fill whole 4-column tiles
        if has_mxfp8_mma(device) and K % 128 == 0 and N % 128 == 0:
            return Route.MXFP8_NATIVE
        return Route.MXFP8_EMULATED
    if numerics == "fp8_blockwise":
        return Route.BLOCKWISE_TRITON if has_fp8_grouped_mm(device) else Route.BLOCKWISE_EMULATED
    if numerics != "fp8_rowwise":
        raise ValueError(f"no GEMM routes for numerics {numerics!r}")
    if not has_fp8_grouped_mm(device):
        return Route.ROWWISE_EMULATED
    if tokens_per_group is None:  # a dense GEMM: torch's `_scaled_mm`
        return Route.ROWWISE_TORCH
    if tokens_per_group >= TORCH_FP8_MIN_TOKENS_PER_GROUP and min(K, N) >= TORCH_FP8_MIN_DIM:
        return Route.ROWWISE_TORCH
    return Route.ROWWISE_TRITON
