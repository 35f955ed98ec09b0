"""Triton twins of the FP8-rowwise weight-gradient quantizer, the one rowwise step Inductor does
badly: a segmented max over variable-size token groups (torch's scatter_reduce uses atomics) and a
gathered, transposed, group-padded write."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import reference as ref
from . import rowwise
from .triton_mx import _bits, _group_of, _group_start, _load_f32, _scaled_to_e4m3


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
    slices = max(1, min(64, 1024 // (G * triton.cdiv(K, BK))))
    _group_amax_kernel[(G, triton.cdiv(K, BK), slices)](
        _bits(x_MK), x_MK.stride(0), offs, out, K,
        IN_BF16=x_MK.dtype == torch.bfloat16, SLICES=slices, BM=64, BK=BK, num_warps=8,
    )
    return out.view(torch.float32)


@triton.jit
def _cast_groups_t_kernel(
    x_ptr, sx_m, offs_ptr, pends_ptr, inv_ptr, y_ptr, K, Mp,
    G: tl.constexpr, GP: tl.constexpr, IN_BF16: tl.constexpr, HW_CVT: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
):
    """Program (p, q): padded token columns p*BM.. and features q*BK.. of y[K, Mp]: gather the
    source rows, scale by their group's power of two, cast, store transposed."""
    j = tl.program_id(0) * BM + tl.arange(0, BM)
    k = tl.program_id(1) * BK + tl.arange(0, BK)
    g = _group_of(pends_ptr, G, GP, j)
    gc = tl.minimum(g, G - 1)
    src = _group_start(offs_ptr, gc) + j - _group_start(pends_ptr, gc)
    valid = (g < G) & (src < tl.load(offs_ptr + gc))
    k_ok = k < K
    m = valid[:, None] & k_ok[None, :]
    x = _load_f32(x_ptr + src.to(tl.int64)[:, None] * sx_m + k[None, :], m, IN_BF16)
    inv = tl.load(inv_ptr + gc[:, None] * K + k[None, :], mask=k_ok[None, :], other=1.0)
    q8 = tl.where(m, _scaled_to_e4m3(x, inv, HW_CVT), 0)
    tl.store(y_ptr + k.to(tl.int64)[:, None] * Mp + j[None, :], tl.trans(q8), mask=k_ok[:, None] & (j < Mp)[None, :])


def quantize_groups(
    x_MK: torch.Tensor, offs: torch.Tensor, rounding: str = "rceil"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton twin of `rowwise.quantize_groups`: two reads of x, one write of the fp8 data."""
    ref.check_float(x_MK)
    M, K = x_MK.shape
    G = offs.numel()
    if x_MK.stride(1) != 1:
        x_MK = x_MK.contiguous()
    biased_GK = ref.scale_exponent(group_amax(x_MK, offs), rounding)
    pends = ref.padded_group_offs(offs, rowwise.ALIGN)
    Mp = rowwise.padded_rows(M, G)
    y = torch.empty(K, Mp, dtype=torch.uint8, device=x_MK.device)
    BM, BK = 64, 64
    _cast_groups_t_kernel[(triton.cdiv(Mp, BM), triton.cdiv(K, BK))](
        _bits(x_MK), x_MK.stride(0), offs, pends, ref.inv_scale(biased_GK).contiguous(), y, K, Mp,
        G=G, GP=triton.next_power_of_2(G), IN_BF16=x_MK.dtype == torch.bfloat16, HW_CVT=x_MK.is_cuda,
        BM=BM, BK=BK, num_warps=4,
    )
    return y.view(torch.float8_e4m3fn), ref.exponent_to_float(biased_GK), pends
