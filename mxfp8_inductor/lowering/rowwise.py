"""The fp8_rowwise recipe's three GEMMs (`kernels/rowwise.py` is its numerics contract).

On compute capability 9.x the GEMMs are torch's FP8 grouped GEMM (`torch._scaled_grouped_mm`),
except for small token groups: there the forward and input-gradient GEMMs take our Triton FP8
grouped GEMM and the weight gradient multiplies its FP8-rounded operands in bf16. Elsewhere the
recipe is emulated: dequantized operands, exact in bf16, into the bf16 grouped GEMM.
"""

from __future__ import annotations

import functools
import types

import torch

from .. import routes
from ..kernels import rowwise, shared_weight
from ..routes import Route
from ..spec import GemmSpec
from . import weight_cache
from .library import OUT_DTYPE, contiguous, define, define_cached_weight_gemm, define_fp8_grouped_mm


def quantizers(device: torch.device) -> types.ModuleType:
    """The rowwise quantizers Inductor does badly (weight-gradient operands, a weight's shared
    form) and the rows' eager ones: Triton twins on GPUs, the pure-torch contract elsewhere."""
    if device.type == "cuda":
        from ..kernels import triton_rowwise  # imported lazily: triton is optional off Linux

        return triton_rowwise
    return rowwise


def quantize_rows(x: torch.Tensor, rounding: str, decomposing: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per row along the last dim: the pure-torch contract where Inductor lowers it
    (fused with the producer), the device's twin in an eager call."""
    if decomposing or x.device.type != "cuda":
        return rowwise.quantize_rows(x, -1, rounding)
    return quantizers(x.device).quantize_rows(x, rounding)


def _quantize_groups(x, offs, rounding):
    """Weight-gradient operand (see `rowwise.quantize_groups`)."""
    return quantizers(x.device).quantize_groups(x, offs, rounding)


def _quantize_groups_fake(x, offs, rounding):
    M, K = x.shape
    G = offs.shape[0]
    data = x.new_empty(K, rowwise.padded_rows(M, G), dtype=torch.float8_e4m3fn)
    return data, x.new_empty(G, K, dtype=torch.float32), offs.new_empty(G)


quantize_groups_rowwise_op = define(
    "quantize_groups_rowwise", "(Tensor x, Tensor offs, str rounding) -> (Tensor, Tensor, Tensor)",
    _quantize_groups, _quantize_groups_fake,
)


# our Triton rowwise FP8 grouped GEMM (`kernels/triton_fp8_gemm.py`, 2d-3d or 2d-2d)
fp8_grouped_mm_op = define_fp8_grouped_mm("fp8_grouped_mm", "scaled_grouped_mm")


def _gemm(a, b, scale_a, scale_b, offs, tokens_per_group) -> torch.Tensor:
    """The FP8 grouped GEMM (2d-3d forward and input gradient, 2d-2d weight gradient) by
    `routes.route`."""
    K, N = a.shape[1] if b.dim() == 3 else a.shape[0], b.shape[-1]
    path = routes.route("fp8_rowwise", a.device, K, N, tokens_per_group)
    if path == Route.ROWWISE_EMULATED:
        return rowwise.scaled_grouped_mm(a, b, scale_a, scale_b, offs)
    if path == Route.ROWWISE_TRITON:
        return fp8_grouped_mm_op(a, b, scale_a, scale_b, offs)
    return torch._scaled_grouped_mm(a, b, scale_a, scale_b, offs=offs, out_dtype=OUT_DTYPE)


def _shared_form(b_EKN: torch.Tensor, rounding: str, decomposing: bool) -> tuple[torch.Tensor, ...]:
    """The weight rounded once for both of its GEMMs (docs/design.md, "Shared weight scales"):
    float8 data in the weight's own layout and one power-of-two scale per expert, that scale
    spread as each GEMM takes it ([E, N] forward, [E, K] input gradient; kept with the data, so a
    reused weight costs no scale copies per call); the pure-torch contract where Inductor lowers
    it, the Triton twin in an eager call on a GPU."""
    if decomposing or b_EKN.device.type != "cuda":
        data_EKN, scale_E = shared_weight.quantize(b_EKN, "fp8_rowwise", rounding)
    else:
        data_EKN, scale_E = quantizers(b_EKN.device).quantize_weight_shared(b_EKN, rounding)
    E, K, N = data_EKN.shape
    return data_EKN, scale_E[:, None].expand(E, N).contiguous(), scale_E[:, None].expand(E, K).contiguous()


def _weight_operand(b_EKN: torch.Tensor, param: torch.Tensor | None, rounding: str, shared: bool, dgrad: bool,
                    decomposing: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight's FP8 operand and scales for the forward ([E, K, N] view of a contiguous
    [E, N, K], scales [E, N]) or the input gradient ([E, N, K] view of a contiguous [E, K, N],
    scales [E, K]). `shared`: the shared form, one float8 copy and a scale per expert, which is
    both GEMMs' operand up to a byte transpose, reused under `param` (None: made for this GEMM);
    so the weight cache holds 1 byte per element (docs/design.md, "Weight cache"). Otherwise
    each GEMM scales the weight's rows along its own contraction."""
    if not shared:
        w_fp8, w_scales = quantize_rows(b_EKN if dgrad else b_EKN.transpose(-2, -1), rounding, decomposing)
        return w_fp8.contiguous().transpose(-2, -1), w_scales
    data_EKN, scale_EN, scale_EK = weight_cache.quantized(
        b_EKN, param, ("fp8_rowwise", rounding), functools.partial(_shared_form, rounding=rounding,
                                                                    decomposing=decomposing))
    if dgrad:
        return contiguous(data_EKN, decomposing).transpose(-2, -1), scale_EK
    return contiguous(data_EKN.transpose(-2, -1), decomposing).transpose(-2, -1), scale_EN


def _grouped_or_dense(x_fp8, w_fp8, w_scales, x_scales, offs):
    """The grouped GEMM, or with offs None the dense one of a one-expert weight operand."""
    if offs is None:
        return _mm(x_fp8, w_fp8[0], x_scales, w_scales[0])
    return _gemm(x_fp8, w_fp8, x_scales, w_scales, offs, x_fp8.shape[0] / max(offs.numel(), 1))


def _cached_weight_gemm(x_fp8, x_scales, b_EKN, param, offs, rounding, dgrad):
    """x_fp8 [M, C] times the weight's FP8 form, reused under `param` (lowering/weight_cache.py):
    grouped when offs is given, else dense (b_EKN then [1, K, N], a dense weight's transposed
    view). A reused weight is always the shared form: the one that serves both GEMMs."""
    w = _weight_operand(b_EKN, param, rounding, shared=True, dgrad=dgrad, decomposing=False)
    return _grouped_or_dense(x_fp8, *w, x_scales, offs)


cached_weight_gemm_op = define_cached_weight_gemm("rowwise_cached_weight_gemm", _cached_weight_gemm)


def _weight_gemm(x_MC, b_EKN, offs, spec, param, dgrad, decomposing):
    """x [M, C] (C = K forward, N input gradient) times the weight in FP8, x quantized here,
    where Inductor fuses it with its producer."""
    x_fp8, x_scales = quantize_rows(x_MC, spec.rounding, decomposing)
    return quantized_weight_gemm(x_fp8.contiguous(), x_scales, b_EKN, offs, spec, param, dgrad, decomposing)


def quantized_weight_gemm(x_fp8: torch.Tensor, x_scales: torch.Tensor, b_EKN: torch.Tensor, offs: torch.Tensor | None,
                          spec: GemmSpec, param: torch.Tensor | None, dgrad: bool, decomposing: bool) -> torch.Tensor:
    """A forward or input gradient once its activation is in FP8 rows (x_fp8 [M, C] contiguous,
    x_scales [M]): what the compiled model runs beside the kernel producing x. The weight's
    quantization reused under `param` (None: made here, for this GEMM alone)."""
    if param is not None:
        return cached_weight_gemm_op(x_fp8, x_scales, b_EKN, param, offs, spec.rounding, dgrad)
    w = _weight_operand(b_EKN, None, spec.rounding, spec.shared_weight, dgrad, decomposing)
    return _grouped_or_dense(x_fp8, *w, x_scales, offs)


# --------------------------------------------------------------------------------------------
# The three GEMMs (`impls.GemmImpl`); every path here decomposes


def forward(a_MK, b_EKN, offs, spec, param, decomposing):
    return _weight_gemm(a_MK, b_EKN, offs, spec, param, dgrad=False, decomposing=decomposing)


def input_grad(grad_MN, b_EKN, offs, spec, param, decomposing):
    return _weight_gemm(grad_MN, b_EKN, offs, spec, param, dgrad=True, decomposing=decomposing)


def weight_grad(grad_MN, a_MK, offs, spec, decomposing):
    a_fp8_KMp, a_scales_GK, padded_offs = quantize_groups_rowwise_op(a_MK, offs, spec.rounding)
    g_fp8_NMp, g_scales_GN, _ = quantize_groups_rowwise_op(grad_MN, offs, spec.rounding)
    return _gemm(a_fp8_KMp, g_fp8_NMp.t(), a_scales_GK.reshape(-1), g_scales_GN.reshape(-1),
                 padded_offs, a_MK.shape[0] / max(offs.numel(), 1))


# --------------------------------------------------------------------------------------------
# Dense linears, out[M, N] = x[M, K] @ w[N, K]^T: torch's rowwise FP8 GEMM on compute capability
# 9.x, emulated elsewhere; the weight as a one-expert [1, K, N] view


def _mm(a_MK, b_KN, scale_M, scale_N) -> torch.Tensor:
    """a [M, K] row-major float8 times b [K, N] column-major float8 with one scale per row of a
    and per column of b, bf16 out."""
    if routes.route("fp8_rowwise", a_MK.device, *b_KN.shape) == Route.ROWWISE_TORCH:
        return torch._scaled_mm(a_MK, b_KN, scale_a=scale_M[:, None], scale_b=scale_N[None, :], out_dtype=OUT_DTYPE)
    a = (a_MK.float() * scale_M[:, None]).to(OUT_DTYPE)
    b = (b_KN.float() * scale_N[None, :]).to(OUT_DTYPE)
    return torch.mm(a, b)


def dense_forward(x_MK, w_NK, spec, param, decomposing):
    return _weight_gemm(x_MK, w_NK.t()[None], None, spec, param, dgrad=False, decomposing=decomposing)


def dense_input_grad(grad_MN, w_NK, spec, param, decomposing):
    return _weight_gemm(grad_MN, w_NK.t()[None], None, spec, param, dgrad=True, decomposing=decomposing)


def dense_weight_grad(grad_MN, x_MK, spec, decomposing):
    rounding = spec.rounding
    if routes.route("fp8_rowwise", x_MK.device, x_MK.shape[0], grad_MN.shape[1]) == Route.ROWWISE_TORCH:
        # torch's FP8 GEMM takes a contraction (here the tokens) in multiples of 16; zero rows
        # change no scale and add nothing
        pad = -x_MK.shape[0] % rowwise.ALIGN
        grad_MN, x_MK = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (grad_MN, x_MK))
    g_fp8_NM, g_scales_N = quantize_rows(grad_MN.t(), rounding, decomposing)
    x_fp8_KM, x_scales_K = quantize_rows(x_MK.t(), rounding, decomposing)
    return _mm(g_fp8_NM.contiguous(), x_fp8_KM.contiguous().t(), g_scales_N, x_scales_K)
