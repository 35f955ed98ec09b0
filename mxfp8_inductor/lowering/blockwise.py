"""The fp8_blockwise recipe's three GEMMs (`kernels/blockwise.py` is its numerics contract).

Every quantization is the pure-torch contract, in the graph for Inductor: each scale covers one
tile of 128 elements, so none needs a pass over a whole row or token group, and Inductor fuses
the activations' 1 x 128 tiles into the kernels producing them (docs/design.md, "Where the
operands are quantized"). On compute capability 9.x the
GEMMs are our Triton FP8 grouped GEMM with a scaling per 128-deep contraction step
(`kernels/triton_fp8_gemm.py`); elsewhere they are emulated: dequantized operands, exact in bf16,
into the bf16 grouped GEMM. A dense linear is a grouped GEMM of one group.

The emulation quantizes and dequantizes its operands zero-padded to whole tiles along K and N
(the zeros stay zeros), and the op running the bf16 GEMM slices them back: no tensor Inductor
computes holds per-tile scales along a dim off whole tiles, which its C++ backend would cut
short (kernels/blockwise.py). The weight gradient's tiles are along the tokens, whole already.
"""

from __future__ import annotations

import functools

import torch

from .. import routes
from ..kernels import blockwise
from ..kernels.blockwise import SCALE_TILE
from ..routes import Route
from . import weight_cache
from .library import contiguous, define, define_cached_weight_gemm, define_fp8_grouped_mm

blockwise_grouped_mm_op = define_fp8_grouped_mm("blockwise_grouped_mm", "blockwise_grouped_mm")


def _leading_grouped_mm(a_MKp: torch.Tensor, b_EKpNp: torch.Tensor, offs: torch.Tensor, K: int, N: int) -> torch.Tensor:
    return torch._grouped_mm(a_MKp[:, :K], b_EKpNp[:, :K, :N], offs)


# the emulation's bf16 grouped GEMM of the leading [M, K] and [E, K, N] blocks of its operands
# padded to whole tiles: an opaque op, so that Inductor never computes the slices
leading_grouped_mm_op = define(
    "blockwise_leading_grouped_mm", "(Tensor a, Tensor b, Tensor offs, SymInt K, SymInt N) -> Tensor",
    _leading_grouped_mm, lambda a, b, offs, K, N: a.new_empty(a.shape[0], N))


def _triton(device: torch.device) -> bool:
    """Whether the GEMMs run in our Triton FP8 grouped GEMM (`routes.route`; blockwise's route
    depends on the device alone), else in the emulation."""
    return routes.route("fp8_blockwise", device, SCALE_TILE, SCALE_TILE) == Route.BLOCKWISE_TRITON


def _for_route(x: torch.Tensor, *dims: int) -> torch.Tensor:
    """An operand as the route quantizes it: as it is for the Triton GEMM, padded to whole tiles
    along `dims` for the emulation."""
    return x if _triton(x.device) else blockwise.pad_tiles(x, *dims)


def _one_group(x: torch.Tensor) -> torch.Tensor:
    """The group ends of a dense GEMM's rows: one group of them all."""
    return torch.full((1,), x.shape[0], dtype=torch.int32, device=x.device)


def _quantize_weight(b_EKN: torch.Tensor, rounding: str) -> tuple[torch.Tensor, torch.Tensor]:
    return blockwise.quantize_weight(_for_route(b_EKN, 1, 2), rounding)


def _weight_operand(b_EKN: torch.Tensor, param: torch.Tensor | None, rounding: str, dgrad: bool, decomposing: bool):
    """The weight's FP8 operand and block scales for the forward ([E, K, N] view of a contiguous
    [E, N, K], scales [E, K / 128, N / 128]) or the input gradient ([E, N, K] view of a contiguous
    [E, K, N], the scales transposed). One quantization serves both, the second a byte transpose of
    the first, so the weight cache holds 1 byte per element; reused under `param` (None: made for
    this GEMM)."""
    quantize = functools.partial(_quantize_weight, rounding=rounding)
    data_ENK, scales = (quantize(b_EKN) if param is None else
                        weight_cache.quantized(b_EKN, param, ("fp8_blockwise", rounding), quantize))
    if dgrad:
        return contiguous(data_ENK.transpose(-2, -1), decomposing).transpose(-2, -1), scales.transpose(-2, -1)
    return data_ENK.transpose(-2, -1), scales


