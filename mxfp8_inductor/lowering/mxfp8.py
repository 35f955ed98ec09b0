"""The mxfp8 recipe's three GEMMs (docs/design.md, "Lowering and dispatch").

  native     compute capability 10.x, K and N multiples of 128: float8 operands + blocked e8m0
             scales into `torch._scaled_grouped_mm` (never on 9.x: that call corrupts the CUDA
             context there);
  fused      any CUDA GPU, with the spec's `fused` (opted into by `MXFP8Config.mxfp8_fused`): Triton
             grouped GEMMs that quantize their bf16 operands in registers as they load them
             (`kernels/triton_mx_gemm.py`), into the MXFP8 MMA (`tl.dot_scaled`) on 10.x and a
             bf16 dot of the MXFP8 values elsewhere;
  emulated   other CUDA GPUs: Triton quantize-dequantize (exact MXFP8 values, which bf16 holds
             exactly) feeding the bf16 `torch._grouped_mm`;
  reference  CPU: the same emulation with the pure-torch reference.
The fused and emulated paths multiply the same MXFP8 values, accumulating in fp32.
"""

from __future__ import annotations

import torch

from ..kernels import shared_weight
from ..kernels.mx import implementation
from ..routes import Route, has_mxfp8_mma, route
from . import weight_cache
from .library import OUT_DTYPE, define, like


def gemm_path(device: torch.device, K: int, N: int, fused: bool = False) -> Route:
    """Which implementation runs a GEMM with contraction K and output width N (`routes.route`).
    The fused kernels are slower than the separate path on the H200 (docs/performance.md, "Fused
    grouped GEMMs") and unmeasured on 10.x: opt-in, for GPUs and Triton versions where they win."""
    return route("mxfp8", device, K, N, fused=fused)


# --------------------------------------------------------------------------------------------
# Native path arguments (pure functions of a kernels module, so CPU tests can check them
# against torch's meta checks with the reference kernels)


def native_forward_args(kern, a_MK, b_EKN, offs, rounding, param=None):
    a_fp8, a_scales = kern.quantize_rows_blocked(a_MK, offs, rounding)
    w_fp8_ENK, w_scales = weight_cache.quantized(
        b_EKN, param, ("mxfp8", rounding, "forward"),
        lambda b: kern.quantize_weight_blocked(b.transpose(-2, -1), rounding))
    return a_fp8, w_fp8_ENK.transpose(-2, -1), a_scales, w_scales, offs


def native_dgrad_args(kern, grad_MN, b_EKN, offs, rounding, param=None):
    g_fp8, g_scales = kern.quantize_rows_blocked(grad_MN, offs, rounding)
    w_fp8_EKN, w_scales = weight_cache.quantized(b_EKN, param, ("mxfp8", rounding, "dgrad"),
                                            lambda b: kern.quantize_weight_blocked(b, rounding))
    return g_fp8, w_fp8_EKN.transpose(-2, -1), g_scales, w_scales, offs


def native_wgrad_args(kern, grad_MN, a_MK, offs, rounding):
    a_fp8_KMp, a_scales, padded_offs = kern.quantize_groups_blocked(a_MK, offs, rounding)
    g_fp8_NMp, g_scales, _ = kern.quantize_groups_blocked(grad_MN, offs, rounding)
    return a_fp8_KMp, g_fp8_NMp.t(), a_scales, g_scales, padded_offs


def _scaled_grouped_mm(args) -> torch.Tensor:
    return torch._scaled_grouped_mm(*args[:4], offs=args[4], out_dtype=OUT_DTYPE)


# --------------------------------------------------------------------------------------------
# Quantize-dequantize ops (the emulated and reference paths)


def _quantize_dequantize(x, dim, rounding):
    """x rounded to MXFP8 values (blocks of 32 along `dim`), as bf16."""
    return like(x, implementation(x.device).quantize_dequantize(x, dim, rounding, OUT_DTYPE))


def _quantize_dequantize_groups(x, offs, rounding):
    """[M, K] rounded to MXFP8 values in blocks along M that restart at every group, as bf16."""
    return like(x, implementation(x.device).quantize_dequantize_groups(x, offs, rounding, OUT_DTYPE))


quantize_dequantize_op = define(
    "quantize_dequantize", "(Tensor x, int dim, str rounding) -> Tensor", _quantize_dequantize,
    lambda x, dim, rounding: torch.empty_like(x, dtype=OUT_DTYPE),
)
quantize_dequantize_groups_op = define(
    "quantize_dequantize_groups", "(Tensor x, Tensor offs, str rounding) -> Tensor", _quantize_dequantize_groups,
    lambda x, offs, rounding: torch.empty_like(x, dtype=OUT_DTYPE),
)


