"""Pure-torch FP8 rowwise recipe: the numerics contract of `recipe="fp8_rowwise"`.

float8_e4m3fn data with one float32 power-of-two scale per row of the contraction (per token row,
per expert row, or per token group and column for the weight gradient). The exponent is the
MXFP8 one with the whole row as the block (`reference.scale_exponent`): data = saturate(x *
2^(127 - byte)), dequantization scale 2^(byte - 127); a row holding NaN or inf gets a NaN scale.

Everything here is traceable without host syncs, so the same functions are the CPU reference and,
decomposed under Inductor, the GPU quantizers (Inductor fuses them with their producers).
"""

from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_false

from .reference import (
    E4M3_MAX,
    check_float,
    exponent_to_float,
    group_ends,
    inv_scale,
    padded_group_offs,
    scale_exponent,
)

# tokens per group in the weight-gradient operands: torch's FP8 grouped GEMM needs every group
# along the contraction to span a multiple of 16 bytes
ALIGN = 16


def _cast(x_fp32: torch.Tensor, biased: torch.Tensor) -> torch.Tensor:
    return (x_fp32 * inv_scale(biased)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def _empty(n: int | torch.SymInt) -> bool:
    """Whether a size is 0 (no tokens, as on an expert-parallel rank that receives none). False
    where tracing could tell only by guarding: Dynamo specializes sizes of 0, so a size that is
    0 at run time is a plain int here."""
    return guard_or_false(n == 0)


def quantize_rows(x: torch.Tensor, dim: int, rounding: str = "rceil") -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per row along `dim`: (data float8 shaped like x, scales float32 without `dim`).
    Rows of no elements get the scale of zero rows (amax has no identity to reduce them with)."""
    check_float(x)
    xf = x.float()
    ax = xf.abs()
    amax = ax.sum(dim, keepdim=True) if _empty(x.shape[dim]) else ax.amax(dim, keepdim=True)  # sum: zeros
    biased = scale_exponent(amax, rounding)
    return _cast(xf, biased), exponent_to_float(biased).squeeze(dim)


def _group_ids(ends: torch.Tensor, n: int) -> torch.Tensor:
    """For positions 0..n-1, the group holding each (len(ends) past the last end)."""
    return torch.searchsorted(ends, torch.arange(n, device=ends.device, dtype=ends.dtype), right=True)


def _starts(ends: torch.Tensor) -> torch.Tensor:
    return torch.cat([ends.new_zeros(1), ends[:-1]])


def group_amax(x_MK: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """amax_GK: per token group and column, max |x| over the group's rows (NaN counts as inf)."""
    M, K = x_MK.shape
    G = offs.numel()
    gid_M = _group_ids(group_ends(offs, M), M)
    ax_MK = x_MK.float().abs()
    ax_MK = torch.where(ax_MK.isnan(), float("inf"), ax_MK)
    amax = torch.zeros(G + 1, K, device=x_MK.device)  # row G collects the rows past offs[-1]
    return amax.scatter_reduce(0, gid_M.long()[:, None].expand(M, K), ax_MK, "amax")[:G]


def padded_rows(M: int, G: int, align: int = ALIGN) -> int:
    """Tokens of a weight-gradient operand: a static bound on sum_g round_up(size_g, align)."""
    return -(-M // align) * align + align * G


def pad_groups(x_MK: torch.Tensor, offs: torch.Tensor, align: int) -> tuple[torch.Tensor, ...]:
    """x's rows in float32 with every token group zero-padded to a multiple of `align` rows:
    (x_TK with T = padded_rows(M, G, align), the group of each of its rows (the last group's for
    the rows past every group), the padded group ends). `offs` must have passed `group_ends`."""
    M, G = x_MK.shape[0], offs.numel()
    padded_ends = padded_group_offs(offs, align)
    j = torch.arange(padded_rows(M, G, align), device=x_MK.device, dtype=torch.int32)
    g = _group_ids(padded_ends, len(j)).clamp(max=G - 1)
    src = _starts(offs)[g] + j - _starts(padded_ends)[g]
    valid = (src < offs[g])[:, None]  # rows past padded_ends[g] map past the group's end
    if _empty(M):  # every row is padding and there is no row to gather
        return x_MK.new_zeros(len(j), x_MK.shape[1], dtype=torch.float32), g, padded_ends
    return torch.where(valid, x_MK[src.clamp(0, M - 1)].float(), 0.0), g, padded_ends


def quantize_groups(
    x_MK: torch.Tensor, offs: torch.Tensor, rounding: str = "rceil"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Weight-gradient operand: one scale per token group and column, along the tokens.

    Returns (data_KMp, scales_GK, padded_offs): data float8 [K, padded_rows(M, G)], each group's
    tokens transposed and zero-padded to a multiple of ALIGN; scales float32 [G, K]; padded_offs
    the int32 group ends in data_KMp.
    """
    check_float(x_MK)
    offs = group_ends(offs, x_MK.shape[0])
    biased_GK = scale_exponent(group_amax(x_MK, offs), rounding)
    x_MpK, g, padded_ends = pad_groups(x_MK, offs, ALIGN)
    return _cast(x_MpK, biased_GK[g]).t().contiguous(), exponent_to_float(biased_GK), padded_ends


def scaled_grouped_mm(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, offs: torch.Tensor
) -> torch.Tensor:
    """`torch._scaled_grouped_mm` (rowwise, bf16 out) emulated: operands dequantized to bf16
    (exact: float8 times a power of two) into the bf16 grouped GEMM, which accumulates in fp32.

    2d-3d: a [M, K], b [E, K, N], scale_a [M], scale_b [E, N].
    2d-2d: a [M, T], b [T, N] grouped along T by offs, scale_a [G * M], scale_b [G * N].
    """
    if b.dim() == 3:
        a_bf = (a.float() * scale_a[:, None]).bfloat16()
        b_bf = (b.float() * scale_b[:, None, :]).bfloat16()
    else:
        G = offs.numel()
        g_T = _group_ids(offs, a.shape[1]).clamp(max=G - 1)
        a_bf = (a.float() * scale_a.view(G, -1)[g_T].t()).bfloat16()
        b_bf = (b.float() * scale_b.view(G, -1)[g_T]).bfloat16()
    return torch._grouped_mm(a_bf, b_bf, offs)
