"""The differentiable FP8 grouped GEMM: torch.library custom ops, their autograd, device dispatch.

out[M, N] = grouped_mm(a[M, K], b[E, K, N], offs) with every GEMM quantized by a recipe, each
operand scaled along the GEMM's contraction:
  forward      a along K,        b along K
  input grad   dY along N,       b along N
  weight grad  dY and a along M, per token group
recipe="mxfp8" (DESIGN §3, blocks of 32, e8m0 scales) has three paths, chosen by `gemm_path`:
  native     compute capability 10.x: float8 operands + blocked e8m0 scales into
             `torch._scaled_grouped_mm` (never on 9.x: that call corrupts the CUDA context there);
  triton     other CUDA GPUs: fused Triton quantize-dequantize (exact MXFP8 values, which bf16
             holds exactly) feeding the bf16 `torch._grouped_mm`;
  reference  CPU: the same emulation with the pure-torch reference.
recipe="fp8_rowwise" (`kernels/rowwise.py`, one power-of-two scale per row) runs on compute
capability 9.x `torch._scaled_grouped_mm`, except for small token groups: there the forward and
input-gradient GEMMs take our Triton FP8 grouped GEMM (`_rowwise_gemm`) and the weight gradient
multiplies its FP8-rounded operands in bf16 (`_wgrad_rowwise`); it is emulated elsewhere.
"""

from __future__ import annotations

import functools
import types

import torch

from ..kernels import reference, rowwise

LIB = "mxfp8"
RECIPES = ("mxfp8", "fp8_rowwise")
WGRAD_MODES = ("quantized", "bf16")
_OUT_DTYPE = torch.bfloat16


def gemm_path(device: torch.device, K: int, N: int) -> str:
    """Which implementation runs a grouped GEMM with contraction K and output width N."""
    if device.type != "cuda":
        return "reference"
    # the native scale layouts are verified only where K/32 and N/32 fill whole 4-column tiles
    if torch.cuda.get_device_capability(device)[0] == 10 and K % 128 == 0 and N % 128 == 0:
        return "native"
    return "triton"


def _kernels(device: torch.device) -> types.ModuleType:
    if device.type == "cuda":
        from ..kernels import triton_mx  # imported lazily: triton is optional off Linux

        return triton_mx
    return reference


# --------------------------------------------------------------------------------------------
# Native path arguments (pure functions of a kernels module, so CPU tests can check them
# against torch's meta checks with the reference kernels)


def native_forward_args(kern, a_MK, b_EKN, offs, rounding):
    a_fp8, a_scales = kern.quantize_rows_blocked(a_MK, offs, rounding)
    w_fp8_ENK, w_scales = kern.quantize_weight_blocked(b_EKN.transpose(-2, -1), rounding)
    return a_fp8, w_fp8_ENK.transpose(-2, -1), a_scales, w_scales, offs


def native_dgrad_args(kern, grad_MN, b_EKN, offs, rounding):
    g_fp8, g_scales = kern.quantize_rows_blocked(grad_MN, offs, rounding)
    w_fp8_EKN, w_scales = kern.quantize_weight_blocked(b_EKN, rounding)
    return g_fp8, w_fp8_EKN.transpose(-2, -1), g_scales, w_scales, offs


def native_wgrad_args(kern, grad_MN, a_MK, offs, rounding):
    a_fp8_KMp, a_scales, padded_offs = kern.quantize_groups_blocked(a_MK, offs, rounding)
    g_fp8_NMp, g_scales, _ = kern.quantize_groups_blocked(grad_MN, offs, rounding)
    return a_fp8_KMp, g_fp8_NMp.t(), a_scales, g_scales, padded_offs


def _scaled_grouped_mm(args) -> torch.Tensor:
    return torch._scaled_grouped_mm(*args[:4], offs=args[4], out_dtype=_OUT_DTYPE)


# --------------------------------------------------------------------------------------------
# Quantize-dequantize ops (emulation on GPUs without MXFP8 MMA, and on CPU)


