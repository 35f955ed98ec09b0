"""Triton twins of the FP8-rowwise weight-gradient quantizer, the one rowwise step Inductor does
badly: a segmented max over variable-size token groups (torch's scatter_reduce uses atomics) and a
gathered, transposed, group-padded write."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import reference as ref
from . import rowwise
from .triton_mx import (
    _bits, _e8m0_to_float, _find, _groups, _inv_scale, _load_f32, _pick, _scale_exponent, _scaled_to_e4m3, cdiv,
    pow2,
)


@triton.jit
def _group_amax_kernel(
    x_ptr, sx_m, offs_ptr, out_ptr, K, IN_BF16: tl.constexpr, SLICES: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr
):
    """Program (g, q, s): columns q*BK.. over slice s of group g's rows, BM rows at a time; slices
    meet in an atomic max on the float bits (ordered like the floats: all are >= 0)."""
    g = tl.program_id(0)
    k = tl.program_id(1) * BK + tl.arange(0, BK)
    start = tl.load(offs_ptr + g - 1, mask=g > 0, other=0)
    end = tl.load(offs_ptr + g)
    chunk = (end - start + SLICES * BM - 1) // (SLICES * BM) * BM
    r0 = start + tl.program_id(2) * chunk
    stop = tl.minimum(r0 + chunk, end)
    acc = tl.zeros([BK], dtype=tl.float32)
    while r0 < stop:  # not range(): the interpreter cannot take loaded bounds
        r = r0 + tl.arange(0, BM)
        m = (r < stop)[:, None] & (k < K)[None, :]
        ax = tl.abs(_load_f32(x_ptr + r.to(tl.int64)[:, None] * sx_m + k[None, :], m, IN_BF16))
        acc = tl.maximum(acc, tl.max(tl.where(ax != ax, float("inf"), ax), axis=0))
        r0 += BM
    tl.atomic_max(out_ptr + g * K + k, acc.to(tl.int32, bitcast=True), mask=k < K)


def group_amax(x_MK: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """amax_GK float32, as `rowwise.group_amax`, in one read of x."""
    K, G = x_MK.shape[1], offs.numel()
    if x_MK.stride(1) != 1:
        x_MK = x_MK.contiguous()
    out = torch.zeros(G, K, device=x_MK.device, dtype=torch.int32)
    BK = 128
    # enough programs to keep every SM streaming, whatever the number of groups
    slices = max(1, min(64, 1024 // (G * cdiv(K, BK))))
    _group_amax_kernel[(G, cdiv(K, BK), slices)](
        _bits(x_MK), x_MK.stride(0), offs, out, K,
        IN_BF16=x_MK.dtype == torch.bfloat16, SLICES=slices, BM=64, BK=BK, num_warps=8,
    )
    return out.view(torch.float32)


@triton.jit
def _cast_groups_t_kernel(
    x_ptr, sx_m, offs_ptr, amax_ptr, y_ptr, scales_ptr, pends_ptr, K, Mp,
    G: tl.constexpr, GP: tl.constexpr, ALIGN: tl.constexpr, RCEIL: tl.constexpr, IN_BF16: tl.constexpr,
    HW_CVT: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
):
    """Program (p, q): padded token columns p*BM.. and features q*BK.. of y[K, Mp]: gather the
    source rows, scale by their group's power of two, cast, store transposed. Programs (0, q)
    also write the float scales of features q*BK.., program (0, 0) the padded group ends: the
    whole operand comes from this kernel and the amax one, with no host ops between them."""
    j = tl.program_id(0) * BM + tl.arange(0, BM)
    k = tl.program_id(1) * BK + tl.arange(0, BK)
    k_ok = k < K
    starts, ends, chunk_ends = _groups(offs_ptr, G, GP, ALIGN)
    g = _find(chunk_ends, G, j // ALIGN)
    start, end = _pick(starts, g), _pick(ends, g)
    src = start + j - (_pick(chunk_ends, g) - (end - start + ALIGN - 1) // ALIGN) * ALIGN
    m = ((g < G) & (src < end))[:, None] & k_ok[None, :]
    x = _load_f32(x_ptr + src.to(tl.int64)[:, None] * sx_m + k[None, :], m, IN_BF16)
    gc = tl.minimum(g, G - 1)
    inv = _inv_scale(_scale_exponent(tl.load(amax_ptr + gc[:, None] * K + k[None, :], mask=m, other=0.0), RCEIL))
    q8 = tl.where(m, _scaled_to_e4m3(x, inv, HW_CVT), 0)
    tl.store(y_ptr + k.to(tl.int64)[:, None] * Mp + j[None, :], tl.trans(q8), mask=k_ok[:, None] & (j < Mp)[None, :])
    if tl.program_id(0) == 0:
        i = tl.arange(0, GP)
        ms = (i < G)[:, None] & k_ok[None, :]
        amax = tl.load(amax_ptr + i[:, None] * K + k[None, :], mask=ms, other=0.0)
        tl.store(scales_ptr + i[:, None] * K + k[None, :], _e8m0_to_float(_scale_exponent(amax, RCEIL)), mask=ms)
        if tl.program_id(1) == 0:
            tl.store(pends_ptr + i, chunk_ends * ALIGN, mask=i < G)


def quantize_groups(
    x_MK: torch.Tensor, offs: torch.Tensor, rounding: str = "rceil"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton twin of `rowwise.quantize_groups`: two reads of x, one write of the fp8 data, two
    kernels and no other device work (host time per call matters at small MoE shapes)."""
    ref.check_float(x_MK)
    ref.check_rounding(rounding)
    M, K = x_MK.shape
    G = offs.numel()
    if x_MK.stride(1) != 1:
        x_MK = x_MK.contiguous()
    amax_GK = group_amax(x_MK, offs)
    Mp = rowwise.padded_rows(M, G)
    data_KMp = torch.empty(K, Mp, dtype=torch.uint8, device=x_MK.device)
    scales_GK = torch.empty(G, K, dtype=torch.float32, device=x_MK.device)
    pends = torch.empty(G, dtype=torch.int32, device=x_MK.device)
    BM, BK = 64, 64
    _cast_groups_t_kernel[(cdiv(Mp, BM), cdiv(K, BK))](
        _bits(x_MK), x_MK.stride(0), offs, amax_GK, data_KMp, scales_GK, pends, K, Mp,
        G=G, GP=pow2(G), ALIGN=rowwise.ALIGN, RCEIL=rounding == "rceil",
        IN_BF16=x_MK.dtype == torch.bfloat16, HW_CVT=x_MK.is_cuda, BM=BM, BK=BK, num_warps=4,
    )
    return data_KMp.view(torch.float8_e4m3fn), scales_GK, pends
