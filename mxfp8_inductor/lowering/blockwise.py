"""The fp8_blockwise recipe's three GEMMs (`kernels/blockwise.py` is its numerics contract).

Every quantization is the pure-torch contract, in the graph for Inductor: each scale covers one
tile of 128 elements, so none needs a pass over a whole row or token group, and Inductor fuses
the activations' 1 x 128 tiles into the kernels producing them (docs/design.md, "Where the
operands are quantized"). On compute capability 9.x the
GEMMs are our Triton FP8 grouped GEMM with a scaling per 128-deep contraction step
(`kernels/triton_fp8_gemm.py`); elsewhere they are emulated: dequantized operands, exact in bf16,
into the bf16 grouped GEMM. A dense linear is a grouped GEMM of one group.
"""

from __future__ import annotations

import functools

import torch

from .. import registry
from ..kernels import blockwise
from ..registry import Route
from . import weights
from .library import define_cached_weight_gemm, define_fp8_grouped_mm

blockwise_grouped_mm_op = define_fp8_grouped_mm("blockwise_grouped_mm", "blockwise_grouped_mm")


def _gemm(a, b, scale_a, scale_b, offs) -> torch.Tensor:
    """The blockwise grouped GEMM (2d-3d forward and input gradient, 2d-2d weight gradient) by
    `registry.route`."""
    K, N = a.shape[1] if b.dim() == 3 else a.shape[0], b.shape[-1]
    if registry.route("fp8_blockwise", a.device, K, N) == Route.BLOCKWISE_TRITON:
        return blockwise_grouped_mm_op(a, b, scale_a, scale_b, offs)
    return blockwise.scaled_grouped_mm(a, b, scale_a, scale_b, offs)


def _one_group(x: torch.Tensor) -> torch.Tensor:
    """The group ends of a dense GEMM's rows: one group of them all."""
    return torch.full((1,), x.shape[0], dtype=torch.int32, device=x.device)


def _weight_operand(b_EKN: torch.Tensor, param: torch.Tensor | None, rounding: str, dgrad: bool):
    """The weight's FP8 operand and block scales for the forward ([E, K, N] view, scales
    [E, K / 128, N / 128]) or the input gradient ([E, N, K] view, the scales transposed): both
    from one quantization of the weight, reused under `param` (None: made for this GEMM)."""
    quantize = functools.partial(blockwise.quantize_weight, rounding=rounding)
    data_ENK, data_EKN, scales = (quantize(b_EKN) if param is None else
                                  weights.quantized(b_EKN, param, ("fp8_blockwise", rounding), quantize))
    if dgrad:
        return data_EKN.transpose(-2, -1), scales.transpose(-2, -1)
    return data_ENK.transpose(-2, -1), scales


def _cached_weight_gemm(x_fp8, x_scales, b_EKN, param, offs, rounding, dgrad):
    w_fp8, w_scales = _weight_operand(b_EKN, param, rounding, dgrad)
    return _gemm(x_fp8, w_fp8, x_scales, w_scales, offs)


cached_weight_gemm_op = define_cached_weight_gemm("blockwise_cached_weight_gemm", _cached_weight_gemm)


def _weight_gemm(x_MC, b_EKN, offs, rounding, param, dgrad):
    """x [M, C] (C = K forward, N input gradient) times the weight in FP8, x quantized in tiles of
    1 x 128 here, where Inductor fuses it with its producer; the weight's quantization reused
    under `param` (None: made here, in the graph)."""
    x_fp8, x_scales = blockwise.quantize_tiles(x_MC, -1, rounding)
    x_fp8 = x_fp8.contiguous()
    offs = _one_group(x_MC) if offs is None else offs
    if param is not None:
        return cached_weight_gemm_op(x_fp8, x_scales, b_EKN, param, offs, rounding, dgrad)
    w_fp8, w_scales = _weight_operand(b_EKN, None, rounding, dgrad)
    return _gemm(x_fp8, w_fp8, x_scales, w_scales, offs)


# --------------------------------------------------------------------------------------------
# The three GEMMs (see lowering/ops.py for the common interface); every path here decomposes


def forward(a_MK, b_EKN, offs, rounding, param, decomposing):
    return _weight_gemm(a_MK, b_EKN, offs, rounding, param, dgrad=False)


def dgrad(grad_MN, b_EKN, offs, rounding, param, decomposing):
    return _weight_gemm(grad_MN, b_EKN, offs, rounding, param, dgrad=True)


def wgrad(grad_MN, a_MK, offs, rounding, decomposing):
    """d b[E, K, N] = a^T @ grad per token group, both quantized in tiles of 128 tokens."""
    a_fp8_KT, a_scales_TK, padded_offs = blockwise.quantize_groups(a_MK, offs, rounding)
    g_fp8_NT, g_scales_TN, _ = blockwise.quantize_groups(grad_MN, offs, rounding)
    return _gemm(a_fp8_KT, g_fp8_NT.t(), a_scales_TK, g_scales_TN, padded_offs)


# Dense linears, out[M, N] = x[M, K] @ w[N, K]^T: the weight as a one-expert [1, K, N] view


def dense_forward(x_MK, w_NK, rounding, param, decomposing):
    return _weight_gemm(x_MK, w_NK.t()[None], None, rounding, param, dgrad=False)


def dense_dgrad(grad_MN, w_NK, rounding, param, decomposing):
    return _weight_gemm(grad_MN, w_NK.t()[None], None, rounding, param, dgrad=True)


def dense_wgrad(grad_MN, x_MK, rounding, decomposing):
    return wgrad(x_MK, grad_MN, _one_group(x_MK), rounding, decomposing)[0]