def _fused_rows(a_MK, b_EKN, offs, rounding):
    from ..kernels import triton_mx_gemm  # imported lazily: triton is optional off Linux

    return triton_mx_gemm.grouped_mm(a_MK, b_EKN, offs, rounding, native=has_mxfp8_mma(a_MK.device))


def _fused_groups(a_MK, g_MN, offs, rounding):
    from ..kernels import triton_mx_gemm

    return triton_mx_gemm.grouped_mm_wgrad(a_MK, g_MN, offs, rounding, native=has_mxfp8_mma(a_MK.device))


fused_grouped_mm_op = define(
    "fused_grouped_mm", "(Tensor a, Tensor b, Tensor offs, str rounding) -> Tensor", _fused_rows,
    lambda a, b, offs, rounding: a.new_empty(a.shape[0], b.shape[-1], dtype=OUT_DTYPE),
)
fused_grouped_mm_wgrad_op = define(
    "fused_grouped_mm_wgrad", "(Tensor a, Tensor g, Tensor offs, str rounding) -> Tensor", _fused_groups,
    lambda a, g, offs, rounding: a.new_empty(offs.shape[0], a.shape[1], g.shape[1], dtype=OUT_DTYPE),
)


# --------------------------------------------------------------------------------------------
# The emulated weight GEMMs. They reuse no weight quantization: what they would keep is a bf16
# copy of each rounded weight per orientation, twice the weights' own size for the whole model
# (docs/design.md, "Weight cache").

# The rounded weight lives only for its GEMM, made in slices of the GEMM's output columns of at
# most this many bytes (or one aligned block of columns, where that is more), so that a large
# expert weight does not add its own size to the step's peak. Rounding blocks run along the
# contraction, so a slice rounds exactly as the whole weight does. Part of the compile caches'
# key (backend.py).
WEIGHT_SLICE_BYTES = 256 * 2**20
_SLICE_ALIGN = 128  # output columns per slice: keeps every GEMM operand's strides 16-byte aligned


