"""What each GPU can run: the one home of the compute-capability checks. A leaf: it imports
nothing from the package."""

from __future__ import annotations

import torch


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
    """Whether torch's rowwise FP8 grouped GEMM is known to run here: compute capability 9.x.
    Its CUTLASS kernel is built for sm_90 only in some torch builds and traps on sm_103 in others
    (pytorch/pytorch#188063), so Blackwell takes the emulation (MXFP8 is its native recipe)."""
    return _cuda_major(device) == 9