def _like(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """y laid out as torch.empty_like(x) (what the fake impls promise)."""
    if y.stride() == x.stride() and x.is_contiguous(memory_format=torch.contiguous_format):
        return y  # the common case, decided without allocating
    out = torch.empty_like(x, dtype=y.dtype)
    return y if out.stride() == y.stride() else out.copy_(y)


def _define(name: str, schema: str, impl, fake) -> torch._ops.OpOverload:
    """An op without autograd that compiled graphs call once per GEMM operand per step.

    Defined with torch.library.define/impl rather than torch.library.custom_op: custom_op wraps
    every call in a Python autograd layer, 31.6 against 6.8 us of dispatch per call on our CI
    machine (benchmarks/bench_dispatch.py), and a small MoE block calls 16 such ops per step.
    """
    qualname = f"{LIB}::{name}"
    torch.library.define(qualname, schema)
    torch.library.impl(qualname, "default", impl)
    torch.library.register_fake(qualname, fake)
    return getattr(getattr(torch.ops, LIB), name).default


def _quantize_dequantize(x, dim, rounding):
    """x rounded to MXFP8 values (blocks of 32 along `dim`), as bf16."""
    return _like(x, _kernels(x.device).quantize_dequantize(x, dim, rounding, _OUT_DTYPE))


def _quantize_dequantize_groups(x, offs, rounding):
    """[M, K] rounded to MXFP8 values in blocks along M that restart at every group, as bf16."""
    return _like(x, _kernels(x.device).quantize_dequantize_groups(x, offs, rounding, _OUT_DTYPE))


quantize_dequantize_op = _define(
    "quantize_dequantize", "(Tensor x, int dim, str rounding) -> Tensor", _quantize_dequantize,
    lambda x, dim, rounding: torch.empty_like(x, dtype=_OUT_DTYPE),
)
quantize_dequantize_groups_op = _define(
    "quantize_dequantize_groups", "(Tensor x, Tensor offs, str rounding) -> Tensor", _quantize_dequantize_groups,
    lambda x, offs, rounding: torch.empty_like(x, dtype=_OUT_DTYPE),
)


# --------------------------------------------------------------------------------------------
# FP8 rowwise


def has_fp8_grouped_mm(device: torch.device) -> bool:
    """Whether torch's rowwise FP8 grouped GEMM is known to run here: compute capability 9.x.
    Its CUTLASS kernel was built for sm_90 only until mid-2026 (pytorch/pytorch#188063) and traps
    on sm_103 in some builds, so Blackwell takes the emulation (MXFP8 is its native recipe)."""
    return device.type == "cuda" and torch.version.hip is None and torch.cuda.get_device_capability(device)[0] == 9


def _rowwise_kernels(device: torch.device) -> types.ModuleType:
    """The rowwise weight-gradient quantizers: Triton twins on GPUs, the pure-torch contract elsewhere."""
    if device.type == "cuda":
        from ..kernels import triton_rowwise  # imported lazily: triton is optional off Linux

        return triton_rowwise
    return rowwise


def _quantize_groups_rowwise(x, offs, rounding):
    """Weight-gradient operand of the rowwise recipe (see `rowwise.quantize_groups`)."""
    return _rowwise_kernels(x.device).quantize_groups(x, offs, rounding)


def _quantize_groups_rowwise_fake(x, offs, rounding):
    M, K = x.shape
    G = offs.shape[0]
    data = x.new_empty(K, rowwise.padded_rows(M, G), dtype=torch.float8_e4m3fn)
    return data, x.new_empty(G, K, dtype=torch.float32), offs.new_empty(G)


quantize_groups_rowwise_op = _define(
    "quantize_groups_rowwise", "(Tensor x, Tensor offs, str rounding) -> (Tensor, Tensor, Tensor)",
    _quantize_groups_rowwise, _quantize_groups_rowwise_fake,
)


def _group_amax(x, offs):
    """Per token group and column max |x| (`rowwise.group_amax`), in one read of x on GPUs."""
    return _rowwise_kernels(x.device).group_amax(x, offs)


group_amax_op = _define(
    "group_amax", "(Tensor x, Tensor offs) -> Tensor", _group_amax,
    lambda x, offs: x.new_empty(offs.shape[0], x.shape[1], dtype=torch.float32),
)


# tokens per group below which our Triton FP8 grouped GEMM beats torch's (CUTLASS) one on the
# H200 in the forward and input-gradient layout (2d-3d): torch's tiles are sized for large groups
# (benchmarks/probe_fp8_grouped_gemm.py).
TRITON_GEMM_MAX_TOKENS_PER_GROUP = 1024
# tokens per group below which the weight gradient (2d-2d) multiplies its FP8-rounded operands in
# torch's bf16 grouped GEMM: there no FP8 kernel we have beats bf16 (H200, fine64's ~512 tokens
# per group: torch's FP8 211 TFLOP/s, Inductor's autotuned FP8 277, bf16 504; at qwen3_30b's
# ~2048 FP8 wins, 654 against 563; benchmarks/results/fp8_grouped_gemm_probe_h200.json).
BF16_WGRAD_MAX_TOKENS_PER_GROUP = 1024


def _rowwise_gemm(a, b, scale_a, scale_b, offs) -> torch.Tensor:
    if not has_fp8_grouped_mm(a.device):
        return rowwise.scaled_grouped_mm(a, b, scale_a, scale_b, offs)
    if b.dim() == 3 and a.shape[0] < TRITON_GEMM_MAX_TOKENS_PER_GROUP * offs.numel():
        return fp8_grouped_mm_op(a, b, scale_a, scale_b, offs)
    return torch._scaled_grouped_mm(a, b, scale_a, scale_b, offs=offs, out_dtype=_OUT_DTYPE)


def _fp8_grouped_mm(a, b, scale_a, scale_b, offs):
    """Our Triton rowwise FP8 grouped GEMM (`kernels/triton_fp8_gemm.py`, 2d-3d), bf16 out."""
    from ..kernels import triton_fp8_gemm

    return triton_fp8_gemm.scaled_grouped_mm(a, b, scale_a, scale_b, offs)


def _fp8_grouped_mm_fake(a, b, scale_a, scale_b, offs):
    return a.new_empty(a.shape[0], b.shape[-1], dtype=_OUT_DTYPE)


fp8_grouped_mm_op = _define(
    "fp8_grouped_mm", "(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor offs) -> Tensor",
    _fp8_grouped_mm, _fp8_grouped_mm_fake,
)


def _forward_rowwise(a_MK, b_EKN, offs, rounding):
    a_fp8_MK, a_scales_M = rowwise.quantize_rows(a_MK, -1, rounding)
    w_fp8_ENK, w_scales_EN = rowwise.quantize_rows(b_EKN.transpose(-2, -1), -1, rounding)
    return _rowwise_gemm(a_fp8_MK.contiguous(), w_fp8_ENK.contiguous().transpose(-2, -1), a_scales_M, w_scales_EN, offs)


def _dgrad_rowwise(grad_MN, b_EKN, offs, rounding):
    g_fp8_MN, g_scales_M = rowwise.quantize_rows(grad_MN, -1, rounding)
    w_fp8_EKN, w_scales_EK = rowwise.quantize_rows(b_EKN, -1, rounding)
    return _rowwise_gemm(g_fp8_MN.contiguous(), w_fp8_EKN.contiguous().transpose(-2, -1), g_scales_M, w_scales_EK, offs)


def _wgrad_rowwise(grad_MN, a_MK, offs, rounding):
    if has_fp8_grouped_mm(a_MK.device) and a_MK.shape[0] < BF16_WGRAD_MAX_TOKENS_PER_GROUP * offs.numel():
        # same rounding as below; Inductor fuses each operand's rounding into one pass after its amax
        a_q = rowwise.quantize_dequantize_groups(a_MK, offs, group_amax_op(a_MK, offs), rounding)
        g_q = rowwise.quantize_dequantize_groups(grad_MN, offs, group_amax_op(grad_MN, offs), rounding)
        return torch._grouped_mm(a_q.t(), g_q, offs)
    a_fp8_KMp, a_scales_GK, padded_offs = quantize_groups_rowwise_op(a_MK, offs, rounding)
    g_fp8_NMp, g_scales_GN, _ = quantize_groups_rowwise_op(grad_MN, offs, rounding)
    return _rowwise_gemm(a_fp8_KMp, g_fp8_NMp.t(), a_scales_GK.reshape(-1), g_scales_GN.reshape(-1), padded_offs)


# --------------------------------------------------------------------------------------------
# The three GEMMs. Each is both the eager implementation of its custom op and, under
# torch.compile, its decomposition: Inductor then sees the quantize-dequantize ops and the
# grouped GEMM, so identical quantizations (the tokens feeding w1 and w3) are computed once.


def _forward(a_MK, b_EKN, offs, recipe, rounding, wgrad=None, *, decomposing=False):
    if recipe == "fp8_rowwise":
        return _forward_rowwise(a_MK, b_EKN, offs, rounding).to(a_MK.dtype)
    K, N = b_EKN.shape[-2:]
    if gemm_path(a_MK.device, K, N) == "native":
        if decomposing:  # keep the op: its native path is not decomposed
            return NotImplemented
        return _scaled_grouped_mm(native_forward_args(_kernels(a_MK.device), a_MK, b_EKN, offs, rounding))
    a_q = quantize_dequantize_op(a_MK, -1, rounding)
    b_q = quantize_dequantize_op(b_EKN, 1, rounding)
    return torch._grouped_mm(a_q, b_q, offs).to(a_MK.dtype)


def _dgrad(grad_MN, b_EKN, offs, recipe, rounding, *, decomposing=False):
    if recipe == "fp8_rowwise":
        return _dgrad_rowwise(grad_MN, b_EKN, offs, rounding).to(grad_MN.dtype)
    K, N = b_EKN.shape[-2:]
    if gemm_path(grad_MN.device, N, K) == "native":
        if decomposing:  # keep the op: its native path is not decomposed
            return NotImplemented
        return _scaled_grouped_mm(native_dgrad_args(_kernels(grad_MN.device), grad_MN, b_EKN, offs, rounding))
    g_q = quantize_dequantize_op(grad_MN, -1, rounding)
    b_q = quantize_dequantize_op(b_EKN, 2, rounding)
    return torch._grouped_mm(g_q, b_q.transpose(-2, -1), offs).to(grad_MN.dtype)


def _wgrad(grad_MN, a_MK, offs, recipe, rounding, *, decomposing=False):
    if recipe == "fp8_rowwise":
        return _wgrad_rowwise(grad_MN, a_MK, offs, rounding).to(grad_MN.dtype)
    K, N = a_MK.shape[1], grad_MN.shape[1]
    if gemm_path(a_MK.device, K, N) == "native":
        if decomposing:  # keep the op: its native path is not decomposed
            return NotImplemented
        dw_EKN = _scaled_grouped_mm(native_wgrad_args(_kernels(a_MK.device), grad_MN, a_MK, offs, rounding))
        # an empty group is skipped by the kernel: its gradient is 0, not whatever was in memory
        sizes = torch.diff(offs, prepend=offs.new_zeros(1))
        return torch.where((sizes > 0)[:, None, None], dw_EKN, 0).to(grad_MN.dtype)
    a_q = quantize_dequantize_groups_op(a_MK, offs, rounding)
    g_q = quantize_dequantize_groups_op(grad_MN, offs, rounding)
    return torch._grouped_mm(a_q.t(), g_q, offs).to(grad_MN.dtype)


# --------------------------------------------------------------------------------------------
# Custom ops


@torch.library.custom_op(f"{LIB}::grouped_mm", mutates_args=())
def grouped_mm_op(
    a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, recipe: str, rounding: str, wgrad: str
) -> torch.Tensor:
    return _forward(a, b, offs, recipe, rounding)


@grouped_mm_op.register_fake
def _(a, b, offs, recipe, rounding, wgrad):
    return a.new_empty(a.shape[0], b.shape[-1])


@torch.library.custom_op(f"{LIB}::grouped_mm_dgrad", mutates_args=())
def grouped_mm_dgrad_op(grad: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, recipe: str, rounding: str) -> torch.Tensor:
    return _dgrad(grad, b, offs, recipe, rounding)


@grouped_mm_dgrad_op.register_fake
def _(grad, b, offs, recipe, rounding):
    return grad.new_empty(grad.shape[0], b.shape[-2])


@torch.library.custom_op(f"{LIB}::grouped_mm_wgrad", mutates_args=())
def grouped_mm_wgrad_op(grad: torch.Tensor, a: torch.Tensor, offs: torch.Tensor, recipe: str, rounding: str) -> torch.Tensor:
    return _wgrad(grad, a, offs, recipe, rounding)


@grouped_mm_wgrad_op.register_fake
def _(grad, a, offs, recipe, rounding):
    return grad.new_empty(offs.shape[0], a.shape[1], grad.shape[1])


def _register_inductor_decompositions() -> None:
    from torch._inductor import decomposition

    for op, fn in ((grouped_mm_op, _forward), (grouped_mm_dgrad_op, _dgrad), (grouped_mm_wgrad_op, _wgrad)):
        decomposition.decompositions[op._opoverload] = functools.partial(fn, decomposing=True)
    decomposition.fast_random_decomps.cache_clear()  # a cached copy of the table predates us


_register_inductor_decompositions()


def _setup_context(ctx, inputs, output):
    a, b, offs, recipe, rounding, wgrad = inputs
    ctx.save_for_backward(a, b, offs)
    ctx.recipe, ctx.rounding, ctx.wgrad = recipe, rounding, wgrad


def _backward(ctx, grad):
    a, b, offs = ctx.saved_tensors
    grad = grad.contiguous()  # incoming gradients may be expanded (zero strides)
    da = db = None
    if ctx.needs_input_grad[0]:
        da = grouped_mm_dgrad_op(grad, b, offs, ctx.recipe, ctx.rounding)
    if ctx.needs_input_grad[1]:
        # the weight gradient is symmetric in its operands: compute it in the weight's own
        # layout (b is usually a transposed view of [E, N, K]), which saves a transposing copy
        x, y = (grad, a) if b.stride(-2) == 1 else (a, grad)
        if ctx.wgrad == "bf16":
            db = torch._grouped_mm(x.to(_OUT_DTYPE).t(), y.to(_OUT_DTYPE), offs)
        else:
            db = grouped_mm_wgrad_op(y, x, offs, ctx.recipe, ctx.rounding)
        db = (db.transpose(-2, -1) if b.stride(-2) == 1 else db).to(b.dtype)
    return da, db, None, None, None, None


grouped_mm_op.register_autograd(_backward, setup_context=_setup_context)


# --------------------------------------------------------------------------------------------
# Public entry


def check_grouped_mm_args(
    a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, recipe: str, rounding: str, wgrad: str
) -> None:
    """Raise ValueError naming the requirement a grouped_mm call breaks (values too, in eager)."""
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {RECIPES}, got {recipe!r}")
    reference.check_rounding(rounding)
    if wgrad not in WGRAD_MODES:
        raise ValueError(f"wgrad must be one of {WGRAD_MODES}, got {wgrad!r}")
    for name, t in (("a", a), ("b", b)):
        if t.dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"{name} must be bf16 or fp32, got {t.dtype}")
    if a.dtype != b.dtype:
        raise ValueError(f"a and b must share a dtype, got {a.dtype} and {b.dtype}")
    if a.dim() != 2 or b.dim() != 3:
        raise ValueError(f"need a[M, K] and b[E, K, N], got {tuple(a.shape)} and {tuple(b.shape)}")
    E, K, N = b.shape
    if a.shape[1] != K:
        raise ValueError(f"contraction dims differ: a[M, {a.shape[1]}] vs b[E, {K}, N]")
    multiple = reference.BLOCK if recipe == "mxfp8" else rowwise.ALIGN
    if K % multiple or N % multiple:
        why = "MXFP8 blocks" if recipe == "mxfp8" else "16-byte aligned FP8 rows"
        raise ValueError(f"K={K} and N={N} must be multiples of {multiple} for {why}")
    if offs.dtype != torch.int32 or offs.dim() != 1:
        raise ValueError(f"offs must be a 1-D int32 tensor, got {offs.dtype} with shape {tuple(offs.shape)}")
    if offs.numel() != E:
        raise ValueError(f"offs has {offs.numel()} group ends but b has E={E} experts")
    if a.device != b.device or a.device != offs.device:
        raise ValueError(f"a, b and offs must be on one device, got {a.device}, {b.device}, {offs.device}")
    if not torch.compiler.is_compiling() and offs.numel():
        # values are unknown while tracing; in eager this reads offs (a host sync on GPU)
        ends = offs.cpu()
        if bool((ends[1:] < ends[:-1]).any()) or int(ends[0]) < 0:
            raise ValueError(f"offs must be non-decreasing group ends, got {ends.tolist()}")
        if int(ends[-1]) > a.shape[0]:
            raise ValueError(f"offs[-1]={int(ends[-1])} is past M={a.shape[0]}")


def grouped_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    offs: torch.Tensor,
    *,
    recipe: str = "mxfp8",
    rounding: str = "rceil",
    wgrad: str = "quantized",
) -> torch.Tensor:
    """FP8 drop-in for `torch._grouped_mm(a[M, K], b[E, K, N], offs)` -> [M, N] in a's dtype.

    Forward, input-gradient and weight-gradient GEMMs run in the recipe, "mxfp8" or
    "fp8_rowwise" (`wgrad="bf16"` keeps the weight gradient in bf16). `b` may be a transposed
    view of [E, N, K] or a contiguous [E, K, N]; token groups may have any size (0 and
    non-multiples of 32 included). As with `torch._grouped_mm`, output rows past offs[-1] are
    unspecified.
    """
    check_grouped_mm_args(a, b, offs, recipe, rounding, wgrad)
    return grouped_mm_op(a, b, offs, recipe, rounding, wgrad)