def _weight_slices(b_EKN: torch.Tensor, dgrad: bool) -> tuple[torch.Tensor, ...]:
    """The weight in slices of the GEMM's output columns (K of b for the input gradient, N
    forward), each rounded on its own."""
    dim = -2 if dgrad else -1
    cols = b_EKN.shape[dim]
    column_bytes = b_EKN.numel() // max(cols, 1) * OUT_DTYPE.itemsize
    per = max(WEIGHT_SLICE_BYTES // max(column_bytes, 1) // _SLICE_ALIGN * _SLICE_ALIGN, _SLICE_ALIGN)
    return (b_EKN,) if per >= cols else b_EKN.split(per, dim)


def _weight_gemm(x_MC, b_EKN, offs, rounding, dgrad):
    """x [M, C] (C = K forward, N input gradient) times the weight, both rounded to MXFP8 values
    along C, into the bf16 GEMM (grouped, or dense with offs None and a one-expert weight)."""
    x_q = quantize_dequantize_op(x_MC, -1, rounding)
    outs = []
    for b in _weight_slices(b_EKN, dgrad):
        # blocks along the contraction: K of b forward (dim 1), N of b for the input gradient (dim 2)
        w_q_EKN = quantize_dequantize_op(b, 2 if dgrad else 1, rounding)
        w_q = w_q_EKN.transpose(-2, -1) if dgrad else w_q_EKN
        outs.append(torch.mm(x_q, w_q[0]) if offs is None else torch._grouped_mm(x_q, w_q, offs))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


# --------------------------------------------------------------------------------------------
# The three GEMMs (`impls.GemmImpl`)


def _as_shared(b_EKN: torch.Tensor, spec) -> torch.Tensor:
    """With `spec.shared_weight`, the weight rounded once for both of its GEMMs (docs/design.md,
    "Shared weight scales"), anew in each GEMM rather than saved for the backward beside the
    weight; the GEMM then quantizes it as any weight, which under rceil changes no value."""
    return shared_weight.quantize_dequantize(b_EKN, "mxfp8", spec.rounding) if spec.shared_weight else b_EKN


def forward(a_MK, b_EKN, offs, spec, param, decomposing):
    b_EKN = _as_shared(b_EKN, spec)
    K, N = b_EKN.shape[-2:]
    rounding = spec.rounding
    path = gemm_path(a_MK.device, K, N, spec.fused)
    if path == Route.MXFP8_NATIVE:
        if decomposing:  # keep the op: its native path is not decomposed
            return NotImplemented
        return _scaled_grouped_mm(native_forward_args(implementation(a_MK.device), a_MK, b_EKN, offs, rounding, param))
    if path == Route.MXFP8_FUSED:
        return fused_grouped_mm_op(a_MK, b_EKN, offs, rounding)
    return _weight_gemm(a_MK, b_EKN, offs, rounding, dgrad=False)


def input_grad(grad_MN, b_EKN, offs, spec, param, decomposing):
    b_EKN = _as_shared(b_EKN, spec)
    K, N = b_EKN.shape[-2:]
    rounding = spec.rounding
    path = gemm_path(grad_MN.device, N, K, spec.fused)
    if path == Route.MXFP8_NATIVE:
        if decomposing:
            return NotImplemented
        args = native_dgrad_args(implementation(grad_MN.device), grad_MN, b_EKN, offs, rounding, param)
        return _scaled_grouped_mm(args)
    if path == Route.MXFP8_FUSED:
        return fused_grouped_mm_op(grad_MN, b_EKN.transpose(-2, -1), offs, rounding)
    return _weight_gemm(grad_MN, b_EKN, offs, rounding, dgrad=True)


def weight_grad(grad_MN, a_MK, offs, spec, decomposing):
    K, N = a_MK.shape[1], grad_MN.shape[1]
    rounding = spec.rounding
    path = gemm_path(a_MK.device, K, N, spec.fused)
    if path == Route.MXFP8_NATIVE:
        if decomposing:
            return NotImplemented
        dw_EKN = _scaled_grouped_mm(native_wgrad_args(implementation(a_MK.device), grad_MN, a_MK, offs, rounding))
        # an empty group is skipped by the kernel: its gradient is 0, not whatever was in memory
        sizes = torch.diff(offs, prepend=offs.new_zeros(1))
        return torch.where((sizes > 0)[:, None, None], dw_EKN, 0)
    if path == Route.MXFP8_FUSED:
        return fused_grouped_mm_wgrad_op(a_MK, grad_MN, offs, rounding)
    a_q = quantize_dequantize_groups_op(a_MK, offs, rounding)
    g_q = quantize_dequantize_groups_op(grad_MN, offs, rounding)
    return torch._grouped_mm(a_q.t(), g_q, offs)


# --------------------------------------------------------------------------------------------
# Dense linears, out[M, N] = x[M, K] @ w[N, K]^T, the weight as a one-expert [1, K, N] view. On
# the native path each GEMM is the grouped one with a single group of all M rows: the same
# operands, scale layouts and meta-checked arguments as the experts'. Elsewhere the emulation,
# into torch's dense GEMM.


def _one_group(x_MK: torch.Tensor) -> torch.Tensor:
    return torch.full((1,), x_MK.shape[0], dtype=torch.int32, device=x_MK.device)


def dense_forward(x_MK, w_NK, spec, param, decomposing):
    b_EKN = w_NK.t()[None]
    if gemm_path(x_MK.device, *b_EKN.shape[-2:]) == Route.MXFP8_NATIVE:
        return forward(x_MK, b_EKN, _one_group(x_MK), spec, param, decomposing)
    return _weight_gemm(x_MK, b_EKN, None, spec.rounding, dgrad=False)


def dense_input_grad(grad_MN, w_NK, spec, param, decomposing):
    b_EKN = w_NK.t()[None]
    K, N = b_EKN.shape[-2:]
    if gemm_path(grad_MN.device, N, K) == Route.MXFP8_NATIVE:
        return input_grad(grad_MN, b_EKN, _one_group(grad_MN), spec, param, decomposing)
    return _weight_gemm(grad_MN, b_EKN, None, spec.rounding, dgrad=True)


def dense_weight_grad(grad_MN, x_MK, spec, decomposing):
    # blocks along the tokens: one group of all M rows, whose last block may be short
    ends = _one_group(x_MK)
    if gemm_path(x_MK.device, grad_MN.shape[1], x_MK.shape[1]) == Route.MXFP8_NATIVE:
        # the weight gradient is symmetric in its operands: x as the "gradient" gives [1, N, K],
        # the weight's own layout, contiguous as the op's fake promises
        dw_1NK = weight_grad(x_MK, grad_MN, ends, spec, decomposing)
        return dw_1NK if dw_1NK is NotImplemented else dw_1NK[0]
    g_q = quantize_dequantize_groups_op(grad_MN, ends, spec.rounding)
    x_q = quantize_dequantize_groups_op(x_MK, ends, spec.rounding)
    return torch.mm(g_q.t(), x_q)