def _times_weight(x_fp8, x_scales, w_fp8, w_scales, b_EKN, offs, dgrad):
    """The 2d-3d GEMM by `routes.route`: x times the weight's operand for the forward (dgrad
    False) or the input gradient, whose contraction and output width are b's K and N or N and K."""
    if _triton(x_fp8.device):
        return blockwise_grouped_mm_op(x_fp8, w_fp8, x_scales, w_scales, offs)
    K, N = b_EKN.shape[1:]
    x_bf, w_bf = blockwise.dequantize_operands(x_fp8, w_fp8, x_scales, w_scales)
    return leading_grouped_mm_op(x_bf, w_bf, offs, *((N, K) if dgrad else (K, N)))


def _cached_weight_gemm(x_fp8, x_scales, b_EKN, param, offs, rounding, dgrad):
    w_fp8, w_scales = _weight_operand(b_EKN, param, rounding, dgrad, decomposing=False)
    return _times_weight(x_fp8, x_scales, w_fp8, w_scales, b_EKN, offs, dgrad)


cached_weight_gemm_op = define_cached_weight_gemm("blockwise_cached_weight_gemm", _cached_weight_gemm)


def _weight_gemm(x_MC, b_EKN, offs, rounding, param, dgrad):
    """x [M, C] (C = K forward, N input gradient) times the weight in FP8, x quantized in tiles of
    1 x 128 here, where Inductor fuses it with its producer; the weight's quantization reused
    under `param` (None: made here, in the graph)."""
    x_fp8, x_scales = blockwise.quantize_tiles(_for_route(x_MC, -1), -1, rounding)
    x_fp8 = x_fp8.contiguous()
    offs = _one_group(x_MC) if offs is None else offs
    if param is not None:
        return cached_weight_gemm_op(x_fp8, x_scales, b_EKN, param, offs, rounding, dgrad)
    w_fp8, w_scales = _weight_operand(b_EKN, None, rounding, dgrad, decomposing=True)
    return _times_weight(x_fp8, x_scales, w_fp8, w_scales, b_EKN, offs, dgrad)


# --------------------------------------------------------------------------------------------
# The three GEMMs (`impls.GemmImpl`); every path here decomposes


def forward(a_MK, b_EKN, offs, spec, param, decomposing):
    return _weight_gemm(a_MK, b_EKN, offs, spec.rounding, param, dgrad=False)


def input_grad(grad_MN, b_EKN, offs, spec, param, decomposing):
    return _weight_gemm(grad_MN, b_EKN, offs, spec.rounding, param, dgrad=True)


def weight_grad(grad_MN, a_MK, offs, spec, decomposing):
    """d b[E, K, N] = a^T @ grad per token group, both quantized in tiles of 128 tokens."""
    a_fp8_KT, a_scales_TK, padded_offs = blockwise.quantize_groups(a_MK, offs, spec.rounding)
    g_fp8_NT, g_scales_TN, _ = blockwise.quantize_groups(grad_MN, offs, spec.rounding)
    args = (a_fp8_KT, g_fp8_NT.t(), a_scales_TK, g_scales_TN, padded_offs)
    return blockwise_grouped_mm_op(*args) if _triton(a_MK.device) else blockwise.scaled_grouped_mm(*args)


# Dense linears, out[M, N] = x[M, K] @ w[N, K]^T: the weight as a one-expert [1, K, N] view


def dense_forward(x_MK, w_NK, spec, param, decomposing):
    return _weight_gemm(x_MK, w_NK.t()[None], None, spec.rounding, param, dgrad=False)


def dense_input_grad(grad_MN, w_NK, spec, param, decomposing):
    return _weight_gemm(grad_MN, w_NK.t()[None], None, spec.rounding, param, dgrad=True)


def dense_weight_grad(grad_MN, x_MK, spec, decomposing):
    return weight_grad(x_MK, grad_MN, _one_group(x_MK), spec, decomposing)[0]
